package testenv

import (
	"fmt"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// fatalRecorder is a testing.TB whose Fatalf records its message and ends
// the goroutine, as testing.T's does.
type fatalRecorder struct {
	testing.TB
	msg string
}

func (r *fatalRecorder) Helper() {}

func (r *fatalRecorder) Fatalf(format string, args ...any) {
	r.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// run calls f with r on a goroutine of its own (Fatalf ends it) and waits.
func (r *fatalRecorder) run(f func(testing.TB)) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		f(r)
	}()
	<-done
}

func TestEventuallyReturnsOnceTheConditionHolds(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	r := &fatalRecorder{TB: t}
	r.run(func(tb testing.TB) {
		Eventually(tb, "the third call", func() bool { return calls.Add(1) == 3 })
	})
	if r.msg != "" || calls.Load() != 3 {
		t.Fatalf("failed %q after %d calls, want no failure after 3", r.msg, calls.Load())
	}
}

func TestEventuallyWithinFailsNamingWhatItWaitedFor(t *testing.T) {
	t.Parallel()
	r := &fatalRecorder{TB: t}
	r.run(func(tb testing.TB) {
		EventuallyWithin(tb, 20*time.Millisecond, "the moon turns blue", func() bool { return false })
	})
	if want := "timed out after 20ms waiting until the moon turns blue"; r.msg != want {
		t.Fatalf("failure %q, want %q", r.msg, want)
	}
}

func TestEventuallyStopsAtTheConditionsFatal(t *testing.T) {
	t.Parallel()
	r := &fatalRecorder{TB: t}
	r.run(func(tb testing.TB) {
		Eventually(tb, "never", func() bool {
			tb.Fatalf("the process ended")
			return false
		})
	})
	if !strings.Contains(r.msg, "the process ended") {
		t.Fatalf("failure %q, want the condition's own", r.msg)
	}
}
