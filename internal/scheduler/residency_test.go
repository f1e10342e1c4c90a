package scheduler

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"testing"
	"time"
)

// residencyConfig is the policy of the residency tests: a load costs 5 s,
// a request may be passed over for 10 s.
func residencyConfig() Config {
	return Config{Residency: &ResidencyPolicy{MaxExtraWait: 10 * time.Second, LoadTime: 5 * time.Second}}
}

// mc is provider's candidate serving model (the target is the model name).
func mc(provider, model string) Candidate {
	return Candidate{NodeID: "n1", Generation: 1, ProviderID: provider, Target: model}
}

// setModel makes group model servable by each of providers.
func (f *fixture) setModel(model string, providers ...string) {
	var cs []Candidate
	for _, p := range providers {
		cs = append(cs, mc(p, model))
	}
	f.world.set(model, cs...)
}

func (f *fixture) setLoaded(provider string, maxLoaded int, models ...string) {
	f.t.Helper()
	if err := f.s.SetLoaded("n1", provider, models, maxLoaded); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fixture) held(provider string) []string {
	f.t.Helper()
	r, ok := f.s.Residency("n1", provider)
	if !ok {
		f.t.Fatalf("no residency of %s", provider)
	}
	return r.Held
}

func leaseOf(t *testing.T, p *pending) *Lease {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		t.Fatal("still queued")
	}
	l, err := p.wait()
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// waiters is how many requests are queued.
func (f *fixture) waiters() int { return f.s.Snapshot().Waiters }

// TestResidencyLoadedWins: among free candidates the one holding the model
// wins over a less loaded one that must load it; a provider whose
// residency is unread holds every model; with no holder free the model is
// loaded where nothing has to be evicted.
func TestResidencyLoadedWins(t *testing.T) {
	f := newFixture(t, residencyConfig())
	f.activate("n1", 1, ResourceSpec{ProviderID: "a", Capacity: 4}, ResourceSpec{ProviderID: "b", Capacity: 4}, ResourceSpec{ProviderID: "c", Capacity: 4})
	f.setLoaded("a", 1, "y")
	f.setLoaded("b", 1, "x")
	f.setModel("x", "a", "b")
	for i := range 3 {
		l := f.admitNow(f.req("x"))
		if got := l.Candidate().ProviderID; got != "b" || l.Info().Load {
			t.Fatalf("admission %d: %s (load %v), want b without a load", i, got, l.Info().Load)
		}
	}
	f.setModel("z", "a", "c") // c's residency is unread: it holds z
	lz := f.admitNow(f.req("z"))
	if lz.Candidate().ProviderID != "c" || lz.Info().Load {
		t.Fatalf("z went to %s (load %v), want c", lz.Candidate().ProviderID, lz.Info().Load)
	}
	lz.Release("done")
	f.setLoaded("c", 2, "w")
	f.setModel("v", "a", "c") // a must evict y, c has room
	if l := f.admitNow(f.req("v")); l.Candidate().ProviderID != "c" || !l.Info().Load {
		t.Fatalf("v went to %s (load %v), want a load on c", l.Candidate().ProviderID, l.Info().Load)
	}
	if got := f.held("c"); !slices.Equal(got, []string{"w", "v"}) {
		t.Fatalf("c holds %v, want [w v]", got)
	}
}

// TestResidencyLoadEvictsIdleLRU: when every candidate must evict, the
// load goes where the model evicted (the least recently used) has no run
// in flight, and the eviction is counted.
func TestResidencyLoadEvictsIdleLRU(t *testing.T) {
	f := newFixture(t, residencyConfig())
	f.activate("n1", 1, ResourceSpec{ProviderID: "a", Capacity: 2}, ResourceSpec{ProviderID: "b", Capacity: 2})
	f.setLoaded("a", 1, "y")
	f.setLoaded("b", 1, "z")
	f.setModel("y", "a")
	busy := f.admitNow(f.req("y")) // a's only model now runs
	f.setModel("x", "a", "b")
	l := f.admitNow(f.req("x"))
	if got := l.Candidate().ProviderID; got != "b" || !l.Info().Load {
		t.Fatalf("x went to %s (load %v), want a load on b (its z is idle)", got, l.Info().Load)
	}
	r, _ := f.s.Residency("n1", "b")
	if !slices.Equal(r.Held, []string{"x"}) || r.Loads != 1 || r.Evictions != 1 {
		t.Fatalf("b: %+v, want x held after 1 load and 1 eviction", r)
	}
	busy.Release("done")
	l.Release("done")
}

