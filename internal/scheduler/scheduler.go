package scheduler

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"
)

// Default group policy (DESIGN.md "model group").
const (
	DefaultMaxQueue     = 16
	DefaultQueueTimeout = 30 * time.Second
)

// Policy is the queue policy of one model group. A zero field means "the
// default" in Config and "unchanged" in UpdatePolicy.
type Policy struct {
	// MaxQueue is the most requests that may wait in the group at once.
	MaxQueue int
	// QueueTimeout is how long one request may wait for a slot.
	QueueTimeout time.Duration
	// Fairness orders the group's waiters: FairnessOn by weighted fair
	// queueing between flows (fairTagLocked), FairnessOff FIFO.
	Fairness Fairness
	// ReconnectGrace is how long a queued request whose every candidate
	// went away (its node disconnected or drains) stays queued, with no
	// candidate, for one to come back (a rolling restart) before it fails
	// with ErrProviderUnavailable; never beyond its queue timeout, which
	// keeps running. 0 takes the default's; negative means none (fail at
	// once).
	ReconnectGrace time.Duration
}

func (p Policy) validate() error {
	if p.MaxQueue < 0 {
		return fmt.Errorf("%w: max_queue %d is negative", ErrInvalid, p.MaxQueue)
	}
	if p.QueueTimeout < 0 {
		return fmt.Errorf("%w: queue_timeout %s is negative", ErrInvalid, p.QueueTimeout)
	}
	return p.Fairness.validate()
}

// overlay returns p with the non-zero fields of o applied.
func (p Policy) overlay(o Policy) Policy {
	if o.MaxQueue > 0 {
		p.MaxQueue = o.MaxQueue
	}
	if o.QueueTimeout > 0 {
		p.QueueTimeout = o.QueueTimeout
	}
	if o.Fairness != FairnessDefault {
		p.Fairness = o.Fairness
	}
	if o.ReconnectGrace != 0 {
		p.ReconnectGrace = o.ReconnectGrace
	}
	return p
}

// Config configures a Scheduler.
type Config struct {
	// Default is the policy of every group without an override; zero fields
	// take DefaultMaxQueue, DefaultQueueTimeout and FairnessOff.
	Default Policy
	// Groups holds per-model overrides, by group name; zero fields take Default.
	Groups map[string]Policy
	// Clock drives queue timeouts; nil means RealClock.
	Clock Clock
	// Residency, when set, turns residency-aware routing on (package doc,
	// "Residency"); nil leaves it off.
	Residency *ResidencyPolicy
	// Batch is the policy of the batch band (PriorityBatch); zero fields
	// take the defaults.
	Batch BatchPolicy
}

// Validate reports a negative queue size or timeout, or an empty group name,
// as an error wrapping ErrInvalid.
func (c Config) Validate() error {
	if err := c.Default.validate(); err != nil {
		return fmt.Errorf("default policy: %w", err)
	}
	for name, p := range c.Groups {
		if name == "" {
			return fmt.Errorf("%w: empty model name in group policies", ErrInvalid)
		}
		if err := p.validate(); err != nil {
			return fmt.Errorf("model %q: %w", name, err)
		}
	}
	if err := c.Batch.validate(); err != nil {
		return err
	}
	if c.Residency != nil {
		return c.Residency.validate()
	}
	return nil
}

// Candidate is one way to serve a request: a provider of one node
// connection, and the served model name dispatch rewrites the request to.
type Candidate struct {
	NodeID     string
	Generation uint64
	ProviderID string
	Target     string
}

// ResourceSpec describes one provider of a node connection for Activate.
type ResourceSpec struct {
	ProviderID string
	// Capacity is the provider's max concurrent requests, ≥ 1.
	Capacity int
	// LongCapacity is its max concurrent long-context requests; 0 means Capacity.
	LongCapacity int
}

func (r ResourceSpec) validate() error {
	if r.ProviderID == "" {
		return fmt.Errorf("%w: empty provider id", ErrInvalid)
	}
	return validateCapacity(r.ProviderID, r.Capacity, r.LongCapacity)
}

func validateCapacity(providerID string, capacity, longCapacity int) error {
	if capacity < 1 {
		return fmt.Errorf("%w: provider %q: capacity %d is below 1", ErrInvalid, providerID, capacity)
	}
	if longCapacity < 0 {
		return fmt.Errorf("%w: provider %q: long capacity %d is negative", ErrInvalid, providerID, longCapacity)
	}
	return nil
}

