package contract

// Message is one message of a run from its node, as the edge decoded it
// (once, when it arrived): the events of one normalized-path RunEvents
// message, or one tunnel-path part. The HTTP API renders messages; it never
// sees the wire protocol.
type Message struct {
	// Tunnel is set for a tunnel-path part, which is Part (a head, data,
	// end or failure event; a head may carry the body's start, or with End
	// all of it: see TunnelParts); clear for a normalized-path message,
	// whose events are Events.
	Tunnel bool
	Part   Event
	// Events are a normalized message's events, in order (delta, usage,
	// end, failure), which the API writes with one flush. Events only the
	// edge reads (started, and types it does not know) and deltas without
	// content are left out, so Events may be empty.
	Events []Event
	// Ends is set when this message ended the run: its lease is already
	// released, and the next Recv returns io.EOF.
	Ends bool
}

// EventKind says what an Event is.
type EventKind uint8

// Event kinds.
const (
	// EventUnknown is the zero EventKind: no event (the Part of a
	// normalized message).
	EventUnknown EventKind = iota
	// EventHead (tunnel): the provider's status and headers, and
	// ContentLength; it may carry the body's first bytes (Data), or the
	// whole body with End.
	EventHead
	// EventData (tunnel): bytes of the provider's body, as it sent them.
	EventData
	// EventDelta (normalized): generated content: text, reasoning
	// (thinking), tool-call parts or embeddings. The edge leaves out
	// deltas that carry none.
	EventDelta
	// EventUsage (normalized): the run's token counts.
	EventUsage
	// EventEnd: the answer ended. Normalized: FinishReason ("" when the
	// node said none). Tunnel: ProviderError, when the provider's 2xx
	// stream carried an error object (the client got it with the bytes;
	// the run failed all the same).
	EventEnd
	// EventFailure: the run failed: Status, Message, InvalidRequest and
	// Param; or Cancelled (the node cancelled it).
	EventFailure
)

// Event is one typed event of a run. Which fields are set depends on Kind.
type Event struct {
	Kind EventKind
	// Status is the provider's HTTP status (EventHead), or the status of a
	// failure (EventFailure): the provider's or the node's (502 upstream
	// failure, 504 timeout); 0 means none said (answered 502).
	Status int
	// Headers are the provider's response headers (EventHead), as the
	// node sent them.
	Headers map[string]string
	// Data is a tunnel body chunk (EventData), or the body's start, or
	// with End all of it (EventHead). Not to be modified.
	Data []byte
	// End (EventHead): Data is the whole body, and the answer ended with
	// it as an EventEnd without ProviderError would say; the message
	// ends the run (Message.Ends).
	End bool
	// ContentLength (EventHead without End) is the length in bytes of the
	// whole body (Data and every EventData after it) when the node knew it
	// in advance (the provider's Content-Length), 0 when not known. With
	// End the whole body is Data, and this field is not used.
	ContentLength int64
	// Text and Thinking are generated text and reasoning (EventDelta).
	Text, Thinking string
	// ToolCalls are tool-call parts (EventDelta).
	ToolCalls []ToolCallPart
	// Embeddings are embedding vectors (EventDelta), in input order.
	Embeddings [][]float32
	// Logprobs are the log probabilities of the tokens of this delta, in
	// order (EventDelta), when the request asked for them and the
	// provider gave them.
	Logprobs []TokenLogprob
	// PromptTokens and CompletionTokens are the run's usage (EventUsage).
	PromptTokens, CompletionTokens int
	// FinishReason is why a normalized answer ended ("stop", "length",
	// "tool_calls"; "" when not said) (EventEnd).
	FinishReason string
	// StopSequence is the request's stop sequence that ended a normalized
	// answer, when one did and the node knew it (EventEnd; FinishReason
	// "stop").
	StopSequence string
	// ProviderError is the error a tunnel answer carried inside its 2xx
	// stream (EventEnd), already safe to log.
	ProviderError string
	// Message is a failure's text, already safe to show a client
	// (EventFailure).
	Message string
	// InvalidRequest marks a failure that is the node's own refusal of a
	// request it could not translate or send (400 invalid_request_error);
	// Param then names the offending field, "" for the body as a whole.
	InvalidRequest bool
	Param          string
	// Cancelled marks a failure that is the node cancelling the run.
	Cancelled bool
}

// TunnelParts is the events of a tunnel message in order, a head that
// carries body bytes or the end split into head, data and end (the data
// and end as a TunnelData and a TunnelEnd would have carried them), so
// that a reader of tunnel parts handles both forms the same way; n is how
// many of parts are set. The head in parts[0] keeps its Data and End.
func TunnelParts(msg Message) (parts [3]Event, n int) {
	ev := msg.Part
	parts[0], n = ev, 1
	if ev.Kind != EventHead {
		return parts, n
	}
	if len(ev.Data) > 0 {
		parts[n], n = Event{Kind: EventData, Data: ev.Data}, n+1
	}
	if ev.End {
		parts[n], n = Event{Kind: EventEnd}, n+1
	}
	return parts, n
}

// ToolCallPart is one part of a tool call in a delta (OpenAI's streamed
// tool_calls): Index says which call it belongs to; ID and Name come with
// a call's first part only; Arguments is appended to the call's arguments.
type ToolCallPart struct {
	Index     int
	ID, Name  string
	Arguments string
}

// TokenLogprob is the log probability of one generated token, with the
// most likely alternatives at its position when asked for (Ollama's
// api.Logprob; OpenAI's logprobs.content[]).
type TokenLogprob struct {
	Token   string
	Logprob float64
	// Bytes are the token's bytes, nil when the provider gave none.
	Bytes []byte
	// TopLogprobs are the alternatives, most likely first; nil for an
	// alternative itself.
	TopLogprobs []TokenLogprob
}
