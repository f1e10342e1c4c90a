package apitest

import (
	"sync"
	"testing"
	"time"
)

// Records is an observer that keeps every record it is handed: as
// Records[observe.RequestRecord], the frame's Config.Observer.
type Records[T any] struct {
	mu   sync.Mutex // guards recs
	recs []T
}

// RequestDone keeps rec.
func (r *Records[T]) RequestDone(rec T) {
	r.mu.Lock()
	r.recs = append(r.recs, rec)
	r.mu.Unlock()
}

// All returns the records kept, in order.
func (r *Records[T]) All() []T {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]T(nil), r.recs...)
}

// Only returns the one record kept, failing the test unless there is
// exactly one.
func (r *Records[T]) Only(t testing.TB) T {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.recs) != 1 {
		t.Fatalf("%d records, want 1: %+v", len(r.recs), r.recs)
	}
	return r.recs[0]
}

// Ticking is a clock that moves one second each time it is read, from
// Unix second 1700000000.
func Ticking() func() time.Time {
	var mu sync.Mutex
	now := time.Unix(1700000000, 0)
	return func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		now = now.Add(time.Second)
		return now
	}
}
