package managed

import (
	"context"
	"errors"
	"os"
	"sync"
	"testing"

	"iop/internal/testenv"
)

// lingering is simServer behind a shell that stays 500 ms after SIGTERM,
// as a model server that frees its GPU memory does: the window in which
// the server it replaces is stopping.
func lingering() Server {
	s := simServer()
	s.Cmd = append([]string{"sh", "-c", `trap 'sleep 0.5; exit 0' TERM; "$@" & wait; wait`, "sh", os.Args[0]}, s.Cmd[1:]...)
	return s
}

// TestRegression_SwapRoomGoesToTheModelThatMadeIt: at max_loaded_models
// 1, a run for b stops a's idle server to make room; a run of a that
// arrives while a stops (a batch line dispatched to a) must not take
// that room first: a started again, to
// be stopped again for b, costs two model loads and b's run waits for
// both. Seen on a managed provider with a batch on a kept model and
// interactive requests for another: a restarted twice between swaps.
func TestRegression_SwapRoomGoesToTheModelThatMadeIt(t *testing.T) {
	t.Parallel()
	m, logs := newManager(t, Config{Servers: map[string]Server{"a": lingering(), "b": lingering()}, MaxLoaded: 1})
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	for i := range 6 {
		if err := m.Load(ctx, "a"); err != nil {
			t.Fatal(err)
		}
		before := len(logs.find("stopping a model server to make room"))
		var wg sync.WaitGroup
		wg.Go(func() { run(t, m, "b") })
		testenv.EventuallyWithin(t, deadline, "a's stop for b", func() bool { return len(logs.find("stopping a model server to make room")) > before })
		wg.Go(func() { run(t, m, "a") })
		wg.Wait()
		// Since a's stop for b, the first start is b's.
		var order []string
		for _, r := range logs.find("model server started") {
			order = append(order, r["model"])
		}
		if n := len(order); n < 2 || order[n-2] != "b" || order[n-1] != "a" {
			t.Fatalf("round %d: starts %v; want b's start, then a's, after a's stop for b", i, order)
		}
	}
}

// TestRegression_PreloadNeverStopsAnotherServer: at max_loaded_models 1,
// a preload (the edge's keep_loaded keeper, an admin load) of a while b's
// server runs, or starts for a run, fails with ErrNoRoom and leaves b's
// server alone. The keeper's load of a kept model stopped the server a
// client's request had just started, after every such request: two
// model loads each.
func TestRegression_PreloadNeverStopsAnotherServer(t *testing.T) {
	t.Parallel()
	m, logs := newManager(t, Config{Servers: map[string]Server{"a": simServer(), "b": simServer()}, MaxLoaded: 1})
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	if err := m.Load(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	if err := m.Load(ctx, "a"); !errors.Is(err, ErrNoRoom) {
		t.Fatalf("preload of a beside b's server: %v, want ErrNoRoom", err)
	}
	if err := m.Load(ctx, "b"); err != nil {
		t.Fatalf("preload of the model already loaded: %v", err)
	}
	run(t, m, "b")
	if got := logs.find("stopping a model server to make room"); len(got) != 0 {
		t.Fatalf("a preload stopped a server: %v", got)
	}
	if l := m.Loaded(); len(l) != 1 || l[0].Model != "b" {
		t.Fatalf("loaded %v, want b alone", l)
	}
}
