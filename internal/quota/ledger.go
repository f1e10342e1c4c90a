package quota

import (
	"fmt"
	"log/slog"
	"maps"
	"math"
	"sort"
	"sync"
	"time"

	"iop/internal/clock"
)

// Resources of a usage vector.
const (
	resInput = iota
	resOutput
	resRequests
	resGPU  // milliseconds × cost_weight
	resCost // currency micro-units
	numRes
)

// vec is an amount of every resource.
type vec [numRes]int64

func (v *vec) add(o vec) {
	for i := range v {
		v[i] += o[i]
	}
}

func (v *vec) sub(o vec) {
	for i := range v {
		v[i] -= o[i]
	}
}

// granules is how many buckets a window's length is cut into: a
// settlement is kept until the end of its bucket plus the window's
// length, so it may count up to Length/granules longer than it must,
// never shorter.
const granules = 60

// lengths are the distinct window lengths; ring i of a scope keeps the
// settlements of windows of lengths[i].
var lengths = [...]time.Duration{time.Minute, 24 * time.Hour, Month}

// ringOf is the ring index of each window.
var ringOf = func() (r [NumWindows]int) {
	for i, w := range Windows {
		for j, l := range lengths {
			if w.Length == l {
				r[i] = j
			}
		}
	}
	return r
}()

// Usage is what one request asks for at admission (its worst case) or
// used at its end.
type Usage struct {
	// Model is the requested model name, the key of the price table.
	Model string
	// InputTokens and OutputTokens are the prompt's and the answer's
	// tokens (at admission: the estimate and the cap).
	InputTokens, OutputTokens int64
	// SlotTime is how long a provider slot was (or may be) held.
	SlotTime time.Duration
	// CostWeight is the provider's cost_weight; 0 means 1.
	CostWeight float64
}

// Config is a Ledger's configuration.
type Config struct {
	// Clock tells the windows' time; nil means clock.Real.
	Clock clock.Clock
	// Logger logs an unknown model price, once per model; nil discards.
	Logger *slog.Logger
}

// Scope is one key's or team's configuration in a Ledger.
type Scope struct {
	// Team is a key's team ("" = none); unused for a team.
	Team string
	// Bounds are its limits.
	Bounds Bounds
	// TokensCounted is what its token windows count: CountTotal (also
	// ""), CountInput or CountOutput.
	TokensCounted string
}

// Ledger holds the quota windows of keys and teams: what is settled in
// each window and what reservations hold now. A reservation is taken
// only if, for every window of the key and of its team, settled +
// reserved + ask ≤ limit; a settlement replaces a reservation by the
// actual usage. Safe for concurrent use.
type Ledger struct {
	clk    clock.Clock
	logger *slog.Logger

	mu          sync.Mutex // guards the fields below
	keys        map[string]Scope
	teams       map[string]Scope
	prices      map[string]Price
	state       map[scopeID]*scope // kept across Configure, by name
	unpriced    map[string]bool    // models logged without a price
	outstanding int                // reservations not yet settled
	gen         uint64             // Reset's count: reservations of an older one settle as no-ops
	doubles     int                // Settle or Cancel of a settled reservation
	overruns    int                // settlements above their reservation
}

type scopeID struct{ kind, name string }

// scope is the live state of one key or team.
type scope struct {
	id       scopeID
	bounds   Bounds
	tokens   string
	reserved vec
	rings    [len(lengths)][]bucket // settlements, oldest first
}

// bucket is what was settled in one granule of a ring.
type bucket struct {
	idx int64 // start / granule
	v   vec
}

