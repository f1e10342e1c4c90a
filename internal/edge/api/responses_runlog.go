package api

import (
	"encoding/json"

	"iop/internal/runs"
	"iop/internal/sse"
)

// responseRunLog records a background response's answer in its run, as
// a run of POST /v1/runs records its own (runRecorder.normalized), so
// /v1/runs/{id} and /v1/runs/{id}/events show it like any other run:
// where it was dispatched (Dispatched), its output, and its events as
// OpenAI chat.completion.chunk objects (a first chunk with the assistant
// role, one per reasoning, text and tool-call part), ended by a chunk
// with the finish reason, a usage chunk and `data: [DONE]`, or by one
// error event. Only the run's goroutine uses it.
type responseRunLog struct {
	run     *runs.Run
	id      string
	created int64
	model   string
	started bool
}

// dispatched records where the run went.
func (l *responseRunLog) dispatched(info DispatchInfo) {
	l.run.Dispatched(runs.Record{
		NodeID: info.NodeID, ProviderID: info.ProviderID, ServedModel: info.ServedModel,
		Path: info.Path.String(), QueueReason: info.QueueReason.String(), QueueWait: info.QueueWait,
	})
}

func (l *responseRunLog) append(v any, text string) {
	b, _ := json.Marshal(v)
	l.run.Append(sse.AppendEvent(nil, "", b), text)
}

func (l *responseRunLog) chunk(delta chunkDelta, finish *string, text string) {
	if !l.started {
		l.started = true
		empty := ""
		l.append(chatChunk{ID: l.id, Object: "chat.completion.chunk", Created: l.created, Model: l.model,
			Choices: []chunkChoice{{Delta: chunkDelta{Role: "assistant", Content: &empty}}}}, "")
	}
	l.append(chatChunk{ID: l.id, Object: "chat.completion.chunk", Created: l.created, Model: l.model,
		Choices: []chunkChoice{{Delta: delta, FinishReason: finish}}}, text)
}

func (l *responseRunLog) thinking(s string) { l.chunk(chunkDelta{ReasoningContent: &s}, nil, "") }

func (l *responseRunLog) text(s string) { l.chunk(chunkDelta{Content: &s}, nil, s) }

func (l *responseRunLog) toolCall(index int, id, name, args string) {
	tc := toolCall{Index: &index, ID: id, Function: toolCallFunction{Name: name, Arguments: args}}
	if id != "" {
		tc.Type = "function"
	}
	l.chunk(chunkDelta{ToolCalls: []toolCall{tc}}, nil, "")
}

// complete ends the log of a complete answer.
func (l *responseRunLog) complete(finish string, u usage) {
	l.chunk(chunkDelta{}, &finish, "")
	l.append(chatChunk{ID: l.id, Object: "chat.completion.chunk", Created: l.created, Model: l.model,
		Choices: []chunkChoice{}, Usage: &u}, "")
	l.run.Append(sse.AppendDone(nil), "")
}

// fail ends the log with an error event.
func (l *responseRunLog) fail(message, code string) {
	l.append(errorBody{Error: newAPIError(0, "server_error", "", code, message)}, "")
}
