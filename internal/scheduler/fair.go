package scheduler

import (
	"fmt"
	"time"
)

// Priority is a request's priority band: the queue orders waiters by band
// first (waiter.before). The zero value is PriorityStandard.
type Priority int8

// Priority bands, highest first in the queue.
const (
	// PriorityBatch waits behind every interactive band (every other one)
	// and takes a slot only where no interactive waiter could use it and
	// its provider keeps the batch headroom free after it (BatchPolicy);
	// FIFO within the band, never displaced by an interactive arrival. Its
	// queue bound and timeout are the BatchPolicy's, not the group's.
	PriorityBatch Priority = -2
	// PrioritySheddable waits behind every other band, is displaced from a
	// full queue by a higher arrival, and is refused at once when its
	// expected queue time passes its queue timeout.
	PrioritySheddable Priority = -1
	// PriorityStandard is every request's band unless configured otherwise.
	PriorityStandard Priority = 0
	// PriorityCritical waits ahead of every other band.
	PriorityCritical Priority = 1
)

// String returns the configuration name: "critical", "standard" or
// "sheddable"; "batch" for PriorityBatch, which no configuration names.
func (p Priority) String() string {
	switch p {
	case PriorityBatch:
		return "batch"
	case PriorityCritical:
		return "critical"
	case PrioritySheddable:
		return "sheddable"
	case PriorityStandard:
		return "standard"
	}
	return fmt.Sprintf("priority(%d)", int8(p))
}

// ParsePriority reads a configuration name (String's, but "batch": only
// the batch runner asks for PriorityBatch); "" is PriorityStandard. Any
// other name returns an error wrapping ErrInvalid.
func ParsePriority(s string) (Priority, error) {
	switch s {
	case "critical":
		return PriorityCritical, nil
	case "standard", "":
		return PriorityStandard, nil
	case "sheddable":
		return PrioritySheddable, nil
	}
	return PriorityStandard, fmt.Errorf("%w: priority %q is none of critical, standard, sheddable", ErrInvalid, s)
}

func (p Priority) valid() bool { return p >= PriorityBatch && p <= PriorityCritical }

// band is p's place in a heap: 0 for critical, 1 standard, 2 sheddable,
// batchBand for batch. Each band is its own fair queue (flow, group and
// resource vtimes by band).
func (p Priority) band() uint8 { return uint8(PriorityCritical - p) }

// batchBand is PriorityBatch's band.
const batchBand = uint8(PriorityCritical - PriorityBatch)

// bands counts the bands: the three interactive ones and batchBand.
const bands = int(batchBand) + 1

// Fairness says how one group orders its waiters (Policy.Fairness).
type Fairness string

const (
	// FairnessDefault, in a Config's Default, means FairnessOff; in a
	// group's policy, the Default's; in UpdatePolicy, unchanged.
	FairnessDefault Fairness = ""
	// FairnessOn: weighted fair order between flows, FIFO within a flow.
	FairnessOn Fairness = "on"
	// FairnessOff: FIFO within each priority band, as if every waiter were
	// of one flow; where every group is off, the queue is global FIFO
	// within each band, exactly as without flows.
	FairnessOff Fairness = "off"
)

func (f Fairness) validate() error {
	switch f {
	case FairnessDefault, FairnessOn, FairnessOff:
		return nil
	}
	return fmt.Errorf("%w: fairness %q is neither on nor off", ErrInvalid, string(f))
}

// tagUnit is the virtual-time cost of one request of a flow of weight 1;
// a flow of weight w pays tagUnit/w. MaxWeight bounds w so that the cost
// stays ≥ 1.
const (
	tagUnit   = 1 << 20
	MaxWeight = 1 << 16
)

// DefaultFlow names the flow of requests that carry none.
const DefaultFlow = ""