// New returns an empty Ledger: no key has a quota until Configure.
func New(cfg Config) *Ledger {
	if cfg.Clock == nil {
		cfg.Clock = clock.Real()
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Ledger{clk: cfg.Clock, logger: cfg.Logger, state: make(map[scopeID]*scope), unpriced: make(map[string]bool)}
}

// Configure sets the keys' and teams' limits and the price table (model
// name → price), at once for later reservations. Usage settled and
// reserved stays with each key and team name; reservations taken under
// the old limits settle as usual. A key whose Team names no team has no
// team limits.
func (l *Ledger) Configure(keys, teams map[string]Scope, prices map[string]Price) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.keys, l.teams, l.prices = keys, teams, prices
	for name, s := range keys {
		st := l.scopeLocked(scopeID{"key", name})
		st.bounds, st.tokens = s.Bounds, s.TokensCounted
	}
	for name, s := range teams {
		st := l.scopeLocked(scopeID{"team", name})
		st.bounds, st.tokens = s.Bounds, s.TokensCounted
	}
	for id, st := range l.state {
		var ok bool
		if id.kind == "key" {
			_, ok = keys[id.name]
		} else {
			_, ok = teams[id.name]
		}
		if !ok {
			st.bounds = Bounds{} // usage kept should the name come back
		}
	}
}

func (l *Ledger) scopeLocked(id scopeID) *scope {
	st := l.state[id]
	if st == nil {
		st = &scope{id: id}
		l.state[id] = st
	}
	return st
}

