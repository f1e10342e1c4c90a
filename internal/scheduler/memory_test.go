package scheduler

import (
	"context"
	"runtime"
	"testing"
	"time"
)

// targetWaiterBytes is the bound on the scheduler's own memory per queued
// request (BENCHMARKS.md, memory per queued request): ≤ 1 KB in its waiter.
const targetWaiterBytes = 1000

// queuedWaiterBytes queues n requests on a full provider of a scheduler
// with the real clock (the edge's: each waiter has a runtime timer) and
// returns the growth of the live heap per waiter: everything the scheduler
// allocates and keeps for one (the waiter, its result channel, queue timer
// and its callback, candidate choices, heap place and the heap's slot). Not
// counted: the caller's resolver (one shared here; the edge's closes over
// its request) and the blocked caller's goroutine (Admit's, here none:
// enqueue is called directly). It abandons them all before it returns.
func queuedWaiterBytes(tb testing.TB, n int) float64 {
	tb.Helper()
	var base runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&base)
	s, err := New(Config{Default: Policy{MaxQueue: n, QueueTimeout: time.Hour}})
	if err != nil {
		tb.Fatal(err)
	}
	if err := s.Activate("node-1", 1, []ResourceSpec{{ProviderID: "prov-1", Capacity: 1}}, nil); err != nil {
		tb.Fatal(err)
	}
	w := newWorld()
	w.set("model-a", cand("node-1", 1, "prov-1"))
	req := Request{Group: "model-a", Resolve: w.resolver("model-a")}
	held, err := s.Admit(context.Background(), req)
	if err != nil {
		tb.Fatal(err)
	}
	// The group exists (the first enqueue creates it) and the slice that
	// keeps the waiters is allocated before the first reading.
	queue := make([]*waiter, 0, n)
	_, q, err := s.enqueue(req)
	if err != nil || q == nil {
		tb.Fatalf("enqueue: %v, %v", q, err)
	}
	queue = append(queue, q)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for range n - 1 {
		_, q, err := s.enqueue(req)
		if err != nil || q == nil {
			tb.Fatalf("enqueue: %v, %v", q, err)
		}
		queue = append(queue, q)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	per := float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / float64(n-1)
	for _, q := range queue {
		if err := s.abandon(q, context.Canceled); err != context.Canceled {
			tb.Fatalf("abandon: %v", err)
		}
	}
	held.Release("done")
	if got := s.Snapshot(); got.Waiters != 0 {
		tb.Fatalf("%d waiters left after abandoning them all", got.Waiters)
	}
	settle(base.HeapAlloc)
	return per
}

// settle waits, up to 10 s, until the live heap is back near heapAlloc (512
// KiB over it: a P's timer heap keeps the capacity it grew to, 16 bytes a
// timer), so that a following measurement starts clean: a stopped runtime
// timer stays in its P's timer heap, keeping its callback and so its waiter
// alive, until that P next cleans the heap.
func settle(heapAlloc uint64) {
	var m runtime.MemStats
	tick := time.NewTicker(time.Millisecond) // no event says the timer heaps are clean: poll, bounded
	defer tick.Stop()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); <-tick.C {
		runtime.GC()
		runtime.ReadMemStats(&m)
		if m.HeapAlloc < heapAlloc+512<<10 {
			return
		}
	}
}

// TestQueuedWaiterMemory holds the scheduler to its bound of 1 KB
// of its own per queued request, at 10,000 queued.
func TestQueuedWaiterMemory(t *testing.T) {
	if per := queuedWaiterBytes(t, 10000); per > targetWaiterBytes {
		t.Errorf("a queued waiter keeps %.0f bytes of live heap, want ≤ %d", per, targetWaiterBytes)
	} else {
		t.Logf("%.0f bytes per queued waiter", per)
	}
}

// BenchmarkQueuedWaiterMemory reports the scheduler's live heap per queued
// request at 10,000 queued (B/waiter, the figure make bench checks against
// 1 KB); ns/op is the time to queue the 10,000 and measure.
func BenchmarkQueuedWaiterMemory(b *testing.B) {
	var per float64
	for b.Loop() {
		per = queuedWaiterBytes(b, 10000)
	}
	b.ReportMetric(per, "B/waiter")
}
