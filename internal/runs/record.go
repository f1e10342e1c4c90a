package runs

import (
	"errors"
	"time"
)

// State is where a run is in its life.
type State string

// The states of a run. Complete, Error and Cancelled are final.
const (
	StateQueued    State = "queued"    // submitted, waiting for a provider slot
	StateRunning   State = "running"   // dispatched to a provider
	StateComplete  State = "complete"  // the provider finished the answer
	StateError     State = "error"     // it failed; Record.Error says why
	StateCancelled State = "cancelled" // cancelled by DELETE or by its submitter leaving
)

// Final reports whether s is a final state.
func (s State) Final() bool {
	return s == StateComplete || s == StateError || s == StateCancelled
}

// ErrNotFound is returned for a run id no store or log knows.
var ErrNotFound = errors.New("run not found")

// Record is what is known of one run. Times are zero until they happen.
type Record struct {
	ID         string
	State      State
	Model      string // the model the run asked for
	SessionID  string
	Background bool
	Metadata   map[string]string
	// KeyName is the name of the API key that submitted the run, "" on an
	// open API; only that key may read or cancel the run.
	KeyName string

	CreatedAt    time.Time // submitted
	StartedAt    time.Time // dispatched to a provider
	FirstTokenAt time.Time // first output reached the edge
	FinishedAt   time.Time // reached a final state

	// Where it ran: set when dispatched.
	NodeID, ProviderID, ServedModel string
	// Path is the execution path: "tunnel" or "normalized".
	Path string
	// QueueReason is "immediate" or "queued"; QueueWait the time queued.
	QueueReason string
	QueueWait   time.Duration

	PromptTokens, CompletionTokens int
	// Output is the answer's text, complete once the run is, up to
	// MaxOutputBytes; OutputTruncated says the run produced more (or more
	// events than MaxEventBytes), which was not kept.
	Output          string
	OutputTruncated bool
	FinishReason    string
	// Error says why a run ended error or cancelled.
	Error string
	// Status is the HTTP status the run's answer had (200 when the provider
	// answered); 0 until known.
	Status int
	// Outcome is how the run's request ended, once it did: the HTTP API's
	// request outcome ("completed", "client_gone" for a run cancelled
	// before its answer was finished, "upstream_error", "refused", ...),
	// the same its log line, metrics, usage ledger entry and RunEnded
	// event say. "" until the run ends; OutcomeEdgeStopped for a run an
	// edge process left unfinished (marked when the next one opens the
	// store).
	Outcome string
}

// Filter selects runs for Store.List. Empty fields match every run.
type Filter struct {
	State     State
	Model     string
	SessionID string
	// KeyName, when set, selects the runs of that API key.
	KeyName string
	// After, when set, is the id of the last run of the previous page:
	// List returns the runs created before it.
	After string
	// Limit caps the page; List treats values outside 1..MaxLimit as
	// DefaultLimit.
	Limit int
}

// Paging limits of Store.List.
const (
	DefaultLimit = 20
	MaxLimit     = 100
)

func (f Filter) limit() int {
	if f.Limit < 1 || f.Limit > MaxLimit {
		return DefaultLimit
	}
	return f.Limit
}

// OutcomeEdgeStopped is the Outcome of a run an edge process stopped before
// it ended, the outcome of the same name of the edge's contract
// (contract.OutcomeEdgeStopped), so no such run is left with no outcome.
const OutcomeEdgeStopped = "edge_stopped"
