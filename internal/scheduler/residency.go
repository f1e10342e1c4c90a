package scheduler

import (
	"fmt"
	"math"
	"slices"
	"time"
)

// Residency defaults (ResidencyPolicy).
const (
	DefaultMaxExtraWait = 10 * time.Second
	DefaultLoadTime     = 5 * time.Second
)

// ResidencyPolicy turns on residency-aware routing (package doc,
// "Residency"). Zero fields take the defaults.
type ResidencyPolicy struct {
	// MaxExtraWait bounds, per request, how long it may be passed over by
	// requests for models a provider holds (batch by model) or wait for a
	// provider that holds its model rather than load it on a free one;
	// default DefaultMaxExtraWait.
	MaxExtraWait time.Duration
	// LoadTime is the cost assumed for loading a model where none was
	// observed (ObserveLoad); default DefaultLoadTime.
	LoadTime time.Duration
}

func (p ResidencyPolicy) validate() error {
	if p.MaxExtraWait < 0 || p.LoadTime < 0 {
		return fmt.Errorf("%w: residency: negative max_extra_wait or load_time", ErrInvalid)
	}
	return nil
}

func (p ResidencyPolicy) withDefaults() ResidencyPolicy {
	if p.MaxExtraWait == 0 {
		p.MaxExtraWait = DefaultMaxExtraWait
	}
	if p.LoadTime == 0 {
		p.LoadTime = DefaultLoadTime
	}
	return p
}

// holding is what the scheduler believes a provider holds loaded: the
// node's latest reading, plus the loads its own grants started since. A
// resource without one (a provider whose node reads no residency, such as
// an OpenAI-compatible server) holds every model it serves.
type holding struct {
	models []heldModel // at most limit() once a limit is known
	// maxLoaded is the configured limit (0: none); learned is the most
	// models ever read loaded at once.
	maxLoaded, learned int
	loadTime           map[string]time.Duration // observed, by served model
	loads, evictions   uint64                   // predicted by grants
}

type heldModel struct {
	name    string
	used    uint64 // the scheduler's lease sequence at its last grant
	loading bool   // a grant started its load; no reading shows it yet
	// demand counts its grants on the provider, each decayed by
	// e^(−age/MaxExtraWait) (demandLocked), as of demandAt.
	demand   float64
	demandAt time.Time
}

// demandLocked is m's demand on its provider now: its grants there, each
// weighing e^(−age/MaxExtraWait), about how many of its requests the
// provider served in the last MaxExtraWait.
func (s *Scheduler) demandLocked(m *heldModel) float64 {
	if m.demand == 0 {
		return 0
	}
	age := s.clock.Now().Sub(m.demandAt)
	return m.demand * math.Exp(-float64(age)/float64(s.maxExtraWait()))
}

// maxExtraWait is the policy's MaxExtraWait, else its default (demand is
// counted with residency off too).
func (s *Scheduler) maxExtraWait() time.Duration {
	if s.residency != nil {
		return s.residency.MaxExtraWait
	}
	return DefaultMaxExtraWait
}

// grantedLocked adds a grant to m's demand.
func (s *Scheduler) grantedLocked(m *heldModel) {
	m.demand = s.demandLocked(m) + 1
	m.demandAt = s.clock.Now()
}

// limit is how many models the provider holds at once: configured, else
// learned, else 0 (unknown: no eviction is predicted).
func (h *holding) limit() int {
	if h.maxLoaded > 0 {
		return h.maxLoaded
	}
	return h.learned
}

func (h *holding) index(name string) int {
	return slices.IndexFunc(h.models, func(m heldModel) bool { return m.name == name })
}

// holds reports whether r holds model loaded (or is loading it).
func (r *resource) holds(model string) bool {
	return r.held == nil || r.held.index(model) >= 0
}

// loadTimeLocked is the expected cost of loading model on r.
func (s *Scheduler) loadTimeLocked(r *resource, model string) time.Duration {
	if r.held != nil {
		if d, ok := r.held.loadTime[model]; ok {
			return d
		}
	}
	return s.residency.LoadTime
}

