package api

import (
	"context"
	"time"

	"iop/internal/wire/nodev1"
)

// Gateway is what the HTTP API needs of the edge service: dispatch one
// request to a provider, and list the model names clients may ask for.
// The edge's *edge.Service satisfies it through a small adapter that converts
// Request and DispatchInfo (their fields mirror edge.Request and
// edge.DispatchInfo one to one, so a Go conversion does it) and maps errors
// onto this package's sentinels (errors.go). A Gateway may also implement
// Admin (admin.go) to serve the /admin/v1 routes.
type Gateway interface {
	// Dispatch admits req through its model's queue and sends it to exactly
	// one provider. It blocks while the request is queued and returns when
	// the run is dispatched, the admission fails, or ctx ends (then with
	// ctx's error). A failed admission wraps one of ErrUnknownModel,
	// ErrNoProvider, ErrCandidatesRejected, ErrQueueFull, ErrQueueTimeout,
	// ErrProviderUnavailable, ErrDispatchTimeout, ErrDispatchRefused,
	// ErrStaleGeneration or ErrNodeGone; any other error is answered 500.
	Dispatch(ctx context.Context, req Request) (Run, error)
	// Models lists the model names (aliases and served names) clients may
	// request, in the order to show them.
	Models() []string
}

// Run is one dispatched request, from dispatch to release.
type Run interface {
	// Info describes where the run was dispatched. It does not change.
	Info() DispatchInfo
	// Recv blocks for the next message from the node: RunEvents on the
	// normalized path; TunnelHead, TunnelData, TunnelEnd or TunnelError on
	// the tunnel path. When it returns a terminal message (a complete,
	// error or cancelled event; TunnelEnd; TunnelError) or an error, the
	// run has ended: its lease is already released. After a terminal
	// message it returns io.EOF. Cancel makes a blocked Recv return
	// promptly (io.EOF or an error). Any other error means the run failed
	// upstream: the node disconnected (wrap ErrNodeGone for a clearer
	// message) or its run stream broke; it is answered 502 without the
	// error's text.
	Recv() (*nodev1.RunUp, error)
	// Cancel ends the run if it has not ended: cancels it on the node and
	// releases its lease. The reason is for logs only. It is idempotent and
	// safe to call from another goroutine while Recv blocks.
	Cancel(reason string)
	// Close ends the run as Cancel does if it has not ended, and reports
	// the outcome of the request it served (one of the Outcome* values, as
	// its RequestRecord says), for the edge's record of the run's end. The
	// request goroutine calls it exactly once, when the answer is finished.
	Close(outcome string)
}

// Request is one client request as the edge service dispatches it. Its fields
// mirror edge.Request in name, type and order.
type Request struct {
	// Model is the model name the client asked for (an alias or a served name).
	Model string
	// Operation is the kind of request; the chat route sends OPERATION_CHAT.
	Operation nodev1.Operation
	// Stream is the request's "stream" flag.
	Stream bool
	// Body is the client's JSON body, byte for byte; the node rewrites its
	// model to the served target.
	Body []byte
	// OllamaFields is the JSON object of Ollama request fields OpenAI's API
	// has no name for (translate.OllamaFields), for Ollama providers; nil
	// when there are none. Body never carries them.
	OllamaFields []byte
	// Needs are the capabilities every candidate provider must have:
	// "tools" (the request defines tools), "vision" (a message carries an
	// image), "embeddings", and needs only tunnel-path providers meet:
	// "choices" (n above 1), "tool_choice", "remote_images",
	// "prompt_batch" (several completions prompts) and "token_input"
	// (token ids as a prompt or input).
	Needs []string
	// Long marks a long-context request, admitted against long_capacity.
	Long bool
	// EstimatedInputTokens is a rough size of the prompt, in tokens: the
	// characters of its messages, tool calls and tool definitions / 4,
	// rounded up.
	EstimatedInputTokens int
	// Headers are selected client headers a provider may need (canonical
	// names, e.g. "Accept"); never the client's credentials.
	Headers map[string]string // RunID, when set, is the run's id (else a new "run_<hex>" one); a
	// second admission after a failed dispatch uses RunID + "-retry".
	RunID string
	// PreferNodeID and PreferProviderID name a provider to choose over the
	// least loaded one when it is a candidate with a free slot (session
	// affinity); empty means no preference.
	PreferNodeID, PreferProviderID string
}

// DispatchInfo describes where a run went. Its fields mirror
// edge.DispatchInfo in name, type and order.
type DispatchInfo struct {
	RunID, NodeID, ProviderID, ProviderType, ServedModel string
	// Generation is the node connection the run was sent on.
	Generation uint64
	// Path says how the answer comes back: tunnel or normalized.
	Path nodev1.ExecutionPath
	// QueueReason says why the request waited, empty if it did not.
	QueueReason string
	// QueueWait is how long the request waited for a slot.
	QueueWait time.Duration
}
