package harness

import (
	"flag"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"iop/internal/ollamatest"
)

// slots limits how many of the suite's parallel tests run at once, as
// go test's -parallel does, and decides which waiting test runs next:
//
//   - A test with a real Ollama server (ParallelOllama) runs only while no
//     other does. Each Ollama server picks its model runners' ports by
//     binding port 0 and closing it before the runner binds it, so two
//     servers loading at once can pick the same port and talk to each
//     other's runner ("model already loaded", then a 5-minute wait for a
//     runner that never starts).
//   - A freed slot goes to a waiting Ollama test when no Ollama test runs
//     (their chain is the suite's longest), else to one of the longest
//     tests (ParallelLongest), else to a long one (ParallelLong), else
//     to any other, each kind in arrival order.
//     go test itself resumes its waiting parallel tests in no set order
//     (last declared first, as it happens), so the longest tests often
//     started last and ran on alone, one core idle, at the end of make
//     test.
//   - The limit grows by one each second in which the machine had half a
//     core or more idle, up to twice -parallel, and shrinks by one each
//     second in which it had less than a tenth of a core idle, down to
//     -parallel: many tests spend seconds waiting on timers, windows and
//     processes, and once make test's other packages had ended,
//     -parallel's tests alone left a core half idle.
//
// Main takes over -parallel: it keeps the value as the number of slots
// and lifts go test's own limit, so every parallel test waits here.
var slots slotQueue

// kind is what a parallel test declares about itself.
type kind int

const (
	other kind = iota
	long
	longest
	withOllama
)

// slotQueue is a counting semaphore of limit slots, with the waiting
// tests of each kind in arrival order and at most one withOllama test
// holding a slot.
type slotQueue struct {
	mu      sync.Mutex
	limit   int // 0: no limit (Main did not run)
	extra   int // slots above limit while cores are idle (adjust), at most limit
	busy    int
	ollama  string // the name of the test holding the Ollama turn, or ""
	waiting [withOllama + 1][]waiter
	// parallel holds the names of the tests that called Parallel,
	// ParallelLong or ParallelOllama.
	parallel map[string]bool
}

type waiter struct {
	name  string
	ready chan struct{}
}

// takeParallel moves go test's -parallel value to slots, sets go test's
// own limit above any number of tests, and has ollamatest.Start check
// that its test took the Ollama turn.
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
	ollamatest.BeforeStart = slots.checkOllama
	stop := make(chan struct{})
	watching.Go(func() { slots.watchIdle(time.Second, stop) })
	stopWatching = func() { close(stop); watching.Wait() }
}

// watching runs slots.watchIdle from takeParallel until stopWatching.
var (
	watching     sync.WaitGroup
	stopWatching = func() {}
)

// Parallel is t.Parallel for an end-to-end test: t runs beside the other
// parallel tests once one of the suite's slots (-parallel of them) is
// free, and holds it until its cleanups have run. A test whose body only
// starts parallel subtests calls t.Parallel instead (it would hold a slot
// its subtests need), and its subtests call Parallel.
func Parallel(t *testing.T) {
	t.Helper()
	parallel(t, other)
}

// ParallelLong is Parallel for one of the suite's longest tests (tens of
// seconds, mostly waiting on clocks and processes): it gets a freed slot
// before the tests that called Parallel, so it starts early and ends
// beside the others, not after them.
func ParallelLong(t *testing.T) {
	t.Helper()
	parallel(t, long)
}

// ParallelLongest is ParallelLong for a test of a minute or more that
// waits on windows of wall-clock time (quotas per minute): it gets a
// freed slot before the long tests, so it starts first of them.
func ParallelLongest(t *testing.T) {
	t.Helper()
	parallel(t, longest)
}

// ParallelOllama is Parallel for a test that starts a real Ollama server
// (package ollamatest), itself or in its subtests: it runs while no other
// such test runs, before the other waiting tests. ollamatest.Start fails
// a parallel test that did not call it.
func ParallelOllama(t *testing.T) {
	t.Helper()
	parallel(t, withOllama)
}

func parallel(t *testing.T, k kind) {
	t.Parallel()
	slots.acquire(t.Name(), k)
	t.Cleanup(func() { slots.release(t.Name()) })
}