// Limited reports whether the key or its team has a limit.
func (l *Ledger) Limited(key string) bool {
	if l == nil {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	k, ok := l.keys[key]
	if !ok {
		return false
	}
	return k.Bounds.Any() || l.teams[k.Team].Bounds.Any()
}

// scopesLocked returns the key's scope and its team's, if any.
func (l *Ledger) scopesLocked(key string) []*scope {
	k, ok := l.keys[key]
	if !ok {
		return nil
	}
	out := []*scope{l.state[scopeID{"key", key}]}
	if _, ok := l.teams[k.Team]; ok && k.Team != "" {
		out = append(out, l.state[scopeID{"team", k.Team}])
	}
	return out
}

// vecLocked converts u to a usage vector of requests requests, pricing
// its tokens (an unknown model costs nothing and is logged once).
func (l *Ledger) vecLocked(u Usage, requests int64) vec {
	w := u.CostWeight
	if w <= 0 {
		w = 1
	}
	v := vec{resInput: u.InputTokens, resOutput: u.OutputTokens, resRequests: requests,
		resGPU: int64(math.Ceil(float64(u.SlotTime.Milliseconds()) * w))}
	if p, ok := l.prices[u.Model]; ok {
		v[resCost] = int64(math.Ceil(float64(u.InputTokens)*p.Input + float64(u.OutputTokens)*p.Output))
	} else if len(l.prices) > 0 && !l.unpriced[u.Model] && u.Model != "" {
		l.unpriced[u.Model] = true
		l.logger.Warn("no price for model: its tokens are counted, its cost is 0", "model", u.Model)
	}
	return v
}

// counted is v's amount in window w of s.
func (s *scope) counted(w int, v vec) int64 {
	switch Windows[w].Unit {
	case "tokens":
		switch s.tokens {
		case CountInput:
			return v[resInput]
		case CountOutput:
			return v[resOutput]
		}
		return v[resInput] + v[resOutput]
	case "requests":
		return v[resRequests]
	case "gpu_ms":
		return v[resGPU]
	}
	return v[resCost]
}

// granule is the bucket width of ring r.
func granule(r int) time.Duration { return lengths[r] / granules }

// expiry is when bucket b of ring r stops counting.
func expiry(r int, b bucket) time.Time {
	g := granule(r)
	return time.Unix(0, (b.idx+1)*int64(g)).Add(lengths[r]).UTC()
}

// pruneLocked drops the buckets that stopped counting by now.
func (s *scope) pruneLocked(now time.Time) {
	for r := range s.rings {
		ring := s.rings[r]
		i := 0
		for i < len(ring) && !expiry(r, ring[i]).After(now) {
			i++
		}
		s.rings[r] = ring[i:]
	}
}

// settledLocked is what ring r holds (after pruneLocked).
func (s *scope) settledLocked(r int) vec {
	var v vec
	for _, b := range s.rings[r] {
		v.add(b.v)
	}
	return v
}

// usedLocked is window w's settled + reserved amount (after pruneLocked).
func (s *scope) usedLocked(w int) int64 {
	return s.counted(w, s.settledLocked(ringOf[w])) + s.counted(w, s.reserved)
}

// addSettledLocked puts v in every ring's bucket of at.
func (s *scope) addSettledLocked(at time.Time, v vec) {
	for r := range s.rings {
		s.addRingLocked(r, at, v)
	}
}

// addRingLocked puts v in ring r's bucket of at.
func (s *scope) addRingLocked(r int, at time.Time, v vec) {
	idx := at.UnixNano() / int64(granule(r))
	ring := s.rings[r]
	i := sort.Search(len(ring), func(i int) bool { return ring[i].idx >= idx })
	if i < len(ring) && ring[i].idx == idx {
		ring[i].v.add(v)
		return
	}
	ring = append(ring, bucket{})
	copy(ring[i+1:], ring[i:])
	ring[i] = bucket{idx: idx, v: v}
	s.rings[r] = ring
}

// refusalLocked checks window w of s for ask; nil if it fits.
func (s *scope) refusalLocked(w int, ask vec, now time.Time) *Refusal {
	limit := s.bounds[w]
	asked := s.counted(w, ask)
	if limit == 0 || asked == 0 {
		return nil
	}
	used := s.usedLocked(w)
	if used+asked <= limit {
		return nil
	}
	ref := &Refusal{Scope: s.id.kind, Name: s.id.name, Window: Windows[w].Name, Limit: limit, Asked: asked, Used: used}
	if asked > limit {
		ref.Never = true
		return ref
	}
	ref.ResetAt = s.fitsAtLocked(w, asked, now)
	ref.RetryAfter = ref.ResetAt.Sub(now)
	return ref
}

// reservedRetry is how soon a request held back only by reservations in
// flight is told to retry: whenever one of them settles, which the
// ledger cannot foresee.
const reservedRetry = time.Second

// fitsAtLocked is when window w of s will hold asked more, if nothing
// else is reserved meanwhile and the reservations in flight stay as
// they are: the expiry of the oldest settlements that make room, or, when
// the reservations in flight alone hold it, reservedRetry from now.
func (s *scope) fitsAtLocked(w int, asked int64, now time.Time) time.Time {
	r := ringOf[w]
	used := s.usedLocked(w)
	for _, b := range s.rings[r] {
		used -= s.counted(w, b.v)
		if used+asked <= s.bounds[w] {
			return expiry(r, b)
		}
	}
	return now.Add(reservedRetry)
}

// Reservation is one request's hold on its key's and team's windows,
// from Reserve (or Adopt) to its Settle or Cancel, which happens once.
type Reservation struct {
	l       *Ledger
	key     string
	ask     Usage
	scopes  []*scope
	v       vec
	gen     uint64
	settled bool // guarded by l.mu

	// end, for a reservation held by another ledger (Held), is called
	// by its first Settle or Cancel; guarded by once.
	end  func(used Usage, ran bool)
	once sync.Once
}

// Held returns a reservation of ask that another ledger holds (a
// scheduler leader's, several edges): its first Settle or Cancel calls
// end once (ran false for Cancel), later ones nothing.
func Held(ask Usage, end func(used Usage, ran bool)) *Reservation {
	return &Reservation{ask: ask, end: end}
}

// Ask is what the reservation holds (OutputTokens as clamped by
// ReserveUpTo).
func (r *Reservation) Ask() Usage { return r.ask }

// Reserve takes ask for the key's and its team's windows, or refuses it
// with a *Refusal naming the first window that cannot hold it (key
// windows first, in Windows order). A key the ledger does not know is
// given an empty reservation. ask counts one request.
func (l *Ledger) Reserve(key string, ask Usage) (*Reservation, error) {
	return l.ReserveUpTo(key, ask, ask.OutputTokens)
}

// ReserveUpTo is Reserve for a request whose answer may be cut: it
// reserves the largest OutputTokens ≤ ask.OutputTokens that every window
// holds, refusing (*Refusal) if that is below minOutput. The
// reservation's Ask says what was reserved.
func (l *Ledger) ReserveUpTo(key string, ask Usage, minOutput int64) (*Reservation, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.clk.Now()
	scopes := l.scopesLocked(key)
	for _, s := range scopes {
		s.pruneLocked(now)
	}
	if minOutput < ask.OutputTokens {
		ask.OutputTokens = max(minOutput, min(ask.OutputTokens, l.fitOutputLocked(scopes, ask)))
	}
	v := l.vecLocked(ask, 1)
	for _, s := range scopes {
		for w := range NumWindows {
			if ref := s.refusalLocked(w, v, now); ref != nil {
				return nil, ref
			}
		}
	}
	for _, s := range scopes {
		s.reserved.add(v)
	}
	l.outstanding++
	return &Reservation{l: l, key: key, ask: ask, scopes: scopes, v: v, gen: l.gen}, nil
}

// fitOutputLocked is the most output tokens every window of scopes holds
// beside ask's other amounts (may be negative: none fits).
func (l *Ledger) fitOutputLocked(scopes []*scope, ask Usage) int64 {
	base := ask
	base.OutputTokens = 0
	b := l.vecLocked(base, 1)
	var perToken float64 // currency micros per output token
	if p, ok := l.prices[ask.Model]; ok {
		perToken = p.Output
	}
	best := int64(math.MaxInt64)
	for _, s := range scopes {
		for w := range NumWindows {
			if s.bounds[w] == 0 {
				continue
			}
			room := s.bounds[w] - s.usedLocked(w) - s.counted(w, b)
			switch {
			case Windows[w].Unit == "tokens" && s.tokens != CountInput:
				best = min(best, room)
			case Windows[w].Unit == "micros" && perToken > 0:
				best = min(best, int64(math.Floor(float64(room)/perToken)))
			}
		}
	}
	return best
}

// Adopt takes ask for a request already running (a new scheduler
// leader's adopted runs), whether or not it fits: later reservations
// wait until the windows are under their limits again.
func (l *Ledger) Adopt(key string, ask Usage) *Reservation {
	l.mu.Lock()
	defer l.mu.Unlock()
	scopes := l.scopesLocked(key)
	v := l.vecLocked(ask, 1)
	for _, s := range scopes {
		s.reserved.add(v)
	}
	l.outstanding++
	return &Reservation{l: l, key: key, ask: ask, scopes: scopes, v: v, gen: l.gen}
}

// Restore counts the settled usage of requests requests, used in sum, at
// the instant at (a new leader rebuilding its windows from the usage
// ledger).
func (l *Ledger) Restore(key string, at time.Time, used Usage, requests int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	v := l.vecLocked(used, requests)
	for _, s := range l.scopesLocked(key) {
		s.addSettledLocked(at, v)
	}
}

// Reset forgets every window's usage, settled and reserved, keeping the
// configuration: a leader rebuilds its windows from scratch (Restore,
// Adopt, Fill). A reservation taken before settles as a no-op.
func (l *Ledger) Reset() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.gen++
	l.outstanding = 0
	for _, st := range l.state {
		st.reserved = vec{}
		for r := range st.rings {
			st.rings[r] = nil
		}
	}
}

