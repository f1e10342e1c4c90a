package ledger

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"sync"
	"time"
)

// Entry is one finished API request as the ledger keeps it: a run, or a
// request refused or failed before it was dispatched.
type Entry struct {
	// Time is when the request reached the API.
	Time time.Time
	// RequestID names the request, as its log line does ("req_...").
	RequestID string
	// Key is the caller's key name; "" when the API is open.
	Key string
	// Model is the model name the client asked for (an alias or a served
	// name).
	Model string
	// RunID, NodeID, ProviderID and ServedModel say where the run went;
	// empty for a refused dispatch.
	RunID, NodeID, ProviderID, ServedModel string
	// PromptTokens and CompletionTokens are what the provider reported, 0
	// when it reported nothing (a tunnel-path stream without
	// stream_options.include_usage reports no usage).
	PromptTokens, CompletionTokens int64
	// Duration is from Time to the end of the answer.
	Duration time.Duration
	// SlotTime is how long the request held its provider slot: from its
	// dispatch to the end of the answer; 0 when it was not dispatched.
	SlotTime time.Duration
	// CostWeight is the provider's cost weight, what one second of its
	// slot counts as in GPU-time; 0 when not known, which counts as 1.
	CostWeight float64
	// Outcome is the request's outcome, the same its log line, metrics
	// and lifecycle events say: "completed", "client_gone",
	// "upstream_error", "write_failed", "refused" (by admission or by the
	// key's limits), "invalid_request" or "error".
	Outcome string
	// ErrorCode is the API's error code of a request that failed
	// ("queue_full", "model_not_found", "concurrency_limit_exceeded",
	// ...); "" for one that did not.
	ErrorCode string
	// Batch marks a line of a batch (run by the edge's batch runner at
	// the batch priority), not a client's own request.
	Batch bool
}

// GPUTime is e's slot time weighted by its cost weight (1 when not
// known), rounded to the nanosecond.
func (e Entry) GPUTime() time.Duration {
	if e.CostWeight <= 0 {
		return e.SlotTime
	}
	return time.Duration(math.Round(float64(e.SlotTime) * e.CostWeight))
}

// OutcomeCompleted is the outcome of a request whose whole answer was
// written; Group.Completed counts those.
const OutcomeCompleted = "completed"

// GroupBy values of a Query.
const (
	GroupNone     = ""
	GroupKey      = "key"
	GroupModel    = "model"
	GroupProvider = "provider" // node_id/provider_id
	GroupNode     = "node"
	GroupDay      = "day"   // the date of Entry.Time in Query.Location (UTC by default), YYYY-MM-DD
	GroupTeam     = "team"  // Query.TeamOf of the entry's key; "" for a key in no team
	GroupBatch    = "batch" // "batch" for Entry.Batch, else "interactive"
)

// Values of Query.Batch.
const (
	BatchAll         = ""            // every entry
	BatchOnly        = "batch"       // the entries of Entry.Batch
	BatchInteractive = "interactive" // the others
)

// Query selects and groups entries. Zero fields select everything.
type Query struct {
	Key, Model string
	// Team selects the entries of the keys TeamOf puts in that team.
	Team string
	// TeamOf names the team of a key ("" for none) when the query runs:
	// a team's usage is that of the keys in it now, so a key that moves
	// takes its history along. nil: no key is in a team.
	TeamOf func(key string) string
	// From (inclusive) and To (exclusive) bound Entry.Time.
	From, To time.Time
	// GroupBy is one of the Group constants.
	GroupBy string
	// Batch selects batch lines or interactive requests (the Batch
	// constants); an unknown value is ErrInvalidQuery.
	Batch string
	// Location is the time zone whose dates GroupDay names; nil is UTC.
	// Exact for every zone whose offsets are whole quarter hours (every
	// zone since 1972).
	Location *time.Location
}

// Group is the sum of the entries of one group value.
type Group struct {
	// Group is the group's value: a key name, model, "node/provider",
	// node id or date; "" for GroupNone.
	Group string
	// Requests counts the entries, Completed those whose outcome is
	// "completed".
	Requests, Completed int64
	// PromptTokens and CompletionTokens are sums, in tokens.
	PromptTokens, CompletionTokens int64
	// Duration is the sum of the entries' durations.
	Duration time.Duration
	// GPUTime is the sum of the entries' slot times, each weighted by its
	// provider's cost weight (1 when not known).
	GPUTime time.Duration
}

// Store persists entries: SQLite (OpenSQLite) or PostgreSQL (OpenPostgres).
type Store interface {
	// Insert adds entries in one transaction.
	Insert(ctx context.Context, entries []Entry) error
	// Aggregate sums the entries q selects, one Group per value of
	// q.GroupBy, ordered by that value. An unknown GroupBy is
	// ErrInvalidQuery.
	Aggregate(ctx context.Context, q Query) ([]Group, error)
	Close() error
}

