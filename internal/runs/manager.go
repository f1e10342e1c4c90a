package runs

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"time"

	"iop/internal/clock"
)

// Limits on what one run keeps, in bytes: its output text and its event
// log. They bound the edge's memory per run (a run's log stays in memory
// for Config.Retention after it ends).
const (
	MaxOutputBytes = 4 << 20
	MaxEventBytes  = 16 << 20
)

// DefaultRetention is how long a finished run's event log stays in memory
// for late readers when Config.Retention is 0.
const DefaultRetention = time.Hour

// maxSessions bounds the session affinity table; past it, an arbitrary
// entry is forgotten for each new one (an affinity is only a preference).
const maxSessions = 100_000

// Config configures a Manager.
type Config struct {
	// Store persists records of this edge alone (SQLite). Exactly one of
	// Store and Shared is set.
	Store Store
	// Shared persists records and event logs that several edges share
	// (Postgres): runs are then read, streamed and cancelled through any
	// of them (shared.go). Exactly one of Store and Shared is set.
	Shared Shared
	// Retention is how long a finished run's event log is kept in memory
	// (its record stays in the Store); 0 means DefaultRetention.
	Retention time.Duration
	// Logger may be nil.
	Logger *slog.Logger
	// Now stamps records; nil means Clock.Now.
	Now func() time.Time
	// Clock schedules the expiry of finished runs' event logs (Retention)
	// and the backoff between a failed save and the next attempt; nil
	// means clock.Real().
	Clock clock.Clock
}

// Manager holds the live runs and their event logs, and writes records
// through to the Store. Its methods are safe for concurrent use.
type Manager struct {
	store     Store
	shared    Shared // store, when several edges share it (shared.go); else nil
	retention time.Duration
	log       *slog.Logger
	now       func() time.Time
	clock     clock.Clock

	mu       sync.Mutex
	live     map[string]*Run      // submitted and not yet expired
	sessions map[string][2]string // session id -> {node id, provider id} of its latest run
	closed   bool
	wg       sync.WaitGroup         // running executions
	timers   map[string]clock.Timer // retention timers of finished runs
}

// NewManager returns a Manager over cfg.Store. It ends the records left
// unfinished by a previous edge process as error "edge restarted"
// (Store.Interrupt). Errors: neither or both of cfg.Store and cfg.Shared
// are set, or the store fails.
func NewManager(ctx context.Context, cfg Config) (*Manager, error) {
	store := cfg.Store
	switch {
	case cfg.Store == nil && cfg.Shared == nil:
		return nil, errors.New("runs: nil store")
	case cfg.Store != nil && cfg.Shared != nil:
		return nil, errors.New("runs: both a store and a shared store")
	case cfg.Shared != nil:
		store = cfg.Shared
	}
	m := &Manager{
		store:     store,
		retention: cfg.Retention,
		log:       cfg.Logger,
		now:       cfg.Now,
		clock:     cfg.Clock,
		live:      make(map[string]*Run),
		sessions:  make(map[string][2]string),
		timers:    make(map[string]clock.Timer),
	}
	if m.clock == nil {
		m.clock = clock.Real()
	}
	if m.retention <= 0 {
		m.retention = DefaultRetention
	}
	if m.log == nil {
		m.log = slog.New(slog.DiscardHandler)
	}
	if m.now == nil {
		m.now = m.clock.Now
	}
	if sh := cfg.Shared; sh != nil {
		m.shared = sh
		sh.OnCancel(m.cancelFromStore)
		// Logs this edge's previous process left past their retention.
		if err := sh.DeleteEventsFinishedBefore(ctx, m.now().Add(-m.retention)); err != nil {
			m.log.Warn("dropping expired run events from the shared store failed", "err", err)
		}
	}
	n, err := m.store.Interrupt(ctx, "edge restarted", m.now())
	if err != nil {
		return nil, err
	}
	if n > 0 {
		m.log.Warn("runs left in flight by the previous edge process marked error", "runs", n, "reason", "edge restarted")
	}
	return m, nil
}