// Fill charges every limited window of length length, of every key and
// team, with what it has room for now, as if settled now: none of them
// takes a reservation until that charge has left the window (length and
// at most a granule more). A new leader that cannot know what the old
// one let run in its last moments fills its shortest windows this way;
// the charge counts in those windows only.
func (l *Ledger) Fill(length time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.clk.Now()
	ring := -1
	for r, n := range lengths {
		if n == length {
			ring = r
		}
	}
	if ring < 0 {
		return
	}
	for _, s := range l.state {
		s.pruneLocked(now)
		var v vec
		for w := range NumWindows {
			if s.bounds[w] == 0 || ringOf[w] != ring {
				continue
			}
			room := s.bounds[w] - s.usedLocked(w) - s.counted(w, v)
			if room <= 0 {
				continue
			}
			switch Windows[w].Unit {
			case "tokens":
				if s.tokens == CountOutput {
					v[resOutput] += room
				} else {
					v[resInput] += room
				}
			case "requests":
				v[resRequests] += room
			case "gpu_ms":
				v[resGPU] += room
			default:
				v[resCost] += room
			}
		}
		if v != (vec{}) {
			s.addRingLocked(ring, now, v)
		}
	}
}

// Settle ends the reservation with the request's actual usage (one
// request): the reservation is returned and used is counted in every
// window from now. Only the first Settle or Cancel counts; a later one is
// a no-op, counted in Stats.DoubleSettles. Usage above the reservation
// is counted as it is (windows may then be over their limits until it
// expires) and, but for slot time, in Stats.Overruns: a request's slot
// time is not known before it runs, so a GPU window is checked at
// admission and charged the actual slot time here. Safe on nil.
func (r *Reservation) Settle(used Usage) { r.settle(used, 1) }

