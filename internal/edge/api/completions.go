package api

import (
	"errors"
	"math"
	"net/http"
	"strings"

	"iop/internal/edge/contract"
)

// completionRequest is what the API reads from a legacy completions request
// body (OpenAI API reference, "Create completion"). Everything else travels
// to the provider untouched.
type completionRequest struct {
	Model        string
	Stream       bool
	IncludeUsage bool
	// EstimatedInputTokens is the prompt's token ids plus its characters / 4.
	EstimatedInputTokens int
	// Needs are NeedPromptBatch for more than one prompt, NeedTokenInput
	// for a prompt of token ids, NeedChoices for n or best_of above 1, in
	// that order; empty for one prompt string and one choice.
	Needs []string
	// ollama is the body's translate.ExtensionKey member.
	ollama ollamaMember
}

// decodeCompletionRequest reads and checks a completions request body, so a
// request every provider would reject is answered 400 before it waits in a
// queue. Checked values (absent or null is allowed unless said otherwise):
//
//	model                    a non-empty string, required
//	prompt                   required: a string, an array of strings, an array
//	                         of token ids or an array of token id arrays
//	                         (decodeTextInput)
//	stream, echo             booleans
//	stream_options           an object; include_usage a boolean
//	suffix, user             strings
//	max_tokens               an integer in [1, 2147483647]
//	n, best_of               integers in [1, 128]
//	logprobs                 an integer in [0, 5]
//	seed                     an integer in the int64 range
//	temperature, top_p,      numbers that fit a float64
//	presence_penalty,
//	frequency_penalty
//	stop                     a string, or an array of at most 4 strings
//
// More than one prompt makes the request need "prompt_batch", a prompt of
// token ids "token_input", and n or best_of above 1 "choices": only
// tunnel-path providers have them (Ollama takes one prompt string and
// answers one choice), so such a request goes only to them, or is answered
// 400 when no provider of the model is one. Whether a provider can honour echo, suffix
// and logprobs is the provider's to say: the tunnel path passes them on;
// the normalized path (Ollama) answers 400 naming the field it cannot
// honour (echo, logprobs). Errors are *requestError naming the field.
func decodeCompletionRequest(body []byte) (completionRequest, error) {
	top, err := parseBody(body)
	if err != nil {
		return completionRequest{}, err
	}
	var req completionRequest
	if req.Model, err = modelOf(top); err != nil {
		return completionRequest{}, err
	}
	prompt, err := textInputOf(top.get("prompt"), "prompt", false)
	if err != nil {
		return completionRequest{}, err
	}
	req.EstimatedInputTokens = prompt.estimatedTokens()
	req.Needs = prompt.needs(true)
	if req.Stream, err = boolOf(top.get("stream"), "stream"); err != nil {
		return completionRequest{}, err
	}
	if req.IncludeUsage, err = includeUsageOf(top); err != nil {
		return completionRequest{}, err
	}
	if err := checkType(top.get("echo"), "echo", wantBool); err != nil {
		return completionRequest{}, err
	}
	for _, name := range []string{"suffix", "user"} {
		if err := checkType(top.get(name), name, wantString); err != nil {
			return completionRequest{}, err
		}
	}
	for _, f := range []struct {
		name     string
		min, max int64
	}{
		{"max_tokens", 1, math.MaxInt32},
		{"n", 1, maxChoices},
		{"best_of", 1, maxChoices},
		{"logprobs", 0, 5},
		{"seed", math.MinInt64, math.MaxInt64},
	} {
		if err := checkInteger(top.get(f.name), f.name, f.min, f.max); err != nil {
			return completionRequest{}, err
		}
	}
	for _, name := range []string{"temperature", "top_p", "presence_penalty", "frequency_penalty"} {
		if err := checkNumber(top.get(name), name); err != nil {
			return completionRequest{}, err
		}
	}
	if err := checkStop(top.get("stop")); err != nil {
		return completionRequest{}, err
	}
	if severalChoicesOf(top.get("n")) || severalChoicesOf(top.get("best_of")) {
		req.Needs = append(req.Needs, NeedChoices)
	}
	if !top.get("logprobs").absent() {
		req.Needs = append(req.Needs, NeedLogprobs)
	}
	req.ollama = ollamaMemberOf(top)
	return req, nil
}

