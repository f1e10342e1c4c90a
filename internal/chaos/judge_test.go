package chaos

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"sort"
	"strings"
	"testing"
	"time"
)

// resumeWithin bounds the time from a fault's reference to the first
// admission on every live edge.
const resumeWithin = sessionTTL + 2*time.Second

// noLeaderWithin bounds the time to a 503 no_leader: 5 s, and half a
// second for the client's own measure on a loaded machine. It runs from
// the later of the request's sending and the last instant the leader
// could answer (docs/several-edges.md: "at most 5 s after the later of its
// arrival and the last answer of the leader it was waiting at"): a request
// that waited in a live leader's queue waited for its turn, not for a
// leader.
const noLeaderWithin = 5*time.Second + 500*time.Millisecond

// never stands for "admission did not resume in the run".
const never = time.Duration(math.MaxInt64)

// figures are one run's worst numbers, one per invariant (0 is good),
// plus counts for the log.
type figures struct {
	overCapacity int           // highest in flight above capacity at sim a or b
	duplicates   int64         // admitted requests whose prompt ran before
	unanswered   int           // no answer within queue_timeout + 5 s, or a broken stream
	wrong        int           // answered, but neither a result nor 429/503 with Retry-After
	phantoms     int           // leases at an edge once the nodes run nothing
	openCircuits int           // most circuits not closed at one edge at once
	resumed      time.Duration // worst edge's time from the reference to a new 200
	noLeader     time.Duration // slowest 503 no_leader (time to its headers from the later of its sending and lostAt)
	keyConc      int           // limited key's peak concurrency above max_concurrent
	keyRate      float64       // limited key's most starts above its rate in any window
	gap          time.Duration // longest time with no new 200 anywhere
	gapWithin    time.Duration // the scenario's bound on gap; 0: not checked
	counts       string
	examples     []string
}

func (f figures) pass() bool {
	return f.overCapacity == 0 && f.duplicates == 0 && f.unanswered == 0 && f.wrong == 0 && f.phantoms == 0 &&
		f.openCircuits == 0 && f.resumed <= resumeWithin && f.noLeader <= noLeaderWithin && f.keyConc == 0 && f.keyRate < 1 &&
		(f.gapWithin == 0 || f.gap <= f.gapWithin)
}

func (f figures) String() string {
	return fmt.Sprintf("over-capacity %d, duplicates %d, unanswered %d, wrong answers %d, phantom leases %d, open circuits %d, resumed %s, no_leader after %s, key concurrency +%d, key rate +%.1f, longest gap %s; %s",
		f.overCapacity, f.duplicates, f.unanswered, f.wrong, f.phantoms, f.openCircuits, dur(f.resumed), dur(f.noLeader), f.keyConc, f.keyRate, dur(f.gap), f.counts)
}

func dur(d time.Duration) string {
	if d == never {
		return "never"
	}
	return fmt.Sprintf("%.1fs", d.Seconds())
}

