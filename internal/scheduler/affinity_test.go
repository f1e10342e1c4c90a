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

// TestAffinityScore checks Request.Affinity's score (Request doc): among
// the candidates with a free slot, the highest Affinity − LoadTokens ×
// in_flight/capacity wins, ties by load, provider id, node id.
func TestAffinityScore(t *testing.T) {
	tests := []struct {
		name       string
		inFlight   map[string]int // of a, b, c (capacity 4 each)
		affinity   map[string]int
		loadTokens int
		want       string
	}{
		{"no match is least loaded", map[string]int{"a": 2, "b": 1, "c": 3}, map[string]int{}, 1000, "b"},
		{"no match ties by provider id", map[string]int{}, map[string]int{}, 1000, "a"},
		{"a match wins over a lighter load", map[string]int{"a": 1, "c": 3}, map[string]int{"c": 2000}, 1000, "c"},
		{"load outweighs a small match", map[string]int{"c": 3}, map[string]int{"c": 500}, 1000, "a"},
		{"exactly traded: tie by load", map[string]int{"c": 2}, map[string]int{"c": 500}, 1000, "a"},
		{"longest match wins at equal load", map[string]int{}, map[string]int{"a": 100, "b": 300, "c": 200}, 1000, "b"},
		{"load weight 0: any match wins", map[string]int{"b": 3}, map[string]int{"b": 1}, 0, "b"},
		{"a full provider is never chosen", map[string]int{"c": 4}, map[string]int{"c": 1 << 20}, 0, "a"},
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
			r.Affinity, r.LoadTokens = affinityOf(tt.affinity), tt.loadTokens
			if got := f.admitNow(r).Candidate().ProviderID; got != tt.want {
				t.Fatalf("chose %s, want %s", got, tt.want)
			}
		})
	}
}

// TestAffinityDifferentCapacities: the load term uses in_flight/capacity,
// so a match on a large provider at the same ratio as a small one's
// weighs the same load.
func TestAffinityDifferentCapacities(t *testing.T) {
	f := newFixture(t, Config{})
	f.activate("n1", 1, ResourceSpec{ProviderID: "a", Capacity: 2}, ResourceSpec{ProviderID: "b", Capacity: 8})
	f.world.set("fill-a", cand("n1", 1, "a"))
	f.world.set("fill-b", cand("n1", 1, "b"))
	f.admitNow(f.req("fill-a")) // a: 1/2
	for range 4 {
		f.admitNow(f.req("fill-b")) // b: 4/8
	}
	f.world.set("m", cand("n1", 1, "a"), cand("n1", 1, "b"))
	r := f.req("m")
	r.Affinity, r.LoadTokens = affinityOf(map[string]int{"a": 10, "b": 10}), 1000
	// Equal scores and equal ratios: provider id decides.
	if got := f.admitNow(r).Candidate().ProviderID; got != "a" {
		t.Fatalf("chose %s, want a", got)
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
	r.Affinity, r.LoadTokens = affinityOf(map[string]int{"c": 5000}), 100
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
