package runs

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"iop/internal/clock"
)

// flakyStore is a Store in memory whose next failures Saves fail.
type flakyStore struct {
	mu       sync.Mutex
	recs     map[string]Record
	failures int // Saves still to fail
	saves    int // Save calls
}

func newFlakyStore() *flakyStore { return &flakyStore{recs: make(map[string]Record)} }

func (s *flakyStore) Save(_ context.Context, rec Record) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.saves++
	if s.failures > 0 {
		s.failures--
		return errors.New("database is locked")
	}
	s.recs[rec.ID] = rec
	return nil
}

func (s *flakyStore) Get(_ context.Context, id string) (Record, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	rec, ok := s.recs[id]
	if !ok {
		return Record{}, ErrNotFound
	}
	return rec, nil
}

func (s *flakyStore) List(context.Context, Filter) ([]Record, bool, error) { return nil, false, nil }
func (s *flakyStore) Interrupt(context.Context, string, time.Time) (int, error) {
	return 0, nil
}
func (s *flakyStore) Close() error { return nil }

// state returns the Save calls so far and the stored record of id.
func (s *flakyStore) state(id string) (int, Record) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.saves, s.recs[id]
}

// TestFinishedRunExpiresAfterRetention: a finished run's event log stays
// live for exactly Config.Retention on the Manager's Clock, then only its
// stored record is left; nothing expires while time stands still. (The
// expiry is scheduled just after the run is seen done: synctest.Wait lets
// the execution return first.)
func TestFinishedRunExpiresAfterRetention(t *testing.T) {
	synctest.Test(t, testFinishedRunExpiresAfterRetention)
}

func testFinishedRunExpiresAfterRetention(t *testing.T) {
	ctx := context.Background()
	clk := clock.NewFake(time.Unix(1_700_000_000, 0))
	store := newFlakyStore()
	const retention = 10 * time.Minute
	m, err := NewManager(ctx, Config{Store: store, Retention: retention, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	r, err := m.Start(ctx, Record{ID: "run_1", Model: "m"}, func(_ context.Context, r *Run) {
		r.Finish(Outcome{State: StateComplete, FinishReason: "stop"})
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	synctest.Wait()
	if rec := r.Record(); !rec.CreatedAt.Equal(clk.Now()) || !rec.FinishedAt.Equal(clk.Now()) {
		t.Errorf("record stamped %v .. %v, want the Clock's %v", rec.CreatedAt, rec.FinishedAt, clk.Now())
	}
	clk.Advance(retention - time.Nanosecond)
	if m.Live("run_1") != r {
		t.Fatal("the run's log expired before its retention")
	}
	clk.Advance(time.Nanosecond)
	if m.Live("run_1") != nil {
		t.Fatal("the run's log is kept past its retention")
	}
	if rec, err := m.Get(ctx, "run_1"); err != nil || rec.State != StateComplete {
		t.Fatalf("stored record %+v, %v", rec, err)
	}
	if n := clk.Pending(); n != 0 {
		t.Errorf("%d timers pending after the expiry", n)
	}
}

// TestCloseStopsRetentionTimers: Close leaves no expiry pending on the
// Clock.
func TestCloseStopsRetentionTimers(t *testing.T) { synctest.Test(t, testCloseStopsRetentionTimers) }

func testCloseStopsRetentionTimers(t *testing.T) {
	ctx := context.Background()
	clk := clock.NewFake(time.Unix(1_700_000_000, 0))
	m, err := NewManager(ctx, Config{Store: newFlakyStore(), Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	r, err := m.Start(ctx, Record{ID: "run_1", Model: "m"}, func(_ context.Context, r *Run) {
		r.Finish(Outcome{State: StateComplete})
	})
	if err != nil {
		t.Fatal(err)
	}
	r.Wait(ctx)
	synctest.Wait()
	if clk.Pending() != 1 {
		t.Fatalf("%d timers pending, want the run's expiry", clk.Pending())
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if clk.Pending() != 0 {
		t.Fatalf("%d timers pending after Close", clk.Pending())
	}
}

// TestSaveRetriesAfterBackoffOnTheClock: a record the Store fails to save
// is tried again after 1×, then 2× saveBackoff of the Manager's Clock, and
// not a moment sooner (testing/synctest tells when the saving goroutine is
// blocked waiting for its timer); the run ends once a save succeeds.
func TestSaveRetriesAfterBackoffOnTheClock(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		clk := clock.NewFake(time.Unix(1_700_000_000, 0))
		store := newFlakyStore()
		m, err := NewManager(ctx, Config{Store: store, Clock: clk})
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		finish := make(chan struct{})
		r, err := m.Start(ctx, Record{ID: "run_1", Model: "m"}, func(_ context.Context, r *Run) {
			<-finish
			r.Finish(Outcome{State: StateComplete})
		})
		if err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		saves, _ := store.state("run_1") // the queued record's
		store.mu.Lock()
		store.failures = 2
		store.mu.Unlock()
		close(finish)
		for _, wait := range []time.Duration{saveBackoff, 2 * saveBackoff} {
			synctest.Wait() // the execution waits out its backoff
			saves++
			if got, _ := store.state("run_1"); got != saves {
				t.Fatalf("%d saves, want %d", got, saves)
			}
			if r.Done() {
				t.Fatal("the run ended before its record was saved")
			}
			clk.Advance(wait - time.Nanosecond)
			synctest.Wait()
			if got, _ := store.state("run_1"); got != saves {
				t.Fatalf("%d saves %v before the backoff of %v ended, want %d", got, wait-time.Nanosecond, wait, saves)
			}
			clk.Advance(time.Nanosecond)
		}
		if _, err := r.Wait(ctx); err != nil {
			t.Fatal(err)
		}
		if got, rec := store.state("run_1"); got != saves+1 || rec.State != StateComplete {
			t.Fatalf("%d saves, stored %+v; want %d, complete", got, rec, saves+1)
		}
	})
}
