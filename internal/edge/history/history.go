package history

import (
	"math"
	"slices"
	"sort"
	"sync"
	"time"
	"unsafe"

	"iop/internal/clock"
	"iop/internal/edge/adminwire"
	"iop/internal/edge/api/observe"
	"iop/internal/edge/contract"
)

// Window is how many seconds the history keeps: 15 minutes.
const Window = 900

// tickLag is how long after a second's end the sampler seals it, so that
// a timer firing a little early never seals a second still going.
const tickLag = 5 * time.Millisecond

// Snapshotter is where the provider samples come from; *edge.Service is
// one.
type Snapshotter interface {
	Snapshot() contract.Snapshot
}

// outcomes are the request outcomes a second counts, in the order the
// history lists them; a record with any other outcome counts as "other".
var outcomes = [...]string{
	contract.OutcomeCompleted.String(), contract.OutcomeRefused.String(), contract.OutcomeUpstreamError.String(),
	contract.OutcomeClientGone.String(), contract.OutcomeInvalidRequest.String(), contract.OutcomeWriteFailed.String(),
	contract.OutcomeError.String(), contract.OutcomeEdgeStopped.String(), other,
}

// reasons are the refusal reasons a second counts (RefusalReason), in
// the order the history lists them; any other counts as "other".
var reasons = [...]string{
	contract.AdmissionQueueFull.String(), contract.AdmissionQueueTimeout.String(), contract.AdmissionUnavailable.String(),
	contract.AdmissionRejected.String(), contract.AdmissionUnknownModel.String(), contract.AdmissionDispatchFailed.String(),
	"concurrency_limit_exceeded", "rate_limit_exceeded", "model_not_allowed", other,
}

const other = "other"

var (
	outcomeIndex = indexOf(outcomes[:])
	reasonIndex  = indexOf(reasons[:])
)

func indexOf(names []string) map[string]int {
	m := make(map[string]int, len(names))
	for i, n := range names {
		m[n] = i
	}
	return m
}

// RefusalReason is why a refused request (OutcomeRefused) was refused:
// its admission (queue_full, unknown_model, ...), or, refused by its
// key's limits before admission, its error code
// (concurrency_limit_exceeded, rate_limit_exceeded, model_not_allowed).
// The events stream's request_refused and the history say the same.
func RefusalReason(rec observe.RequestRecord) string {
	if rec.Admission != "" {
		return rec.Admission.String()
	}
	return rec.ErrorCode
}

// The time-to-first-token buckets: bucket k holds times in
// [bucketBase·2^(k/4), bucketBase·2^((k+1)/4)); bucket 0 also holds
// anything shorter, the last anything longer.
const (
	bucketBase     = time.Millisecond
	bucketsPerStep = 4 // per octave
	numBuckets     = 68
)

// bucketUpper[k] is bucket k's upper bound (the last one's is never used).
var bucketUpper = func() (b [numBuckets]time.Duration) {
	for k := range b {
		b[k] = time.Duration(float64(bucketBase) * math.Exp2(float64(k+1)/bucketsPerStep))
	}
	return b
}()

// bucketOf is the bucket of d.
func bucketOf(d time.Duration) int {
	return min(sort.Search(numBuckets-1, func(k int) bool { return d < bucketUpper[k] }), numBuckets-1)
}

// bucketMid is bucket k's geometric midpoint.
func bucketMid(k int) time.Duration {
	return time.Duration(float64(bucketBase) * math.Exp2((float64(k)+0.5)/bucketsPerStep))
}

// slot is one second's request aggregates.
type slot struct {
	mu sync.Mutex // guards the fields below
	// sec is the Unix second held (0: never used); a slot holding an
	// older second than one being added to is reset first.
	sec int64
	// sealed: the second is over, it takes no more additions.
	sealed bool
	counts
}

// counts are the aggregates of one second.
type counts struct {
	requests     [len(outcomes)]uint32
	refusals     [len(reasons)]uint32
	ttft         [numBuckets]uint32
	ttftCount    uint32
	ttftMin      time.Duration
	ttftMax      time.Duration
	outputTokens int64
}

// resetLocked makes s hold sec, empty.
func (s *slot) resetLocked(sec int64) {
	s.sec, s.sealed, s.counts = sec, false, counts{}
}

// providerName names a provider of a sample.
type providerName struct{ node, provider string }

// providerSample is one provider's counters; id indexes History.names.
type providerSample struct {
	id                         uint32
	inFlight, queued, capacity int32
}

// sampleSet is the provider samples of one second.
type sampleSet struct {
	sec     int64 // 0: none
	samples []providerSample
}