// Request is one admission.
type Request struct {
	// Group is the model group: the model name the client asked for.
	Group string
	// Long marks a long-context request: it also needs a free long slot.
	Long bool
	// EstimatedInputTokens is carried into DispatchInfo for observability.
	EstimatedInputTokens int
	// Resolve returns the request's live candidates, already filtered by its
	// request-local predicate, in a slice the scheduler may keep and
	// modify. It is called under the scheduler's lock at admission and at
	// every re-resolution (resolveLocked), so it must not call
	// the scheduler. It returns an error wrapping ErrUnknownModel,
	// ErrNoProvider, ErrCandidatesRejected or ErrProviderUnavailable when
	// that is the case: at admission the error is Admit's; at re-resolution
	// each of them fails the waiter with ErrProviderUnavailable (its
	// providers went away). Any other error is a fault of the resolver: at
	// admission it is Admit's error; at re-resolution it leaves the waiter
	// queued with its candidates that are still live, and the resolver is
	// called again at the next admission, release or capacity change.
	Resolve func() ([]Candidate, error)
	// Prefer, when set, names a provider to choose at admission over the
	// least loaded one, if it is a live candidate with a free slot (a soft
	// affinity: a session's runs go back to the provider that holds its
	// prompt cache). Otherwise, and for a queued request, it changes nothing.
	Prefer ProviderRef
	// Flow names the request's flow within its group (an API key's name,
	// say); DefaultFlow ("") is one flow like any other. Where the group's
	// fairness is on, flows share its slots in proportion to their weights.
	Flow string
	// Weight is the flow's weight, 1 to MaxWeight; 0 means 1. The weight of
	// each request counts for the share that request takes.
	Weight int
	// Priority is the request's band: critical waiters go before standard
	// ones, standard before sheddable, sheddable before batch, whatever
	// their flow. A batch request takes a slot only under the rules of
	// PriorityBatch (batchRoomLocked).
	Priority Priority
	// Affinity, when set, returns the prompt tokens candidate c is expected
	// to hold in its prompt cache already (prefix-cache-aware routing; the
	// edge computes them from its prefix index before Admit, so Affinity
	// reads immutable data and takes no lock). Among the candidates with a
	// free slot, those whose load (in_flight/capacity) is at most
	// AffinitySlack above the least loaded one's are eligible, and the
	// eligible one with the highest Affinity wins, ties by lessLoaded
	// (load, then provider id, then node id). With Affinity 0 everywhere
	// that is the least loaded one. So a busy candidate is never chosen
	// while another is free, and affinity never makes the loads of free
	// candidates differ by more than the slack (the balance rule of
	// SGLang's cache-aware router). Prefer, when it has a free slot, wins
	// over Affinity. Called under the scheduler's lock: it must not call
	// the scheduler.
	Affinity func(Candidate) int
	// AffinitySlack is the load, as a fraction of capacity (≥ 0), a
	// candidate may carry above the least loaded free candidate and still
	// be chosen for its Affinity: 0.5 lets a provider of capacity 4 take a
	// request for its cache while it runs 2 more than the least loaded.
	AffinitySlack float64
	// OnQueued, if set, is called once, on the caller's goroutine and
	// without the scheduler's lock, when the request starts waiting in its
	// group's queue (for observability).
	OnQueued func()
}

// ProviderRef names one provider of one node, whatever its generation.
type ProviderRef struct {
	NodeID, ProviderID string
}

// QueueReason says how a lease was obtained.
type QueueReason string

const (
	// ReasonImmediate: a slot was free at admission.
	ReasonImmediate QueueReason = "immediate"
	// ReasonQueued: the request waited for a slot to be handed over.
	ReasonQueued QueueReason = "queued"
)

type resourceKey struct{ node, provider string }

// resource holds the capacity counters of one (node, provider), shared by
// every group that can use it.
type resource struct {
	key          resourceKey
	generation   uint64
	capacity     int
	longCapacity int
	inFlight     int
	longInFlight int
	// batchInFlight counts its leases of batch requests (of inFlight).
	batchInFlight int
	orphan        bool
	leases        leaseList // unreleased leases on this resource
	// Waiters listing this resource, first in queue order (waiter.before)
	// first; long ones apart so a release can skip them cheaply when no long
	// slot is free.
	short, long waitHeap
	// vtime is, by band, the largest start tag of a fair waiter granted a
	// slot here.
	vtime [bands]uint64
	// held is what it holds loaded; nil: every model (residency unread).
	held *holding
	// waited holds when each recent interactive wait for it stops
	// counting (the batch policy's Backoff after the waiter's grant), at
	// most capacity of them: each keeps one more of its slots from batch
	// requests (batchRoomLocked). waitedTimer hands its slots out when the
	// earliest of them passes; waitedArm numbers its arming, so a timer
	// replaced by a later one does nothing when it fires.
	waited      []time.Time
	waitedTimer Timer
	waitedArm   uint64
}

func (r *resource) fits(long bool) bool {
	if r.orphan || r.inFlight >= r.capacity {
		return false
	}
	return !long || r.longInFlight < r.longCapacity
}

type group struct {
	name   string
	policy Policy
	queued int
	// vtime is the group's virtual time by band: the largest start tag
	// granted in it (or caught up from its resources', fairTagLocked).
	vtime [bands]uint64
	// bandQueued counts its waiters by band.
	bandQueued [bands]int
	// flows are the group's flows that have a waiter, by name.
	flows map[string]*flow
	// shedHead, shedTail: its sheddable waiters, in enqueue order.
	shedHead, shedTail *waiter
	// batchQueued counts its batch waiters (of queued).
	batchQueued int
	// service is the mean time its leases were held, over leases observed.
	service time.Duration
	leases  uint64
}

// interactive is how many of g's waiters are of an interactive band: those
// its MaxQueue bounds.
func (g *group) interactive() int { return g.queued - g.batchQueued }

type waiterState uint8

const (
	waiting waiterState = iota
	granted
	failed
	abandoned
)

type result struct {
	lease *Lease
	err   error
}

// waiter is one queued admission. It is in the heap of a resource r only
// while one of its cands is live on r (r not orphan, of the candidate's
// generation): so the earliest waiter of a resource with a free slot can
// always take it.
type waiter struct {
	seq      uint64
	band     uint8  // req.Priority.band()
	tag      uint64 // start tag (fairTagLocked); 0 where fairness is off
	flow     *flow
	req      Request
	group    *group
	cands    []choice // live candidates, one heap place per distinct resource (refs)
	refs     []*waitRef
	state    waiterState
	ch       chan result // one slot; exactly one send, by the settling lock holder
	timer    Timer
	enqueued time.Time
	// hotWait is the timer of a waiter that waits for a provider holding
	// its model rather than load it on a free one (residency); nil if none.
	hotWait Timer
	// swapWait offers a waiter a slot again once it has waited
	// MaxExtraWait (residency: waitSwapLocked); nil if none.
	swapWait Timer
	// lost is the grace timer (Policy.ReconnectGrace) of a waiter whose
	// every candidate went away, nil otherwise; lostEpoch tells a stale
	// timer from the current one.
	lost      Timer
	lostEpoch uint64
	// prev, next link the global list of waiters in enqueue order.
	prev, next *waiter
	// stale: its resolver failed at its last re-resolution, so its
	// candidates may be out of date; prevStale, nextStale link the list of
	// stale waiters, in enqueue order.
	stale                bool
	prevStale, nextStale *waiter
	// prevShed, nextShed link its group's sheddable waiters; prevFlow,
	// nextFlow its flow's waiters of its band.
	prevShed, nextShed *waiter
	prevFlow, nextFlow *waiter
}

