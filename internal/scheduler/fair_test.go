package scheduler

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"iop/internal/clock"
)

// fairFixture is one node "n" with providers of the given capacities and
// a scheduler whose default policy is pol; groups list providers.
type fairFixture struct {
	t      *testing.T
	clk    *clock.Fake
	s      *Scheduler
	groups map[string][]string
	leases []*Lease
}

func newFairFixture(t *testing.T, pol Policy, caps map[string]int, groups map[string][]string) *fairFixture {
	t.Helper()
	clk := clock.NewFake(time.Unix(0, 0))
	s, err := New(Config{Default: pol, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	var specs []ResourceSpec
	for p, c := range caps {
		specs = append(specs, ResourceSpec{ProviderID: p, Capacity: c})
	}
	if err := s.Activate("n", 1, specs, nil); err != nil {
		t.Fatal(err)
	}
	return &fairFixture{t: t, clk: clk, s: s, groups: groups}
}

func (f *fairFixture) req(group, flow string, weight int, prio Priority) Request {
	return Request{Group: group, Flow: flow, Weight: weight, Priority: prio, Resolve: func() ([]Candidate, error) {
		var out []Candidate
		for _, p := range f.groups[group] {
			out = append(out, cand("n", 1, p))
		}
		return out, nil
	}}
}

// fill takes every free slot of group with immediate admissions.
func (f *fairFixture) fill(group string, n int) {
	f.t.Helper()
	for range n {
		l, w, err := f.s.enqueue(f.req(group, "filler", 1, PriorityStandard))
		if err != nil || l == nil || w != nil {
			f.t.Fatalf("fill: %v %v %v", l, w, err)
		}
		f.leases = append(f.leases, l)
	}
}

// queue queues one request and returns its waiter.
func (f *fairFixture) queue(r Request) *waiter {
	f.t.Helper()
	l, w, err := f.s.enqueue(r)
	if err != nil || l != nil || w == nil {
		f.t.Fatalf("queue %s/%s: %v %v %v", r.Group, r.Flow, l, w, err)
	}
	return w
}

// next releases the oldest lease and returns the flow of the waiter among
// ws the freed slot went to ("" if none).
func (f *fairFixture) next(ws map[*waiter]string) string {
	f.t.Helper()
	l := f.leases[0]
	f.leases = f.leases[1:]
	l.Release("done")
	for w, name := range ws {
		select {
		case r := <-w.ch:
			if r.err != nil {
				f.t.Fatalf("%s failed: %v", name, r.err)
			}
			delete(ws, w)
			f.leases = append(f.leases, r.lease)
			return name
		default:
		}
	}
	return ""
}

// TestFairOrderFollowsWeights: with two backlogged flows of weights 2 and
// 1 in one group, the slots go 2:1 (start-time fair queueing), each flow
// in its own enqueue order; the flow that queued all its requests first
// gets no more than its share.
func TestFairOrderFollowsWeights(t *testing.T) {
	f := newFairFixture(t, Policy{MaxQueue: 100, Fairness: FairnessOn}, map[string]int{"p": 1}, map[string][]string{"g": {"p"}})
	f.fill("g", 1)
	ws := map[*waiter]string{}
	for i := range 6 {
		ws[f.queue(f.req("g", "light", 1, PriorityStandard))] = fmt.Sprintf("light%d", i)
	}
	for i := range 12 {
		ws[f.queue(f.req("g", "heavy", 2, PriorityStandard))] = fmt.Sprintf("heavy%d", i)
	}
	var order []string
	for range 18 {
		order = append(order, f.next(ws))
	}
	got := strings.Join(order, " ")
	// light0 and heavy0 both start at 0 (light first, by seq), then
	// heavy's tags advance by ½, light's by 1.
	want := "light0 heavy0 heavy1 light1 heavy2 heavy3 light2 heavy4 heavy5 light3 heavy6 heavy7 light4 heavy8 heavy9 light5 heavy10 heavy11"
	if got != want {
		t.Fatalf("grant order\n got %s\nwant %s", got, want)
	}
}

// TestFairnessOffIsFIFO: the same arrivals with fairness off are served in
// enqueue order exactly.
func TestFairnessOffIsFIFO(t *testing.T) {
	f := newFairFixture(t, Policy{MaxQueue: 100, Fairness: FairnessOff}, map[string]int{"p": 1}, map[string][]string{"g": {"p"}})
	f.fill("g", 1)
	ws := map[*waiter]string{}
	var want []string
	for i := range 8 {
		flow := []string{"a", "b", "b", "b"}[i%4]
		name := fmt.Sprintf("%s%d", flow, i)
		ws[f.queue(f.req("g", flow, 1+i%3, PriorityStandard))] = name
		want = append(want, name)
	}
	var got []string
	for range 8 {
		got = append(got, f.next(ws))
	}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("fairness off: order %v, want %v", got, want)
	}
}

// TestCriticalGoesFirst: a critical waiter that queues last is served
// first, a sheddable one that queued first last; with fairness off too.
func TestCriticalGoesFirst(t *testing.T) {
	for _, mode := range []Fairness{FairnessOn, FairnessOff} {
		f := newFairFixture(t, Policy{MaxQueue: 100, Fairness: mode}, map[string]int{"p": 1}, map[string][]string{"g": {"p"}})
		f.fill("g", 1)
		ws := map[*waiter]string{}
		ws[f.queue(f.req("g", "a", 1, PrioritySheddable))] = "sheddable"
		ws[f.queue(f.req("g", "a", 1, PriorityStandard))] = "standard"
		ws[f.queue(f.req("g", "b", 1, PriorityCritical))] = "critical"
		var got []string
		for range 3 {
			got = append(got, f.next(ws))
		}
		if strings.Join(got, " ") != "critical standard sheddable" {
			t.Errorf("fairness %s: order %v, want critical standard sheddable", mode, got)
		}
	}
}

// TestShedDisplacesLatestSheddable: at a full queue (one waiter a flow,
// so no flow holds more than another), a standard arrival displaces the
// latest sheddable waiter (ErrShed, ErrDisplaced) and queues; a sheddable
// arrival is refused with ErrQueueFull; with no sheddable waiter left, a
// critical arrival too. Nothing holds a slot for the shed one.
func TestShedDisplacesLatestSheddable(t *testing.T) {
	f := newFairFixture(t, Policy{MaxQueue: 3, QueueTimeout: time.Minute, Fairness: FairnessOn}, map[string]int{"p": 1}, map[string][]string{"g": {"p"}})
	f.fill("g", 1)
	first := f.queue(f.req("g", "a", 1, PrioritySheddable))
	f.queue(f.req("g", "b", 1, PriorityStandard))
	latest := f.queue(f.req("g", "c", 1, PrioritySheddable))
	if _, _, err := f.s.enqueue(f.req("g", "d", 1, PrioritySheddable)); !errors.Is(err, ErrQueueFull) {
		t.Fatalf("sheddable arrival at a full queue: %v, want ErrQueueFull", err)
	}
	f.queue(f.req("g", "e", 1, PriorityStandard))
	select {
	case r := <-latest.ch:
		if !errors.Is(r.err, ErrShed) || !errors.Is(r.err, ErrDisplaced) || r.lease != nil {
			t.Fatalf("latest sheddable waiter: %+v, want ErrShed/ErrDisplaced", r)
		}
	default:
		t.Fatal("the latest sheddable waiter was not shed")
	}
	select {
	case r := <-first.ch:
		t.Fatalf("the earlier sheddable waiter settled: %+v", r)
	default:
	}
	f.queue(f.req("g", "f", 1, PriorityCritical)) // displaces first
	if r := <-first.ch; !errors.Is(r.err, ErrDisplaced) {
		t.Fatalf("first sheddable waiter: %+v", r)
	}
	if _, _, err := f.s.enqueue(f.req("g", "h", 1, PriorityCritical)); !errors.Is(err, ErrQueueFull) {
		t.Fatalf("critical arrival with no sheddable waiter: %v, want ErrQueueFull", err)
	}
	snap := f.s.Snapshot()
	if snap.Waiters != 3 || snap.Leases != 1 || snap.Groups[0].Queued != 3 {
		t.Fatalf("after sheds: %+v", snap)
	}
}

// TestSheddableRefusedForExpectedWait: once the group's service time is
// known, a sheddable arrival whose expected wait ((queued+1) × mean
// service / capacity) passes the queue timeout is refused at once with
// ErrShed/ErrExpectedWait; a standard one queues; a sheddable one with a
// short expected wait queues.
func TestSheddableRefusedForExpectedWait(t *testing.T) {
	f := newFairFixture(t, Policy{MaxQueue: 100, QueueTimeout: 10 * time.Second, Fairness: FairnessOn}, map[string]int{"p": 2}, map[string][]string{"g": {"p"}})
	f.fill("g", 2)
	w := f.queue(f.req("g", "a", 1, PriorityStandard)) // the group exists now
	f.clk.Advance(4 * time.Second)
	f.leases[0].Release("done") // held 4s: mean service 4s; w takes the slot
	if r := <-w.ch; r.lease == nil {
		t.Fatalf("waiter: %+v", r)
	}
	// Queued 0: (0+1) × 4s / 2 = 2s ≤ 10s: queues.
	f.queue(f.req("g", "s", 1, PrioritySheddable))
	for range 3 {
		f.queue(f.req("g", "a", 1, PriorityStandard))
	}
	// Queued 4: (4+1) × 4s / 2 = 10s: not past the timeout, queues.
	f.queue(f.req("g", "s", 1, PrioritySheddable))
	// Queued 5: 12s > 10s: refused.
	l, qw, err := f.s.enqueue(f.req("g", "s", 1, PrioritySheddable))
	if !errors.Is(err, ErrShed) || !errors.Is(err, ErrExpectedWait) || l != nil || qw != nil {
		t.Fatalf("sheddable arrival expecting 12s: %v %v %v, want ErrShed/ErrExpectedWait", l, qw, err)
	}
	f.queue(f.req("g", "a", 1, PriorityStandard)) // standard: queued whatever its wait
	if snap := f.s.Snapshot(); snap.Waiters != 6 {
		t.Fatalf("%d waiters, want 6", snap.Waiters)
	}
}

// TestFairGroupJoinsAtItsResourcesVirtualTime: a group that starts
// queueing on a provider where another group's fair waiters have long
// advanced the virtual time neither takes every slot ahead of them nor
// waits behind their whole queue: it alternates with them.
func TestFairGroupJoinsAtItsResourcesVirtualTime(t *testing.T) {
	f := newFairFixture(t, Policy{MaxQueue: 100, Fairness: FairnessOn}, map[string]int{"p": 1}, map[string][]string{"a": {"p"}, "b": {"p"}})
	f.fill("a", 1)
	ws := map[*waiter]string{}
	for i := range 40 {
		ws[f.queue(f.req("a", "x", 1, PriorityStandard))] = fmt.Sprintf("a%d", i)
	}
	for range 30 { // a's virtual time advances 30 units
		if f.next(ws) == "" {
			t.Fatal("no grant")
		}
	}
	for i := range 5 {
		ws[f.queue(f.req("b", "y", 1, PriorityStandard))] = fmt.Sprintf("b%d", i)
	}
	var got []string
	for range 10 {
		got = append(got, f.next(ws)[:1])
	}
	if s := strings.Join(got, ""); s != "ababababab" && s != "babababab"+"a" {
		t.Fatalf("after b joined: %s, want a and b alternating", s)
	}
}

// TestFairRequestValidation: a priority outside the three bands and a
// weight outside 0..MaxWeight are ErrInvalid.
func TestFairRequestValidation(t *testing.T) {
	f := newFairFixture(t, Policy{}, map[string]int{"p": 1}, map[string][]string{"g": {"p"}})
	for _, r := range []Request{f.req("g", "a", -1, PriorityStandard), f.req("g", "a", MaxWeight+1, PriorityStandard), f.req("g", "a", 1, Priority(2))} {
		if _, _, err := f.s.enqueue(r); !errors.Is(err, ErrInvalid) {
			t.Errorf("weight %d priority %d: %v, want ErrInvalid", r.Weight, r.Priority, err)
		}
	}
	if _, err := New(Config{Default: Policy{Fairness: "fair"}}); !errors.Is(err, ErrInvalid) {
		t.Errorf("fairness \"fair\": %v, want ErrInvalid", err)
	}
}

// TestFloodingFlowMakesRoom: at a full fair queue, an arrival of a flow
// that holds less of the queue for its weight than another pushes that
// flow's latest waiter out (ErrQueueFull) and queues, served next; with
// fairness off, it is refused with ErrQueueFull as before.
func TestFloodingFlowMakesRoom(t *testing.T) {
	for _, mode := range []Fairness{FairnessOn, FairnessOff} {
		f := newFairFixture(t, Policy{MaxQueue: 4, QueueTimeout: time.Minute, Fairness: mode}, map[string]int{"p": 1}, map[string][]string{"g": {"p"}})
		f.fill("g", 1)
		ws := map[*waiter]string{}
		var flood []*waiter
		for i := range 4 {
			w := f.queue(f.req("g", "flood", 1, PriorityStandard))
			flood = append(flood, w)
			ws[w] = fmt.Sprintf("flood%d", i)
		}
		l, w, err := f.s.enqueue(f.req("g", "light", 1, PriorityStandard))
		if mode == FairnessOff {
			if !errors.Is(err, ErrQueueFull) || l != nil || w != nil {
				t.Fatalf("fairness off: light at a full queue: %v %v %v, want ErrQueueFull", l, w, err)
			}
			continue
		}
		if err != nil || w == nil {
			t.Fatalf("light at a queue the flood fills: %v %v %v, want queued", l, w, err)
		}
		if r := <-flood[3].ch; !errors.Is(r.err, ErrQueueFull) || r.lease != nil {
			t.Fatalf("the flood's latest waiter: %+v, want ErrQueueFull", r)
		}
		delete(ws, flood[3])
		ws[w] = "light"
		// light queued at the flow's start: at the virtual time, ahead of
		// flood1.. (flood0 has the same start tag and an earlier seq).
		var got []string
		for range 4 {
			got = append(got, f.next(ws))
		}
		if s := strings.Join(got, " "); s != "flood0 light flood1 flood2" {
			t.Fatalf("order after light joined: %s, want flood0 light flood1 flood2", s)
		}
	}
}