// hotOn reports whether w needs no load on r: one of its candidates on r
// names a model r holds.
func (w *waiter) hotOn(r *resource) bool {
	for _, c := range w.cands {
		if c.res == r && r.holds(c.Target) {
			return true
		}
	}
	return false
}

// overdueLocked reports whether w has waited MaxExtraWait: it may not be
// passed over any more. A batch waiter is never overdue: it may always be
// passed over for a request its provider holds the model of, and never
// forces a swap that waits for another model's runs (evictBusy).
func (s *Scheduler) overdueLocked(w *waiter) bool {
	return w.band != batchBand && s.clock.Now().Sub(w.enqueued) >= s.residency.MaxExtraWait
}

// SetResidencyPolicy turns residency-aware routing on (p) or off (nil) for
// later decisions; what the scheduler believes providers hold is kept
// either way. It returns an error wrapping ErrInvalid for a negative field.
func (s *Scheduler) SetResidencyPolicy(p *ResidencyPolicy) error {
	if p != nil {
		if err := p.validate(); err != nil {
			return err
		}
		d := p.withDefaults()
		p = &d
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.residency = p
	return nil
}

// SetLoaded records a reading of the models provider providerID of node
// holds loaded (served names) and its configured limit, maxLoaded (0:
// learn it, as the most models read loaded at once). Models with leases
// in flight there stay held (their load may not show yet); beyond the
// limit the least recently used others are dropped. From then on the
// provider holds only what it is read or granted to hold (before, every
// model). Then r's free slots are offered again. It returns an error
// wrapping ErrUnknownResource for a provider never activated.
func (s *Scheduler) SetLoaded(nodeID, providerID string, loaded []string, maxLoaded int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.resources[resourceKey{nodeID, providerID}]
	if r == nil {
		return fmt.Errorf("%w: node %q provider %q", ErrUnknownResource, nodeID, providerID)
	}
	h := r.held
	if h == nil {
		h = &holding{loadTime: make(map[string]time.Duration)}
		r.held = h
	}
	h.maxLoaded = max(maxLoaded, 0)
	h.learned = max(h.learned, len(loaded))
	old := h.models
	models := make([]heldModel, 0, len(loaded)+1)
	add := func(name string, loading bool) {
		if slices.ContainsFunc(models, func(m heldModel) bool { return m.name == name }) {
			return
		}
		m := heldModel{name: name, used: s.leaseSeq, loading: loading}
		if i := slices.IndexFunc(old, func(o heldModel) bool { return o.name == name }); i >= 0 {
			m.used, m.demand, m.demandAt = old[i].used, old[i].demand, old[i].demandAt
		}
		models = append(models, m)
	}
	for _, name := range loaded {
		add(name, false)
	}
	for l := r.leases.head; l != nil; l = l.next {
		add(l.info.Target, true)
	}
	h.models = models
	s.trimLocked(r)
	s.pumpResourceLocked(r)
	return nil
}

// ObserveLoad records that loading model on provider providerID of node
// took d (a cold run's delay to its first output): later decisions expect
// the mean of it and the earlier observation. Unknown providers, or ones
// whose residency is not read, are ignored.
func (s *Scheduler) ObserveLoad(nodeID, providerID, model string, d time.Duration) {
	if d <= 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.resources[resourceKey{nodeID, providerID}]
	if r == nil || r.held == nil {
		return
	}
	if old, ok := r.held.loadTime[model]; ok {
		d = (old + d) / 2
	}
	r.held.loadTime[model] = d
}

// touchLocked records a grant of model on r: a model r holds becomes the
// most recently used; another starts loading (a load), evicting the least
// recently used one beyond the limit. It reports whether the grant loads.
func (s *Scheduler) touchLocked(r *resource, model string) bool {
	h := r.held
	if h == nil {
		return false
	}
	if i := h.index(model); i >= 0 {
		h.models[i].used = s.leaseSeq
		s.grantedLocked(&h.models[i])
		return false
	}
	h.models = append(h.models, heldModel{name: model, used: s.leaseSeq, loading: true})
	s.grantedLocked(&h.models[len(h.models)-1])
	h.loads++
	s.trimLocked(r)
	return true
}

// trimLocked drops r's least recently used models beyond its limit,
// preferring those with no lease in flight and not kept (victimLocked); the newest is
// never dropped.
func (s *Scheduler) trimLocked(r *resource) {
	h := r.held
	limit := h.limit()
	for limit > 0 && len(h.models) > limit {
		victim, _ := s.victimLocked(r, h.models[:len(h.models)-1])
		h.models = slices.Delete(h.models, victim, victim+1)
		h.evictions++
	}
}

// victimLocked returns the index in models of the one a load on r evicts:
// the least recently used with no lease in flight on r and not kept
// (SetKept), else the least recently used idle kept one, else the least
// recently used; busy says it has a lease in flight. It costs
// O(len(models) × leases on r).
func (s *Scheduler) victimLocked(r *resource, models []heldModel) (victim int, busy bool) {
	victim, busy = -1, true
	rank := func(b, kept bool) int {
		switch {
		case b:
			return 2
		case kept:
			return 1
		}
		return 0
	}
	best := 3
	for i, m := range models {
		b := r.runsModel(m.name)
		k := rank(b, s.kept[m.name])
		if victim < 0 || k < best || (k == best && m.used < models[victim].used) {
			victim, busy, best = i, b, k
		}
	}
	return victim, busy
}

// SetKept names the served models kept loaded ahead of demand
// (models.<alias>.keep_loaded): a load evicts one only when every model
// it could evict instead has runs in flight or is kept too, and a load
// that would evict one ranks as if a waiter asked for it
// (evictionCostLocked), so it goes elsewhere when it can. It replaces the
// earlier set.
func (s *Scheduler) SetKept(models []string) {
	kept := make(map[string]bool, len(models))
	for _, m := range models {
		kept[m] = true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.kept = kept
}

// runsModel reports whether a lease in flight on r serves model.
func (r *resource) runsModel(model string) bool {
	for l := r.leases.head; l != nil; l = l.next {
		if l.info.Target == model {
			return true
		}
	}
	return false
}

// Eviction costs (evictionCostLocked), cheapest first.
const (
	evictNothing  = iota // r has room, or its limit is unknown
	evictIdle            // the victim has no run in flight and no waiter
	evictWanted          // a waiter listing r asks for the victim, or it is kept
	evictInDemand        // the victim was asked for more than the load's model waits: the swap waits
	evictBusy            // the victim has runs in flight: the swap waits for them
)

// evictionCostLocked ranks loading model on r, which does not hold it,
// for waiting requests of that model (counting the one deciding), by
// what the load evicts (victimLocked): evictNothing, evictIdle,
// evictWanted, evictInDemand (its demand on r, demandLocked, is above
// waiting) or evictBusy. A swap waits for the runs of the model it
// evicts, and does not evict a model in more demand than its own (the
// pause between two requests of a model in use is not the end of its
// use): pickResidentLocked takes such a load only for a request that
// waited MaxExtraWait, or, for evictInDemand, hold: what evicting the
// model is expected to cost its own requests, its demand times its load
// time (a model that loads in 0.3 s is not worth a 10 s wait), at most
// MaxExtraWait.
func (s *Scheduler) evictionCostLocked(r *resource, model string, waiting int) (cost int, hold time.Duration) {
	h := r.held
	limit := h.limit()
	if limit == 0 || len(h.models) < limit {
		return evictNothing, 0
	}
	i, busy := s.victimLocked(r, h.models)
	if busy {
		return evictBusy, 0
	}
	victim := h.models[i]
	if d := s.demandLocked(&victim); victim.name != model && d > float64(waiting) {
		return evictInDemand, min(s.residency.MaxExtraWait, time.Duration(d*float64(s.loadTimeLocked(r, victim.name))))
	}
	if s.kept[victim.name] {
		return evictWanted, 0
	}
	for _, hp := range []waitHeap{r.short, r.long} {
		for _, ref := range hp {
			for _, c := range ref.w.cands {
				if c.res == r && c.Target == victim.name {
					return evictWanted, 0
				}
			}
		}
	}
	return evictIdle, 0
}

// waitingForLocked counts r's waiters whose candidate on r is model.
// It costs O(waiters listing r × their candidates).
func waitingForLocked(r *resource, model string) int {
	n := 0
	for _, hp := range []waitHeap{r.short, r.long} {
		for _, ref := range hp {
			if slices.ContainsFunc(ref.w.cands, func(c choice) bool { return c.res == r && c.Target == model }) {
				n++
			}
		}
	}
	return n
}

// nextResidentLocked returns the waiter r's free slot goes to under a
// residency policy, given top, the first in queue order: top itself when
// r holds its model or it is overdue (MaxExtraWait), else the first, in
// queue order, of r's waiters that needs no load there or is overdue;
// top when there is none. It costs O(waiters listing r).
func (s *Scheduler) nextResidentLocked(r *resource, top *waiter) *waiter {
	if s.residency == nil || r.held == nil || top == nil || top.hotOn(r) || s.overdueLocked(top) {
		return top
	}
	var best *waiter
	scan := func(hp waitHeap) {
		for _, ref := range hp {
			w := ref.w
			if w.band == batchBand && (top.band != batchBand || !s.batchRoomLocked(r, w.req.Long)) {
				continue // never ahead of an interactive waiter, nor into the headroom
			}
			if (best == nil || w.before(best)) && (w.hotOn(r) || s.overdueLocked(w)) {
				best = w
			}
		}
	}
	if r.fits(false) {
		scan(r.short)
	}
	if r.fits(true) {
		scan(r.long)
	}
	if best == nil {
		return top
	}
	return best
}

// pickResidentLocked chooses among choices, under a residency policy, the
// free one for req: the best (by the chooser, Prefer first) of those that
// hold their target; else, when wait is set and a busy candidate holds its
// target with an expected wait shorter than the load, none (res nil,
// waitHot true); else the best of the cheapest loads (evictionCostLocked,
// counting req among its model's waiters unless queued is set), leaving
// out those that wait for the runs of the model they evict (evictBusy) or
// would evict a model in more demand (evictInDemand, until req has waited
// its hold) unless overdue is set. waited is how long req has been queued.
func (s *Scheduler) pickResidentLocked(choices []choice, req *Request, wait, overdue, queued bool, waited time.Duration) (best choice, waitHot bool) {
	hot := newChooser(req)
	var preferred choice
	var free []choice
	var busyHot []choice
	for _, c := range choices {
		if !live(c.res, c.Candidate) {
			continue
		}
		holds := c.res.holds(c.Target)
		if !s.fitsLocked(c.res, req) {
			if holds {
				busyHot = append(busyHot, c)
			}
			continue
		}
		if holds {
			hot.offer(c)
			if c.NodeID == req.Prefer.NodeID && c.ProviderID == req.Prefer.ProviderID {
				preferred = c
			}
			continue
		}
		free = append(free, c)
	}
	if preferred.res != nil {
		return preferred, false
	}
	if b := hot.choice(); b.res != nil {
		return b, false
	}
	if len(free) == 0 {
		return choice{}, false
	}
	if wait && len(busyHot) > 0 {
		load := s.loadTimeLocked(free[0].res, free[0].Target)
		service := time.Duration(0)
		if g := s.groups[req.Group]; g != nil {
			service = g.service
		}
		for _, c := range busyHot {
			ahead := len(c.res.short) + len(c.res.long) + 1 + max(c.res.inFlight-c.res.capacity, 0)
			if time.Duration(ahead)*service/time.Duration(c.res.capacity) < load {
				return choice{}, true
			}
		}
	}
	cold := newChooser(req)
	bestCost := evictBusy + 1
	self := 1
	if queued {
		self = 0
	}
	for _, c := range free {
		cost, hold := s.evictionCostLocked(c.res, c.Target, waitingForLocked(c.res, c.Target)+self)
		if cost >= evictInDemand && !overdue && (cost == evictBusy || waited < hold) {
			continue
		}
		if cost < bestCost {
			bestCost, cold = cost, newChooser(req)
		}
		if cost == bestCost {
			cold.offer(c)
		}
	}
	return cold.choice(), false
}

// waitHotLocked bounds the wait of w, queued for a busy provider that
// holds its model while another could load it now: after the shorter of
// the load time and MaxExtraWait it takes any free slot it can use.
func (s *Scheduler) waitHotLocked(w *waiter) {
	d := min(s.residency.MaxExtraWait, s.residency.LoadTime)
	for _, c := range w.cands {
		d = min(d, s.loadTimeLocked(c.res, c.Target))
	}
	w.hotWait = s.clock.AfterFunc(d, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if w.state == waiting {
			s.grantLocked(w)
		}
	})
}

// waitSwapLocked bounds the wait of w, queued under a residency policy:
// once w has waited MaxExtraWait it is offered a slot again, and may then
// take a load that evicts a model with runs in flight (evictBusy) or pass
// waiters of models a provider holds (nextResidentLocked); before that,
// once it has waited the hold of a candidate whose load would evict a
// model in more demand (evictInDemand), it is offered a slot then (a
// batch waiter too, which is never overdue).
func (s *Scheduler) waitSwapLocked(w *waiter) {
	waited := s.clock.Now().Sub(w.enqueued)
	d := time.Duration(math.MaxInt64) // a batch waiter is never overdue
	if w.band != batchBand {
		d = s.residency.MaxExtraWait - waited
	}
	for _, c := range w.cands {
		if c.res.held == nil {
			continue
		}
		if cost, hold := s.evictionCostLocked(c.res, c.Target, waitingForLocked(c.res, c.Target)); cost == evictInDemand && hold > waited {
			d = min(d, hold-waited)
		}
	}
	if d <= 0 || d == math.MaxInt64 {
		return
	}
	w.swapWait = s.clock.AfterFunc(d, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		w.swapWait = nil
		if w.state == waiting && !s.grantLocked(w) {
			s.waitSwapLocked(w)
		}
	})
}