// before reports whether w is ahead of o in queue order: by priority band,
// then start tag, then enqueue sequence.
func (w *waiter) before(o *waiter) bool {
	if w.band != o.band {
		return w.band < o.band
	}
	if w.tag != o.tag {
		return w.tag < o.tag
	}
	return w.seq < o.seq
}

// Scheduler is the admission scheduler. Create it with New.
type Scheduler struct {
	clock Clock

	mu        sync.Mutex // guards the fields below
	defaults  Policy
	overrides map[string]Policy
	resources map[resourceKey]*resource
	nodes     map[string]map[string]*resource // node id → provider id → resource
	groups    map[string]*group
	byRun     map[string]*Lease
	head      *waiter // earliest waiter
	tail      *waiter // latest waiter
	waiters   int
	seq       uint64
	leaseSeq  uint64
	active    int // leases not yet released

	// staleHead, staleTail: the stale waiters, earliest first (waiter.stale).
	staleHead, staleTail *waiter
	// residency is the residency policy; nil: off.
	residency *ResidencyPolicy
	// batch is the batch band's policy, defaults applied.
	batch BatchPolicy
	// kept are the served models kept loaded (SetKept): a load evicts
	// them last.
	kept map[string]bool
}

// New returns a Scheduler, or an error wrapping ErrInvalid for a bad Config.
func New(cfg Config) (*Scheduler, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	clock := cfg.Clock
	if clock == nil {
		clock = RealClock()
	}
	overrides := make(map[string]Policy, len(cfg.Groups))
	for name, p := range cfg.Groups {
		overrides[name] = p
	}
	var residency *ResidencyPolicy
	if cfg.Residency != nil {
		p := cfg.Residency.withDefaults()
		residency = &p
	}
	return &Scheduler{
		batch:     cfg.Batch.withDefaults(),
		residency: residency,
		clock:     clock,
		defaults:  Policy{MaxQueue: DefaultMaxQueue, QueueTimeout: DefaultQueueTimeout, Fairness: FairnessOff}.overlay(cfg.Default),
		overrides: overrides,
		resources: make(map[resourceKey]*resource),
		nodes:     make(map[string]map[string]*resource),
		groups:    make(map[string]*group),
		byRun:     make(map[string]*Lease),
	}, nil
}

// groupLocked returns the group of name, creating it with its policy. A
// group stays once created, with its policy and queue counter: one per
// model name that has queued.
func (s *Scheduler) groupLocked(name string) *group {
	g := s.groups[name]
	if g == nil {
		g = &group{name: name, policy: s.defaults.overlay(s.overrides[name]), flows: make(map[string]*flow)}
		s.groups[name] = g
	}
	return g
}

// Admit reserves a slot for req, waiting in req.Group's queue if every
// candidate is busy. It returns the lease, or an error wrapping
// ErrUnknownModel, ErrNoProvider, ErrCandidatesRejected (from the resolver,
// nothing reserved), ErrQueueFull (at once), ErrQueueTimeout,
// ErrProviderUnavailable (while queued, its providers went away; or from the
// resolver), ErrInvalid (empty group or nil resolver), the resolver's own
// error, or the context's error. A slot handed over in the same instant as
// a timeout or cancel is released, never lost. Before it considers req,
// Admit re-resolves the stale waiters (retryStaleLocked).
func (s *Scheduler) Admit(ctx context.Context, req Request) (*Lease, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	lease, w, err := s.enqueue(req)
	if err != nil || lease != nil {
		return lease, err
	}
	if req.OnQueued != nil {
		req.OnQueued()
	}
	select {
	case r := <-w.ch:
		return r.lease, r.err
	case <-ctx.Done():
		return nil, s.abandon(w, ctx.Err())
	}
}

