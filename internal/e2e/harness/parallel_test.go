package harness

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"iop/internal/testenv"
)

// TestSlotQueueOrder: with its one slot taken, a queue hands each freed
// slot to the waiting Ollama tests first, then the longest, then the
// long ones, then the others, each kind in arrival order, and never to
// two tests at once.
func TestSlotQueueOrder(t *testing.T) {
	Parallel(t)
	q := &slotQueue{limit: 1}
	q.acquire("first", other)
	arrive := []arrival{{"other-1", other}, {"long-1", long}, {"ollama-1", withOllama}, {"longest-1", longest}, {"other-2", other}, {"long-2", long}, {"ollama-2", withOllama}, {"longest-2", longest}}
	order := run(t, q, arrive, func() { q.release("first") })
	if want := []string{"ollama-1", "ollama-2", "longest-1", "longest-2", "long-1", "long-2", "other-1", "other-2"}; !slices.Equal(order, want) {
		t.Fatalf("served %v, want %v", order, want)
	}
}

// TestSlotQueueRunsOneOllamaTestAtATime: with slots to spare, a second
// Ollama test waits for the first to end while the other tests run.
func TestSlotQueueRunsOneOllamaTestAtATime(t *testing.T) {
	Parallel(t)
	q := &slotQueue{limit: 4}
	q.acquire("ollama-0", withOllama)
	arrive := []arrival{{"ollama-1", withOllama}, {"ollama-2", withOllama}}
	var order []string
	done := make(chan struct{})
	go func() {
		defer close(done)
		order = run(t, q, arrive, func() {
			q.acquire("other", other) // a free slot: not behind the Ollama tests
			q.release("other")
			q.release("ollama-0")
		})
	}()
	<-done
	if want := []string{"ollama-1", "ollama-2"}; !slices.Equal(order, want) {
		t.Fatalf("served %v, want %v", order, want)
	}
}

// arrival is a test that comes to wait for a slot.
type arrival struct {
	name string
	kind kind
}

// run lets each of arrive wait on q in turn, then calls start, and
// returns the order in which they got their slot; each holds it alone
// among them (q.ollama checked for the Ollama ones) and releases it.
func run(t *testing.T, q *slotQueue, arrive []arrival, start func()) []string {
	var (
		mu     sync.Mutex
		order  []string
		inside int
		wg     sync.WaitGroup
	)
	for i, a := range arrive {
		wg.Go(func() {
			q.acquire(a.name, a.kind)
			mu.Lock()
			inside++
			if inside > 1 {
				t.Errorf("%s got a slot while %d others held one", a.name, inside-1)
			}
			q.mu.Lock()
			if a.kind == withOllama && q.ollama != a.name {
				t.Errorf("%s runs without the Ollama turn (held by %q)", a.name, q.ollama)
			}
			q.mu.Unlock()
			order = append(order, a.name)
			inside--
			mu.Unlock()
			q.release(a.name)
		})
		testenv.Eventually(t, fmt.Sprintf("%d waiting", i+1), func() bool {
			q.mu.Lock()
			defer q.mu.Unlock()
			n := 0
			for _, ws := range q.waiting {
				n += len(ws)
			}
			return n == i+1
		})
	}
	start()
	wg.Wait()
	if q.busy != 0 || q.ollama != "" {
		t.Errorf("after: %d slots busy, Ollama turn %q", q.busy, q.ollama)
	}
	return order
}

// TestOllamaStartNeedsTheOllamaTurn: ollamatest.Start (through
// BeforeStart) fails a parallel test, or its subtest, that did not call
// ParallelOllama.
func TestOllamaStartNeedsTheOllamaTurn(t *testing.T) {
	Parallel(t)
	q := &slotQueue{limit: 2}
	q.acquire("TestA", other)
	q.acquire("TestB", withOllama)
	for _, c := range []struct {
		name  string
		fails bool
	}{{"TestA", true}, {"TestA/sub", true}, {"TestB", false}, {"TestB/sub/sub", false}, {"TestSerial", false}} {
		r := &fatalRecorder{TB: t, name: c.name}
		q.checkOllama(r)
		if (r.fatal != "") != c.fails {
			t.Errorf("%s: failed %q, want a failure: %v", c.name, r.fatal, c.fails)
		}
	}
}