// judge computes a run's figures once its load has stopped. lostAt is
// the last instant the leader could answer the followers (the fault's
// start, or later: scenario.answersFor); with providersStay a 503
// provider_unavailable is a wrong answer (scenario.providersStay).
func judge(t *testing.T, r *rig, mon *monitor, outs []outcome, loadStart, began, lostAt, ref time.Time, providersStay bool) figures {
	var f figures
	example := func(format string, args ...any) {
		if len(f.examples) < 8 {
			f.examples = append(f.examples, fmt.Sprintf(format, args...))
		}
	}

	// The model servers' own counters, once idle.
	idle := waitUntil(20*time.Second, func() bool {
		for name := range simCaps {
			if s, err := r.simStats(name); err != nil || s.InFlight != 0 {
				return false
			}
		}
		return true
	})
	if !idle {
		example("a model server still runs requests 20 s after the load stopped")
	}
	stats := map[string]simStats{}
	for name := range simCaps {
		s, err := r.simStats(name)
		if err != nil {
			t.Fatalf("sim %s: %v", name, err)
		}
		stats[name] = s
		f.duplicates += s.Repeated
	}
	for _, name := range []string{"a", "b"} {
		if over := stats[name].MaxInFlight - simCaps[name]; over > f.overCapacity {
			f.overCapacity = over
			example("sim %s (capacity %d) ran %d at once", name, simCaps[name], stats[name].MaxInFlight)
		}
	}
	if over := stats["c"].MaxInFlight - limMaxConcurrent; over > 0 {
		f.keyConc = over
		example("key lim (max_concurrent %d) ran %d at once at sim c", limMaxConcurrent, stats["c"].MaxInFlight)
	}

	// Leases once the nodes run nothing: gone within one heartbeat and a
	// grace (the check below says which are left when they are not).
	waitUntil(heartbeatInterval+2*time.Second, func() bool {
		for _, e := range r.edges {
			if e.killed.Load() {
				continue
			}
			if v, err := r.view(e); err != nil || v.Leases > 0 || v.HeldLeases > 0 {
				return false
			}
		}
		return true
	})
	for _, e := range r.edges {
		if e.killed.Load() {
			continue
		}
		v, err := r.view(e)
		if err != nil {
			example("%s: /admin/v1/cluster: %v", e.name, err)
			f.phantoms = max(f.phantoms, 1)
			continue
		}
		if n := max(v.Leases, v.HeldLeases); n > 0 {
			f.phantoms = max(f.phantoms, n)
			example("%s with nothing running: leader %v, leases %d, held_leases %d, runs %d, waiters %d", e.name, v.Leader, v.Leases, v.HeldLeases, v.Runs, v.Waiters)
		}
	}
	mon.sample()
	f.openCircuits = mon.maxOpen
	if mon.maxOpen > 0 {
		example("circuits not closed: %s", mon.openSeen)
	}

	// The clients' view.
	var ok, clean, excused int
	codes := map[string]int{} // clean 429/503 by error code
	var limStarts []time.Time
	var oks []time.Time
	firstOK := map[string]time.Time{}
	byName := map[string]*edge{}
	for _, e := range r.edges {
		byName[e.name] = e
	}
	for _, o := range outs {
		switch {
		case o.excused != "":
			excused++
		case o.header.IsZero() || o.header.Sub(o.sent) > answerWithin || o.err != "":
			f.unanswered++
			example("unanswered: %s %s sent %s: status %d after %s: %s", o.key, o.edge, o.sent.Format("15:04:05.000"), o.status, o.end.Sub(o.sent).Round(time.Millisecond), o.err)
		case o.status == http.StatusOK && o.complete:
			ok++
		case o.status == http.StatusTooManyRequests && o.key == "big" && strings.HasSuffix(errorCode(o.body), "limit_exceeded"):
			// Key big has no limit: a key-limit refusal is wrong.
			f.wrong++
			example("wrong answer: key big (no limits) refused by %s: %.200s", o.edge, o.body)
		case o.status == http.StatusServiceUnavailable && providersStay && errorCode(o.body) == "provider_unavailable":
			f.wrong++
			example("wrong answer: %s %s sent %s: 503 provider_unavailable though every provider stayed: %.200s", o.key, o.edge, o.sent.Format("15:04:05.000"), o.body)
		case (o.status == http.StatusServiceUnavailable || o.status == http.StatusTooManyRequests) && o.retry:
			clean++
			code := errorCode(o.body)
			codes[fmt.Sprintf("%d %s", o.status, code)]++
			if code == "no_leader" && boundsNoLeader(byName[o.edge], o) {
				if d := noLeaderAfter(o, lostAt); d > f.noLeader {
					f.noLeader = d
					if d > noLeaderWithin {
						example("503 no_leader from %s %s after the later of the request and the leader's loss (sent %s, %s after it)", o.edge, dur(d), o.sent.Format("15:04:05.000"), dur(o.header.Sub(o.sent)))
					}
				}
			}
		default:
			f.wrong++
			example("wrong answer: %s %s sent %s: %d after %s: %.200s", o.key, o.edge, o.sent.Format("15:04:05.000"), o.status, o.header.Sub(o.sent).Round(time.Millisecond), o.body)
		}
		if o.status == http.StatusOK && !o.header.IsZero() {
			oks = append(oks, o.header)
			if o.key == "lim" {
				limStarts = append(limStarts, o.header)
			}
			if o.header.After(ref.Add(graceRef)) {
				if was, seen := firstOK[o.edge]; !seen || o.header.Before(was) {
					firstOK[o.edge] = o.header
				}
			}
		}
	}
	for _, e := range r.edges {
		if e.killed.Load() {
			continue
		}
		first, seen := firstOK[e.name]
		d := never
		if seen {
			d = first.Sub(ref)
		}
		if d > f.resumed {
			f.resumed = d
		}
		if d > resumeWithin {
			example("%s admitted nothing until %s after the reference", e.name, dur(d))
		}
	}
	f.keyRate = rateExcess(limStarts)
	if f.keyRate >= 1 {
		example("key lim (%d requests per minute) started %.1f more than its bucket allows in some window", limPerMinute, f.keyRate)
	}
	sort.Slice(oks, func(i, j int) bool { return oks[i].Before(oks[j]) })
	end := outsEnd(outs)
	prev := loadStart.Add(warmUp / 2)
	for _, at := range oks {
		if at.Before(prev) {
			continue
		}
		f.gap = max(f.gap, at.Sub(prev))
		prev = at
	}
	f.gap = max(f.gap, end.Sub(prev))
	f.counts = fmt.Sprintf("%d requests: %d results (key lim: %d), %d clean 429/503 %v, %d to a killed or frozen edge; fault began %s after the load, reference %s after it began",
		len(outs), ok, len(limStarts), clean, codes, excused, began.Sub(loadStart).Round(time.Millisecond), ref.Sub(began).Round(time.Millisecond))
	return f
}