// enqueue admits req at once (lease), queues it (waiter) or fails. A free
// slot goes to req only when no queued waiter can use it (the pumps hand
// out every slot a waiter can use before they return).
//
// At a full queue (MaxQueue): a request that is not sheddable displaces
// the group's latest sheddable waiter (ErrShed, ErrDisplaced); else, in a
// fair group, pushOutLocked may push out the latest waiter of the flow
// holding the most of the queue for its weight (ErrQueueFull); else req
// is refused (ErrQueueFull). A sheddable req that would queue is refused
// at once (ErrShed, ErrExpectedWait) when its expected wait
// (expectedWaitLocked) passes the group's queue timeout. Every shed or
// pushed-out waiter is settled once, under the lock, holding no slot.
//
// A batch req (PriorityBatch) counts against the BatchPolicy's MaxQueue
// only (ErrQueueFull at once), displaces nobody and is displaced by
// nobody; its queue timeout is the BatchPolicy's.
func (s *Scheduler) enqueue(req Request) (*Lease, *waiter, error) {
	if req.Group == "" {
		return nil, nil, fmt.Errorf("%w: empty model name", ErrInvalid)
	}
	if req.Resolve == nil {
		return nil, nil, fmt.Errorf("%w: nil resolver", ErrInvalid)
	}
	if !req.Priority.valid() {
		return nil, nil, fmt.Errorf("%w: priority %d", ErrInvalid, req.Priority)
	}
	if req.Weight < 0 || req.Weight > MaxWeight {
		return nil, nil, fmt.Errorf("%w: weight %d is outside 0..%d", ErrInvalid, req.Weight, MaxWeight)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	// Waiters whose resolver failed come first: one that recovered and can
	// use a free slot takes it before this request.
	s.grantEachLocked(s.retryStaleLocked())
	cands, err := req.Resolve()
	if err != nil {
		if errors.Is(err, ErrProviderAway) {
			return s.enqueueAwayLocked(req, err)
		}
		return nil, nil, err
	}
	cands, best := s.scanLocked(cands, &req)
	if len(cands) == 0 {
		return nil, nil, fmt.Errorf("%w %q", ErrNoProvider, req.Group)
	}
	waitHot := false
	if s.residency != nil && s.tracksAnyLocked(cands) {
		best, waitHot = s.pickResidentLocked(s.choicesLocked(cands), &req, true, false, false, 0)
		if g := s.groups[req.Group]; waitHot && g != nil && s.fullLocked(g, req.Priority) {
			// No room to wait for a holder: load it where a slot is free.
			best, waitHot = s.pickResidentLocked(s.choicesLocked(cands), &req, false, false, false, 0)
		}
	}
	if best.res != nil {
		l := s.reserveLocked(best.res, best.Candidate, req, ReasonImmediate, 0)
		s.loadedLocked(l)
		return l, nil, nil
	}
	g := s.groupLocked(req.Group)
	if req.Priority == PriorityBatch && s.fullLocked(g, req.Priority) {
		return nil, nil, fmt.Errorf("model %q: %w (%d batch requests waiting)", g.name, ErrQueueFull, g.batchQueued)
	}
	if req.Priority != PriorityBatch && s.fullLocked(g, req.Priority) {
		switch {
		case req.Priority != PrioritySheddable && g.shedTail != nil:
			// Make room: the latest sheddable waiter goes.
			s.failLocked(g.shedTail, fmt.Errorf("model %q: %w: %w", g.name, ErrShed, ErrDisplaced))
		case g.policy.Fairness == FairnessOn && s.pushOutLocked(g, req):
		default:
			return nil, nil, fmt.Errorf("model %q: %w (%d waiting)", g.name, ErrQueueFull, g.interactive())
		}
	}
	if req.Priority == PrioritySheddable {
		if wait, ok := expectedWaitLocked(g, cands, s.resources); ok && wait > g.policy.QueueTimeout {
			return nil, nil, fmt.Errorf("model %q: %w: %w (about %s, queue timeout %s)", g.name, ErrShed, ErrExpectedWait,
				wait.Round(time.Millisecond), g.policy.QueueTimeout)
		}
	}
	s.seq++
	w := &waiter{
		band:     req.Priority.band(),
		seq:      s.seq,
		req:      req,
		group:    g,
		ch:       make(chan result, 1),
		enqueued: s.clock.Now(),
	}
	s.linkLocked(w, s.choicesLocked(cands))
	w.timer = s.clock.AfterFunc(s.queueTimeoutLocked(g, req.Priority), func() { s.expire(w) })
	if waitHot {
		s.waitHotLocked(w)
	}
	if s.residency != nil {
		s.waitSwapLocked(w)
	}
	return nil, w, nil
}

// enqueueAwayLocked queues req, whose providers are away (err wraps
// ErrProviderAway), without a candidate for its group's reconnect grace
// (loseLocked); without a grace it returns err, with a full queue
// ErrQueueFull.
func (s *Scheduler) enqueueAwayLocked(req Request, err error) (*Lease, *waiter, error) {
	g := s.groupLocked(req.Group)
	if g.policy.ReconnectGrace <= 0 {
		return nil, nil, err
	}
	if s.fullLocked(g, req.Priority) {
		return nil, nil, fmt.Errorf("model %q: %w (%d waiting)", g.name, ErrQueueFull, g.queued)
	}
	s.seq++
	w := &waiter{
		band:     req.Priority.band(),
		seq:      s.seq,
		req:      req,
		group:    g,
		ch:       make(chan result, 1),
		enqueued: s.clock.Now(),
	}
	s.linkLocked(w, nil)
	w.timer = s.clock.AfterFunc(s.queueTimeoutLocked(g, req.Priority), func() { s.expire(w) })
	s.loseLocked(w, fmt.Errorf("model %q: %w: %v", g.name, ErrProviderUnavailable, err))
	return nil, w, nil
}

// abandon withdraws w after its caller's context ended and returns cause.
func (s *Scheduler) abandon(w *waiter, cause error) error {
	s.mu.Lock()
	if w.state == waiting {
		s.unlinkLocked(w)
		w.state = abandoned
		s.mu.Unlock()
		return cause
	}
	s.mu.Unlock()
	// Settled in the same instant: the result is in w.ch already.
	if r := <-w.ch; r.lease != nil {
		r.lease.Release("abandoned")
	}
	return cause
}

func (s *Scheduler) expire(w *waiter) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if w.state == waiting {
		s.failLocked(w, fmt.Errorf("model %q: %w after %s", w.group.name, ErrQueueTimeout, s.queueTimeoutLocked(w.group, w.req.Priority)))
	}
}

// choice is a live candidate and its resource.
type choice struct {
	Candidate
	res *resource
}

// live reports whether r exists, is not orphan and belongs to c's generation.
func live(r *resource, c Candidate) bool {
	return r != nil && !r.orphan && r.generation == c.Generation
}

