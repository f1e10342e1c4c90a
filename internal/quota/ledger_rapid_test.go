package quota

import (
	"math"
	"strconv"
	"testing"
	"time"

	"pgregory.net/rapid"

	"iop/internal/clock"
)

// modelRes is the test's own record of one reservation or settlement.
type modelRes struct {
	key     string
	ask     Usage
	res     *Reservation
	at      time.Time // of the settlement
	used    Usage
	reqs    int64
	settled bool
	// lost: a request of a leader that died, which ran to its end while
	// no ledger counted it (its usage is known to the model only).
	lost bool
}

// rig is a Ledger beside a model of what it must hold.
type rig struct {
	clk     *clock.Fake
	l       *Ledger
	keys    map[string]Scope
	teams   map[string]Scope
	prices  map[string]Price
	open    []*modelRes // reservations not settled
	done    []*modelRes // settled, with their usage
	doubles int
	// filledUntil: the minute windows were filled (Fill) and may refuse
	// anything until then.
	filledUntil time.Time
}

// amount is u's amount (of reqs requests) in window w of a scope
// counting tokens as tokens says, computed independently of the ledger.
func (g *rig) amount(w int, tokens string, u Usage, reqs int64) int64 {
	switch Windows[w].Unit {
	case "tokens":
		switch tokens {
		case CountInput:
			return u.InputTokens
		case CountOutput:
			return u.OutputTokens
		}
		return u.InputTokens + u.OutputTokens
	case "requests":
		return reqs
	case "gpu_ms":
		cw := u.CostWeight
		if cw <= 0 {
			cw = 1
		}
		return int64(math.Ceil(float64(u.SlotTime.Milliseconds()) * cw))
	}
	p := g.prices[u.Model]
	return int64(math.Ceil(float64(u.InputTokens)*p.Input + float64(u.OutputTokens)*p.Output))
}

// used is the exact amount of window w of a scope: settlements within
// the window's length before now (within extra more, for the liveness
// bound), plus the open reservations.
func (g *rig) used(w int, s Scope, member func(key string) bool, extra time.Duration) int64 {
	now := g.clk.Now()
	var n int64
	for _, d := range g.done {
		if d.lost && Windows[w].Length > time.Minute {
			continue // the documented slack of the longer windows
		}
		if member(d.key) && d.at.After(now.Add(-Windows[w].Length-extra)) {
			n += g.amount(w, s.TokensCounted, d.used, d.reqs)
		}
	}
	for _, o := range g.open {
		if member(o.key) {
			n += g.amount(w, s.TokensCounted, o.res.Ask(), 1)
		}
	}
	return n
}

// each calls f for every scope with its membership test.
func (g *rig) each(f func(name string, s Scope, member func(string) bool)) {
	for name, s := range g.keys {
		f("key "+name, s, func(k string) bool { return k == name })
	}
	for name, s := range g.teams {
		f("team "+name, s, func(k string) bool { return g.keys[k].Team == name })
	}
}

// check asserts the invariant: every limited window's settled + reserved
// ≤ limit, and the ledger's counts agree with the model's.
func (g *rig) check(t *rapid.T) {
	g.each(func(name string, s Scope, member func(string) bool) {
		for w := range NumWindows {
			if lim := s.Bounds[w]; lim > 0 {
				if u := g.used(w, s, member, 0); u > lim {
					t.Fatalf("%s: %s settled+reserved %d > limit %d at %s", name, Windows[w].Name, u, lim, g.clk.Now())
				}
			}
		}
	})
	st := g.l.Stats()
	if st.Outstanding != len(g.open) || st.DoubleSettles != g.doubles || st.Overruns != 0 {
		t.Fatalf("stats %+v, model: %d open, %d double settles", st, len(g.open), g.doubles)
	}
}

// mustFit reports whether the ledger must hold ask for key: every
// window fits it even counting settlements one granule longer than their
// window.
func (g *rig) mustFit(key string, ask Usage) bool {
	if g.clk.Now().Before(g.filledUntil) {
		return false
	}
	fits := true
	g.each(func(name string, s Scope, member func(string) bool) {
		if !member(key) {
			return
		}
		for w := range NumWindows {
			lim := s.Bounds[w]
			if lim == 0 {
				continue
			}
			a := g.amount(w, s.TokensCounted, ask, 1)
			if a > 0 && g.used(w, s, member, Windows[w].Length/granules)+a > lim {
				fits = false
			}
		}
	})
	return fits
}

