package scheduler

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"runtime"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"iop/internal/clock"
)

// modelChecks is how many random runs TestSchedulerModel makes unless
// -rapid.checks (or RAPID_CHECKS) says otherwise: rapid's default of 100
// finds a revert of the work-conservation fix only now and then.
const modelChecks = "1000"

func TestMain(m *testing.M) {
	flag.Parse()
	given := os.Getenv("RAPID_CHECKS") != ""
	flag.Visit(func(f *flag.Flag) { given = given || f.Name == "rapid.checks" })
	if !given {
		if err := flag.Set("rapid.checks", modelChecks); err != nil {
			panic(err)
		}
	}
	goleak.VerifyTestMain(m)
}

// world is a test catalog: the candidates of each model group, changed by
// tests and read by resolvers under the scheduler's lock.
type world struct {
	mu    sync.Mutex
	cands map[string][]Candidate
	errs  map[string]error
}

func newWorld() *world {
	return &world{cands: make(map[string][]Candidate), errs: make(map[string]error)}
}

func (w *world) set(group string, cands ...Candidate) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.cands[group] = cands
}

func (w *world) fail(group string, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.errs[group] = err
}

func (w *world) resolver(group string) func() ([]Candidate, error) {
	return func() ([]Candidate, error) {
		w.mu.Lock()
		defer w.mu.Unlock()
		if err := w.errs[group]; err != nil {
			return nil, err
		}
		c, ok := w.cands[group]
		if !ok {
			return nil, ErrUnknownModel
		}
		return append([]Candidate(nil), c...), nil
	}
}

func cand(node string, gen uint64, provider string) Candidate {
	return Candidate{NodeID: node, Generation: gen, ProviderID: provider, Target: "m-" + provider}
}

type fixture struct {
	t     *testing.T
	clk   *clock.Fake
	s     *Scheduler
	world *world
}

func newFixture(t *testing.T, cfg Config) *fixture {
	t.Helper()
	clk := clock.NewFake(time.Unix(1000, 0))
	cfg.Clock = clk
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{t: t, clk: clk, s: s, world: newWorld()}
}

func (f *fixture) activate(node string, gen uint64, specs ...ResourceSpec) {
	f.t.Helper()
	if err := f.s.Activate(node, gen, specs, nil); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fixture) req(group string) Request {
	return Request{Group: group, Resolve: f.world.resolver(group)}
}

func (f *fixture) admitNow(r Request) *Lease {
	f.t.Helper()
	l, err := f.s.Admit(context.Background(), r)
	if err != nil {
		f.t.Fatalf("admit %s: %v", r.Group, err)
	}
	return l
}

// pending is an Admit running in its own goroutine.
type pending struct {
	done  chan struct{}
	lease *Lease
	err   error
}

// admitAsync starts Admit and returns once the request is queued (or done).
func (f *fixture) admitAsync(ctx context.Context, r Request) *pending {
	f.t.Helper()
	before := f.s.Snapshot().Waiters
	p := &pending{done: make(chan struct{})}
	go func() {
		defer close(p.done)
		p.lease, p.err = f.s.Admit(ctx, r)
	}()
	for f.s.Snapshot().Waiters == before {
		select {
		case <-p.done:
			return p
		default:
			runtime.Gosched()
		}
	}
	return p
}

func (p *pending) wait() (*Lease, error) { <-p.done; return p.lease, p.err }

func (p *pending) settled() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

func (f *fixture) provider(node, provider string) ProviderSnapshot {
	f.t.Helper()
	for _, p := range f.s.Snapshot().Providers {
		if p.NodeID == node && p.ProviderID == provider {
			return p
		}
	}
	f.t.Fatalf("no provider %s/%s in snapshot", node, provider)
	return ProviderSnapshot{}
}