// acquire takes a slot for the test name, waiting until one is free
// (and, for withOllama, the Ollama turn too).
func (q *slotQueue) acquire(name string, k kind) {
	q.mu.Lock()
	if q.parallel == nil {
		q.parallel = map[string]bool{}
	}
	q.parallel[name] = true
	if (q.limit == 0 || q.busy < q.limit+q.extra) && (k != withOllama || q.ollama == "") {
		q.busy++
		if k == withOllama {
			q.ollama = name
		}
		q.mu.Unlock()
		return
	}
	w := waiter{name, make(chan struct{})}
	q.waiting[k] = append(q.waiting[k], w)
	q.mu.Unlock()
	<-w.ready
}

// release gives back the slot (and the Ollama turn) of the test name,
// to the next waiting test (see wakeNext) while fewer than the current
// limit (see adjust) run.
func (q *slotQueue) release(name string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.ollama == name {
		q.ollama = ""
	}
	q.busy--
	q.fill()
}

// adjust moves the current limit by the machine's idle cores over the
// last interval: one slot more when at least spareCores were idle, one
// less when fewer than busyCores were, between limit and twice limit;
// then it starts waiting tests up to it.
func (q *slotQueue) adjust(idle float64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	switch {
	case idle >= spareCores && q.extra < q.limit:
		q.extra++
	case idle < busyCores && q.extra > 0:
		q.extra--
	}
	q.fill()
}

// The idle cores (of the machine, over adjust's last interval) at which
// adjust adds a slot, and under which it takes one back.
const (
	spareCores = 0.5
	busyCores  = 0.1
)

// fill starts waiting tests while fewer than the current limit run.
// q.mu is held.
func (q *slotQueue) fill() {
	for q.busy < q.limit+q.extra && q.wakeNext() {
		q.busy++
	}
}

// wakeNext hands a slot to the first waiting Ollama test if the turn is
// free, else to the first waiting longest test, else long, else any
// other, and reports whether there was one. q.mu is held.
func (q *slotQueue) wakeNext() bool {
	for k := withOllama; k >= other; k-- {
		ws := q.waiting[k]
		if len(ws) == 0 || k == withOllama && q.ollama != "" {
			continue
		}
		w := ws[0]
		q.waiting[k] = ws[1:]
		if k == withOllama {
			q.ollama = w.name
		}
		close(w.ready)
		return true
	}
	return false
}

// watchIdle calls q.adjust every interval with the machine's idle cores
// over it (from /proc/stat), until stop is closed; without /proc/stat
// it returns at once and the limit stays fixed.
func (q *slotQueue) watchIdle(interval time.Duration, stop <-chan struct{}) {
	last, ok := cpuTimes()
	if !ok {
		return
	}
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		now, ok := cpuTimes()
		if !ok {
			return
		}
		if total := now.total - last.total; total > 0 {
			q.adjust(float64(now.idle-last.idle) / float64(total) * float64(runtime.NumCPU()))
		}
		last = now
	}
}

// jiffies are the machine's CPU time since boot, all cores summed, in
// clock ticks: in total and idle (idle and iowait).
type jiffies struct{ total, idle uint64 }

// cpuTimes reads the first line of /proc/stat ("cpu user nice system
// idle iowait irq softirq steal ...", proc(5)).
func cpuTimes() (jiffies, bool) {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return jiffies{}, false
	}
	line, _, _ := strings.Cut(string(data), "\n")
	fields := strings.Fields(line)
	if len(fields) < 6 || fields[0] != "cpu" {
		return jiffies{}, false
	}
	var j jiffies
	// user nice system idle iowait irq softirq; steal (time another
	// machine had) and guest (counted in user already) are left out.
	for i, f := range fields[1:min(len(fields), 8)] {
		v, err := strconv.ParseUint(f, 10, 64)
		if err != nil {
			return jiffies{}, false
		}
		j.total += v
		if i == 3 || i == 4 {
			j.idle += v
		}
	}
	return j, true
}

// checkOllama fails t, about to start an Ollama server, when it or the
// test it belongs to is parallel without the Ollama turn. Serial tests
// run while no parallel test does.
func (q *slotQueue) checkOllama(t testing.TB) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for name := t.Name(); ; {
		if q.ollama != "" && name == q.ollama {
			return
		}
		if q.parallel[name] {
			t.Fatalf("%s starts an Ollama server beside other tests: call harness.ParallelOllama(t) instead of harness.Parallel", name)
			return
		}
		i := strings.LastIndexByte(name, '/')
		if i < 0 {
			return
		}
		name = name[:i]
	}
}
