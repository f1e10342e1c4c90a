package openai

import (
	"net/http"
	"strings"

	"iop/internal/edge/api"
	"iop/internal/edge/api/request"
	"iop/internal/edge/api/stream"
	"iop/internal/edge/contract"
)

// chatCompletions serves POST /v1/chat/completions: the body is checked
// (request.DecodeChat) and dispatched with Operation CHAT; a normalized run
// is rendered as one chat.completion object, or with "stream": true as
// chat.completion.chunk events (chatRender).
func (s *server) chatCompletions(w http.ResponseWriter, r *http.Request) {
	s.serve(w, r, "chat.completions", request.DecodeChat, func(a *api.Answer, info contract.DispatchInfo, b *request.Body, model string) string {
		c := &chatRender{Answer: a, id: "chatcmpl-" + info.RunID, created: s.f.Now().Unix(), model: model, includeUsage: b.IncludeUsage}
		if b.Request.Stream {
			return c.stream()
		}
		return c.json()
	})
}

// chatRender renders a normalized-path run as an OpenAI chat completion.
// Only the request goroutine uses it.
type chatRender struct {
	*api.Answer
	id           string // "chatcmpl-" + run id
	created      int64  // Unix seconds
	model        string // the model name the client asked for
	includeUsage bool
}

// chatCompletion is the non-streamed answer (object "chat.completion").
type chatCompletion struct {
	ID      string       `json:"id"`
	Object  string       `json:"object"`
	Created int64        `json:"created"`
	Model   string       `json:"model"`
	Choices []chatChoice `json:"choices"`
	Usage   usage        `json:"usage"`
}

// chatChoice is one choice of a chat.completion. Logprobs is always
// null: no provider's log probabilities reach it.
type chatChoice struct {
	Index        int         `json:"index"`
	Message      chatMessage `json:"message"`
	Logprobs     *struct{}   `json:"logprobs"`
	FinishReason string      `json:"finish_reason"`
}

// chatMessage is the answer's message. Content is null when the message
// only calls tools, as OpenAI answers.
//
// ReasoningContent is the model's reasoning (an Ollama provider's
// message.thinking), sent as "reasoning_content" on the message and on
// stream deltas (stream.ChatChunks), as vLLM, DeepSeek and LiteLLM send it.
// It is the name the clients agents are built on read: @langchain/openai
// reads reasoning_content only, the Vercel AI SDK's openai-compatible
// provider reasoning_content and then reasoning, and so do most
// hand-written clients; Ollama's own OpenAI API and OpenRouter say
// "reasoning" instead. Only one of the two is written, since a client
// that reads both would show the reasoning twice.
type chatMessage struct {
	Role             string     `json:"role"`
	Content          *string    `json:"content"`
	Refusal          *string    `json:"refusal"` // always null
	ReasoningContent string     `json:"reasoning_content,omitempty"`
	ToolCalls        []toolCall `json:"tool_calls,omitempty"`
}

// toolCall is one entry of a message's "tool_calls" (OpenAI API
// reference, chat completion object).
type toolCall struct {
	ID       string           `json:"id,omitempty"`
	Type     string           `json:"type,omitempty"` // "function"
	Function toolCallFunction `json:"function"`
}

type toolCallFunction struct {
	Name      string `json:"name,omitempty"`
	Arguments string `json:"arguments"` // JSON text
}

// json collects the whole answer and writes one chat.completion object.
// A delta's tool-call parts are joined by their index (below
// api.MaxToolCalls, else the run broke the protocol). Usage is what the
// node reported, zero if it reported none. It returns the rendering's
// reason.
func (c *chatRender) json() string {
	var (
		text, thinking strings.Builder
		calls          []toolCall // by index; parts of one call are joined
	)
	ev, err := c.ReadEvents(func(ev *contract.Event) error {
		text.WriteString(ev.Text)
		thinking.WriteString(ev.Thinking)
		for _, part := range ev.ToolCalls {
			i := part.Index
			if i < 0 || i >= api.MaxToolCalls {
				return api.ErrUpstreamProtocol
			}
			for len(calls) <= i {
				calls = append(calls, toolCall{Type: "function"})
			}
			if part.ID != "" {
				calls[i].ID = part.ID
			}
			if part.Name != "" {
				calls[i].Function.Name = part.Name
			}
			calls[i].Function.Arguments += part.Arguments
		}
		return nil
	})
	if err != nil {
		return c.Fail(err)
	}
	if api.ClientGone(c.HTTPRequest()) {
		return api.ReasonClientGone
	}
	msg := chatMessage{Role: "assistant", ToolCalls: calls, ReasoningContent: thinking.String()}
	if content := text.String(); content != "" || len(calls) == 0 {
		msg.Content = &content
	}
	api.WriteJSON(c.ResponseWriter(), http.StatusOK, chatCompletion{
		ID:      c.id,
		Object:  "chat.completion",
		Created: c.created,
		Model:   c.model,
		Choices: []chatChoice{{Message: msg, FinishReason: ev.Finish}},
		Usage:   usageOf(ev),
	})
	return api.ReasonCompleted
}

// stream writes the answer as SSE chat.completion.chunk events
// (stream.ChatChunks; each message's chunks flushed at once, so a stream that
// is only reasoning so far sends it as it comes), a usage chunk when the
// request asked for include_usage, and `data: [DONE]`. The status line is
// sent with the first delta or the completion, so a run that fails before
// either gets an error answer with its own status; a run that fails later
// ends with an error event and no [DONE]. It returns the rendering's
// reason.
func (c *chatRender) stream() string {
	chunks := stream.NewChatChunks(c.id, c.created, c.model, func(data []byte, _ string) error {
		c.StartStream()
		if err := c.EventWriter().Event("", data); err != nil {
			return api.WriteFailure(err)
		}
		return nil
	})
	ev, err := c.ReadEvents(chunks.Delta)
	if err != nil {
		if reason, ended := c.FailedEarly(err); ended {
			return reason
		}
		return c.FailStream(err)
	}
	if err := c.finishStream(chunks, ev); err != nil {
		return c.WriteFailed(err)
	}
	return api.ReasonCompleted
}

// finishStream writes the final chunk, the usage chunk if asked for, and
// [DONE], in one flush.
func (c *chatRender) finishStream(chunks *stream.ChatChunks, ev api.Events) (err error) {
	c.Hold()
	defer func() {
		if rerr := c.Release(); err == nil {
			err = rerr
		}
	}()
	if c.includeUsage {
		err = chunks.End(ev.Finish, ev.PromptTokens, ev.CompletionTokens)
	} else {
		err = chunks.Finish(ev.Finish)
	}
	if err != nil {
		return err
	}
	return c.EventWriter().Done()
}