// TestResidencyWaitsForLoadInProgress: a request for a model being loaded
// on a busy provider waits for it rather than start a second load on a
// free one; the load's end serves it there. Without a release it loads
// elsewhere after the load time (the wait is bounded).
func TestResidencyWaitsForLoadInProgress(t *testing.T) {
	for _, released := range []bool{true, false} {
		t.Run(fmt.Sprint("released=", released), func(t *testing.T) {
			f := newFixture(t, residencyConfig())
			f.activate("n1", 1, ResourceSpec{ProviderID: "a", Capacity: 1}, ResourceSpec{ProviderID: "b", Capacity: 1})
			f.setLoaded("a", 1)
			f.setLoaded("b", 1)
			f.setModel("x", "a", "b")
			first := f.admitNow(f.req("x"))
			if !first.Info().Load || first.Candidate().ProviderID != "a" {
				t.Fatalf("first: %+v, want a load on a", first.Info())
			}
			second := f.admitAsync(context.Background(), f.req("x"))
			if f.waiters() != 1 {
				l, err := second.wait()
				t.Fatalf("second did not wait for the load: %v %v", l.Info(), err)
			}
			if released {
				first.Release("done")
				l := leaseOf(t, second)
				if l.Candidate().ProviderID != "a" || l.Info().Load {
					t.Fatalf("second: %+v, want a without a load", l.Info())
				}
				l.Release("done")
				return
			}
			f.clk.Advance(5*time.Second - time.Millisecond)
			if f.waiters() != 1 {
				t.Fatal("second stopped waiting before the load time")
			}
			f.clk.Advance(time.Millisecond)
			l := leaseOf(t, second)
			if l.Candidate().ProviderID != "b" || !l.Info().Load {
				t.Fatalf("second: %+v, want a load on b", l.Info())
			}
			first.Release("done")
			l.Release("done")
		})
	}
}

// TestResidencyLongQueueLoadsElsewhere: when the queue at the provider
// holding the model is longer than a load takes, the model is loaded on a
// free provider at once.
func TestResidencyLongQueueLoadsElsewhere(t *testing.T) {
	f := newFixture(t, residencyConfig())
	f.activate("n1", 1, ResourceSpec{ProviderID: "a", Capacity: 1}, ResourceSpec{ProviderID: "b", Capacity: 1})
	f.setLoaded("a", 1, "x")
	f.setLoaded("b", 1)
	f.setModel("x", "a", "b")
	f.s.mu.Lock()
	f.s.groupLocked("x").service = 6 * time.Second // one run outlasts a load
	f.s.mu.Unlock()
	first := f.admitNow(f.req("x"))
	l := f.admitNow(f.req("x"))
	if l.Candidate().ProviderID != "b" || !l.Info().Load {
		t.Fatalf("second: %+v, want a load on b", l.Info())
	}
	first.Release("done")
	l.Release("done")
}

// TestResidencyBatchesByModel: on a provider holding x, waiters for x are
// served before an earlier waiter for y, which needs a swap; without the
// policy the order is the queue's. With it, x, just asked for three times,
// is in more demand than the one y waiter: y swaps it out at its deadline
// (MaxExtraWait), not as soon as the x waiters are served.
func TestResidencyBatchesByModel(t *testing.T) {
	for _, on := range []bool{true, false} {
		t.Run(fmt.Sprint("residency=", on), func(t *testing.T) {
			cfg := residencyConfig()
			if !on {
				cfg = Config{}
			}
			f := newFixture(t, cfg)
			f.activate("n1", 1, ResourceSpec{ProviderID: "a", Capacity: 1})
			f.setLoaded("a", 1, "x")
			f.setModel("x", "a")
			f.setModel("y", "a")
			cur := f.admitNow(f.req("x"))
			y := f.admitAsync(context.Background(), f.req("y"))
			f.clk.Advance(time.Second)
			x2 := f.admitAsync(context.Background(), f.req("x"))
			x3 := f.admitAsync(context.Background(), f.req("x"))
			names := map[*pending]string{y: "y", x2: "x2", x3: "x3"}
			var order []string
			for i := range 3 {
				if i == 2 {
					f.clk.Advance(9 * time.Second) // y's deadline
				}
				cur.Release("done")
				if f.waiters() != 2-i {
					t.Fatalf("release %d: %d waiters left", i, f.waiters())
				}
				var next *pending
				for next == nil {
					for p, name := range names {
						if p.settled() {
							next = p
							order = append(order, name)
						}
					}
					runtime.Gosched()
				}
				delete(names, next)
				cur = leaseOf(t, next)
			}
			cur.Release("done")
			want := []string{"x2", "x3", "y"}
			if !on {
				want = []string{"y", "x2", "x3"}
			}
			if !slices.Equal(order, want) {
				t.Fatalf("served %v, want %v", order, want)
			}
		})
	}
}

