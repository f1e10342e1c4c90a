package scheduler

import (
	"context"
	"testing"
)

// TestKeepOnFenceSurvivesTheFence: a lease kept on fence (another edge's
// run) stays counted when this scheduler's connection to the node is
// fenced, and still holds its slot when the node reconnects: the
// reconnected provider of capacity 1 admits nothing until it is released.
func TestKeepOnFenceSurvivesTheFence(t *testing.T) {
	f := newFixture(t, Config{})
	f.activate("n1", 1, ResourceSpec{ProviderID: "p1", Capacity: 1})
	f.world.set("m", cand("n1", 1, "p1"))
	kept := f.admitNow(f.req("m"))
	kept.KeepOnFence()
	f.s.Fence("n1", 1)
	if ok, _ := kept.Released(); ok {
		t.Fatal("a lease kept on fence was released by the fence")
	}
	f.activate("n1", 2, ResourceSpec{ProviderID: "p1", Capacity: 1})
	f.world.set("m", cand("n1", 2, "p1"))
	if p := f.provider("n1", "p1"); p.InFlight != 1 {
		t.Fatalf("in-flight after reconnect = %d, want 1", p.InFlight)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	p := f.admitAsync(ctx, f.req("m"))
	if p.settled() {
		t.Fatal("admitted above capacity while the kept lease holds the slot")
	}
	kept.Release("done")
	l, err := p.wait()
	if err != nil {
		t.Fatal(err)
	}
	l.Release("done")
	// A lease not kept is released by the fence, as before.
	plain := f.admitNow(f.req("m"))
	f.s.Fence("n1", 2)
	if ok, _ := plain.Released(); !ok {
		t.Fatal("a plain lease survived the fence")
	}
}

// TestAdoptCountsRunsInFlight: adopted runs (a new leader's rebuild) count
// even above capacity and on a resource not activated yet, are released by
// run id, and the resource admits again only once under capacity.
func TestAdoptCountsRunsInFlight(t *testing.T) {
	f := newFixture(t, Config{})
	// Before the node's connection: held orphan with its counters.
	if _, err := f.s.Adopt("n1", "p1", "m-p1", "m", false, "r1"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.s.Adopt("n1", "p1", "m-p1", "m", true, "r2"); err != nil {
		t.Fatal(err)
	}
	f.activate("n1", 1, ResourceSpec{ProviderID: "p1", Capacity: 1})
	f.world.set("m", cand("n1", 1, "p1"))
	if p := f.provider("n1", "p1"); p.InFlight != 2 || p.LongInFlight != 1 {
		t.Fatalf("in-flight %d long %d, want 2 and 1", p.InFlight, p.LongInFlight)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	p := f.admitAsync(ctx, f.req("m"))
	if !f.s.ReleaseRun("r1", "ended") {
		t.Fatal("ReleaseRun r1 released nothing")
	}
	if p.settled() {
		t.Fatal("admitted while in-flight (1) is not under capacity (1)")
	}
	f.s.ReleaseRun("r2", "ended")
	l, err := p.wait()
	if err != nil {
		t.Fatal(err)
	}
	l.Release("done")
	if _, err := f.s.Adopt("", "p1", "", "m", false, ""); err == nil {
		t.Fatal("adopt without a node id: no error")
	}
	if f.provider("n1", "p1").InFlight != 0 {
		t.Fatal("counters not back to 0")
	}
}