// fatalRecorder is a test named name whose Fatalf only records.
type fatalRecorder struct {
	testing.TB
	name, fatal string
}

func (r *fatalRecorder) Name() string { return r.name }
func (r *fatalRecorder) Fatalf(format string, args ...any) {
	r.fatal = fmt.Sprintf(format, args...)
}

// TestSlotQueueLimitFollowsIdleCores: the limit grows by one for each
// interval with half a core or more idle, up to twice -parallel, and
// shrinks by one for each with less than a tenth idle, down to
// -parallel; waiting tests start while fewer than it run.
func TestSlotQueueLimitFollowsIdleCores(t *testing.T) {
	Parallel(t)
	q := &slotQueue{limit: 2}
	q.acquire("a", other)
	q.acquire("b", other)
	for _, name := range []string{"c", "d", "e", "f"} {
		go q.acquire(name, other)
		testenv.Eventually(t, name+" waiting", func() bool { return slices.Contains(q.waitingNames(), name) })
	}
	steps := []struct {
		do      func()
		busy    int
		waiting []string
	}{
		{func() { q.adjust(spareCores - 0.1) }, 2, []string{"c", "d", "e", "f"}}, // neither idle nor busy
		{func() { q.adjust(1) }, 3, []string{"d", "e", "f"}},
		{func() { q.adjust(spareCores) }, 4, []string{"e", "f"}},
		{func() { q.adjust(2) }, 4, []string{"e", "f"}}, // at twice the limit
		{func() { q.release("c") }, 4, []string{"f"}},
		{func() { q.adjust(busyCores - 0.01) }, 4, []string{"f"}}, // limit 3
		{func() { q.release("d") }, 3, []string{"f"}},
		{func() { q.adjust(0) }, 3, []string{"f"}}, // limit 2
		{func() { q.adjust(0) }, 3, []string{"f"}}, // not below -parallel
		{func() { q.release("e") }, 2, []string{"f"}},
		{func() { q.release("a") }, 2, nil},
		{func() { q.release("b"); q.release("f") }, 0, nil},
	}
	for i, s := range steps {
		s.do()
		if busy, waiting := q.busyCount(), q.waitingNames(); busy != s.busy || !slices.Equal(waiting, s.waiting) {
			t.Fatalf("step %d: %d running, %v waiting; want %d, %v", i, busy, waiting, s.busy, s.waiting)
		}
	}
}

// busyCount is the number of tests holding a slot.
func (q *slotQueue) busyCount() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.busy
}

// waitingNames are the waiting tests of kind other, in arrival order.
func (q *slotQueue) waitingNames() []string {
	q.mu.Lock()
	defer q.mu.Unlock()
	var names []string
	for _, w := range q.waiting[other] {
		names = append(names, w.name)
	}
	return names
}

// TestCPUTimesReadsTheMachine: /proc/stat's first line gives a total
// that grows and an idle part of it; on a system without it, watchIdle
// returns at once (the limit stays -parallel).
func TestCPUTimesReadsTheMachine(t *testing.T) {
	Parallel(t)
	a, ok := cpuTimes()
	if !ok {
		q := &slotQueue{limit: 1}
		q.watchIdle(time.Hour, make(chan struct{})) // blocks for good if it watches
		return
	}
	testenv.Eventually(t, "the CPU times to grow", func() bool {
		b, _ := cpuTimes()
		return b.total > a.total
	})
	if b, _ := cpuTimes(); b.idle > b.total || b.idle < a.idle {
		t.Fatalf("idle %d of total %d, before %d of %d", b.idle, b.total, a.idle, a.total)
	}
}