// ErrInvalidQuery: a Query with an unknown GroupBy.
var ErrInvalidQuery = errors.New("invalid usage query")

// bufferEntries is how many entries wait for the writer before Record
// blocks; batchEntries is the most one transaction inserts. The buffer is
// allocated whole at New (an entry and its acknowledgement take about
// 216 bytes: 221 KB): four batches absorb a store stalled for 200 ms at
// 5,000 requests a second.
const (
	bufferEntries = 1024
	batchEntries  = 256
)

// defaultLinger is how long the writer waits, after the first entry of a
// batch, for more to join it before it writes the batch (sooner when the
// batch is full, a Flush asks or the ledger closes). Each transaction has a
// fixed cost (begin, prepare, commit: a WAL write for SQLite, a round trip
// for PostgreSQL); without the wait a busy edge wrote a transaction for
// every one or two entries, which was 16% of its CPU at 1,900 requests/s
// (BENCHMARKS.md). An entry reaches the store at most this much later.
const defaultLinger = 20 * time.Millisecond

// Ledger records entries into a Store on a writer goroutine of its own,
// in batches, so a finishing request never waits for the database unless
// thousands of entries are already waiting. Create it with New; Close it to
// flush.
type Ledger struct {
	store Store
	log   *slog.Logger
	in    chan item
	done  chan struct{}
	// linger is defaultLinger; the benchmark compares it with none.
	linger time.Duration

	mu     sync.RWMutex // guards closed; held for reading while sending on in
	closed bool
}

// item is an entry for the writer, or (ack set) a flush request.
type item struct {
	entry Entry
	ack   chan struct{}
}

// New starts a ledger writing into store. A nil logger discards; failed
// inserts are logged at error with the entries' count.
func New(store Store, logger *slog.Logger) *Ledger {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	l := &Ledger{store: store, log: logger.With("component", "ledger"), in: make(chan item, bufferEntries), done: make(chan struct{}), linger: defaultLinger}
	go l.write()
	return l
}

// Record queues e for the store. It blocks only while the buffer is full;
// after Close it drops e (logged at warn).
func (l *Ledger) Record(e Entry) {
	if !l.send(item{entry: e}) {
		l.log.Warn("usage entry after the ledger closed, dropped", "key", e.Key, "model", e.Model, "run_id", e.RunID)
	}
}

// Flush returns once every entry recorded before the call is in the store
// (or its insert failed and was logged).
func (l *Ledger) Flush() {
	ack := make(chan struct{})
	if l.send(item{ack: ack}) {
		<-ack
	}
}

func (l *Ledger) send(it item) bool {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.closed {
		return false
	}
	l.in <- it
	return true
}

// Aggregate is Store.Aggregate on every entry recorded before the call
// (it flushes first; after Close, on the entries written).
func (l *Ledger) Aggregate(ctx context.Context, q Query) ([]Group, error) {
	l.Flush()
	return l.store.Aggregate(ctx, q)
}

// Close writes the entries still buffered, stops the writer and closes the
// store. Later calls return nil.
func (l *Ledger) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	close(l.in)
	l.mu.Unlock()
	<-l.done
	return l.store.Close()
}

// write is the writer goroutine: it inserts the entries that arrive
// within linger of a batch's first one, up to batchEntries at a time, and
// answers flushes after the entries before them are written (a flush
// writes its batch at once).
func (l *Ledger) write() {
	defer close(l.done)
	batch := make([]Entry, 0, batchEntries)
	var acks []chan struct{}
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for it := range l.in {
		batch, acks = batch[:0], acks[:0]
		add := func(it item) {
			if it.ack != nil {
				acks = append(acks, it.ack)
			} else {
				batch = append(batch, it.entry)
			}
		}
		add(it)
		if len(acks) == 0 && l.linger > 0 {
			timer.Reset(l.linger)
		wait:
			for len(batch) < batchEntries && len(acks) == 0 {
				select {
				case it, ok := <-l.in:
					if !ok {
						break wait
					}
					add(it)
				case <-timer.C:
					break wait
				}
			}
			timer.Stop()
		}
	more:
		for len(batch) < batchEntries {
			select {
			case it, ok := <-l.in:
				if !ok {
					break more
				}
				add(it)
			default:
				break more
			}
		}
		if len(batch) > 0 {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			if err := l.store.Insert(ctx, batch); err != nil {
				l.log.Error("writing usage entries failed", "entries", len(batch), "err", err)
			}
			cancel()
		}
		for _, ack := range acks {
			close(ack)
		}
	}
}
