package scheduler

import (
	"container/heap"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"iop/internal/clock"
)

// batchSim is a discrete-event simulation of the batch band on the real
// scheduler under a fake clock: interactive requests arrive on a fixed
// schedule (or, with poisson, at exponential gaps of the same mean, from
// a fixed seed) at load × the fleet's capacity (each held for service), a
// batch keeps lines queued (line i held for 1 s + (i mod 40) × 50 ms),
// and every grant is held for its service time, then released. No CPU,
// no network: what it measures is the band's rule alone.
type batchSim struct {
	providers, capacity, headroom int
	backoff                       time.Duration // the batch policy's Backoff
	load                          float64
	service                       time.Duration
	length                        time.Duration
	poisson                       bool
}

type simEvent struct {
	at    time.Duration
	lease *Lease
}

type simEvents []simEvent

func (h simEvents) Len() int           { return len(h) }
func (h simEvents) Less(i, j int) bool { return h[i].at < h[j].at }
func (h simEvents) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *simEvents) Push(x any)        { *h = append(*h, x.(simEvent)) }
func (h *simEvents) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}

type simResult struct {
	waits                    []time.Duration // of interactive requests
	busy, batchBusy, elapsed float64         // slot-seconds
}

func (c batchSim) run(tb testing.TB, batch bool) simResult {
	clk := clock.NewFake(time.Unix(0, 0))
	start := clk.Now()
	s, err := New(Config{Clock: clk, Default: Policy{MaxQueue: 1 << 20, QueueTimeout: time.Hour},
		Batch: BatchPolicy{Headroom: c.headroom, MaxQueue: 1 << 20, Backoff: c.backoff}})
	if err != nil {
		tb.Fatal(err)
	}
	var specs []ResourceSpec
	var cands []Candidate
	for i := range c.providers {
		p := fmt.Sprintf("p%d", i)
		specs = append(specs, ResourceSpec{ProviderID: p, Capacity: c.capacity})
		cands = append(cands, cand("n", 1, p))
	}
	if err := s.Activate("n", 1, specs, nil); err != nil {
		tb.Fatal(err)
	}
	resolve := func() ([]Candidate, error) { return slices.Clone(cands), nil }
	var events simEvents
	type pendingW struct {
		w     *waiter
		batch bool
		line  int
		at    time.Duration
	}
	var waiting []pendingW
	var res simResult
	line := 0
	lineService := func(i int) time.Duration { return time.Second + time.Duration(i%40)*50*time.Millisecond }
	hold := func(l *Lease, d time.Duration) {
		heap.Push(&events, simEvent{at: clk.Now().Sub(start) + d, lease: l})
	}
	submit := func(p Priority) {
		req := Request{Group: "m", Priority: p, Resolve: resolve}
		l, w, err := s.enqueue(req)
		if err != nil {
			tb.Fatal(err)
		}
		d := c.service
		if p == PriorityBatch {
			d = lineService(line)
		}
		if l != nil {
			if p != PriorityBatch {
				res.waits = append(res.waits, 0)
			}
			hold(l, d)
		} else {
			waiting = append(waiting, pendingW{w: w, batch: p == PriorityBatch, line: line, at: clk.Now().Sub(start)})
		}
		if p == PriorityBatch {
			line++
		}
	}
	collect := func() {
		kept := waiting[:0]
		for _, pw := range waiting {
			select {
			case r := <-pw.w.ch:
				if r.err != nil {
					tb.Fatal(r.err)
				}
				if pw.batch {
					hold(r.lease, lineService(pw.line))
				} else {
					res.waits = append(res.waits, clk.Now().Sub(start)-pw.at)
					hold(r.lease, c.service)
				}
			default:
				kept = append(kept, pw)
			}
		}
		waiting = kept
	}
	queuedBatch := func() int {
		n := 0
		for _, pw := range waiting {
			if pw.batch {
				n++
			}
		}
		return n
	}
	gap := time.Duration(float64(c.service) / (c.load * float64(c.providers*c.capacity)))
	rng := rand.New(rand.NewPCG(1, 2))
	nextGap := func() time.Duration {
		if c.poisson {
			return time.Duration(rng.ExpFloat64() * float64(gap))
		}
		return gap
	}
	next := time.Duration(0)
	last := time.Duration(0)
	for next < c.length {
		// The next event: an arrival or a release, whichever is first.
		at := next
		release := len(events) > 0 && events[0].at <= next
		if release {
			at = events[0].at
		}
		if d := at - clk.Now().Sub(start); d > 0 {
			snap := s.Snapshot()
			for _, p := range snap.Providers {
				res.busy += float64(p.InFlight) * d.Seconds()
				res.batchBusy += float64(p.BatchInFlight) * d.Seconds()
			}
			clk.Advance(d)
		}
		last = at
		if release {
			e := heap.Pop(&events).(simEvent)
			e.lease.Release("done")
		} else {
			submit(PriorityStandard)
			next += nextGap()
		}
		if batch {
			for queuedBatch() < 8 {
				submit(PriorityBatch)
			}
		}
		collect()
	}
	res.elapsed = last.Seconds()
	return res
}