// Cancel ends the reservation of a request that never ran (refused
// before it started): it counts nothing, not even the request.
func (r *Reservation) Cancel() { r.settle(Usage{}, 0) }

func (r *Reservation) settle(used Usage, requests int64) {
	if r == nil {
		return
	}
	if r.l == nil {
		r.once.Do(func() {
			if r.end != nil {
				r.end(used, requests > 0)
			}
		})
		return
	}
	l := r.l
	l.mu.Lock()
	defer l.mu.Unlock()
	if r.settled {
		l.doubles++
		return
	}
	r.settled = true
	if r.gen != l.gen {
		return // taken before a Reset: its usage is counted anew
	}
	l.outstanding--
	v := l.vecLocked(used, requests)
	for i := range v {
		if i != resGPU && v[i] > r.v[i] { // slot time is known only at the end
			l.overruns++
			break
		}
	}
	now := l.clk.Now()
	for _, s := range r.scopes {
		s.reserved.sub(r.v)
		if v != (vec{}) {
			s.addSettledLocked(now, v)
		}
	}
}

// Stats counts the ledger's reservations.
type Stats struct {
	// Outstanding reservations: taken and not yet settled.
	Outstanding int
	// DoubleSettles counts Settle or Cancel calls on a settled reservation.
	DoubleSettles int
	// Overruns counts settlements above their reservation.
	Overruns int
}

// Stats returns the counts.
func (l *Ledger) Stats() Stats {
	l.mu.Lock()
	defer l.mu.Unlock()
	return Stats{Outstanding: l.outstanding, DoubleSettles: l.doubles, Overruns: l.overruns}
}

// WindowStatus is one limited window of a key or team now.
type WindowStatus struct {
	Scope, Name string // "key" or "team", and its name
	Window      Window
	// Limit and Used (settled in the window + reserved) in Window.Unit.
	Limit, Used int64
	// ResetAt is when what is settled now has left the window (now when
	// nothing is); reservations in flight are not foreseen.
	ResetAt time.Time
}

// Remaining is Limit − Used, at least 0.
func (s WindowStatus) Remaining() int64 { return max(0, s.Limit-s.Used) }