// ResidencySnapshot is what the scheduler believes one provider holds.
type ResidencySnapshot struct {
	// Held lists the served models it holds or is loading, least recently
	// granted first; Loading those of them no reading shows yet.
	Held, Loading []string
	// MaxLoaded is the configured limit; Learned the most models read
	// loaded at once.
	MaxLoaded, Learned int
	// Loads and Evictions count the loads its grants started and the
	// models they (or a reading beyond the limit) dropped.
	Loads, Evictions uint64
}

// Residency returns what the scheduler believes provider providerID of
// node holds; ok is false when the provider is unknown or its residency
// unread (it holds every model).
func (s *Scheduler) Residency(nodeID, providerID string) (snap ResidencySnapshot, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.resources[resourceKey{nodeID, providerID}]
	if r == nil || r.held == nil {
		return snap, false
	}
	h := r.held
	models := slices.Clone(h.models)
	slices.SortStableFunc(models, func(a, b heldModel) int { return cmpUint(a.used, b.used) })
	for _, m := range models {
		snap.Held = append(snap.Held, m.name)
		if m.loading {
			snap.Loading = append(snap.Loading, m.name)
		}
	}
	snap.MaxLoaded, snap.Learned, snap.Loads, snap.Evictions = h.maxLoaded, h.learned, h.loads, h.evictions
	return snap, true
}

func cmpUint(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// loadedLocked offers r's free slots after l started a load there: the
// waiters of that model listing r need no load there any more.
func (s *Scheduler) loadedLocked(l *Lease) {
	if l.info.Load && s.residency != nil {
		s.pumpResourceLocked(l.res)
	}
}

// tracksAnyLocked reports whether one of cands is a provider whose
// residency is read: otherwise every one holds every model and the
// residency rules change nothing.
func (s *Scheduler) tracksAnyLocked(cands []Candidate) bool {
	for _, c := range cands {
		if r := s.resources[resourceKey{c.NodeID, c.ProviderID}]; r != nil && r.held != nil {
			return true
		}
	}
	return false
}