// scanLocked filters cands in place to the live ones and, in the same pass,
// picks the best with a free slot for req: req.Prefer if it is one, else
// the best by chooser (best.res is nil if none is free).
func (s *Scheduler) scanLocked(cands []Candidate, req *Request) (liveCands []Candidate, best choice) {
	liveCands = cands[:0]
	var preferred choice
	ch := newChooser(req)
	for _, c := range cands {
		r := s.resources[resourceKey{c.NodeID, c.ProviderID}]
		if !live(r, c) {
			continue
		}
		liveCands = append(liveCands, c)
		if !s.fitsLocked(r, req) {
			continue
		}
		ch.offer(choice{c, r})
		if c.NodeID == req.Prefer.NodeID && c.ProviderID == req.Prefer.ProviderID {
			preferred = choice{c, r}
		}
	}
	if preferred.res != nil {
		return liveCands, preferred
	}
	return liveCands, ch.choice()
}

// chooser keeps the best of the free choices offered to it: without
// Affinity the least loaded (lessLoaded); with it the highest Affinity
// among those within AffinitySlack of the least loaded load, ties by
// lessLoaded (Request.Affinity).
type chooser struct {
	affinity func(Candidate) int
	slack    float64
	best     choice   // the least loaded so far
	free     []choice // every free choice, when affinity is set
	buf      [8]choice
}

func newChooser(req *Request) chooser {
	return chooser{affinity: req.Affinity, slack: max(req.AffinitySlack, 0)}
}

func (ch *chooser) offer(c choice) {
	if ch.best.res == nil || lessLoaded(c.res, c.Candidate, ch.best.res, ch.best.Candidate) {
		ch.best = c
	}
	if ch.affinity != nil {
		if ch.free == nil {
			ch.free = ch.buf[:0]
		}
		ch.free = append(ch.free, c)
	}
}

func loadOf(r *resource) float64 { return float64(r.inFlight) / float64(r.capacity) }

// choice returns the chosen free choice (res nil if none was offered).
func (ch *chooser) choice() choice {
	if ch.affinity == nil || ch.best.res == nil {
		return ch.best
	}
	limit := loadOf(ch.best.res) + ch.slack + 1e-9 // equal ratios compare equal, whatever the rounding
	best, bestAff := ch.best, ch.affinity(ch.best.Candidate)
	for _, c := range ch.free {
		if loadOf(c.res) > limit {
			continue
		}
		a := ch.affinity(c.Candidate)
		if a > bestAff || (a == bestAff && lessLoaded(c.res, c.Candidate, best.res, best.Candidate)) {
			best, bestAff = c, a
		}
	}
	return best
}

// choicesLocked pairs live candidates with their resources.
func (s *Scheduler) choicesLocked(cands []Candidate) []choice {
	out := make([]choice, len(cands))
	for i, c := range cands {
		out[i] = choice{c, s.resources[resourceKey{c.NodeID, c.ProviderID}]}
	}
	return out
}

// pickLocked returns the best choice of req with a free slot, by the same
// chooser as scanLocked (res nil if none).
func (s *Scheduler) pickLocked(choices []choice, req *Request) choice {
	ch := newChooser(req)
	for _, c := range choices {
		if !live(c.res, c.Candidate) || !s.fitsLocked(c.res, req) {
			continue
		}
		ch.offer(c)
	}
	return ch.choice()
}

func lessLoaded(a *resource, ac Candidate, b *resource, bc Candidate) bool {
	// a.inFlight/a.capacity < b.inFlight/b.capacity, without division.
	la, lb := a.inFlight*b.capacity, b.inFlight*a.capacity
	if la != lb {
		return la < lb
	}
	if ac.ProviderID != bc.ProviderID {
		return ac.ProviderID < bc.ProviderID
	}
	return ac.NodeID < bc.NodeID
}

func (s *Scheduler) reserveLocked(r *resource, c Candidate, req Request, reason QueueReason, wait time.Duration) *Lease {
	r.inFlight++
	if req.Long {
		r.longInFlight++
	}
	if req.Priority == PriorityBatch {
		r.batchInFlight++
	}
	s.leaseSeq++
	load := s.touchLocked(r, c.Target)
	s.active++
	l := &Lease{
		s:     s,
		res:   r,
		id:    s.leaseSeq,
		start: s.clock.Now(),
		info: DispatchInfo{
			NodeID:               c.NodeID,
			Generation:           c.Generation,
			ProviderID:           c.ProviderID,
			Target:               c.Target,
			Group:                req.Group,
			Long:                 req.Long,
			EstimatedInputTokens: req.EstimatedInputTokens,
			QueueReason:          reason,
			Wait:                 wait,
			Load:                 load,
		},
	}
	l.batch = req.Priority == PriorityBatch
	r.leases.push(l)
	return l
}

// grantLocked hands w a slot if one of its candidates has one.
func (s *Scheduler) grantLocked(w *waiter) bool {
	var best choice
	if s.residency != nil && slices.ContainsFunc(w.cands, func(c choice) bool { return c.res.held != nil }) {
		best, _ = s.pickResidentLocked(w.cands, &w.req, false, s.overdueLocked(w), true, s.clock.Now().Sub(w.enqueued))
	} else {
		best = s.pickLocked(w.cands, &w.req)
	}
	if best.res == nil {
		return false
	}
	if w.band != batchBand {
		s.yieldLocked(w.cands)
	}
	w.state = granted // before unlinkLocked: a granted waiter keeps its flow's cost
	s.unlinkLocked(w)
	fairGrantedLocked(w, best.res)
	l := s.reserveLocked(best.res, best.Candidate, w.req, ReasonQueued, s.clock.Now().Sub(w.enqueued))
	w.ch <- result{lease: l}
	s.loadedLocked(l)
	return true
}

func (s *Scheduler) failLocked(w *waiter, err error) {
	s.unlinkLocked(w)
	w.state = failed
	w.ch <- result{err: err}
}