// flow is the fair-queueing state of one flow of one group: the virtual
// finish tag of its latest waiter and its queued waiters by band. It exists
// only while the flow has a waiter (so the flows of a group are bounded by
// its queue): a flow that empties is forgotten, and its next waiter starts
// at the group's virtual time, as a flow that was idle does in start-time
// fair queueing.
type flow struct {
	name   string
	weight uint64        // of its latest waiter, 1..MaxWeight
	finish [bands]uint64 // by band
	queued [bands]int    // by band
	total  int           // its waiters of the interactive bands (what MaxQueue bounds)
	// head, tail: its waiters by band, in enqueue order (waiter.prevFlow).
	head, tail [bands]*waiter
}

func weightOf(w int) uint64 { return uint64(min(max(w, 1), MaxWeight)) }

// fairTagLocked sets w's start tag (w.tag) and advances its flow's finish
// tag, in w's band: start = max(group virtual time, flow's finish), finish =
// start + tagUnit/weight (start-time fair queueing, Goyal, Vin and Cheng
// 1996). Each band of each group is its own fair queue, with its own
// virtual time, so grants in one band never push back another's. A group
// with fairness off tags every waiter 0, so its waiters are FIFO by seq
// within each band. A band of a group that had no waiter first catches up
// with the largest virtual time, in that band, of the resources w can use:
// it does not jump ahead of the waiters other groups have there, and it
// waits behind them no longer than its fair share (on at least the
// resource whose virtual time it took). So backlogged flows get slots in
// proportion to their weights, within 1/w_a + 1/w_b of it over any
// interval (TestFairModel), and FIFO within a flow.
func (s *Scheduler) fairTagLocked(w *waiter, cands []choice) {
	g := w.group
	if w.band == batchBand {
		g.batchQueued++
	}
	f := g.flows[w.req.Flow]
	if f == nil {
		f = &flow{name: w.req.Flow}
		g.flows[w.req.Flow] = f
	}
	b := w.band
	w.flow = f
	f.queued[b]++
	if b != batchBand {
		f.total++
	}
	f.weight = weightOf(w.req.Weight)
	w.prevFlow = f.tail[b]
	if f.tail[b] != nil {
		f.tail[b].nextFlow = w
	} else {
		f.head[b] = w
	}
	f.tail[b] = w
	idle := g.bandQueued[b] == 0
	g.bandQueued[b]++
	if g.policy.Fairness != FairnessOn {
		return
	}
	if idle {
		for _, c := range cands {
			g.vtime[b] = max(g.vtime[b], c.res.vtime[b])
		}
	}
	w.tag = max(g.vtime[b], f.finish[b])
	f.finish[b] = w.tag + tagUnit/f.weight
}

// fairGrantedLocked advances the virtual times of w's group and of r, the
// resource w was granted, to w's start tag.
func fairGrantedLocked(w *waiter, r *resource) {
	w.group.vtime[w.band] = max(w.group.vtime[w.band], w.tag)
	r.vtime[w.band] = max(r.vtime[w.band], w.tag)
}

// fairUnlinkLocked takes w out of its flow's counts and out of its group's
// sheddable list. A w that leaves without a slot (timeout, cancel, shed,
// failure) and is its flow's latest in its band gives its cost back, so a
// flow does not pay for requests it was never served; one that leaves from
// the middle of its flow leaves a gap its later waiters pay for (bounded by
// the queue limit). A flow's band left empty forgets its finish tag, and a
// flow left with no waiter is forgotten.
func fairUnlinkLocked(w *waiter) {
	g, f := w.group, w.flow
	if w.band == batchBand {
		g.batchQueued--
	}
	if f != nil {
		b := w.band
		if w.state != granted && g.policy.Fairness == FairnessOn && f.finish[b] > w.tag &&
			f.finish[b]-w.tag == tagUnit/weightOf(w.req.Weight) {
			f.finish[b] = w.tag
		}
		if w.prevFlow != nil {
			w.prevFlow.nextFlow = w.nextFlow
		} else {
			f.head[b] = w.nextFlow
		}
		if w.nextFlow != nil {
			w.nextFlow.prevFlow = w.prevFlow
		} else {
			f.tail[b] = w.prevFlow
		}
		w.prevFlow, w.nextFlow = nil, nil
		g.bandQueued[b]--
		f.queued[b]--
		if f.queued[b] == 0 {
			f.finish[b] = 0
		}
		if b != batchBand {
			f.total--
		}
		if f.total == 0 && f.queued[batchBand] == 0 && g.flows[f.name] == f {
			delete(g.flows, f.name)
		}
		w.flow = nil
	}
	if w.req.Priority == PrioritySheddable {
		if w.prevShed != nil {
			w.prevShed.nextShed = w.nextShed
		} else {
			g.shedHead = w.nextShed
		}
		if w.nextShed != nil {
			w.nextShed.prevShed = w.prevShed
		} else {
			g.shedTail = w.prevShed
		}
		w.prevShed, w.nextShed = nil, nil
	}
}

