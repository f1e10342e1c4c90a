package auth

import (
	"context"
	"crypto/sha256"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"iop/internal/modelname"
	"iop/internal/quota"
)

// Caller is one authenticated key and its live limit state.
type Caller struct {
	name          string
	hash          [sha256.Size]byte
	models        map[string]bool // nil = every model
	maxConcurrent int             // 0 = no limit
	now           func() time.Time
	expiresAt     time.Time // zero = never
	weight        int       // ≥ 1
	priority      int       // PriorityRank of Key.Priority
	headerMax     bool      // Key.PriorityHeader is set
	priorityMax   int       // its PriorityRank
	team          string    // Key.Team
	quota         quota.Limits
	st            *keyState // shared by the Callers of one key name across Replace
}

// keyState is a key's live limit state, kept across Keyring.Replace for
// as long as the key keeps its name.
type keyState struct {
	mu       sync.Mutex // guards the fields below
	inFlight int
	rpm      int           // the limiter's requests_per_minute; 0 = none
	limiter  *rate.Limiter // nil = no per-minute limit
}

// setRate sets the per-minute limit, keeping the bucket when rpm is
// unchanged.
func (s *keyState) setRate(rpm int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if rpm == s.rpm {
		return
	}
	s.rpm, s.limiter = rpm, nil
	if rpm > 0 {
		// Refilled evenly over the minute, up to a burst of the whole
		// minute's allowance.
		s.limiter = rate.NewLimiter(rate.Every(time.Minute/time.Duration(rpm)), rpm)
	}
}

// Name is the key's configured name.
func (c *Caller) Name() string { return c.name }

// Limited reports whether the key has a limit to count (max_concurrent or
// requests_per_minute); without one, Admit never refuses it.
func (c *Caller) Limited() bool {
	c.st.mu.Lock()
	defer c.st.mu.Unlock()
	return c.maxConcurrent > 0 || c.st.limiter != nil
}

// Team is the key's team (Key.Team), "" for none.
func (c *Caller) Team() string { return c.team }

// Quota is the key's own quota configuration (Key.Quota).
func (c *Caller) Quota() quota.Limits { return c.quota }

// RateStatus is the key's per-minute allowance now: its
// requests_per_minute (0 = none), how many requests it may start at once,
// and how long until the allowance is whole again.
func (c *Caller) RateStatus() (limit, remaining int, full time.Duration) {
	st := c.st
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.limiter == nil {
		return 0, 0, 0
	}
	tokens := st.limiter.TokensAt(c.now())
	missing := float64(st.limiter.Burst()) - tokens
	return st.limiter.Burst(), max(0, int(tokens)), time.Duration(missing * float64(time.Minute) / float64(st.rpm))
}

// Weight is the key's flow weight (Key.Weight), ≥ 1.
func (c *Caller) Weight() int { return c.weight }

// Priority returns the rank (PriorityRank) of a request of the key that
// asks for header, the X-Iop-Priority value ("" = none): the key's own
// priority when the header is absent or the key does not allow it (Key.
// PriorityHeader ""), else the header's, lowered to the key's
// PriorityHeader. ok is false for a header that names no priority while
// the key allows the header.
func (c *Caller) Priority(header string) (rank int, ok bool) {
	if header == "" || !c.headerMax {
		return c.priority, true
	}
	rank, ok = PriorityRank(header)
	if !ok {
		return c.priority, false
	}
	return min(rank, c.priorityMax), true
}

// Allows reports whether the key may request model. An Ollama name "x" and
// "x:latest" are one model (package modelname's rule, the edge's
// everywhere).
func (c *Caller) Allows(model string) bool {
	if c.models == nil {
		return true
	}
	if c.models[model] {
		return true
	}
	alt := modelname.Alternative(model)
	return alt != "" && c.models[alt]
}

// Filter returns the names of models the key may request, in order.
func (c *Caller) Filter(models []string) []string {
	if c.models == nil {
		return models
	}
	out := make([]string, 0, len(models))
	for _, m := range models {
		if c.Allows(m) {
			out = append(out, m)
		}
	}
	return out
}

// Admit takes one request slot of the key: one of MaxConcurrent, and one
// of the minute's RequestsPerMinute. A key over either limit gets a
// *LimitError (wrapping ErrLimited) saying which and when to retry, and
// takes nothing: a request refused for concurrency spends none of the
// minute's allowance. Release the returned permit when the request ends.
func (c *Caller) Admit() (*Permit, error) { return c.AdmitLeaving(0) }

// AdmitLeaving is Admit for background work of the key (a batch's lines):
// it takes a slot only while leave of the key's MaxConcurrent stay free
// for its other requests, at most MaxConcurrent−1 (a key of
// max_concurrent 1 lends its one slot). Refused, it is a *LimitError as
// Admit's.
func (c *Caller) AdmitLeaving(leave int) (*Permit, error) {
	st := c.st
	st.mu.Lock()
	defer st.mu.Unlock()
	if leave = min(leave, c.maxConcurrent-1); leave < 0 {
		leave = 0
	}
	if c.maxConcurrent > 0 && st.inFlight >= c.maxConcurrent-leave {
		// A slot frees when any of the key's requests ends; retry soon.
		return nil, &LimitError{Limit: "max_concurrent", Max: c.maxConcurrent, RetryAfter: time.Second}
	}
	if st.limiter != nil {
		now := c.now()
		r := st.limiter.ReserveN(now, 1)
		if d := r.DelayFrom(now); d > 0 {
			r.CancelAt(now)
			return nil, &LimitError{Limit: "requests_per_minute", Max: st.limiter.Burst(), RetryAfter: d}
		}
	}
	st.inFlight++
	return &Permit{st: st}, nil
}

// Adopt takes a concurrency slot for a request already running (a new
// scheduler leader counting the runs it adopts), even above
// max_concurrent: the key's next requests wait until it is under again.
// It takes nothing from the per-minute allowance.
func (c *Caller) Adopt() *Permit {
	st := c.st
	st.mu.Lock()
	defer st.mu.Unlock()
	st.inFlight++
	return &Permit{st: st}
}

// ExhaustRate empties the key's per-minute allowance at once, so it
// refills from zero at its steady rate (RequestsPerMinute per minute):
// a new scheduler leader, which cannot know how much of the allowance
// the old one gave out, assumes all of it. A no-op without a limit.
func (c *Caller) ExhaustRate() {
	st := c.st
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.limiter == nil {
		return
	}
	now := c.now()
	if n := int(st.limiter.TokensAt(now)); n > 0 {
		st.limiter.AllowN(now, n)
	}
}

// InFlight is how many of the key's requests hold a permit.
func (c *Caller) InFlight() int {
	c.st.mu.Lock()
	defer c.st.mu.Unlock()
	return c.st.inFlight
}

// Permit is one admitted request of a key. Release gives its concurrency
// slot back, exactly once however often it is called.
type Permit struct {
	st   *keyState
	once sync.Once
}

// Release gives the slot back; later calls do nothing. Safe on nil.
func (p *Permit) Release() {
	if p == nil {
		return
	}
	p.once.Do(func() {
		p.st.mu.Lock()
		p.st.inFlight--
		p.st.mu.Unlock()
	})
}

type callerKey struct{}

// NewContext returns ctx carrying the authenticated caller.
func NewContext(ctx context.Context, c *Caller) context.Context {
	return context.WithValue(ctx, callerKey{}, c)
}

// FromContext returns the caller ctx carries, or nil (an open API).
func FromContext(ctx context.Context) *Caller {
	c, _ := ctx.Value(callerKey{}).(*Caller)
	return c
}
