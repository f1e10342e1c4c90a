package openai

import (
	"net/http"
	"strings"

	"iop/internal/edge/api"
	"iop/internal/edge/api/request"
	"iop/internal/edge/contract"
)

// completions serves POST /v1/completions (legacy text completions): the
// body is checked (request.DecodeCompletion) and dispatched with Operation
// COMPLETION; a normalized run is rendered as text_completion objects
// (textRender).
func (s *server) completions(w http.ResponseWriter, r *http.Request) {
	s.serve(w, r, "completions", request.DecodeCompletion, func(a *api.Answer, info contract.DispatchInfo, b *request.Body, model string) string {
		t := &textRender{Answer: a, id: "cmpl-" + info.RunID, created: s.f.Now().Unix(), model: model, includeUsage: b.IncludeUsage}
		if b.Request.Stream {
			return t.stream()
		}
		return t.json()
	})
}

// textRender renders a normalized-path run as an OpenAI text completion.
// Only the request goroutine uses it.
type textRender struct {
	*api.Answer
	id           string // "cmpl-" + run id
	created      int64  // Unix seconds
	model        string // the model name the client asked for
	includeUsage bool
}

// textCompletion is a completion object or a streamed chunk of one (object
// "text_completion" both). Usage is set on the whole answer and on the
// usage chunk only.
type textCompletion struct {
	ID      string       `json:"id"`
	Object  string       `json:"object"`
	Created int64        `json:"created"`
	Model   string       `json:"model"`
	Choices []textChoice `json:"choices"`
	Usage   *usage       `json:"usage,omitempty"`
}

type textChoice struct {
	Text         string    `json:"text"`
	Index        int       `json:"index"`
	Logprobs     *struct{} `json:"logprobs"`      // always null
	FinishReason *string   `json:"finish_reason"` // null until the last chunk
}

func (t *textRender) object(choices []textChoice, u *usage) textCompletion {
	return textCompletion{ID: t.id, Object: "text_completion", Created: t.created, Model: t.model, Choices: choices, Usage: u}
}

// json collects the whole answer and writes one text_completion object
// with usage. It returns the rendering's reason.
func (t *textRender) json() string {
	var text strings.Builder
	ev, err := t.ReadEvents(func(ev *contract.Event) error {
		text.WriteString(ev.Text)
		return nil
	})
	if err != nil {
		return t.Fail(err)
	}
	if api.ClientGone(t.HTTPRequest()) {
		return api.ReasonClientGone
	}
	u := usageOf(ev)
	api.WriteJSON(t.ResponseWriter(), http.StatusOK, t.object([]textChoice{{Text: text.String(), FinishReason: &ev.Finish}}, &u))
	return api.ReasonCompleted
}

// stream writes the answer as SSE text_completion chunks: one per delta
// (flushed at once), a last one with empty text and the finish reason, a
// usage chunk (choices []) when the request asked for include_usage, and
// `data: [DONE]`. The status line goes with the first delta or the end, so
// a run that fails before either gets an error answer with its own status;
// one that fails later ends with an error event and no [DONE]. It returns
// the rendering's reason.
func (t *textRender) stream() string {
	ev, err := t.ReadEvents(func(ev *contract.Event) error {
		if ev.Text == "" {
			return nil
		}
		t.StartStream()
		if err := t.EventWriter().JSON("", t.object([]textChoice{{Text: ev.Text}}, nil)); err != nil {
			return api.WriteFailure(err)
		}
		return nil
	})
	if err != nil {
		if reason, ended := t.FailedEarly(err); ended {
			return reason
		}
		return t.FailStream(err)
	}
	t.StartStream()
	events := t.EventWriter()
	if err := events.JSON("", t.object([]textChoice{{FinishReason: &ev.Finish}}, nil)); err != nil {
		return t.WriteFailed(err)
	}
	if t.includeUsage {
		u := usageOf(ev)
		if err := events.JSON("", t.object([]textChoice{}, &u)); err != nil {
			return t.WriteFailed(err)
		}
	}
	if err := events.Done(); err != nil {
		return t.WriteFailed(err)
	}
	return api.ReasonCompleted
}