// linkLocked queues w with candidates cands: its start tag and flow, its
// group's sheddable list if it is sheddable, the global list, its group's
// count, and the heap of each distinct candidate resource.
func (s *Scheduler) linkLocked(w *waiter, cands []choice) {
	s.fairTagLocked(w, cands)
	if w.req.Priority == PrioritySheddable {
		linkShedLocked(w)
	}
	w.prev = s.tail
	if s.tail != nil {
		s.tail.next = w
	} else {
		s.head = w
	}
	s.tail = w
	s.waiters++
	w.group.queued++
	s.setCandidatesLocked(w, cands)
}

// setCandidatesLocked replaces w's candidates and its places in the
// per-resource heaps.
func (s *Scheduler) setCandidatesLocked(w *waiter, cands []choice) {
	s.dropRefsLocked(w)
	w.cands = cands
	for _, c := range cands {
		r := c.res
		if w.lists(r) {
			continue
		}
		ref := &waitRef{w: w, res: r}
		w.refs = append(w.refs, ref)
		r.heap(w.req.Long).push(ref)
	}
}

func (w *waiter) lists(r *resource) bool {
	for _, ref := range w.refs {
		if ref.res == r {
			return true
		}
	}
	return false
}

func (s *Scheduler) dropRefsLocked(w *waiter) {
	for _, ref := range w.refs {
		ref.res.heap(w.req.Long).remove(ref)
	}
	w.refs = w.refs[:0]
}

// unlinkLocked removes a waiting w from every queue structure.
func (s *Scheduler) unlinkLocked(w *waiter) {
	s.dropRefsLocked(w)
	s.unstaleLocked(w)
	fairUnlinkLocked(w)
	if w.prev != nil {
		w.prev.next = w.next
	} else {
		s.head = w.next
	}
	if w.next != nil {
		w.next.prev = w.prev
	} else {
		s.tail = w.prev
	}
	w.prev, w.next = nil, nil
	s.waiters--
	w.group.queued--
	if w.timer != nil {
		w.timer.Stop()
	}
	if w.hotWait != nil {
		w.hotWait.Stop()
	}
	if w.swapWait != nil {
		w.swapWait.Stop()
	}
	s.foundLocked(w)
}

// loseLocked settles a waiting w whose every candidate went away (err
// says why): with a reconnect grace it stays queued, with no candidate
// and stale (re-resolved at every event that could grant it), until its
// grace ends (then err) or a re-resolution finds a candidate; without
// one it fails with err at once.
func (s *Scheduler) loseLocked(w *waiter, err error) {
	grace := w.group.policy.ReconnectGrace
	if grace <= 0 {
		s.failLocked(w, err)
		return
	}
	if len(w.cands) > 0 {
		s.setCandidatesLocked(w, nil)
	}
	s.markStaleLocked(w)
	if w.lost != nil {
		return // the grace already runs
	}
	w.lostEpoch++
	epoch := w.lostEpoch
	w.lost = s.clock.AfterFunc(grace, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if w.state == waiting && w.lost != nil && w.lostEpoch == epoch {
			s.failLocked(w, fmt.Errorf("%w (no candidate came back within reconnect_grace %s)", err, grace))
		}
	})
}

// foundLocked ends w's reconnect grace, if it runs.
func (s *Scheduler) foundLocked(w *waiter) {
	if w.lost != nil {
		w.lost.Stop()
		w.lost = nil
		w.lostEpoch++
	}
}

func (r *resource) heap(long bool) *waitHeap {
	if long {
		return &r.long
	}
	return &r.short
}

// markStaleLocked puts w at the end of the stale list, if it is not in it.
// Only reresolveLocked calls it, walking waiters in enqueue order after
// emptying the list, so the list stays in enqueue order.
func (s *Scheduler) markStaleLocked(w *waiter) {
	if w.stale {
		return
	}
	w.stale = true
	w.prevStale = s.staleTail
	if s.staleTail != nil {
		s.staleTail.nextStale = w
	} else {
		s.staleHead = w
	}
	s.staleTail = w
}

// unstaleLocked takes w out of the stale list, if it is in it.
func (s *Scheduler) unstaleLocked(w *waiter) {
	if !w.stale {
		return
	}
	if w.prevStale != nil {
		w.prevStale.nextStale = w.nextStale
	} else {
		s.staleHead = w.nextStale
	}
	if w.nextStale != nil {
		w.nextStale.prevStale = w.prevStale
	} else {
		s.staleTail = w.prevStale
	}
	w.stale, w.prevStale, w.nextStale = false, nil, nil
}

// pumpResourceLocked hands r's free slots to the first waiters, in queue
// order, that can use them. Every waiter in r's heaps has a live candidate
// on r (see waiter), so the first one that fits can always be granted, on r or on
// a less loaded candidate of its own; the pump stops only when r is full,
// no waiter lists it, or the first is a batch waiter r has no batch room
// for (every later one is of the batch band too), at O(log W) per grant.
func (s *Scheduler) pumpResourceLocked(r *resource) {
	for {
		var next *waiter
		if r.fits(false) {
			next = r.short.peek()
		}
		if r.fits(true) {
			if w := r.long.peek(); w != nil && (next == nil || w.before(next)) {
				next = w
			}
		}
		next = s.nextResidentLocked(r, next)
		if next == nil || !s.grantLocked(next) {
			return
		}
	}
}

// pumpAllLocked walks every waiter in queue order (waiter.before) and
// grants each one a slot if any of its candidates has one. Where every
// waiter is standard and untagged (fairness off), queue order is the
// global list's enqueue order and nothing is sorted; else the list is
// sorted, O(W log W), at those rare events only (Activate, Fence).
func (s *Scheduler) pumpAllLocked() {
	ordered := true
	for w := s.head; w != nil && w.next != nil; w = w.next {
		if !w.before(w.next) {
			ordered = false
			break
		}
	}
	if ordered {
		for w := s.head; w != nil; {
			next := w.next
			s.grantLocked(w)
			w = next
		}
		return
	}
	ws := make([]*waiter, 0, s.waiters)
	for w := s.head; w != nil; w = w.next {
		ws = append(ws, w)
	}
	slices.SortFunc(ws, func(a, b *waiter) int {
		if a.before(b) {
			return -1
		}
		return 1
	})
	s.grantEachLocked(ws)
}