// BenchmarkBatchBandSimulated reports, for the batch band on the real
// scheduler under a fake clock, the interactive queue wait (p99, and the
// share of requests that waited) with and without a batch, and the share
// of the slots the interactive load leaves idle that the batch held.
// Figures: BENCHMARKS.md, "batch band".
func BenchmarkBatchBandSimulated(b *testing.B) {
	for _, c := range []batchSim{
		{providers: 2, capacity: 8, headroom: 1},
		{providers: 2, capacity: 8, headroom: 2},
		{providers: 2, capacity: 32, headroom: 2},
		{providers: 2, capacity: 32, headroom: 4},
		{providers: 2, capacity: 32, headroom: 8},
		{providers: 2, capacity: 8, headroom: 1, poisson: true},
		{providers: 2, capacity: 8, headroom: 2, poisson: true},
		{providers: 2, capacity: 32, headroom: 2, poisson: true},
		{providers: 2, capacity: 32, headroom: 4, poisson: true},
		{providers: 2, capacity: 32, headroom: 8, poisson: true},
		{providers: 2, capacity: 8, headroom: 1, backoff: 2 * time.Second},
		{providers: 2, capacity: 32, headroom: 2, backoff: 2 * time.Second},
		{providers: 2, capacity: 8, headroom: 1, backoff: 2 * time.Second, poisson: true},
		{providers: 2, capacity: 8, headroom: 2, backoff: 2 * time.Second, poisson: true},
		{providers: 2, capacity: 32, headroom: 2, backoff: 2 * time.Second, poisson: true},
		{providers: 2, capacity: 32, headroom: 4, backoff: 2 * time.Second, poisson: true},
		{providers: 2, capacity: 8, headroom: 1, backoff: 5 * time.Second},
		{providers: 2, capacity: 32, headroom: 2, backoff: 5 * time.Second},
		{providers: 2, capacity: 8, headroom: 1, backoff: 5 * time.Second, poisson: true},
		{providers: 2, capacity: 8, headroom: 2, backoff: 5 * time.Second, poisson: true},
		{providers: 2, capacity: 32, headroom: 2, backoff: 5 * time.Second, poisson: true},
		{providers: 2, capacity: 32, headroom: 4, backoff: 5 * time.Second, poisson: true},
		{providers: 2, capacity: 8, headroom: 1, backoff: time.Second, poisson: true},
		{providers: 2, capacity: 32, headroom: 2, backoff: time.Second, poisson: true},
		{providers: 2, capacity: 8, headroom: 1, backoff: 10 * time.Second, poisson: true},
		{providers: 2, capacity: 32, headroom: 2, backoff: 10 * time.Second, poisson: true},
		{providers: 2, capacity: 8, headroom: 1, backoff: time.Second},
		{providers: 2, capacity: 8, headroom: 1, backoff: 10 * time.Second},
	} {
		c.load, c.service, c.length = 0.6, 1150*time.Millisecond, 10*time.Minute
		arrivals := "fixed"
		if c.poisson {
			arrivals = "poisson"
		}
		b.Run(fmt.Sprintf("%s/capacity=%dx%d/headroom=%d/backoff=%s", arrivals, c.providers, c.capacity, c.headroom, c.backoff), func(b *testing.B) {
			var alone, with simResult
			for range b.N {
				alone, with = c.run(b, false), c.run(b, true)
			}
			capacity := float64(c.providers * c.capacity)
			idle := capacity - (with.busy-with.batchBusy)/with.elapsed
			b.ReportMetric(float64(p99(alone.waits).Milliseconds()), "alone-p99-wait-ms")
			b.ReportMetric(100*waited(alone.waits), "alone-waited-%")
			b.ReportMetric(float64(p99(with.waits).Milliseconds()), "batch-p99-wait-ms")
			b.ReportMetric(100*waited(with.waits), "batch-waited-%")
			b.ReportMetric(100*(with.batchBusy/with.elapsed)/idle, "batch-use-of-idle-%")
		})
	}
}

func p99(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, len(s)*99/100)]
}

func waited(ds []time.Duration) float64 {
	n := 0
	for _, d := range ds {
		if d > 0 {
			n++
		}
	}
	return float64(n) / float64(max(len(ds), 1))
}
