package harness

import (
	"flag"
	"strconv"
	"sync"
	"testing"
)

// slots limits how many of the suite's parallel tests run at once, as
// go test's -parallel does, but hands a freed slot to a waiting long test
// (ParallelLong) before any other. go test itself resumes its waiting
// parallel tests in no set order (last declared first, as it happens), so
// the suite's longest tests often started last and ran on alone, one
// core idle, for the last minute of make test.
//
// Main takes over -parallel: it keeps the value as the number of slots
// and lifts go test's own limit, so every parallel test waits here.
var slots slotQueue

// slotQueue is a counting semaphore of limit slots whose waiters are
// served long ones first, each kind in arrival order.
type slotQueue struct {
	mu    sync.Mutex
	limit int // 0: no limit (Main did not run)
	busy  int
	long  []chan struct{} // waiting long tests, in arrival order
	other []chan struct{} // waiting other tests, in arrival order
}

// takeParallel moves go test's -parallel value to slots and sets go
// test's own limit above any number of tests.
func takeParallel() {
	f := flag.Lookup("test.parallel")
	if f == nil {
		return
	}
	n, err := strconv.Atoi(f.Value.String())
	if err != nil || n < 1 {
		return
	}
	slots.limit = n
	_ = f.Value.Set(strconv.Itoa(1 << 20))
}

// Parallel is t.Parallel for an end-to-end test: t runs beside the other
// parallel tests once one of the suite's slots (-parallel of them) is
// free, and holds it until its cleanups have run. A test whose body only
// starts parallel subtests calls t.Parallel instead (it would hold a slot
// its subtests need), and its subtests call Parallel.
func Parallel(t *testing.T) {
	t.Helper()
	parallel(t, false)
}

// ParallelLong is Parallel for one of the suite's longest tests (tens of
// seconds, mostly waiting on clocks and processes): it gets a freed slot
// before any test that called Parallel, so it starts early and ends
// beside the others, not after them.
func ParallelLong(t *testing.T) {
	t.Helper()
	parallel(t, true)
}

func parallel(t *testing.T, long bool) {
	t.Parallel()
	slots.acquire(long)
	t.Cleanup(slots.release)
}

// acquire takes a slot, waiting for one if all are busy.
func (q *slotQueue) acquire(long bool) {
	q.mu.Lock()
	if q.limit == 0 || q.busy < q.limit {
		q.busy++
		q.mu.Unlock()
		return
	}
	ready := make(chan struct{})
	if long {
		q.long = append(q.long, ready)
	} else {
		q.other = append(q.other, ready)
	}
	q.mu.Unlock()
	<-ready
}

// release hands the slot to the first waiting long test, else to the
// first other one, else frees it.
func (q *slotQueue) release() {
	q.mu.Lock()
	defer q.mu.Unlock()
	var next chan struct{}
	switch {
	case len(q.long) > 0:
		next, q.long = q.long[0], q.long[1:]
	case len(q.other) > 0:
		next, q.other = q.other[0], q.other[1:]
	default:
		q.busy--
		return
	}
	close(next)
}