// modelOf reads the required, non-empty "model".
func modelOf(top *jsonValue) (string, error) {
	model, err := stringOf(top.get("model"), "model")
	if err != nil {
		return "", err
	}
	if strings.TrimSpace(model) == "" {
		return "", &requestError{param: "model", message: "you must provide a model parameter"}
	}
	return model, nil
}

// includeUsageOf reads "stream_options.include_usage".
func includeUsageOf(top *jsonValue) (bool, error) {
	opts := top.get("stream_options")
	if err := checkType(opts, "stream_options", wantObject); err != nil {
		return false, err
	}
	return boolOf(opts.get("include_usage"), "stream_options.include_usage")
}

// completions serves POST /v1/completions (legacy text completions):
// it decodes and checks the body, dispatches it with Operation COMPLETION,
// and relays the tunnel path's answer or renders the normalized path's as
// text_completion objects. Statuses as for chat completions.
func (h *handler) completions(w http.ResponseWriter, r *http.Request) {
	obsOf(r).begin("completions")
	body, err := h.readBody(r)
	if err != nil {
		h.writeError(w, r, err, nil)
		return
	}
	cr, err := decodeCompletionRequest(body)
	if err != nil {
		h.writeError(w, r, err, nil)
		return
	}
	req := contract.Request{
		Model:                cr.Model,
		Operation:            contract.OperationCompletion,
		Stream:               cr.Stream,
		Body:                 body,
		Needs:                cr.Needs,
		EstimatedInputTokens: cr.EstimatedInputTokens,
		Headers:              forwardHeaders(r.Header),
	}
	if err := cr.ollama.moveTo(&req); err != nil {
		h.writeError(w, r, err, nil)
		return
	}
	h.serveRun(w, r, &req, func(rr *Answer, info contract.DispatchInfo) string {
		tr := &textRender{eventReader: eventReader{Answer: rr}, id: "cmpl-" + info.RunID,
			created: h.cfg.Now().Unix(), model: cr.Model, includeUsage: cr.IncludeUsage}
		if cr.Stream {
			return tr.stream()
		}
		return tr.json()
	})
}

// textRender renders a normalized-path run as an OpenAI text completion.
type textRender struct {
	eventReader
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
	finish, err := t.next(func(ev *contract.Event) error {
		text.WriteString(ev.Text)
		return nil
	})
	if err != nil {
		return t.fail(err)
	}
	if clientGone(t.r) {
		return ReasonClientGone
	}
	u := t.usage
	writeJSON(t.w, http.StatusOK, t.object([]textChoice{{Text: text.String(), FinishReason: &finish}}, &u))
	return ReasonCompleted
}

// stream writes the answer as SSE text_completion chunks: one per delta
// (flushed at once), a last one with empty text and the finish reason, a
// usage chunk (choices []) when the request asked for include_usage, and
// `data: [DONE]`. The status line goes with the first delta or the end, so
// a run that fails before either gets an error answer with its own status;
// one that fails later ends with an error event and no [DONE]. It returns
// the rendering's reason.
func (t *textRender) stream() string {
	finish, err := t.next(func(ev *contract.Event) error {
		if ev.Text == "" {
			return nil
		}
		t.startStream()
		if err := t.writeEvent(t.object([]textChoice{{Text: ev.Text}}, nil)); err != nil {
			return &errWrite{err}
		}
		return nil
	})
	var werr *errWrite
	switch {
	case errors.As(err, &werr):
		return t.writeFailed(werr.err)
	case err != nil && !t.started:
		return t.fail(err)
	case err != nil:
		return t.failStarted(err, true)
	}
	t.startStream()
	if err := t.writeEvent(t.object([]textChoice{{FinishReason: &finish}}, nil)); err != nil {
		return t.writeFailed(err)
	}
	if t.includeUsage {
		u := t.usage
		if err := t.writeEvent(t.object([]textChoice{}, &u)); err != nil {
			return t.writeFailed(err)
		}
	}
	if err := t.events().Done(); err != nil {
		return t.writeFailed(err)
	}
	return ReasonCompleted
}
