package scheduler

import (
	"context"
	"fmt"
	"testing"
)

// affinityOf returns a Request.Affinity giving each provider id its tokens.
func affinityOf(tokens map[string]int) func(Candidate) int {
	return func(c Candidate) int { return tokens[c.ProviderID] }
}

// TestAffinityChoice checks Request.Affinity's rule (Request doc): among
// the free candidates whose load is within AffinitySlack of the least
// loaded one's, the highest affinity wins, ties by load, provider id,
// node id; without a match, the least loaded.
func TestAffinityChoice(t *testing.T) {
	tests := []struct {
		name     string
		inFlight map[string]int // of a, b, c (capacity 4 each)
		affinity map[string]int
		slack    float64
		want     string
	}{
		{"no match is least loaded", map[string]int{"a": 2, "b": 1, "c": 3}, map[string]int{}, 0.5, "b"},
		{"no match ties by provider id", map[string]int{}, map[string]int{}, 0.5, "a"},
		{"a match within the slack wins", map[string]int{"a": 1, "c": 2}, map[string]int{"c": 2000}, 0.5, "c"},
		{"exactly at the slack still wins", map[string]int{"c": 2}, map[string]int{"c": 10}, 0.5, "c"},
		{"beyond the slack loses", map[string]int{"c": 3}, map[string]int{"c": 1 << 20}, 0.5, "a"},
		{"longest match wins at equal load", map[string]int{}, map[string]int{"a": 100, "b": 300, "c": 200}, 0, "b"},
		{"equal matches: least loaded", map[string]int{"a": 2, "b": 1}, map[string]int{"a": 50, "b": 50, "c": 50}, 1, "c"},
		{"slack 0: a match only breaks ties", map[string]int{"a": 1, "b": 1}, map[string]int{"a": 9, "b": 5}, 0, "c"},
		{"slack 0 tie broken by the match", map[string]int{"c": 1}, map[string]int{"b": 5}, 0, "b"},
		{"a full provider is never chosen", map[string]int{"c": 4}, map[string]int{"c": 1 << 20}, 1, "a"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, Config{})
			f.activate("n1", 1, ResourceSpec{ProviderID: "a", Capacity: 4}, ResourceSpec{ProviderID: "b", Capacity: 4}, ResourceSpec{ProviderID: "c", Capacity: 4})
			for _, p := range []string{"a", "b", "c"} {
				f.world.set("fill-"+p, cand("n1", 1, p))
				for range tt.inFlight[p] {
					f.admitNow(f.req("fill-" + p))
				}
			}
			f.world.set("m", cand("n1", 1, "a"), cand("n1", 1, "b"), cand("n1", 1, "c"))
			r := f.req("m")
			r.Affinity, r.AffinitySlack = affinityOf(tt.affinity), tt.slack
			if got := f.admitNow(r).Candidate().ProviderID; got != tt.want {
				t.Fatalf("chose %s, want %s", got, tt.want)
			}
		})
	}
}

// TestAffinitySlackIsAFractionOfCapacity: the slack compares
// in_flight/capacity, so 2 of 8 and 1 of 4 are the same load.
func TestAffinitySlackIsAFractionOfCapacity(t *testing.T) {
	f := newFixture(t, Config{})
	f.activate("n1", 1, ResourceSpec{ProviderID: "a", Capacity: 2}, ResourceSpec{ProviderID: "b", Capacity: 8})
	f.world.set("fill-b", cand("n1", 1, "b"))
	for range 4 {
		f.admitNow(f.req("fill-b")) // b: 4/8 = 0.5, a: 0
	}
	f.world.set("m", cand("n1", 1, "a"), cand("n1", 1, "b"))
	r := f.req("m")
	r.Affinity, r.AffinitySlack = affinityOf(map[string]int{"b": 10}), 0.5
	if got := f.admitNow(r).Candidate().ProviderID; got != "b" {
		t.Fatalf("chose %s, want b (4/8 is within 0.5 of 0)", got)
	}
	r.AffinitySlack = 0.4 // b: 5/8 now
	if got := f.admitNow(r).Candidate().ProviderID; got != "a" {
		t.Fatalf("chose %s, want a (5/8 is beyond 0.4 of 0)", got)
	}
}

// TestPreferWinsOverAffinity: Prefer (session affinity), when it has a
// free slot, is chosen whatever the other candidates' affinity; full, the
// affinity score decides.
func TestPreferWinsOverAffinity(t *testing.T) {
	f := newFixture(t, Config{})
	f.activate("n1", 1, ResourceSpec{ProviderID: "a", Capacity: 1}, ResourceSpec{ProviderID: "b", Capacity: 1}, ResourceSpec{ProviderID: "c", Capacity: 1})
	f.world.set("m", cand("n1", 1, "a"), cand("n1", 1, "b"), cand("n1", 1, "c"))
	r := f.req("m")
	r.Prefer = ProviderRef{NodeID: "n1", ProviderID: "a"}
	r.Affinity, r.AffinitySlack = affinityOf(map[string]int{"c": 5000}), 1
	var got []string
	for range 3 {
		got = append(got, f.admitNow(r).Candidate().ProviderID)
	}
	if want := []string{"a", "c", "b"}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("order %v, want %v", got, want)
	}
}

// TestAffinityQueuedWaiterTakesReleasedSlot: a waiter with an affinity for
// a busy provider is handed the first slot released anywhere among its
// candidates (work conservation beats affinity).
func TestAffinityQueuedWaiterTakesReleasedSlot(t *testing.T) {
	f := newFixture(t, Config{})
	f.activate("n1", 1, ResourceSpec{ProviderID: "a", Capacity: 1}, ResourceSpec{ProviderID: "b", Capacity: 1})
	f.world.set("m", cand("n1", 1, "a"), cand("n1", 1, "b"))
	la := f.admitNow(f.req("m"))
	lb := f.admitNow(f.req("m"))
	if la.Candidate().ProviderID != "a" || lb.Candidate().ProviderID != "b" {
		t.Fatalf("fill: %s %s", la.Candidate().ProviderID, lb.Candidate().ProviderID)
	}
	r := f.req("m")
	r.Affinity = affinityOf(map[string]int{"a": 1 << 20})
	p := f.admitAsync(context.Background(), r)
	lb.Release("done")
	l, err := p.wait()
	if err != nil {
		t.Fatal(err)
	}
	if got := l.Candidate().ProviderID; got != "b" {
		t.Fatalf("waiter got %s, want the released b", got)
	}
	l.Release("done")
	la.Release("done")
}