// reresolveLocked refreshes every waiter's candidates through its resolver
// (resolveLocked), in enqueue order, then hands out every free slot
// (pumpAllLocked). It rebuilds the stale list, in enqueue order.
func (s *Scheduler) reresolveLocked() {
	for w := s.staleHead; w != nil; {
		next := w.nextStale
		w.stale, w.prevStale, w.nextStale = false, nil, nil
		w = next
	}
	s.staleHead, s.staleTail = nil, nil
	for w := s.head; w != nil; {
		next := w.next
		s.resolveLocked(w)
		w = next
	}
	s.pumpAllLocked()
}

// resolveLocked calls a waiting w's resolver again and applies the answer,
// without granting anything:
//   - candidates: w lists the live ones, and is no longer stale; none live
//     fails it with ErrProviderUnavailable;
//   - ErrUnknownModel, ErrNoProvider, ErrCandidatesRejected or
//     ErrProviderUnavailable: the providers that could serve it are gone
//     (it had a live candidate that met its predicate when it was queued),
//     so it fails with ErrProviderUnavailable, never with the rejection,
//     which means "no provider could ever take this request";
//   - any other error: w keeps those of its candidates that are still live
//     (possibly none, then it is in no heap) and becomes stale, to be
//     re-resolved at the next event that could grant it (retryStaleLocked).
func (s *Scheduler) resolveLocked(w *waiter) {
	cands, err := w.req.Resolve()
	switch {
	case errors.Is(err, ErrProviderUnavailable):
		s.loseLocked(w, fmt.Errorf("model %q: %w", w.group.name, err))
	case errors.Is(err, ErrUnknownModel), errors.Is(err, ErrNoProvider), errors.Is(err, ErrCandidatesRejected):
		// %v: the cause is text; the outcome is unavailable alone.
		s.loseLocked(w, fmt.Errorf("model %q: %w: %v", w.group.name, ErrProviderUnavailable, err))
	case err != nil:
		kept := w.cands[:0]
		for _, c := range w.cands {
			if live(c.res, c.Candidate) {
				kept = append(kept, c)
			}
		}
		if len(kept) != len(w.cands) {
			s.setCandidatesLocked(w, kept)
		}
		s.markStaleLocked(w)
	default:
		filter := Request{Long: w.req.Long} // only the live filter: no choice made here
		if cands, _ = s.scanLocked(cands, &filter); len(cands) == 0 {
			s.loseLocked(w, fmt.Errorf("model %q: %w: every candidate is gone", w.group.name, ErrProviderUnavailable))
			return
		}
		s.setCandidatesLocked(w, s.choicesLocked(cands))
		s.unstaleLocked(w)
		s.foundLocked(w)
	}
}

// retryStaleLocked re-resolves every stale waiter, in enqueue order
// (resolveLocked), and returns those still waiting, in that order, for the
// caller to grant after it pumped what it freed. It costs nothing when no
// waiter is stale.
func (s *Scheduler) retryStaleLocked() []*waiter {
	if s.staleHead == nil {
		return nil
	}
	var retried []*waiter
	for w := s.staleHead; w != nil; {
		next := w.nextStale
		s.resolveLocked(w)
		if w.state == waiting {
			retried = append(retried, w)
		}
		w = next
	}
	return retried
}

// grantEachLocked hands each waiting w of ws, in order, a free slot of one
// of its candidates, if one has one: the interactive ones first, then the
// batch ones, so no batch waiter takes a slot an interactive one of ws
// could use.
func (s *Scheduler) grantEachLocked(ws []*waiter) {
	batch := false
	for _, w := range ws {
		if w.band == batchBand {
			batch = true
		} else if w.state == waiting {
			s.grantLocked(w)
		}
	}
	if !batch {
		return
	}
	for _, w := range ws {
		if w.band == batchBand && w.state == waiting {
			s.grantLocked(w)
		}
	}
}

// freedLocked offers what a release or a capacity change freed on r: stale
// waiters are re-resolved first (so one that recovered takes its place in
// r's heaps), then r's heaps are pumped, then the re-resolved waiters get
// any other free slot they now list; a drained orphan r is then dropped.
func (s *Scheduler) freedLocked(r *resource) {
	retried := s.retryStaleLocked()
	s.pumpResourceLocked(r)
	s.grantEachLocked(retried)
	s.dropIfDrainedLocked(r)
}

// dropIfDrainedLocked forgets r if it is an orphan with no lease and no
// waiter listing it: its node connection ended, or the node's newer
// connection no longer has the provider, and nothing refers to it any more.
// A node left without resources is forgotten too, generation included:
// after that, only Activate's ownership check tells a late activation of
// an old generation. It runs at the fence, at the Activate that orphans
// r, and at the release of r's last lease.
func (s *Scheduler) dropIfDrainedLocked(r *resource) {
	if !r.orphan || r.leases.head != nil || len(r.short) != 0 || len(r.long) != 0 || s.resources[r.key] != r {
		return
	}
	delete(s.resources, r.key)
	if byProvider := s.nodes[r.key.node]; byProvider != nil {
		delete(byProvider, r.key.provider)
		if len(byProvider) == 0 {
			delete(s.nodes, r.key.node)
		}
	}
}