// ErrClosed is returned by Start after Close.
var ErrClosed = errors.New("runs: manager closed")

// ErrStopping is the cancellation cause of the runs still live when the
// manager closes: they end error with this text, not cancelled.
var ErrStopping = errors.New("the edge stopped while the run was in flight")

// Start saves rec as a new queued run, registers it and runs exec(ctx, run)
// in its own goroutine, where ctx is parent's values without its
// cancellation (so a background run outlives its submitter) and is
// cancelled by Run.Cancel. exec reports progress through run's methods and
// must end it with Finish; if it returns without, the run ends error.
// Errors: ErrClosed, or the Store's.
func (m *Manager) Start(parent context.Context, rec Record, exec func(ctx context.Context, run *Run)) (*Run, error) {
	rec.State = StateQueued
	rec.CreatedAt = m.now()
	if err := m.store.Save(parent, rec); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancelCause(context.WithoutCancel(parent))
	r := &Run{m: m, rec: rec, cancel: cancel, changed: make(chan struct{})}
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		cancel(ErrClosed)
		return nil, ErrClosed
	}
	m.live[rec.ID] = r
	m.wg.Add(1)
	if m.shared != nil {
		m.wg.Add(1)
		go m.publish(r)
	}
	m.mu.Unlock()
	go func() {
		defer m.wg.Done()
		defer cancel(nil)
		exec(ctx, r)
		r.Finish(Outcome{State: StateError, Error: "the run ended without an outcome"})
	}()
	return r, nil
}

// Live returns the run with id while its event log is kept, else nil.
func (m *Manager) Live(id string) *Run {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.live[id]
}

// Get returns the record of run id: the live one if kept, else the
// stored one. Errors: wrapping ErrNotFound, or the Store's.
func (m *Manager) Get(ctx context.Context, id string) (Record, error) {
	if r := m.Live(id); r != nil {
		return r.Record(), nil
	}
	return m.store.Get(ctx, id)
}

// List returns records from the Store (see Store.List).
func (m *Manager) List(ctx context.Context, f Filter) ([]Record, bool, error) {
	return m.store.List(ctx, f)
}