// TestResidencyMaxExtraWait: a waiter passed over for MaxExtraWait is
// served next, swap or not: no model starves.
func TestResidencyMaxExtraWait(t *testing.T) {
	f := newFixture(t, residencyConfig())
	f.activate("n1", 1, ResourceSpec{ProviderID: "a", Capacity: 1})
	f.setLoaded("a", 1, "x")
	f.setModel("x", "a")
	f.setModel("y", "a")
	cur := f.admitNow(f.req("x"))
	y := f.admitAsync(context.Background(), f.req("y"))
	x2 := f.admitAsync(context.Background(), f.req("x"))
	f.clk.Advance(10 * time.Second)
	cur.Release("done")
	l := leaseOf(t, y)
	if f.waiters() != 1 || !l.Info().Load {
		t.Fatalf("y: %+v, want it served (a load) before x2", l.Info())
	}
	if got := f.held("a"); !slices.Equal(got, []string{"y"}) {
		t.Fatalf("a holds %v, want [y]", got)
	}
	l.Release("done")
	l2 := leaseOf(t, x2)
	if !l2.Info().Load {
		t.Fatal("x2 after y is a load")
	}
	l2.Release("done")
}

// TestResidencyReadings: a reading replaces what is held but keeps the
// models with runs in flight; the limit is learned from readings when not
// configured; beyond it the least recently used idle model goes.
func TestResidencyReadings(t *testing.T) {
	f := newFixture(t, residencyConfig())
	f.activate("n1", 1, ResourceSpec{ProviderID: "a", Capacity: 4})
	f.setModel("x", "a")
	f.setModel("y", "a")
	f.setModel("z", "a")
	f.setLoaded("a", 0)
	lx := f.admitNow(f.req("x")) // unknown limit: a load, nothing evicted
	ly := f.admitNow(f.req("y"))
	if got := f.held("a"); !slices.Equal(got, []string{"x", "y"}) {
		t.Fatalf("held %v, want [x y]", got)
	}
	f.setLoaded("a", 0, "x", "y")
	f.setLoaded("a", 0, "y") // x still runs: kept, loading
	r, _ := f.s.Residency("n1", "a")
	if !slices.Equal(r.Held, []string{"x", "y"}) || !slices.Equal(r.Loading, []string{"x"}) || r.Learned != 2 {
		t.Fatalf("after a reading: %+v", r)
	}
	lx.Release("done")
	ly.Release("done")
	f.setLoaded("a", 0, "x", "y")
	lz := f.admitNow(f.req("z")) // learned limit 2: x, the least recently used, goes
	if got := f.held("a"); !slices.Equal(got, []string{"y", "z"}) {
		t.Fatalf("held %v, want [y z]", got)
	}
	lz.Release("done")
	if err := f.s.SetLoaded("n1", "nope", nil, 0); err == nil {
		t.Fatal("SetLoaded of an unknown provider: no error")
	}
}

// TestRegression_ResidencyWaitWithAFullQueue: a request that would wait
// for a busy provider holding its model, while another provider could
// load it now, was refused with ErrQueueFull when its group's queue was
// full; it takes the free slot (a load) instead.
func TestRegression_ResidencyWaitWithAFullQueue(t *testing.T) {
	cfg := residencyConfig()
	cfg.Default.MaxQueue = 1
	f := newFixture(t, cfg)
	f.activate("n1", 1, ResourceSpec{ProviderID: "a", Capacity: 1}, ResourceSpec{ProviderID: "b", Capacity: 2})
	f.setLoaded("a", 1, "x")
	f.setLoaded("b", 1)
	f.setModel("x", "a", "b")
	busy := f.admitNow(f.req("x"))
	waiting := f.admitAsync(context.Background(), f.req("x")) // waits for a, the queue is full
	if f.waiters() != 1 {
		t.Fatal("the second request did not wait for a")
	}
	l := f.admitNow(f.req("x"))
	if l.Candidate().ProviderID != "b" || !l.Info().Load {
		t.Fatalf("third: %+v, want a load on b", l.Info())
	}
	// b now holds x: the waiter takes its other slot at once.
	w := leaseOf(t, waiting)
	if w.Candidate().ProviderID != "b" || w.Info().Load {
		t.Fatalf("waiter: %+v, want b without a load", w.Info())
	}
	for _, x := range []*Lease{busy, l, w} {
		x.Release("done")
	}
}