// linkShedLocked appends a sheddable w to its group's sheddable list.
func linkShedLocked(w *waiter) {
	g := w.group
	w.prevShed = g.shedTail
	if g.shedTail != nil {
		g.shedTail.nextShed = w
	} else {
		g.shedHead = w
	}
	g.shedTail = w
}

// serviceAlpha is the weight of a new observation in a group's mean
// service time: an exponentially weighted moving average over roughly the
// last 8 leases.
const serviceAlpha = 8

// observeServiceLocked folds d, how long one lease of g was held, into g's
// mean service time.
func observeServiceLocked(g *group, d time.Duration) {
	if d < 0 {
		d = 0
	}
	if g.leases == 0 {
		g.service = d
	} else {
		g.service += (d - g.service) / serviceAlpha
	}
	g.leases++
}

// expectedWaitLocked estimates how long a request of g arriving now would
// wait for a slot of one of cands: every waiter already in g's queue ahead
// of it, and itself, served at the group's mean service time by the
// candidates' total capacity:
//
//	(queued + 1) × mean service time / Σ capacity
//
// It reports false while g has released no lease yet (nothing observed).
func expectedWaitLocked(g *group, cands []Candidate, resources map[resourceKey]*resource) (time.Duration, bool) {
	if g.leases == 0 {
		return 0, false
	}
	capacity := 0
	for _, c := range cands {
		if r := resources[resourceKey{c.NodeID, c.ProviderID}]; r != nil {
			capacity += r.capacity
		}
	}
	if capacity == 0 {
		return 0, false
	}
	return time.Duration(int64(g.interactive()+1) * int64(g.service) / int64(capacity)), true
}

// observeLocked folds how long the released l was held into its group's
// mean service time, if the group exists (it has queued once). Leases a
// Fence releases are not observed: they say nothing of service times.
func (s *Scheduler) observeLocked(l *Lease) {
	if g := s.groups[l.info.Group]; g != nil {
		observeServiceLocked(g, s.clock.Now().Sub(l.start))
	}
}

// pushOutLocked makes room in g's full queue for req, a request of a fair
// group, by longest-queue drop: the flow that holds the most of the queue
// for its weight (queued/weight, all bands), among those with a waiter of
// req's band or lower, loses its latest such waiter (of the lowest band)
// with ErrQueueFull, if that flow would still hold more than req's flow
// once req is queued (queued_h/w_h > (queued_req+1)/w_req). So a flow that
// floods a queue cannot keep another's requests out of it. It reports
// whether it made room. It costs O(flows of g).
func (s *Scheduler) pushOutLocked(g *group, req Request) bool {
	qa := uint64(0)
	if fa := g.flows[req.Flow]; fa != nil {
		qa = uint64(fa.total)
	}
	wa, band := weightOf(req.Weight), int(req.Priority.band())
	var victim *waiter
	var vq, vw uint64
	for _, f := range g.flows {
		if f.name == req.Flow {
			continue
		}
		var last *waiter
		for b := 2; b >= band && last == nil; b-- {
			last = f.tail[b]
		}
		if last == nil {
			continue
		}
		if q := uint64(f.total); victim == nil || q*vw > vq*f.weight {
			victim, vq, vw = last, q, f.weight
		}
	}
	if victim == nil || vq*wa <= (qa+1)*vw {
		return false
	}
	s.failLocked(victim, fmt.Errorf("model %q: %w: flow %q holds the most of the queue; its latest request made room for flow %q's",
		g.name, ErrQueueFull, victim.flow.name, req.Flow))
	return true
}