func TestAdmitPicksLeastLoadedThenProviderThenNode(t *testing.T) {
	f := newFixture(t, Config{})
	f.activate("n1", 1, ResourceSpec{ProviderID: "b", Capacity: 4}, ResourceSpec{ProviderID: "a", Capacity: 2})
	f.activate("n0", 1, ResourceSpec{ProviderID: "a", Capacity: 2})
	f.world.set("m", cand("n1", 1, "b"), cand("n1", 1, "a"), cand("n0", 1, "a"))
	var got []string
	for range 8 {
		l := f.admitNow(f.req("m"))
		c := l.Candidate()
		got = append(got, c.NodeID+"/"+c.ProviderID)
	}
	// Loads start 0,0,0: ties by provider id (a) then node id (n0).
	want := []string{"n0/a", "n1/a", "n1/b", "n1/b", "n0/a", "n1/a", "n1/b", "n1/b"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("order %v, want %v", got, want)
	}
	for _, p := range f.s.Snapshot().Providers {
		if p.InFlight != p.Capacity {
			t.Fatalf("%s/%s: in-flight %d of %d", p.NodeID, p.ProviderID, p.InFlight, p.Capacity)
		}
	}
}

// TestPreferIsASoftAffinity checks Request.Prefer: the preferred provider
// wins over a less loaded one while it has a free slot; when it is full, or
// not a candidate, the least loaded one is chosen as usual.
func TestPreferIsASoftAffinity(t *testing.T) {
	f := newFixture(t, Config{})
	f.activate("n1", 1, ResourceSpec{ProviderID: "a", Capacity: 2}, ResourceSpec{ProviderID: "b", Capacity: 2})
	f.world.set("m", cand("n1", 1, "a"), cand("n1", 1, "b"))
	prefB := f.req("m")
	prefB.Prefer = ProviderRef{NodeID: "n1", ProviderID: "b"}
	var got []string
	for range 4 {
		got = append(got, f.admitNow(prefB).Candidate().ProviderID)
	}
	// b twice (preferred, free), then a twice (b is full).
	if want := []string{"b", "b", "a", "a"}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("order %v, want %v", got, want)
	}

	g := newFixture(t, Config{})
	g.activate("n1", 1, ResourceSpec{ProviderID: "a", Capacity: 2}, ResourceSpec{ProviderID: "b", Capacity: 2})
	g.world.set("m", cand("n1", 1, "a"), cand("n1", 1, "b"))
	elsewhere := g.req("m")
	elsewhere.Prefer = ProviderRef{NodeID: "n9", ProviderID: "b"}
	if c := g.admitNow(elsewhere).Candidate(); c.ProviderID != "a" {
		t.Fatalf("a preference for another node chose %s, want the least loaded a", c.ProviderID)
	}
}

func TestAdmitErrors(t *testing.T) {
	f := newFixture(t, Config{Default: Policy{MaxQueue: 1}})
	f.activate("n1", 1, ResourceSpec{ProviderID: "p", Capacity: 1})
	f.world.set("m", cand("n1", 1, "p"))
	f.world.set("stale", cand("n1", 0, "p"))
	f.world.set("none")
	f.world.set("rejected")
	f.world.fail("rejected", fmt.Errorf("%w: needs tools", ErrCandidatesRejected))
	tests := []struct {
		name string
		req  Request
		want error
	}{
		{"unknown model", f.req("nope"), ErrUnknownModel},
		{"no candidates", f.req("none"), ErrNoProvider},
		{"stale generation only", f.req("stale"), ErrNoProvider},
		{"rejected by predicate", f.req("rejected"), ErrCandidatesRejected},
		{"empty group", Request{Resolve: f.world.resolver("m")}, ErrInvalid},
		{"nil resolver", Request{Group: "m"}, ErrInvalid},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := f.s.Admit(context.Background(), tt.req); !errors.Is(err, tt.want) {
				t.Fatalf("err %v, want %v", err, tt.want)
			}
			if snap := f.s.Snapshot(); snap.Leases != 0 || snap.Waiters != 0 {
				t.Fatalf("state changed: %+v", snap)
			}
		})
	}
}

func TestQueueFullAtOnce(t *testing.T) {
	f := newFixture(t, Config{Default: Policy{MaxQueue: 1}})
	f.activate("n1", 1, ResourceSpec{ProviderID: "p", Capacity: 1})
	f.world.set("m", cand("n1", 1, "p"))
	l := f.admitNow(f.req("m"))
	p := f.admitAsync(context.Background(), f.req("m"))
	if _, err := f.s.Admit(context.Background(), f.req("m")); !errors.Is(err, ErrQueueFull) {
		t.Fatalf("err %v, want ErrQueueFull", err)
	}
	l.Release("done")
	l2, err := p.wait()
	if err != nil || l2.Info().QueueReason != ReasonQueued {
		t.Fatalf("queued admit: %v %+v", err, l2)
	}
	l2.Release("done")
}

