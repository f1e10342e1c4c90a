package responses

import (
	"iop/internal/edge/api"
	"iop/internal/edge/api/stream"
	"iop/internal/edge/contract"
	"iop/internal/runs"
	"iop/internal/sse"
)

// responseRunLog records a background response's answer in its run, as
// a run of POST /v1/runs records its own (package runsapi), so
// /v1/runs/{id} and /v1/runs/{id}/events show it like any other run:
// where it was dispatched (Dispatched), its output, and its events as
// OpenAI chat.completion.chunk objects (a first chunk with the assistant
// role, one per reasoning, text and tool-call part), ended by a chunk
// with the finish reason, a usage chunk and `data: [DONE]`, or by one
// error event. Only the run's goroutine uses it.
type responseRunLog struct {
	run    *runs.Run
	chunks *stream.ChatChunks
}

// newResponseRunLog returns the log of run, whose chunks carry id, created
// (Unix seconds) and model.
func newResponseRunLog(run *runs.Run, id string, created int64, model string) *responseRunLog {
	l := &responseRunLog{run: run}
	l.chunks = stream.NewChatChunks(id, created, model, func(data []byte, text string) error {
		l.run.Append(sse.AppendEvent(nil, "", data), text)
		return nil
	})
	return l
}

// dispatched records where the run went.
func (l *responseRunLog) dispatched(info contract.DispatchInfo) {
	l.run.Dispatched(runs.Record{
		NodeID: info.NodeID, ProviderID: info.ProviderID, ServedModel: info.ServedModel,
		Path: info.Path.String(), QueueReason: info.QueueReason.String(), QueueWait: info.QueueWait,
	})
}

// The sink does not fail: the errors below are ChatChunks' own (none
// for these values).

func (l *responseRunLog) thinking(s string) { _ = l.chunks.Delta(&contract.Event{Thinking: s}) }

func (l *responseRunLog) text(s string) { _ = l.chunks.Delta(&contract.Event{Text: s}) }

func (l *responseRunLog) toolCall(index int, id, name, args string) {
	_ = l.chunks.Delta(&contract.Event{ToolCalls: []contract.ToolCallPart{{Index: index, ID: id, Name: name, Arguments: args}}})
}

// complete ends the log of a complete answer, with its token counts.
func (l *responseRunLog) complete(finish string, promptTokens, completionTokens int) {
	_ = l.chunks.End(finish, promptTokens, completionTokens)
	l.run.Append(sse.AppendDone(nil), "")
}

// fail ends the log with an error event.
func (l *responseRunLog) fail(message, code string) {
	l.run.Append(sse.AppendEvent(nil, "", api.ErrorJSON("server_error", code, message)), "")
}