// boundsNoLeader reports whether o's 503 no_leader is held to
// noLeaderWithin: not when its edge e was stopped (SIGSTOP) while o
// waited, since it answers only when it wakes.
func boundsNoLeader(e *edge, o outcome) bool {
	return e == nil || !e.frozenDuring(o.sent, o.header)
}

// noLeaderAfter is how long after the later of its sending and lostAt
// (the leader's last possible answer) the 503 no_leader o came.
func noLeaderAfter(o outcome, lostAt time.Time) time.Duration {
	return o.header.Sub(maxTime(o.sent, lostAt))
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// errorCode is the code (else the type) of an OpenAI error body, "?" if none.
func errorCode(body string) string {
	var e struct {
		Error struct {
			Type string `json:"type"`
			Code any    `json:"code"`
		} `json:"error"`
	}
	if json.Unmarshal([]byte(body), &e) != nil {
		return "?"
	}
	if c, ok := e.Error.Code.(string); ok && c != "" {
		return c
	}
	if e.Error.Type != "" {
		return e.Error.Type
	}
	return "?"
}

// outsEnd is when the last request ended.
func outsEnd(outs []outcome) time.Time {
	var end time.Time
	for _, o := range outs {
		if o.end.After(end) {
			end = o.end
		}
	}
	return end
}

// rateExcess is the most starts (sorted or not) above what a token bucket
// of limPerMinute (burst limPerMinute, refilled limPerMinute a minute)
// allows in any window between two starts. A start is a client's 200
// headers, a little after the leader took the key's token: up to
// limMaxConcurrent requests sit between the two at once (the key's
// concurrency permit is held from the token to the end), so windows
// between headers may hold that many more than windows between tokens;
// they are not counted.
func rateExcess(starts []time.Time) float64 {
	sort.Slice(starts, func(i, j int) bool { return starts[i].Before(starts[j]) })
	worst := 0.0
	for i := range starts {
		for j := i; j < len(starts); j++ {
			allowed := float64(limPerMinute) + starts[j].Sub(starts[i]).Minutes()*limPerMinute
			if over := float64(j-i+1) - allowed - limMaxConcurrent; over > worst {
				worst = over
			}
		}
	}
	return worst
}

// row aggregates one scenario's runs.
type row struct {
	scenario scenario
	runs     int
	passes   int
	worst    figures
}

func (rw *row) add(f figures, ok bool) {
	rw.runs++
	if ok {
		rw.passes++
	}
	w := &rw.worst
	w.overCapacity = max(w.overCapacity, f.overCapacity)
	w.duplicates = max(w.duplicates, f.duplicates)
	w.unanswered = max(w.unanswered, f.unanswered)
	w.wrong = max(w.wrong, f.wrong)
	w.phantoms = max(w.phantoms, f.phantoms)
	w.openCircuits = max(w.openCircuits, f.openCircuits)
	w.resumed = max(w.resumed, f.resumed)
	w.noLeader = max(w.noLeader, f.noLeader)
	w.keyConc = max(w.keyConc, f.keyConc)
	w.keyRate = max(w.keyRate, f.keyRate)
	w.gap = max(w.gap, f.gap)
}

// renderTable is the Markdown table of every scenario's worst figures.
func renderTable(rows []row, runs int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Chaos suite (`make chaos`), %s, %d runs per scenario; worst figure over the runs (0 is good; resumed: at most %s; no_leader after: at most %s from the later of the request and the leader's last possible answer; longest gap with no new result on any edge, checked where a bound is shown).\n\n",
		time.Now().UTC().Format("2006-01-02 15:04 UTC"), runs, dur(resumeWithin), dur(noLeaderWithin))
	b.WriteString("| scenario | runs | passes | over capacity | duplicate runs | unanswered | wrong answers | phantom leases | open circuits | resumed | no_leader after | key concurrency | key rate | longest gap |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, rw := range rows {
		w := rw.worst
		gap := dur(w.gap)
		if rw.scenario.gapWithin > 0 {
			gap += " (≤ " + dur(rw.scenario.gapWithin) + ")"
		}
		fmt.Fprintf(&b, "| %s | %d | %d | %d | %d | %d | %d | %d | %d | %s | %s | +%d | +%.1f | %s |\n",
			rw.scenario.name, rw.runs, rw.passes, w.overCapacity, w.duplicates, w.unanswered, w.wrong, w.phantoms, w.openCircuits,
			dur(w.resumed), dur(w.noLeader), w.keyConc, w.keyRate, gap)
	}
	b.WriteString("\nScenarios: ")
	var what []string
	for _, rw := range rows {
		what = append(what, rw.scenario.name+" = "+rw.scenario.what)
	}
	b.WriteString(strings.Join(what, "; ") + ".\n")
	return b.String()
}

// TestRegression_NoLeaderBoundFromTheLeadersLoss: the judge measured a
// 503 no_leader from the request's sending, so a request that waited in
// a live leader's queue before the leader was lost (cut, quorum: 5.5-5.9 s
// in every run) broke a bound the edges never promised: no_leader comes
// at most 5 s after the later of the request's arrival and the last
// answer of the leader it waited at.
func TestRegression_NoLeaderBoundFromTheLeadersLoss(t *testing.T) {
	lost := time.Date(2026, 12, 6, 7, 0, 0, 0, time.UTC)
	queued := outcome{sent: lost.Add(-900 * time.Millisecond), header: lost.Add(5 * time.Second)}
	if d := noLeaderAfter(queued, lost); d > noLeaderWithin {
		t.Errorf("request queued at the leader 0.9 s before its loss, no_leader 5 s after the loss: measured %s, want within %s", d, noLeaderWithin)
	}
	late := outcome{sent: lost.Add(2 * time.Second), header: lost.Add(8 * time.Second)}
	if d := noLeaderAfter(late, lost); d <= noLeaderWithin {
		t.Errorf("request sent 2 s after the loss, no_leader 6 s later: measured %s, want above %s", d, noLeaderWithin)
	}
}

// TestRegression_NoLeaderOfAFrozenEdgeIsNotBounded: a request sent to the
// leader 0.3 s before it was stopped for 10 s got its 503 no_leader when
// the edge woke, 10.3 s after it was sent (stop10 on 5cb72cf); the judge
// held it to the 5 s bound, which no stopped process can keep (an
// unanswered request to a frozen edge is excused likewise).
func TestRegression_NoLeaderOfAFrozenEdgeIsNotBounded(t *testing.T) {
	sent := time.Date(2026, 12, 6, 7, 7, 55, 867e6, time.UTC)
	e := &edge{name: "edge-a"}
	e.frozenAt.Store(sent.Add(300 * time.Millisecond).UnixNano())
	e.thawedAt.Store(sent.Add(10300 * time.Millisecond).UnixNano())
	o := outcome{edge: e.name, sent: sent, header: sent.Add(10300 * time.Millisecond)}
	if boundsNoLeader(e, o) {
		t.Errorf("no_leader of an edge stopped while the request waited: bounded, want not")
	}
	other := &edge{name: "edge-b"}
	if !boundsNoLeader(other, outcome{edge: other.name, sent: sent, header: sent.Add(6 * time.Second)}) {
		t.Errorf("no_leader of an edge never stopped: not bounded, want bounded")
	}
}