// Status returns the limited windows of the key and of its team, key
// first, each in Windows order.
func (l *Ledger) Status(key string) []WindowStatus {
	if l == nil {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.clk.Now()
	var out []WindowStatus
	for _, s := range l.scopesLocked(key) {
		out = s.statusLocked(now, out)
	}
	return out
}

// All returns the limited windows of every configured key and team,
// ordered by scope and name.
func (l *Ledger) All() []WindowStatus {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.clk.Now()
	ids := make([]scopeID, 0, len(l.state))
	for id := range l.state {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool {
		if ids[i].kind != ids[j].kind {
			return ids[i].kind < ids[j].kind
		}
		return ids[i].name < ids[j].name
	})
	var out []WindowStatus
	for _, id := range ids {
		out = l.state[id].statusLocked(now, out)
	}
	return out
}

func (s *scope) statusLocked(now time.Time, out []WindowStatus) []WindowStatus {
	s.pruneLocked(now)
	for w := range NumWindows {
		if s.bounds[w] == 0 {
			continue
		}
		r := ringOf[w]
		reset := now
		for _, b := range s.rings[r] {
			if s.counted(w, b.v) > 0 {
				reset = expiry(r, b)
			}
		}
		out = append(out, WindowStatus{Scope: s.id.kind, Name: s.id.name, Window: Windows[w], Limit: s.bounds[w], Used: s.usedLocked(w), ResetAt: reset})
	}
	return out
}

// ScopeStatus is one key's or team's quota configuration and its windows
// now.
type ScopeStatus struct {
	Scope, Name string // "key" or "team", and its name
	Team        string // a key's team, "" for none or for a team
	// Limits are its windows' limits (uncapped and default_max_tokens,
	// a key's admission settings, are not the ledger's and stay empty).
	Limits Limits
	// Windows are its limited windows (WindowStatus).
	Windows []WindowStatus
}

// Scopes kinds.
const (
	ScopeKey  = "key"
	ScopeTeam = "team"
)

// Describe returns the configured key or team (scope ScopeKey or
// ScopeTeam) named name; ok false if there is none.
func (l *Ledger) Describe(scope, name string) (_ ScopeStatus, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.describeLocked(scopeID{scope, name})
}

// DescribeAll returns every configured key and team, keys first, each
// ordered by name.
func (l *Ledger) DescribeAll() []ScopeStatus {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []ScopeStatus
	for _, kind := range []string{ScopeKey, ScopeTeam} {
		m := l.keys
		if kind == ScopeTeam {
			m = l.teams
		}
		names := make([]string, 0, len(m))
		for n := range m {
			names = append(names, n)
		}
		sort.Strings(names)
		for _, n := range names {
			if st, ok := l.describeLocked(scopeID{kind, n}); ok {
				out = append(out, st)
			}
		}
	}
	return out
}

func (l *Ledger) describeLocked(id scopeID) (ScopeStatus, bool) {
	var cfg Scope
	var ok bool
	switch id.kind {
	case ScopeKey:
		cfg, ok = l.keys[id.name]
	case ScopeTeam:
		cfg, ok = l.teams[id.name]
	}
	if !ok {
		return ScopeStatus{}, false
	}
	st := l.state[id]
	return ScopeStatus{Scope: id.kind, Name: id.name, Team: cfg.Team, Limits: st.bounds.limits(st.tokens),
		Windows: st.statusLocked(l.clk.Now(), nil)}, true
}

// limits converts b back to Limits.
func (b Bounds) limits(tokens string) Limits {
	return Limits{TokensPerMinute: b[0], TokensPerDay: b[1], TokensCounted: tokens, RequestsPerMinute: b[2], RequestsPerDay: b[3],
		GPUSecondsPerDay: float64(b[4]) / 1000, GPUSecondsPerMonth: float64(b[5]) / 1000,
		BudgetPerDay: float64(b[6]) / 1e6, BudgetPerMonth: float64(b[7]) / 1e6}
}

// SetLimits replaces the windows' limits of the configured key or team
// named name, until the next Configure (a reload of the keys): the
// admin API's change of a quota. Errors: ErrUnknownScope, or
// ErrInvalidLimits: lim's (Limits.Validate), or a key's admission settings
// (uncapped, default_max_tokens), which the keys file sets, not this.
func (l *Ledger) SetLimits(scope, name string, lim Limits) error {
	if scope == ScopeKey && (lim.Uncapped != "" || lim.DefaultMaxTokens != 0) {
		return fmt.Errorf("%w: a key's uncapped and default_max_tokens are set in the keys file (a reload applies them), not by a quota change", ErrInvalidLimits)
	}
	if err := lim.ValidateTeam(); err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	m := l.keys
	if scope == ScopeTeam {
		m = l.teams
	} else if scope != ScopeKey {
		m = nil
	}
	cfg, ok := m[name]
	if !ok {
		return fmt.Errorf("%w: %s %q", ErrUnknownScope, scope, name)
	}
	cfg.Bounds, cfg.TokensCounted = lim.Bounds(), lim.TokensCounted
	m = maps.Clone(m) // Configure's maps are the caller's
	m[name] = cfg
	if scope == ScopeTeam {
		l.teams = m
	} else {
		l.keys = m
	}
	st := l.state[scopeID{scope, name}]
	st.bounds, st.tokens = cfg.Bounds, cfg.TokensCounted
	return nil
}