func TestQueueTimeoutWithInjectedClock(t *testing.T) {
	f := newFixture(t, Config{Default: Policy{QueueTimeout: 5 * time.Second}})
	f.activate("n1", 1, ResourceSpec{ProviderID: "p", Capacity: 1})
	f.world.set("m", cand("n1", 1, "p"))
	l := f.admitNow(f.req("m"))
	p := f.admitAsync(context.Background(), f.req("m"))
	f.clk.Advance(4 * time.Second)
	if p.settled() {
		t.Fatal("settled before its timeout")
	}
	f.clk.Advance(time.Second)
	if _, err := p.wait(); !errors.Is(err, ErrQueueTimeout) {
		t.Fatalf("err %v, want ErrQueueTimeout", err)
	}
	if snap := f.s.Snapshot(); snap.Waiters != 0 || snap.Groups[0].Queued != 0 {
		t.Fatalf("waiter left behind: %+v", snap)
	}
	l.Release("done")
	if f.clk.Pending() != 0 {
		t.Fatalf("%d timers left", f.clk.Pending())
	}
}

func TestCancelWhileQueuedLeavesQueue(t *testing.T) {
	f := newFixture(t, Config{})
	f.activate("n1", 1, ResourceSpec{ProviderID: "p", Capacity: 1})
	f.world.set("m", cand("n1", 1, "p"))
	l := f.admitNow(f.req("m"))
	ctx, cancel := context.WithCancel(context.Background())
	p := f.admitAsync(ctx, f.req("m"))
	cancel()
	if _, err := p.wait(); !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v, want context.Canceled", err)
	}
	l.Release("done")
	if pr := f.provider("n1", "p"); pr.InFlight != 0 || pr.Queued != 0 {
		t.Fatalf("slot held after cancel: %+v", pr)
	}
}

// A grant that lands in the same instant as the waiter's cancel must be
// returned, not lost: abandon finds the waiter settled and releases its lease.
func TestGrantRacingCancelIsReleased(t *testing.T) {
	f := newFixture(t, Config{})
	f.activate("n1", 1, ResourceSpec{ProviderID: "p", Capacity: 1})
	f.world.set("m", cand("n1", 1, "p"))
	l := f.admitNow(f.req("m"))
	_, w, err := f.s.enqueue(f.req("m"))
	if err != nil || w == nil {
		t.Fatalf("enqueue: %v %v", w, err)
	}
	l.Release("done") // hands the slot to w
	if err := f.s.abandon(w, context.Canceled); !errors.Is(err, context.Canceled) {
		t.Fatalf("abandon: %v", err)
	}
	if pr := f.provider("n1", "p"); pr.InFlight != 0 {
		t.Fatalf("handed-over slot lost: in-flight %d", pr.InFlight)
	}
}

func TestReleaseExactlyOnceByAnyPath(t *testing.T) {
	f := newFixture(t, Config{})
	f.activate("n1", 1, ResourceSpec{ProviderID: "p", Capacity: 2})
	f.world.set("m", cand("n1", 1, "p"))
	l := f.admitNow(f.req("m"))
	other := f.admitNow(f.req("m"))
	l.Track("run-1")
	if !f.s.ReleaseRun("run-1", "complete") {
		t.Fatal("first release by run id had no effect")
	}
	if l.Release("send failure") || f.s.ReleaseRun("run-1", "complete") || f.s.ReleaseRun("nope", "x") {
		t.Fatal("second release had an effect")
	}
	f.s.Fence("n1", 1)
	if f.s.ReleaseRun("run-1", "again") || other.Release("late") {
		t.Fatal("release after fence had an effect")
	}
	if snap := f.s.Snapshot(); snap.Leases != 0 || len(snap.Providers) != 0 {
		t.Fatalf("after the fence: %+v, want no lease and the drained orphan forgotten", snap)
	}
	if _, why := l.Released(); why != "complete" {
		t.Fatalf("release reason %q", why)
	}
}