// History is the edge's per-second aggregates of the last Window seconds.
// Create it with New; feed it RequestDone; Start its sampler.
type History struct {
	clock clock.Clock
	snap  Snapshotter
	start int64 // the second New was called in: nothing earlier is listed
	slots [Window]slot

	mu       sync.Mutex // guards the fields below; taken before a slot's mu
	through  int64      // the last second sealed
	sets     [Window]sampleSet
	ids      map[providerName]uint32
	names    []providerName
	lastSeen []int64 // by id: the last second with a sample of it
	free     []uint32
	timer    clock.Timer
	stopped  bool
}

var _ observe.Observer = (*History)(nil)

// New returns an empty History reading time from c and provider
// counters from snap. Its sampler is not running: call Start.
func New(c clock.Clock, snap Snapshotter) *History {
	start := c.Now().Unix()
	return &History{clock: c, snap: snap, start: start, through: start - 1, ids: make(map[providerName]uint32)}
}

// Start starts the sampler: at the end of each second (tickLag after it,
// by the clock) it seals the seconds that are over and samples the
// providers. It runs until Stop; a second Start does nothing.
func (h *History) Start() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.timer == nil && !h.stopped {
		h.timer = h.clock.AfterFunc(untilNextTick(h.clock.Now()), h.tick)
	}
}

// Stop stops the sampler; the history still answers Since.
func (h *History) Stop() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.stopped = true
	if h.timer != nil {
		h.timer.Stop()
	}
}

// untilNextTick is the time from now to tickLag after the next second
// starts.
func untilNextTick(now time.Time) time.Duration {
	return time.Second - time.Duration(now.Nanosecond()) + tickLag
}

func (h *History) tick() {
	h.Sample()
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.stopped {
		h.timer = h.clock.AfterFunc(untilNextTick(h.clock.Now()), h.tick)
	}
}

// RequestDone counts one finished API request in the current second (or,
// if the sampler sealed that one meanwhile, the next).
func (h *History) RequestDone(rec observe.RequestRecord) {
	sec := h.clock.Now().Unix()
	outcome, ok := outcomeIndex[rec.Outcome.String()]
	if !ok {
		outcome = outcomeIndex[other]
	}
	reason := -1
	if rec.Outcome == contract.OutcomeRefused {
		if reason, ok = reasonIndex[RefusalReason(rec)]; !ok {
			reason = reasonIndex[other]
		}
	}
	bucket := -1
	if rec.TimeToFirstToken > 0 {
		bucket = bucketOf(rec.TimeToFirstToken)
	}
	var tokens int64
	if rec.TokensKnown {
		tokens = int64(rec.OutputTokens)
	}
	h.count(sec, outcome, reason, bucket, rec.TimeToFirstToken, tokens)
}

// count counts a request in second sec, or the first later one not
// sealed.
func (h *History) count(sec int64, outcome, reason, bucket int, ttft time.Duration, tokens int64) {
	for range Window {
		if h.add(sec, outcome, reason, bucket, ttft, tokens) {
			return
		}
		sec++
	}
}

// add counts a request in second sec unless sec's slot is sealed (or
// holds a later second); it reports whether it counted it.
func (h *History) add(sec int64, outcome, reason, bucket int, ttft time.Duration, tokens int64) bool {
	s := &h.slots[sec%Window]
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sec < sec {
		s.resetLocked(sec)
	}
	if s.sec != sec || s.sealed {
		return false
	}
	s.requests[outcome]++
	if reason >= 0 {
		s.refusals[reason]++
	}
	if bucket >= 0 {
		s.ttft[bucket]++
		if s.ttftCount == 0 || ttft < s.ttftMin {
			s.ttftMin = ttft
		}
		s.ttftMax = max(s.ttftMax, ttft)
		s.ttftCount++
	}
	s.outputTokens += tokens
	return true
}

// Sample seals every second that is over by the clock and records the
// providers' counters, read now, as the last one's. The sampler calls it
// each second; a call within a second already sealed does nothing.
func (h *History) Sample() {
	now := h.clock.Now().Unix()
	h.mu.Lock()
	due := now-1 > h.through
	h.mu.Unlock()
	if !due {
		return
	}
	snap := h.snap.Snapshot()
	h.mu.Lock()
	defer h.mu.Unlock()
	last := now - 1
	if last <= h.through {
		return
	}
	for sec := max(h.through+1, last-Window+1); sec <= last; sec++ {
		h.seal(sec)
	}
	h.through = last
	h.recordLocked(last, snap.Providers)
}

// seal marks second sec's slot over.
func (h *History) seal(sec int64) {
	s := &h.slots[sec%Window]
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sec < sec {
		s.resetLocked(sec)
	}
	if s.sec == sec {
		s.sealed = true
	}
}