func genBounds(t *rapid.T, label string) Scope {
	var b Bounds
	for w := range NumWindows {
		if rapid.Bool().Draw(t, label+"_has_"+Windows[w].Name) {
			hi := int64(200)
			switch Windows[w].Unit {
			case "requests":
				hi = 8
			case "gpu_ms":
				hi = 20_000
			}
			b[w] = rapid.Int64Range(1, hi).Draw(t, label+"_"+Windows[w].Name)
		}
	}
	return Scope{Bounds: b, TokensCounted: rapid.SampledFrom([]string{"", CountTotal, CountInput, CountOutput}).Draw(t, label+"_counted")}
}

func genUsage(t *rapid.T, label string) Usage {
	return Usage{
		Model:        rapid.SampledFrom([]string{"priced", "free", "unpriced"}).Draw(t, label+"_model"),
		InputTokens:  rapid.Int64Range(0, 60).Draw(t, label+"_in"),
		OutputTokens: rapid.Int64Range(0, 80).Draw(t, label+"_out"),
		SlotTime:     time.Duration(rapid.Int64Range(0, 5000).Draw(t, label+"_slot_ms")) * time.Millisecond,
		CostWeight:   rapid.SampledFrom([]float64{0, 1, 0.5, 2.5}).Draw(t, label+"_weight"),
	}
}

// below draws a usage no larger than u in any part (an actual usage of
// a request that reserved u).
func below(t *rapid.T, u Usage) Usage {
	return Usage{
		Model:        u.Model,
		InputTokens:  rapid.Int64Range(0, u.InputTokens).Draw(t, "actual_in"),
		OutputTokens: rapid.Int64Range(0, u.OutputTokens).Draw(t, "actual_out"),
		SlotTime:     time.Duration(rapid.Int64Range(0, int64(u.SlotTime)).Draw(t, "actual_slot")),
		CostWeight:   u.CostWeight,
	}
}

func (g *rig) reserve(t *rapid.T, upTo bool) {
	key := rapid.SampledFrom([]string{"a", "b", "solo"}).Draw(t, "key")
	ask := genUsage(t, "ask")
	must := g.mustFit(key, ask)
	var r *Reservation
	var err error
	if upTo {
		r, err = g.l.ReserveUpTo(key, ask, 1)
		if err == nil && (r.Ask().OutputTokens > ask.OutputTokens || r.Ask().OutputTokens < 1 && ask.OutputTokens >= 1) {
			t.Fatalf("ReserveUpTo(%+v) reserved %d output tokens", ask, r.Ask().OutputTokens)
		}
	} else {
		r, err = g.l.Reserve(key, ask)
		if err != nil && must {
			t.Fatalf("Reserve(%s, %+v) refused, though every window holds it: %v", key, ask, err)
		}
		if err == nil && r.Ask() != ask {
			t.Fatalf("Reserve changed the ask: %+v, want %+v", r.Ask(), ask)
		}
	}
	if err != nil {
		ref, ok := err.(*Refusal)
		if !ok || ref.Asked <= 0 || (!ref.Never && ref.Used+ref.Asked <= ref.Limit) || (ref.Never && ref.Asked <= ref.Limit) ||
			(!ref.Never && !ref.ResetAt.After(g.clk.Now())) {
			t.Fatalf("refusal %#v", err)
		}
		return
	}
	g.open = append(g.open, &modelRes{key: key, ask: ask, res: r})
}

func (g *rig) settle(t *rapid.T, cancel bool) {
	if len(g.open) == 0 {
		t.Skip("nothing to settle")
	}
	i := rapid.IntRange(0, len(g.open)-1).Draw(t, "which")
	o := g.open[i]
	g.open = append(g.open[:i:i], g.open[i+1:]...)
	o.at = g.clk.Now()
	if cancel {
		o.res.Cancel()
	} else {
		o.used, o.reqs = below(t, o.res.Ask()), 1
		o.res.Settle(o.used)
	}
	o.settled = true
	g.done = append(g.done, o)
}

// failover replaces the ledger by a new one rebuilt the way a new
// leader rebuilds it: the settled usage from the usage ledger, every
// run in flight adopted with its reservation, and the minute windows
// filled while requests lost by an earlier leader may count in them.
func (g *rig) failover() {
	l := New(Config{Clock: g.clk})
	l.Configure(g.keys, g.teams, g.prices)
	for _, d := range g.done {
		if d.reqs > 0 && !d.lost { // a lost request is in no usage ledger
			l.Restore(d.key, d.at, d.used, 1)
		}
	}
	for _, o := range g.open {
		o.res = l.Adopt(o.key, o.res.Ask())
	}
	if g.clk.Now().Before(g.filledUntil) {
		// Requests lost within the minute: this leader fills it too.
		l.Fill(time.Minute)
		g.filledUntil = g.clk.Now().Add(time.Minute + time.Minute/granules)
	}
	g.l, g.doubles = l, 0
}