func TestReleaseHandsSlotToEarliestWaiterInAnyGroup(t *testing.T) {
	f := newFixture(t, Config{})
	f.activate("n1", 1, ResourceSpec{ProviderID: "p", Capacity: 1})
	f.world.set("alias", cand("n1", 1, "p"))
	f.world.set("served", cand("n1", 1, "p"))
	l := f.admitNow(f.req("alias"))
	first := f.admitAsync(context.Background(), f.req("served"))
	second := f.admitAsync(context.Background(), f.req("alias"))
	l.Release("done")
	l1, err := first.wait()
	if err != nil {
		t.Fatal(err)
	}
	if second.settled() {
		t.Fatal("later waiter served before the earlier one")
	}
	l1.Release("done")
	l2, err := second.wait()
	if err != nil {
		t.Fatal(err)
	}
	l2.Release("done")
}

func TestLongContextNeedsLongSlot(t *testing.T) {
	f := newFixture(t, Config{})
	f.activate("n1", 1, ResourceSpec{ProviderID: "p", Capacity: 3, LongCapacity: 1})
	f.world.set("m", cand("n1", 1, "p"))
	long := f.req("m")
	long.Long = true
	l1 := f.admitNow(long)
	waitingLong := f.admitAsync(context.Background(), long)
	// A short request behind the long waiter still gets a free short slot.
	short := f.admitNow(f.req("m"))
	if waitingLong.settled() {
		t.Fatal("second long request admitted past long capacity")
	}
	short.Release("done")
	if waitingLong.settled() {
		t.Fatal("short release freed a long slot")
	}
	l1.Release("done")
	l2, err := waitingLong.wait()
	if err != nil || !l2.Info().Long {
		t.Fatalf("long waiter: %v", err)
	}
	if pr := f.provider("n1", "p"); pr.LongInFlight != 1 || pr.InFlight != 1 {
		t.Fatalf("counters %+v", pr)
	}
	l2.Release("done")
}

func TestFenceSettlesLeasesAndFailsWaitersWithoutCandidates(t *testing.T) {
	f := newFixture(t, Config{})
	f.activate("n1", 1, ResourceSpec{ProviderID: "p", Capacity: 1})
	f.world.set("m", cand("n1", 1, "p"))
	l := f.admitNow(f.req("m"))
	p := f.admitAsync(context.Background(), f.req("m"))
	f.world.set("m") // the catalog no longer lists the node
	f.s.Fence("n1", 1)
	if _, err := p.wait(); !errors.Is(err, ErrProviderUnavailable) {
		t.Fatalf("err %v, want ErrProviderUnavailable", err)
	}
	if ok, _ := l.Released(); !ok {
		t.Fatal("fence did not release the lease")
	}
	// Its only lease released and no waiter listing it, the orphan is
	// forgotten (DESIGN.md: bounded state).
	if snap := f.s.Snapshot(); len(snap.Providers) != 0 {
		t.Fatalf("after fence %+v", snap.Providers)
	}
}

func TestFenceFallsBackToSurvivingProvider(t *testing.T) {
	f := newFixture(t, Config{})
	f.activate("n1", 1, ResourceSpec{ProviderID: "p", Capacity: 1})
	f.activate("n2", 1, ResourceSpec{ProviderID: "p", Capacity: 1})
	f.world.set("m", cand("n1", 1, "p"), cand("n2", 1, "p"))
	a := f.admitNow(f.req("m"))
	b := f.admitNow(f.req("m"))
	p := f.admitAsync(context.Background(), f.req("m"))
	f.world.set("m", cand("n2", 1, "p"))
	f.s.Fence(a.Candidate().NodeID, 1)
	// The fence freed nothing on n2, so the waiter stays queued for it.
	if p.settled() {
		t.Fatal("waiter settled though n2 is full")
	}
	b.Release("done")
	l, err := p.wait()
	if err != nil || l.Candidate().NodeID != "n2" {
		t.Fatalf("fallback: %v %+v", err, l)
	}
	l.Release("done")
}

func TestStaleFenceAndActivateChangeNothing(t *testing.T) {
	f := newFixture(t, Config{})
	f.activate("n1", 1, ResourceSpec{ProviderID: "p", Capacity: 1})
	f.s.Fence("n1", 1)
	f.activate("n1", 2, ResourceSpec{ProviderID: "p", Capacity: 1})
	f.world.set("m", cand("n1", 2, "p"))
	l := f.admitNow(f.req("m"))
	f.s.Fence("n1", 1) // late callback of the superseded connection
	if ok, _ := l.Released(); ok {
		t.Fatal("stale fence released the live generation's lease")
	}
	if err := f.s.Activate("n1", 1, []ResourceSpec{{ProviderID: "p", Capacity: 9}}, nil); err != nil {
		t.Fatal(err)
	}
	if pr := f.provider("n1", "p"); pr.Generation != 2 || pr.Capacity != 1 || pr.Status != StatusAvailable {
		t.Fatalf("stale activate changed the resource: %+v", pr)
	}
	// An activation whose connection is no longer the owner is a no-op too.
	if err := f.s.Activate("n1", 3, []ResourceSpec{{ProviderID: "p", Capacity: 9}}, func() bool { return false }); err != nil {
		t.Fatal(err)
	}
	if pr := f.provider("n1", "p"); pr.Generation != 2 {
		t.Fatalf("non-owner activate took effect: %+v", pr)
	}
	l.Release("done")
}