// Affinity returns the node and provider of the session's latest
// dispatched run, or empty strings.
func (m *Manager) Affinity(sessionID string) (nodeID, providerID string) {
	if sessionID == "" {
		return "", ""
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	p := m.sessions[sessionID]
	return p[0], p[1]
}

func (m *Manager) remember(sessionID, nodeID, providerID string) {
	if sessionID == "" {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.sessions[sessionID]; !ok && len(m.sessions) >= maxSessions {
		for k := range m.sessions {
			delete(m.sessions, k)
			break
		}
	}
	m.sessions[sessionID] = [2]string{nodeID, providerID}
}

// Drain refuses new runs (Start then fails with ErrClosed) and waits until
// every run's execution has ended, or ctx is done (then it returns ctx's
// error and the runs go on until Close). A stopping edge drains its
// background runs within its drain timeout, as it does its requests (a new
// user saw a background run cut at once by a stop whose drain timeout had
// 23 s left).
func (m *Manager) Drain(ctx context.Context) error {
	m.mu.Lock()
	m.closed = true // no wg.Add after this (Start checks it under mu)
	m.mu.Unlock()
	done := make(chan struct{})
	go func() {
		m.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Close cancels every live run (cause ErrStopping), waits for their executions to end (their
// final records saved), drops the event logs and closes the Store.
func (m *Manager) Close() error {
	m.mu.Lock()
	m.closed = true
	live := make([]*Run, 0, len(m.live))
	for _, r := range m.live {
		live = append(live, r)
	}
	for _, t := range m.timers {
		t.Stop()
	}
	m.mu.Unlock()
	for _, r := range live {
		r.cancel(ErrStopping)
	}
	m.wg.Wait()
	m.mu.Lock()
	m.live = map[string]*Run{}
	m.mu.Unlock()
	return m.store.Close()
}

// expireLater drops a finished run's event log after the retention
// period (a Clock timer).
func (m *Manager) expireLater(r *Run) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return
	}
	id := r.rec.ID
	m.timers[id] = m.clock.AfterFunc(m.retention, func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		if m.live[id] == r {
			delete(m.live, id)
		}
		delete(m.timers, id)
		if m.shared != nil && !m.closed {
			m.wg.Add(1)
			go m.dropSharedLog(id)
		}
	})
}

// Run is a live run: its record and its event log. Its methods are safe
// for concurrent use.
type Run struct {
	m      *Manager
	cancel context.CancelCauseFunc

	mu        sync.Mutex
	rec       Record          // its Output is kept in output until Finish
	output    strings.Builder // the output so far, at most MaxOutputBytes
	events    []byte          // the SSE events so far, whole events only, at most MaxEventBytes
	logCut    bool            // the log reached MaxEventBytes
	done      bool            // the log is complete and the final record saved
	finishing bool            // Finish has begun: no more appends
	// published is how many bytes of events are in the shared store
	// (publish); publishFailed says publish gave up. Shared stores only.
	published     int
	publishFailed bool
	changed       chan struct{} // closed and replaced when events or done change
	attached      any           // Attach's value
}

// Attach keeps v with the run for as long as the run is Live (while it
// runs, then for its event log's retention): a caller's own record of the
// run, such as the Responses API event stream of a background response.
func (r *Run) Attach(v any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.attached = v
}

// Attached returns the value given to Attach, nil for none.
func (r *Run) Attached() any {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.attached
}

// Record returns a copy of the run's record.
func (r *Run) Record() Record {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.record()
}

// record is the record with its output so far. r.mu is held.
func (r *Run) record() Record {
	rec := r.rec
	if !r.done {
		rec.Output = r.output.String()
	}
	return rec
}

// Dispatched records where the run went and moves it to running. The
// session (if any) remembers the provider. It saves the record.
func (r *Run) Dispatched(d Record) {
	r.mu.Lock()
	if r.rec.State != StateQueued {
		r.mu.Unlock()
		return
	}
	r.rec.State = StateRunning
	r.rec.StartedAt = r.m.now()
	r.rec.NodeID, r.rec.ProviderID, r.rec.ServedModel, r.rec.Path = d.NodeID, d.ProviderID, d.ServedModel, d.Path
	r.rec.QueueReason, r.rec.QueueWait = d.QueueReason, d.QueueWait
	rec := r.record()
	r.mu.Unlock()
	r.m.remember(rec.SessionID, rec.NodeID, rec.ProviderID)
	r.save(rec)
}

// Append adds whole SSE events to the log and wakes its readers. text is
// the output they carry, added to Record.Output; the first non-empty text
// stamps FirstTokenAt. A run's output is kept up to MaxOutputBytes and its
// log up to MaxEventBytes: past either, the rest is dropped (the run goes
// on; its record says OutputTruncated, and the log ends with one last
// event saying so).
func (r *Run) Append(events []byte, text string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.finishing {
		return
	}
	if text != "" {
		if r.rec.FirstTokenAt.IsZero() {
			r.rec.FirstTokenAt = r.m.now()
		}
		if room := MaxOutputBytes - r.output.Len(); room >= len(text) {
			r.output.WriteString(text)
		} else {
			r.rec.OutputTruncated = true
		}
	}
	if len(r.events)+len(events) > MaxEventBytes {
		if !r.logCut {
			r.logCut, r.rec.OutputTruncated = true, true
			r.events = append(r.events, truncatedEvent...)
			r.wake()
		}
		return
	}
	r.events = append(r.events, events...)
	r.wake()
}

// truncatedEvent ends a log cut at MaxEventBytes.
var truncatedEvent = []byte(`data: {"error":{"message":"the run's events exceed the edge's limit; the rest is not kept","type":"server_error","param":null,"code":"events_truncated"}}` + "\n\n")

// wake tells the log's readers something changed. r.mu is held.
func (r *Run) wake() {
	close(r.changed)
	r.changed = make(chan struct{})
}

// Outcome is how a run ended. Outcome is its request's outcome
// (Record.Outcome).
type Outcome struct {
	State                          State
	Error, FinishReason            string
	Status                         int
	PromptTokens, CompletionTokens int
	Outcome                        string
}

// Finish ends the run with o unless it has ended: it saves the final
// record, then completes the log (so whoever sees the run end finds the
// record stored) and schedules the log's expiry. It reports whether this
// call ended the run.
func (r *Run) Finish(o Outcome) bool {
	r.mu.Lock()
	if r.finishing {
		r.mu.Unlock()
		return false
	}
	r.finishing = true
	rec := r.record()
	r.mu.Unlock()
	if r.m.shared != nil {
		// Every event is in the shared store before the final record is:
		// an edge that reads the record final then finds them all.
		r.awaitPublished()
	}

	rec.State = o.State
	rec.Error, rec.FinishReason, rec.Status = o.Error, o.FinishReason, o.Status
	rec.PromptTokens, rec.CompletionTokens = o.PromptTokens, o.CompletionTokens
	rec.Outcome = o.Outcome
	rec.FinishedAt = r.m.now()
	r.save(rec)

	r.mu.Lock()
	r.rec = rec
	r.done = true
	r.output = strings.Builder{}
	close(r.changed)
	r.mu.Unlock()
	r.m.expireLater(r)
	r.m.log.Info("run ended", "run_id", rec.ID, "model", rec.Model, "state", rec.State, "node_id", rec.NodeID,
		"provider_id", rec.ProviderID, "status", rec.Status, "outcome", rec.Outcome, "prompt_tokens", rec.PromptTokens,
		"completion_tokens", rec.CompletionTokens, "error", rec.Error)
	return true
}

// Cancel cancels the run's execution with reason (no-op once it ended).
func (r *Run) Cancel(reason string) {
	r.cancel(errors.New(reason))
}

// Done reports whether the run has ended.
func (r *Run) Done() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.done
}

// Wait blocks until the run ends or ctx does, and returns its record.
func (r *Run) Wait(ctx context.Context) (Record, error) {
	for {
		r.mu.Lock()
		done, rec, ch := r.done, r.record(), r.changed
		r.mu.Unlock()
		if done {
			return rec, nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return rec, ctx.Err()
		}
	}
}

// Next returns the log's bytes from offset on, waiting while there are none
// and the run has not ended. done is true when the returned bytes reach
// the end of a complete log. Errors: ctx's, when it ends first.
func (r *Run) Next(ctx context.Context, offset int) (p []byte, done bool, err error) {
	for {
		r.mu.Lock()
		if offset < len(r.events) {
			p = r.events[offset:len(r.events):len(r.events)]
		}
		done, ch := r.done, r.changed
		r.mu.Unlock()
		if len(p) > 0 || done {
			return p, done, nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, false, ctx.Err()
		}
	}
}

// saveAttempts and saveBackoff bound how hard save tries: a database
// briefly locked by another program (SQLITE_BUSY after its 5 s busy
// timeout) gets a few more chances before the record is given up.
const (
	saveAttempts = 4
	saveBackoff  = 500 * time.Millisecond
)

func (r *Run) save(rec Record) {
	// The record must reach the store even when the run was cancelled.
	for attempt := 1; ; attempt++ {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := r.m.store.Save(ctx, rec)
		cancel()
		if err == nil {
			return
		}
		if attempt == saveAttempts {
			r.m.log.Error("saving a run record failed; giving up", "run_id", rec.ID, "state", rec.State, "attempts", attempt, "err", err)
			return
		}
		r.m.log.Warn("saving a run record failed; trying again", "run_id", rec.ID, "state", rec.State, "attempt", attempt, "err", err)
		r.m.sleep(time.Duration(attempt) * saveBackoff)
	}
}

// sleep returns after d on the Manager's Clock.
func (m *Manager) sleep(d time.Duration) {
	done := make(chan struct{})
	m.clock.AfterFunc(d, func() { close(done) })
	<-done
}
