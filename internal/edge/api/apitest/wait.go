package apitest

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"iop/internal/ledger"
)

// Eventually waits until cond holds, checking it every 5 ms; it fails
// the test, naming what, after 30 s.
func Eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(30 * time.Second)
	for !cond() {
		select {
		case <-tick.C:
		case <-deadline:
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// Ledger is a usage ledger that keeps every entry recorded (the frame's
// Config.Ledger); it aggregates nothing.
type Ledger struct {
	mu      sync.Mutex // guards entries
	entries []ledger.Entry
}

// Record keeps e.
func (l *Ledger) Record(e ledger.Entry) {
	l.mu.Lock()
	l.entries = append(l.entries, e)
	l.mu.Unlock()
}

// Aggregate fails: the tests' ledger only keeps entries.
func (l *Ledger) Aggregate(context.Context, ledger.Query) ([]ledger.Group, error) {
	return nil, errors.New("apitest.Ledger does not aggregate")
}

// All returns the entries kept, in order.
func (l *Ledger) All() []ledger.Entry {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.entries)
}