func TestReconnectActivatesAndPumpsWaiters(t *testing.T) {
	f := newFixture(t, Config{})
	f.activate("n1", 1, ResourceSpec{ProviderID: "p", Capacity: 1})
	f.world.set("m", cand("n1", 1, "p"))
	l := f.admitNow(f.req("m"))
	p := f.admitAsync(context.Background(), f.req("m"))
	f.world.fail("m", errors.New("catalog busy")) // a resolver error keeps the waiter
	f.s.Fence("n1", 1)
	if p.settled() {
		t.Fatal("resolver error settled the waiter")
	}
	f.world.fail("m", nil)
	f.world.set("m", cand("n1", 2, "p"))
	f.activate("n1", 2, ResourceSpec{ProviderID: "p", Capacity: 1})
	l2, err := p.wait()
	if err != nil || l2.Candidate().Generation != 2 {
		t.Fatalf("after reconnect: %v %+v", err, l2)
	}
	if ok, _ := l.Released(); !ok {
		t.Fatal("old lease not released by fence")
	}
	l2.Release("done")
}

func TestWholeNodeFence(t *testing.T) {
	f := newFixture(t, Config{})
	f.activate("n1", 1, ResourceSpec{ProviderID: "p", Capacity: 2})
	f.world.set("m", cand("n1", 1, "p"))
	l := f.admitNow(f.req("m"))
	f.activate("n1", 2, ResourceSpec{ProviderID: "p", Capacity: 2})
	f.world.set("m", cand("n1", 2, "p"))
	l2 := f.admitNow(f.req("m"))
	f.s.Fence("n1", 0)
	for _, x := range []*Lease{l, l2} {
		if ok, _ := x.Released(); !ok {
			t.Fatal("whole-node fence left a lease")
		}
	}
	if snap := f.s.Snapshot(); len(snap.Providers) != 0 {
		t.Fatalf("whole-node fence left %+v", snap.Providers)
	}
}

func TestCapacityChangeDrainsAndGrows(t *testing.T) {
	f := newFixture(t, Config{})
	f.activate("n1", 1, ResourceSpec{ProviderID: "p", Capacity: 2})
	f.world.set("m", cand("n1", 1, "p"))
	a, b := f.admitNow(f.req("m")), f.admitNow(f.req("m"))
	if err := f.s.SetCapacity("n1", "p", 1, 0); err != nil {
		t.Fatal(err)
	}
	p := f.admitAsync(context.Background(), f.req("m"))
	a.Release("done") // 1 in flight at capacity 1: still full
	if p.settled() {
		t.Fatal("admitted over the new capacity")
	}
	if err := f.s.SetCapacity("n1", "p", 3, 0); err != nil {
		t.Fatal(err)
	}
	c, err := p.wait()
	if err != nil {
		t.Fatal(err)
	}
	b.Release("done")
	c.Release("done")
}