// TestRegression_ResidencySwapWaitsForTheRunsItEvicts: on one provider of
// capacity 3 holding one model at a time, clients alternating x and y
// every 50 ms made 3 loads where 2 suffice: a request for y took a free
// slot and evicted x while x still ran, so the next x loaded it again. A
// swap now waits for the runs of the model it evicts: x requests arriving
// meanwhile run on the loaded x, then y loads once for both y waiters.
func TestRegression_ResidencySwapWaitsForTheRunsItEvicts(t *testing.T) {
	f := newFixture(t, residencyConfig())
	f.activate("n1", 1, ResourceSpec{ProviderID: "a", Capacity: 3})
	f.setLoaded("a", 1)
	f.setModel("x", "a")
	f.setModel("y", "a")
	x1 := f.admitNow(f.req("x")) // loads x
	f.clk.Advance(50 * time.Millisecond)
	y1 := f.admitAsync(context.Background(), f.req("y"))
	f.clk.Advance(50 * time.Millisecond)
	x2 := f.admitNow(f.req("x")) // x is loaded: no load
	f.clk.Advance(50 * time.Millisecond)
	y2 := f.admitAsync(context.Background(), f.req("y"))
	if f.waiters() != 2 {
		t.Fatalf("%d waiters, want both y requests waiting for the x runs", f.waiters())
	}
	if x2.Info().Load {
		t.Fatal("x2 loaded x again")
	}
	f.clk.Advance(50 * time.Millisecond)
	x1.Release("done")
	if f.waiters() != 2 {
		t.Fatal("a y request loaded y while x2 still runs")
	}
	f.clk.Advance(50 * time.Millisecond)
	x2.Release("done")
	l1, l2 := leaseOf(t, y1), leaseOf(t, y2)
	if !l1.Info().Load || l2.Info().Load {
		t.Fatalf("y1 load %v, y2 load %v: want one load for both", l1.Info().Load, l2.Info().Load)
	}
	l1.Release("done")
	l2.Release("done")
	if r, _ := f.s.Residency("n1", "a"); r.Loads != 2 || r.Evictions != 1 {
		t.Fatalf("a: %d loads and %d evictions, want 2 and 1", r.Loads, r.Evictions)
	}
}

// TestResidencySwapWaitIsBounded: a request whose load waits for the runs
// of the model it evicts waits at most MaxExtraWait; then it loads its
// model, and the server finishes the runs before it swaps.
func TestResidencySwapWaitIsBounded(t *testing.T) {
	f := newFixture(t, residencyConfig())
	f.activate("n1", 1, ResourceSpec{ProviderID: "a", Capacity: 2})
	f.setLoaded("a", 1, "x")
	f.setModel("x", "a")
	f.setModel("y", "a")
	x := f.admitNow(f.req("x"))
	y := f.admitAsync(context.Background(), f.req("y"))
	f.clk.Advance(9 * time.Second)
	if f.waiters() != 1 {
		t.Fatal("y did not wait for the x run")
	}
	f.clk.Advance(time.Second)
	l := leaseOf(t, y)
	if !l.Info().Load {
		t.Fatal("y after MaxExtraWait: no load")
	}
	x.Release("done")
	l.Release("done")
}

