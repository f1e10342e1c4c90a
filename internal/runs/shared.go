package runs

import (
	"context"
	"errors"
	"time"
)

// Runs shared between edges (a Shared store, PostgreSQL): the edge that
// executes a run publishes its event log to the store as it grows
// (publish), so that any edge can replay it from the start and follow it
// live (Follow), and takes cancel requests from other edges
// (CancelRemote) through the store's notifications.

// followBatch is how many log entries Follow reads at a time.
const followBatch = 256

// finalPolls is how many wake-ups (each within about a second, see
// Postgres) Follow waits, once a run's record is final, for the end of its
// log (written just after the record) before it stops following a log
// whose edge stopped before writing it.
const finalPolls = 3

// remoteCancelWait bounds how long CancelRemote waits for the run's edge
// to end it.
const remoteCancelWait = 30 * time.Second

// Shared reports whether the Manager's store is shared between edges.
func (m *Manager) Shared() bool { return m.shared != nil }

// publish writes r's event log to the shared store as it grows, one entry
// per batch Next returns, then its end; it marks the bytes written
// (Run.published) so Finish can wait for them before it saves the final
// record. It runs in its own goroutine (Manager.wg), from Start until the
// log is complete. A write that still fails after saveAttempts gives the
// log up (Run.publishFailed): the record is saved all the same.
func (m *Manager) publish(r *Run) {
	defer m.wg.Done()
	var seq int64
	write := func(p []byte, last bool) bool {
		seq++
		for attempt := 1; ; attempt++ {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			err := m.shared.AppendEvents(ctx, r.id(), seq, p, last)
			cancel()
			if err == nil {
				return true
			}
			if attempt == saveAttempts {
				m.log.Error("writing a run's events to the shared store failed; giving its log up", "run_id", r.id(), "attempts", attempt, "err", err)
				return false
			}
			m.log.Warn("writing a run's events to the shared store failed; trying again", "run_id", r.id(), "attempt", attempt, "err", err)
			m.sleep(time.Duration(attempt) * saveBackoff)
		}
	}
	for offset := 0; ; {
		p, done, _ := r.Next(context.Background(), offset)
		if len(p) > 0 {
			ok := write(p, false)
			offset += len(p)
			r.mu.Lock()
			r.published, r.publishFailed = offset, !ok
			r.wake()
			r.mu.Unlock()
			if !ok {
				return
			}
			continue
		}
		if done {
			write(nil, true)
			return
		}
	}
}

// id is the run's id (never changes).
func (r *Run) id() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.rec.ID
}

// awaitPublished waits until every event of r's log is in the shared
// store (or publishing gave up). r's log takes no more events (finishing).
func (r *Run) awaitPublished() {
	for {
		r.mu.Lock()
		ok := r.published >= len(r.events) || r.publishFailed
		ch := r.changed
		r.mu.Unlock()
		if ok {
			return
		}
		<-ch
	}
}

// Follow writes run id's shared event log from the start with write,
// then follows it live until its end, as a local reader of Next does. It
// reports whether it wrote anything: false (and nil) when the store is not
// shared, or the run's log is gone or never held anything and its record
// is final (the caller replays the record). Errors: ctx's, write's, the
// store's (ErrNotFound for a run no edge knows).
func (m *Manager) Follow(ctx context.Context, id string, write func([]byte) error) (bool, error) {
	if m.shared == nil {
		return false, nil
	}
	wake, stop := m.shared.Watch(id)
	defer stop()
	var after int64
	streamed, finalSeen := false, 0
	for {
		evs, err := m.shared.Events(ctx, id, after, followBatch)
		if err != nil {
			return streamed, err
		}
		for _, e := range evs {
			if e.Last {
				return streamed, nil
			}
			if err := write(e.Data); err != nil {
				return true, err
			}
			after, streamed = e.Seq, true
		}
		if len(evs) == followBatch {
			continue
		}
		if len(evs) == 0 {
			rec, err := m.store.Get(ctx, id)
			if err != nil {
				return streamed, err
			}
			if rec.State.Final() {
				// Every event is written before the final record, and the
				// log's end just after it.
				finalSeen++
				if !streamed {
					// A read after seeing it final gets every event: none
					// means the log is gone (expired) or was never kept.
					more, err := m.shared.Events(ctx, id, after, 1)
					if err != nil || len(more) == 0 {
						return false, err
					}
					continue
				}
				if finalSeen > finalPolls {
					return true, nil // its edge stopped before writing the end
				}
			}
		}
		select {
		case <-wake:
		case <-ctx.Done():
			return streamed, ctx.Err()
		}
	}
}

// CancelRemote asks the edge that holds run id (the shared store carries
// the request) to cancel it with reason, and waits until its record is
// final, ctx ends, or remoteCancelWait has passed (an edge that stopped
// ends its runs only when it starts again); it returns the record as it
// then is. Without a shared store, or for a run already final, it returns
// the record at once. Errors: ctx's, the store's.
func (m *Manager) CancelRemote(ctx context.Context, id, reason string) (Record, error) {
	rec, err := m.store.Get(ctx, id)
	if err != nil || m.shared == nil || rec.State.Final() {
		return rec, err
	}
	wake, stop := m.shared.Watch(id)
	defer stop()
	if _, err := m.shared.RequestCancel(ctx, id, reason); err != nil {
		return rec, err
	}
	wctx, cancel := context.WithTimeout(ctx, remoteCancelWait)
	defer cancel()
	for {
		rec, err := m.store.Get(ctx, id)
		if err != nil || rec.State.Final() {
			return rec, err
		}
		select {
		case <-wake:
		case <-wctx.Done():
			if errors.Is(ctx.Err(), context.Canceled) {
				return rec, ctx.Err()
			}
			return rec, nil
		}
	}
}

// cancelFromStore cancels the live run id for a request another edge left
// in the shared store (a no-op for a run this edge does not hold).
func (m *Manager) cancelFromStore(id, reason string) {
	if r := m.Live(id); r != nil {
		r.Cancel(reason)
	}
}

// dropSharedLog deletes run id's shared log once its retention is over.
func (m *Manager) dropSharedLog(id string) {
	defer m.wg.Done()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := m.shared.DeleteEvents(ctx, id); err != nil {
		m.log.Warn("dropping a run's expired events from the shared store failed", "run_id", id, "err", err)
	}
}
