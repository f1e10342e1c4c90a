// Package lifecycle is the edge's lifecycle event stream: node connections
// and fences, and each run's way from queue to end. The edge service
// publishes events to an Observer; a Hub fans them out to subscribers (the
// admin API's GET /admin/v1/events, metrics) without ever blocking the
// publisher.
//
// # Concurrency
//
// A Hub is safe for concurrent use. Hub.mu guards the set of subscriptions;
// Publish holds it while it offers the event to each subscription's buffer
// with a non-blocking send, so events reach every subscriber in publish
// order. A subscription whose buffer is full is dropped there and then: its
// channel is closed and Dropped reports true. The subscriber (an SSE client)
// then reconnects and reads the current state again, instead of going on
// with a view that silently missed events. Close of a subscription and of
// the Hub close each channel exactly once, under Hub.mu.
package lifecycle

import "time"

// Type names an event. The values are the "type" field of the JSON form.
type Type string

const (
	// NodeConnected: a node connection was accepted (NodeID, Generation,
	// Label, Providers).
	NodeConnected Type = "node_connected"
	// NodeFenced: a node connection ended and its generation was fenced
	// (NodeID, Generation, Reason).
	NodeFenced Type = "node_fenced"
	// NodeDraining: a node said it drains (it is shutting down): its
	// providers take no new requests while its runs in flight finish
	// (NodeID, Generation, Label, Providers).
	NodeDraining Type = "node_draining"
	// RunQueued: a request found every candidate busy and waits in its
	// model's queue (Model; Load.ModelQueued counts it). No run id yet.
	RunQueued Type = "run_queued"
	// RunAdmitted: a request got a slot and is being sent to its node
	// (RunID, Model, NodeID, Generation, ProviderID, ServedModel,
	// QueueReason, QueueWait, Load).
	RunAdmitted Type = "run_admitted"
	// RunStarted: the node opened the run's stream (RunID, Model, NodeID,
	// ProviderID, Load).
	RunStarted Type = "run_started"
	// RunEnded: the run ended, its slot was released and the request it
	// served was answered (RunID, Model, NodeID, ProviderID, Reason: why the
	// run ended, Outcome: how its request ended, the same outcome the
	// request's log line, metrics and usage ledger entry say; empty for an
	// attempt the edge dropped to admit the request again; Load). It is
	// published when the request's handler closes the run, just after the
	// answer's last byte was written (the slot was free before it).
	RunEnded Type = "run_ended"
	// DispatchRetried: a dispatch failed before its node started the run
	// and the request is admitted once more (Model, NodeID, ProviderID of
	// the failed candidate, Reason).
	DispatchRetried Type = "dispatch_retried"
	// RequestRefused: the HTTP API refused a request: an admission failure
	// or one of its key's limits (RequestID, Model, Reason: the admission
	// outcome such as "queue_full", or for a key's limit the error code
	// "concurrency_limit_exceeded", "rate_limit_exceeded" or
	// "model_not_allowed", Outcome "refused", Status: the HTTP status).
	RequestRefused Type = "request_refused"
)

// Event is one lifecycle event. Fields that do not apply to its Type are
// zero and left out of the JSON form.
type Event struct {
	Type Type      `json:"type"`
	Time time.Time `json:"time"`

	NodeID     string   `json:"node_id,omitempty"`
	Generation uint64   `json:"generation,omitempty"`
	Label      string   `json:"label,omitempty"`
	Providers  []string `json:"providers,omitempty"`

	RunID       string `json:"run_id,omitempty"`
	Model       string `json:"model,omitempty"` // the requested model name (its queue)
	ProviderID  string `json:"provider_id,omitempty"`
	ServedModel string `json:"served_model,omitempty"`
	// QueueReason is "immediate" or "queued" (RunAdmitted).
	QueueReason string `json:"queue_reason,omitempty"`
	// QueueWait is the time spent queued, in nanoseconds in Go and in
	// seconds (queue_wait_seconds) in JSON.
	QueueWait time.Duration `json:"-"`
	// QueueWaitSeconds is QueueWait in seconds, for the JSON form; set by
	// the Hub.
	QueueWaitSeconds float64 `json:"queue_wait_seconds,omitempty"`
	// PrefixPromptTokens and PrefixPredictedTokens (RunAdmitted, routing
	// prefix only): the prompt's full blocks in tokens, and the tokens of
	// them the edge expected the chosen provider to hold in its cache.
	PrefixPromptTokens    int `json:"prefix_prompt_tokens,omitempty"`
	PrefixPredictedTokens int `json:"prefix_predicted_tokens,omitempty"`
	// Reason says why a run ended, a node was fenced, a dispatch retried
	// or a request refused.
	Reason string `json:"reason,omitempty"`
	// Outcome is how the request ended (RunEnded, RequestRefused): one of
	// the HTTP API's request outcomes, as its log line says.
	Outcome string `json:"outcome,omitempty"`
	// RequestID names the HTTP API request (RequestRefused), as its log
	// line and usage ledger entry do.
	RequestID string `json:"request_id,omitempty"`
	// Status is the HTTP status of a refused request.
	Status int `json:"status,omitempty"`
	// Load is the provider's and the model queue's counters right after
	// the event (run events only).
	Load *Load `json:"load,omitempty"`
}

// Load is a provider's scheduler counters and its model's queue length.
type Load struct {
	InFlight int `json:"in_flight"`
	Capacity int `json:"capacity"`
	// Queued counts the waiters that list the provider.
	Queued int `json:"queued"`
	// ModelQueued counts the waiters of the event's model.
	ModelQueued int `json:"model_queued"`
}

// Observer is told of events as they happen. Observe is called on the
// goroutine where the event happened, with no edge lock held, and must not
// block.
type Observer interface {
	Observe(Event)
}

// Observers calls every Observer in turn.
type Observers []Observer

// Observe passes e to each observer.
func (os Observers) Observe(e Event) {
	for _, o := range os {
		o.Observe(e)
	}
}

// ObserverFunc makes a function an Observer.
type ObserverFunc func(Event)

// Observe calls f(e).
func (f ObserverFunc) Observe(e Event) { f(e) }
