package scheduler

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestLoadReportsOneResourceAndGroup(t *testing.T) {
	f := newFixture(t, Config{})
	f.activate("n1", 1, ResourceSpec{ProviderID: "p", Capacity: 1})
	f.world.set("m", cand("n1", 1, "p"))
	l := f.admitNow(f.req("m"))
	queued := 0
	r := f.req("m")
	r.OnQueued = func() { queued++ }
	p := f.admitAsync(context.Background(), r)
	ps, gq, ok := f.s.Load("n1", "p", "m")
	if !ok || ps.InFlight != 1 || ps.Capacity != 1 || ps.Queued != 1 || gq != 1 || ps.Status != StatusAvailable {
		t.Fatalf("Load = %+v, group queued %d, ok %v", ps, gq, ok)
	}
	if _, gq, ok := f.s.Load("n1", "zzz", "other"); ok || gq != 0 {
		t.Fatalf("unknown resource: ok %v, group queued %d", ok, gq)
	}
	l.Release("done")
	l2, err := p.wait()
	if err != nil {
		t.Fatal(err)
	}
	if queued != 1 {
		t.Fatalf("OnQueued called %d times, want 1", queued)
	}
	l2.Release("done")
	// An immediate admission never calls OnQueued.
	f.admitNow(r).Release("done")
	if queued != 1 {
		t.Fatalf("OnQueued called for an immediate admission")
	}
}

// SetPolicies replaces defaults and overrides: a group whose override is
// gone takes the new default, later admissions see the new limits, and a
// queued waiter keeps its deadline.
func TestSetPoliciesReplacesDefaultsAndOverrides(t *testing.T) {
	f := newFixture(t, Config{
		Default: Policy{MaxQueue: 1, QueueTimeout: 10 * time.Second},
		Groups:  map[string]Policy{"a": {MaxQueue: 5}},
	})
	f.activate("n1", 1, ResourceSpec{ProviderID: "p", Capacity: 1})
	f.world.set("a", cand("n1", 1, "p"))
	f.world.set("b", cand("n1", 1, "p"))
	l := f.admitNow(f.req("b"))
	p := f.admitAsync(context.Background(), f.req("b"))
	if _, err := f.s.Admit(context.Background(), f.req("b")); !errors.Is(err, ErrQueueFull) {
		t.Fatalf("b's queue of 1: %v", err)
	}
	if err := f.s.SetPolicies(Policy{MaxQueue: 2, QueueTimeout: time.Second}, map[string]Policy{"b": {QueueTimeout: time.Minute}}); err != nil {
		t.Fatal(err)
	}
	groups := map[string]Policy{}
	f.admitAsyncThen(t, "a", func() {
		for _, g := range f.s.Snapshot().Groups {
			groups[g.Name] = g.Policy
		}
	})
	if groups["a"] != (Policy{MaxQueue: 2, QueueTimeout: time.Second, Fairness: FairnessOff}) ||
		groups["b"] != (Policy{MaxQueue: 2, QueueTimeout: time.Minute, Fairness: FairnessOff}) {
		t.Fatalf("policies after SetPolicies: %+v", groups)
	}
	// The waiter queued under a 10s timeout keeps it (not b's new 1m).
	f.clk.Advance(5 * time.Second)
	if p.settled() {
		t.Fatal("the queued waiter's deadline changed")
	}
	f.clk.Advance(6 * time.Second)
	if _, err := p.wait(); !errors.Is(err, ErrQueueTimeout) {
		t.Fatalf("queued waiter after its 10s: %v", err)
	}
	if err := f.s.SetPolicies(Policy{MaxQueue: -1}, nil); !errors.Is(err, ErrInvalid) {
		t.Fatalf("negative default: %v", err)
	}
	if g := f.s.Snapshot().Groups[1]; g.Policy.MaxQueue != 2 {
		t.Fatalf("a refused SetPolicies changed %+v", g)
	}
	l.Release("done")
}

// admitAsyncThen queues one request of group, runs check while it waits,
// then cancels it.
func (f *fixture) admitAsyncThen(t *testing.T, group string, check func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	p := f.admitAsync(ctx, f.req(group))
	check()
	cancel()
	if _, err := p.wait(); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled waiter: %v", err)
	}
}