// releaseLocked moves l to released and frees its slot, without pumping. It
// reports whether this call made the transition.
func (s *Scheduler) releaseLocked(l *Lease, reason string) bool {
	if l.state == leaseReleased {
		return false
	}
	l.state = leaseReleased
	l.reason = reason
	if l.info.RunID != "" && s.byRun[l.info.RunID] == l {
		delete(s.byRun, l.info.RunID)
	}
	r := l.res
	r.leases.remove(l)
	r.inFlight--
	if l.info.Long {
		r.longInFlight--
	}
	if l.batch {
		r.batchInFlight--
	}
	s.active--
	return true
}

// ReleaseRun releases the lease tracked under runID (a terminal run event).
// It reports whether a lease was released; an unknown or already released
// run id is a no-op.
func (s *Scheduler) ReleaseRun(runID, reason string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	l := s.byRun[runID]
	if l == nil || !s.releaseLocked(l, reason) {
		return false
	}
	s.observeLocked(l)
	s.freedLocked(l.res)
	return true
}

// Activate makes the providers in specs available for the node's connection
// generation gen, marks the node's other providers orphan (forgetting those
// already drained), re-resolves every waiter and hands out free slots.
// isCurrentOwner (nil = always) is called under the scheduler's lock: when it
// reports false, or the scheduler holds a resource of a newer generation of
// the node, Activate changes nothing (a stale callback). A node whose
// resources were all fenced and drained is forgotten, generation included:
// then only isCurrentOwner tells a late activation of an old generation.
// Invalid specs (empty or duplicate provider id, capacity < 1, negative long
// capacity) return an error wrapping ErrInvalid and change nothing.
func (s *Scheduler) Activate(nodeID string, gen uint64, specs []ResourceSpec, isCurrentOwner func() bool) error {
	if nodeID == "" {
		return fmt.Errorf("%w: empty node id", ErrInvalid)
	}
	seen := make(map[string]bool, len(specs))
	for _, spec := range specs {
		if err := spec.validate(); err != nil {
			return fmt.Errorf("node %q: %w", nodeID, err)
		}
		if seen[spec.ProviderID] {
			return fmt.Errorf("%w: node %q: duplicate provider id %q", ErrInvalid, nodeID, spec.ProviderID)
		}
		seen[spec.ProviderID] = true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if isCurrentOwner != nil && !isCurrentOwner() {
		return nil
	}
	byProvider := s.nodes[nodeID]
	for _, r := range byProvider {
		if r.generation > gen {
			return nil
		}
	}
	if byProvider == nil {
		byProvider = make(map[string]*resource, len(specs))
		s.nodes[nodeID] = byProvider
	}
	for _, r := range byProvider {
		if !seen[r.key.provider] {
			r.orphan = true
		}
	}
	for _, spec := range specs {
		r := byProvider[spec.ProviderID]
		if r == nil {
			r = &resource{key: resourceKey{nodeID, spec.ProviderID}}
			byProvider[spec.ProviderID] = r
			s.resources[r.key] = r
		}
		r.generation = gen
		r.orphan = false
		r.capacity, r.longCapacity = spec.Capacity, longOr(spec.LongCapacity, spec.Capacity)
	}
	s.reresolveLocked()
	for _, r := range byProvider {
		s.dropIfDrainedLocked(r)
	}
	if len(byProvider) == 0 {
		delete(s.nodes, nodeID)
	}
	return nil
}

func longOr(long, capacity int) int {
	if long == 0 {
		return capacity
	}
	return long
}

// Fence settles a node connection that ended: every lease of the node with
// generation ≤ gen is released (but those kept on fence, Lease.KeepOnFence) and every resource of the node owned by a
// generation ≤ gen is marked orphan; gen 0 fences the whole node. Waiters
// then re-resolve their candidates, free slots are handed out, and the
// node's drained orphan resources are forgotten. A fence that matches
// nothing (a callback for a superseded generation) changes nothing.
func (s *Scheduler) Fence(nodeID string, gen uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	changed := false
	for _, r := range s.nodes[nodeID] {
		for l := r.leases.head; l != nil; {
			next := l.next
			if !l.keep && (gen == 0 || l.info.Generation <= gen) {
				changed = s.releaseLocked(l, "node fenced") || changed
			}
			l = next
		}
		if !r.orphan && (gen == 0 || r.generation <= gen) {
			r.orphan = true
			changed = true
		}
	}
	if changed {
		s.reresolveLocked()
		for _, r := range s.nodes[nodeID] {
			s.dropIfDrainedLocked(r)
		}
	}
}

// SetCapacity changes a provider's capacity and long capacity (0 = capacity)
// at once, and hands out the slots a rise frees. A resource above its new
// capacity admits nothing until its in-flight count drains below it. It
// returns an error wrapping ErrInvalid (capacity < 1, negative long
// capacity) or ErrUnknownResource (never activated, or a drained orphan
// already forgotten), changing nothing.
func (s *Scheduler) SetCapacity(nodeID, providerID string, capacity, longCapacity int) error {
	if err := validateCapacity(providerID, capacity, longCapacity); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.resources[resourceKey{nodeID, providerID}]
	if r == nil {
		return fmt.Errorf("%w: node %q provider %q", ErrUnknownResource, nodeID, providerID)
	}
	r.capacity, r.longCapacity = capacity, longOr(longCapacity, capacity)
	s.freedLocked(r)
	return nil
}

// UpdatePolicy applies the non-zero fields of p to group name, for later
// admissions; queued waiters keep their deadlines and in-flight leases are
// untouched. A group not seen yet gets p as its override. It returns an
// error wrapping ErrInvalid for an empty name or negative field.
func (s *Scheduler) UpdatePolicy(name string, p Policy) error {
	if name == "" {
		return fmt.Errorf("%w: empty model name", ErrInvalid)
	}
	if err := p.validate(); err != nil {
		return fmt.Errorf("model %q: %w", name, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.overrides[name] = s.overrides[name].overlay(p)
	if g := s.groups[name]; g != nil {
		g.policy = g.policy.overlay(p)
	}
	return nil
}