// TestResidencyKeptEvictedLast: a kept model (SetKept) is not evicted
// while another idle one can be, and a load goes where it evicts no kept
// model; when every slot holds a kept model it is evicted all the same.
func TestResidencyKeptEvictedLast(t *testing.T) {
	f := newFixture(t, residencyConfig())
	f.activate("n1", 1, ResourceSpec{ProviderID: "a", Capacity: 2}, ResourceSpec{ProviderID: "b", Capacity: 2})
	f.s.SetKept([]string{"k"})
	f.setLoaded("a", 2, "k", "x") // k least recently used
	f.setLoaded("b", 1, "k")
	f.setModel("y", "a")
	l := f.admitNow(f.req("y"))
	if got := f.held("a"); !slices.Equal(got, []string{"k", "y"}) {
		t.Fatalf("a holds %v, want [k y]: x evicted, not the kept k", got)
	}
	l.Release("done")
	f.setLoaded("a", 1, "z")
	f.setModel("w", "a", "b")
	l = f.admitNow(f.req("w"))
	if got := l.Candidate().ProviderID; got != "a" {
		t.Fatalf("w loaded on %s, want a (b would evict the kept k)", got)
	}
	l.Release("done")
	f.setModel("v", "b")
	l = f.admitNow(f.req("v"))
	if got := f.held("b"); !slices.Equal(got, []string{"v"}) {
		t.Fatalf("b holds %v, want [v]: the only slot is needed", got)
	}
	l.Release("done")
}

// TestRegression_ResidencyIdleSwapOfAModelInUse: two providers of
// capacity 2 holding one model each (a: x, b: y), clients asking for x, y
// and z in turns at about 2 a second, as `iop bench --residency` run D
// does. A request for z found both providers idle between two requests
// of their models and swapped one out at once; the next request of that
// model swapped it back in: a load every second or two (45 in 60 s). A
// swap now waits while the model it evicts is in more demand than its
// own: z waits (x and y keep running without a load) until its deadline,
// then loads once, and the z requests that came meanwhile share the load.
func TestRegression_ResidencyIdleSwapOfAModelInUse(t *testing.T) {
	f := newFixture(t, residencyConfig())
	f.activate("n1", 1, ResourceSpec{ProviderID: "a", Capacity: 2}, ResourceSpec{ProviderID: "b", Capacity: 2})
	f.setLoaded("a", 1, "x")
	f.setLoaded("b", 1, "y")
	for _, m := range []string{"x", "y", "z"} {
		f.setModel(m, "a", "b")
	}
	serve := func(model string) {
		t.Helper()
		l := f.admitNow(f.req(model))
		if l.Info().Load {
			t.Fatalf("%s loaded on %s", model, l.Candidate().ProviderID)
		}
		f.clk.Advance(250 * time.Millisecond)
		l.Release("done")
		f.clk.Advance(250 * time.Millisecond)
	}
	for range 3 {
		serve("x")
		serve("y")
	}
	z1 := f.admitAsync(context.Background(), f.req("z"))
	if f.waiters() != 1 {
		l, err := z1.wait()
		t.Fatalf("z swapped out a model in use at once: %+v %v", l.Info(), err)
	}
	for range 4 { // 4 s: x and y run where they are
		serve("x")
		serve("y")
	}
	z2 := f.admitAsync(context.Background(), f.req("z"))
	f.clk.Advance(6 * time.Second) // z1's deadline
	l1, l2 := leaseOf(t, z1), leaseOf(t, z2)
	if !l1.Info().Load || l2.Info().Load || l1.Candidate() != l2.Candidate() {
		t.Fatalf("z1 %+v, z2 %+v: want one load for both", l1.Info(), l2.Info())
	}
	l1.Release("done")
	l2.Release("done")
	var loads uint64
	for _, p := range []string{"a", "b"} {
		r, _ := f.s.Residency("n1", p)
		loads += r.Loads
	}
	if loads != 1 {
		t.Fatalf("%d loads, want 1", loads)
	}
}

// TestResidencyAlternatingClientSwapsAtOnce: one client alternating two
// models on a provider that holds one (Aider's architect mode, alone) is
// never held back: each model was asked for once since its last swap, no
// more than the request waiting for the other, so each request loads at
// once.
func TestResidencyAlternatingClientSwapsAtOnce(t *testing.T) {
	f := newFixture(t, residencyConfig())
	f.activate("n1", 1, ResourceSpec{ProviderID: "a", Capacity: 2})
	f.setLoaded("a", 1)
	f.setModel("x", "a")
	f.setModel("y", "a")
	for i := range 6 {
		model := []string{"x", "y"}[i%2]
		l := f.admitNow(f.req(model))
		if !l.Info().Load {
			t.Fatalf("request %d (%s): no load", i, model)
		}
		f.clk.Advance(time.Second)
		l.Release("done")
		f.clk.Advance(100 * time.Millisecond)
	}
}
