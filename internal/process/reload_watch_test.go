package process

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/fsnotify/fsnotify"

	"iop/internal/clock"
)

// testWatch is a configWatch on a fake clock, fed by the test.
type testWatch struct {
	clk     *clock.Fake
	hup     chan os.Signal
	events  chan fsnotify.Event
	errs    chan error
	reloads chan string // each reload's trigger
}

// event hands the loop a file event and returns once it was handled: the
// loop takes one message at a time, so the watch error sent after it is
// received only when the event's timer is set.
func (tw *testWatch) event(name string, op fsnotify.Op) {
	tw.events <- fsnotify.Event{Name: name, Op: op}
	tw.errs <- errors.New("handled")
}

// newTestWatch runs a configWatch on a fake clock with channels the test
// feeds.
func newTestWatch(t *testing.T) *testWatch {
	t.Helper()
	tw := &testWatch{clk: clock.NewFake(time.Unix(0, 0)), hup: make(chan os.Signal), events: make(chan fsnotify.Event),
		errs: make(chan error), reloads: make(chan string, 8)}
	w := &configWatch{clock: tw.clk, hup: tw.hup, events: tw.events, errs: tw.errs, name: "edge.yaml", path: "edge.yaml",
		reload: func(trigger string) { tw.reloads <- trigger }, logger: slog.New(slog.DiscardHandler)}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); w.run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return tw
}

// An edit of the config file followed at once by a SIGHUP (the usual
// "edit, then kill -HUP") made two reloads, the second a second after
// the first, reading the same file again: the SIGHUP's read now takes in
// the settling change.
func TestRegression_EditThenSIGHUPIsOneReload(t *testing.T) {
	tw := newTestWatch(t)
	clk, reloads := tw.clk, tw.reloads
	tw.event("/etc/iop/edge.yaml", fsnotify.Write)
	tw.hup <- syscall.SIGHUP
	if got := <-reloads; got != "SIGHUP" {
		t.Fatalf("first reload %q, want SIGHUP", got)
	}
	if n := clk.Pending(); n != 0 {
		t.Fatalf("%d settle timers still pending after the SIGHUP's reload", n)
	}
	clk.Advance(2 * reloadSettle)
	// The watch goes on: a later edit is read once it settles.
	tw.event("/etc/iop/edge.yaml", fsnotify.Write)
	clk.Advance(reloadSettle)
	if got := <-reloads; got != "file changed" {
		t.Fatalf("second reload %q, want file changed", got)
	}
	select {
	case got := <-reloads:
		t.Fatalf("a third reload %q", got)
	default:
	}
}

// Events of one save, closer together than reloadSettle, are one reload,
// read after the last; other files in the directory are ignored.
func TestConfigWatchSettlesASave(t *testing.T) {
	tw := newTestWatch(t)
	clk, reloads := tw.clk, tw.reloads
	for _, op := range []fsnotify.Op{fsnotify.Create, fsnotify.Write, fsnotify.Rename} {
		tw.event("/etc/iop/edge.yaml", op)
		clk.Advance(reloadSettle / 2)
	}
	tw.event("/etc/iop/other.yaml", fsnotify.Write)
	if n := clk.Pending(); n != 1 {
		t.Fatalf("%d settle timers pending, want 1", n)
	}
	clk.Advance(reloadSettle / 2)
	if got := <-reloads; got != "file changed" {
		t.Fatalf("reload %q", got)
	}
	if n := clk.Pending(); n != 0 {
		t.Fatalf("%d settle timers pending after the reload", n)
	}
}