// leaderLost rebuilds the same ledger the way a new leader does after
// another leader died: Reset, Restore of what the usage ledger has
// (every settlement but the lost ones), Adopt of the followers' holds;
// the old leader's own requests in flight (a random part of the open
// ones) are lost: they ran to an end no ledger counted (here: now, as
// much as they reserved at most). Then Fill of the minute windows.
func (g *rig) leaderLost(t *rapid.T) {
	g.l.Reset()
	for _, d := range g.done {
		if d.reqs > 0 && !d.lost {
			g.l.Restore(d.key, d.at, d.used, 1)
		}
	}
	var open []*modelRes
	for i, o := range g.open {
		if rapid.Bool().Draw(t, "lost_"+strconv.Itoa(i)) {
			o.lost, o.settled, o.at, o.reqs = true, true, g.clk.Now(), 1
			o.used = below(t, o.res.Ask())
			o.res = Held(o.ask, nil) // the dead leader's: settling it does nothing
			g.done = append(g.done, o)
			continue
		}
		o.res = g.l.Adopt(o.key, o.res.Ask())
		open = append(open, o)
	}
	g.open = open
	g.l.Fill(time.Minute)
	g.filledUntil = g.clk.Now().Add(time.Minute + time.Minute/granules)
}

// TestLedgerInvariants drives a ledger with random reservations,
// settlements, cancels, double settles, clock advances and failovers,
// and checks after every step that no window of a key or a team holds
// more than its limit (settled in the window + reserved), that a
// reservation every window holds is not refused, and that every
// reservation is settled exactly once.
func TestLedgerInvariants(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		clk := clock.NewFake(time.Date(2026, 3, 1, 23, 59, 30, 0, time.UTC))
		g := &rig{clk: clk, l: New(Config{Clock: clk})}
		team := genBounds(t, "team")
		a, b, solo := genBounds(t, "a"), genBounds(t, "b"), genBounds(t, "solo")
		a.Team, b.Team = "t", "t"
		g.keys = map[string]Scope{"a": a, "b": b, "solo": solo}
		g.teams = map[string]Scope{"t": team}
		g.prices = map[string]Price{"priced": {Input: rapid.Float64Range(0, 3).Draw(t, "price_in"), Output: rapid.Float64Range(0, 5).Draw(t, "price_out")}, "free": {}}
		g.l.Configure(g.keys, g.teams, g.prices)
		t.Repeat(map[string]func(*rapid.T){
			"reserve":     func(t *rapid.T) { g.reserve(t, false) },
			"reserveUpTo": func(t *rapid.T) { g.reserve(t, true) },
			"settle":      func(t *rapid.T) { g.settle(t, false) },
			"cancel":      func(t *rapid.T) { g.settle(t, true) },
			"settleAgain": func(t *rapid.T) {
				if len(g.done) == 0 {
					t.Skip("nothing settled")
				}
				d := rapid.SampledFrom(g.done).Draw(t, "again")
				if rapid.Bool().Draw(t, "again_cancel") {
					d.res.Cancel()
				} else {
					d.res.Settle(d.used)
				}
				if d.res.l == g.l && !d.lost {
					g.doubles++
				}
			},
			"advance": func(t *rapid.T) {
				d := rapid.SampledFrom([]time.Duration{300 * time.Millisecond, time.Second, 7 * time.Second, 59*time.Second + 700*time.Millisecond, 23*time.Hour + 50*time.Minute, 30*24*time.Hour - 5*time.Minute, 30 * time.Second, time.Minute, 61 * time.Second, time.Hour, 24 * time.Hour, 25 * time.Hour, 31 * 24 * time.Hour}).Draw(t, "advance")
				clk.Advance(d)
			},
			"failover":   func(t *rapid.T) { g.failover() },
			"leaderLost": func(t *rapid.T) { g.leaderLost(t) },
			"":           g.check,
		})
		for _, o := range g.open {
			o.res.Settle(below(t, o.res.Ask()))
		}
		g.open = nil
		if st := g.l.Stats(); st.Outstanding != 0 {
			t.Fatalf("%d reservations outstanding after every one settled", st.Outstanding)
		}
		for _, ws := range g.l.All() {
			if ws.Used < 0 {
				t.Fatalf("%s %s %s used %d", ws.Scope, ws.Name, ws.Window.Name, ws.Used)
			}
		}
	})
}