func TestUpdatePolicyKeepsQueuedWork(t *testing.T) {
	f := newFixture(t, Config{Default: Policy{MaxQueue: 2, QueueTimeout: 10 * time.Second}})
	f.activate("n1", 1, ResourceSpec{ProviderID: "p", Capacity: 1})
	f.world.set("m", cand("n1", 1, "p"))
	l := f.admitNow(f.req("m"))
	p := f.admitAsync(context.Background(), f.req("m"))
	if err := f.s.UpdatePolicy("m", Policy{MaxQueue: 1, QueueTimeout: time.Second}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.s.Admit(context.Background(), f.req("m")); !errors.Is(err, ErrQueueFull) {
		t.Fatalf("new max_queue not applied: %v", err)
	}
	f.clk.Advance(2 * time.Second)
	if p.settled() {
		t.Fatal("queued waiter's deadline changed by a policy update")
	}
	if g := f.s.Snapshot().Groups[0]; g.Policy.QueueTimeout != time.Second || g.Policy.MaxQueue != 1 || g.Queued != 1 {
		t.Fatalf("group %+v", g)
	}
	l.Release("done")
	l2, err := p.wait()
	if err != nil {
		t.Fatal(err)
	}
	l2.Release("done")
}

func TestBadInputIsRejectedAndChangesNothing(t *testing.T) {
	if _, err := New(Config{Default: Policy{MaxQueue: -1}}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("negative max_queue: %v", err)
	}
	if _, err := New(Config{Groups: map[string]Policy{"m": {QueueTimeout: -time.Second}}}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("negative timeout: %v", err)
	}
	if _, err := New(Config{Groups: map[string]Policy{"": {}}}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("empty model name: %v", err)
	}
	f := newFixture(t, Config{})
	f.activate("n1", 1, ResourceSpec{ProviderID: "p", Capacity: 2})
	bad := []struct {
		name string
		err  error
	}{
		{"capacity 0", f.s.Activate("n1", 2, []ResourceSpec{{ProviderID: "p", Capacity: 0}}, nil)},
		{"empty provider", f.s.Activate("n1", 2, []ResourceSpec{{Capacity: 1}}, nil)},
		{"duplicate provider", f.s.Activate("n1", 2, []ResourceSpec{{ProviderID: "p", Capacity: 1}, {ProviderID: "p", Capacity: 1}}, nil)},
		{"negative long", f.s.Activate("n1", 2, []ResourceSpec{{ProviderID: "p", Capacity: 1, LongCapacity: -1}}, nil)},
		{"empty node", f.s.Activate("", 2, []ResourceSpec{{ProviderID: "p", Capacity: 1}}, nil)},
		{"set capacity 0", f.s.SetCapacity("n1", "p", 0, 0)},
		{"policy negative", f.s.UpdatePolicy("m", Policy{MaxQueue: -3})},
		{"policy empty name", f.s.UpdatePolicy("", Policy{MaxQueue: 3})},
	}
	for _, b := range bad {
		if !errors.Is(b.err, ErrInvalid) {
			t.Errorf("%s: err %v, want ErrInvalid", b.name, b.err)
		}
	}
	if err := f.s.SetCapacity("n1", "zzz", 1, 0); !errors.Is(err, ErrUnknownResource) {
		t.Errorf("unknown resource: %v", err)
	}
	if pr := f.provider("n1", "p"); pr.Generation != 1 || pr.Capacity != 2 {
		t.Fatalf("bad input changed state: %+v", pr)
	}
}

// Many goroutines admitting and releasing at once never exceed capacity and
// leave every counter at zero (run under -race).
func TestConcurrentAdmitRelease(t *testing.T) {
	s, err := New(Config{Default: Policy{MaxQueue: 1000, QueueTimeout: time.Minute}})
	if err != nil {
		t.Fatal(err)
	}
	w := newWorld()
	var cands []Candidate
	for i := range 3 {
		node := fmt.Sprintf("n%d", i)
		if err := s.Activate(node, 1, []ResourceSpec{{ProviderID: "p", Capacity: 2}}, nil); err != nil {
			t.Fatal(err)
		}
		cands = append(cands, cand(node, 1, "p"))
	}
	w.set("m", cands...)
	var wg sync.WaitGroup
	var mu sync.Mutex
	inFlight := map[string]int{}
	for range 40 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 25 {
				l, err := s.Admit(context.Background(), Request{Group: "m", Resolve: w.resolver("m")})
				if err != nil {
					t.Error(err)
					return
				}
				node := l.Candidate().NodeID
				mu.Lock()
				inFlight[node]++
				if inFlight[node] > 2 {
					t.Errorf("node %s above capacity: %d", node, inFlight[node])
				}
				mu.Unlock()
				runtime.Gosched()
				mu.Lock()
				inFlight[node]--
				mu.Unlock()
				l.Release("done")
			}
		}()
	}
	wg.Wait()
	snap := s.Snapshot()
	if snap.Leases != 0 || snap.Waiters != 0 {
		t.Fatalf("leftovers %+v", snap)
	}
	for _, p := range snap.Providers {
		if p.InFlight != 0 {
			t.Fatalf("%+v", p)
		}
	}
}