// recordLocked keeps the provider counters of second sec and forgets the
// names of providers with no sample in the window.
func (h *History) recordLocked(sec int64, providers []contract.ProviderSnapshot) {
	set := &h.sets[sec%Window]
	if cap(set.samples) < len(providers) {
		set.samples = make([]providerSample, 0, len(providers))
	}
	set.sec, set.samples = sec, set.samples[:0]
	for _, p := range providers {
		name := providerName{p.NodeID, p.ProviderID}
		id, ok := h.ids[name]
		if !ok {
			if n := len(h.free); n > 0 {
				id, h.free = h.free[n-1], h.free[:n-1]
				h.names[id] = name
			} else {
				id = uint32(len(h.names))
				h.names, h.lastSeen = append(h.names, name), append(h.lastSeen, 0)
			}
			h.ids[name] = id
		}
		h.lastSeen[id] = sec
		set.samples = append(set.samples, providerSample{id: id, inFlight: int32(p.InFlight), queued: int32(p.Queued), capacity: int32(p.Capacity)})
	}
	// A name whose last sample left the window is in no listed second:
	// its id may name another provider from now on.
	for name, id := range h.ids {
		if h.lastSeen[id] <= sec-Window {
			delete(h.ids, name)
			h.names[id] = providerName{}
			h.free = append(h.free, id)
		}
	}
}

// Since returns the seconds after since (Unix seconds; 0 or less: the
// whole window) that are over and still in the window, oldest first.
func (h *History) Since(since int64) adminwire.History {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := adminwire.History{Object: "history", IntervalSeconds: 1, WindowSeconds: Window, Since: since, Through: h.through, Start: h.start,
		Outcomes: slices.Clone(outcomes[:]), Reasons: slices.Clone(reasons[:]), Data: []adminwire.Second{}}
	if since >= h.through {
		return out // nothing after it yet (and since+1 would overflow at MaxInt64)
	}
	from := max(since+1, h.through-Window+1, h.start)
	for sec := from; sec <= h.through; sec++ {
		second, ok := h.second(sec)
		if !ok {
			continue
		}
		if set := &h.sets[sec%Window]; set.sec == sec {
			second.Providers = make([]adminwire.ProviderSample, 0, len(set.samples))
			for _, p := range set.samples {
				name := h.names[p.id]
				second.Providers = append(second.Providers, adminwire.ProviderSample{NodeID: name.node, ProviderID: name.provider,
					InFlight: int(p.inFlight), Queued: int(p.queued), Capacity: int(p.capacity)})
			}
		}
		out.Data = append(out.Data, second)
	}
	return out
}

// second reads second sec's request aggregates; false if its slot holds
// another second (it left the window while Since read).
func (h *History) second(sec int64) (adminwire.Second, bool) {
	s := &h.slots[sec%Window]
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sec != sec || !s.sealed {
		return adminwire.Second{}, false
	}
	out := adminwire.Second{Time: sec, Requests: map[string]int{}, Refusals: map[string]int{}, OutputTokens: s.outputTokens}
	for i, n := range s.requests {
		if n > 0 {
			out.Requests[outcomes[i]] = int(n)
		}
	}
	for i, n := range s.refusals {
		if n > 0 {
			out.Refusals[reasons[i]] = int(n)
		}
	}
	if s.ttftCount > 0 {
		out.TimeToFirstToken = &adminwire.Quantiles{Count: int(s.ttftCount),
			P50: s.quantile(0.50), P95: s.quantile(0.95)}
	}
	return out, true
}

// quantile is the q-quantile (nearest rank) of the slot's times to
// first token, in milliseconds (two decimals): the smallest time seen
// for the first rank, the largest for the last, else its bucket's
// midpoint kept within those two.
func (s *counts) quantile(q float64) float64 {
	rank := max(1, uint32(math.Ceil(q*float64(s.ttftCount))))
	switch rank {
	case 1:
		return ms(s.ttftMin)
	case s.ttftCount:
		return ms(s.ttftMax)
	}
	var seen uint32
	k := 0
	for ; k < numBuckets-1; k++ {
		if seen += s.ttft[k]; seen >= rank {
			break
		}
	}
	return ms(min(max(bucketMid(k), s.ttftMin), s.ttftMax))
}

// ms is d in milliseconds, rounded to two decimals.
func ms(d time.Duration) float64 {
	return math.Round(float64(d)/float64(time.Millisecond)*100) / 100
}

// Bytes is the memory the history holds, in bytes: its slots, its
// provider samples' arrays and its provider names (their strings
// counted at their length).
func (h *History) Bytes() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := int(unsafe.Sizeof(*h))
	for i := range h.sets {
		n += cap(h.sets[i].samples) * int(unsafe.Sizeof(providerSample{}))
	}
	n += cap(h.names)*int(unsafe.Sizeof(providerName{})) + cap(h.lastSeen)*8 + cap(h.free)*4
	for _, name := range h.names {
		n += len(name.node) + len(name.provider)
	}
	// The ids map: about a key, a value and a word of overhead per entry.
	n += len(h.ids) * int(unsafe.Sizeof(providerName{})+8)
	return n
}
