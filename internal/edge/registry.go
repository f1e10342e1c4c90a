package edge

import (
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"

	"iop/internal/scheduler"
	"iop/internal/wire/nodev1"
)

// maxOutbox is the most control messages (dispatches, cancels) that may wait
// for a node's control stream; one more means the node stopped reading it
// and the connection is closed.
const maxOutbox = 4096

// provider is one provider of one node connection, as its Hello described
// it. The fields above mu-guarded ones are immutable.
type provider struct {
	id     string
	typ    string
	models []string // served model names, sorted, unique
	caps   []string // lifecycle capabilities, sorted, unique
	capSet map[string]bool
	path   nodev1.ExecutionPath

	// Guarded by registry.mu.
	healthy      bool
	capacity     int // ≥ 1
	longCapacity int // 0 = follows capacity
}

// NeedChoices is the need of a request for more than one choice (OpenAI's
// "n", or a completion's "best_of", above 1). No provider declares it: a
// tunnel-path (OpenAI-compatible) provider has it, since the request
// reaches it as sent; a normalized-path one (Ollama, a command) answers
// one choice per request and does not.
const NeedChoices = "choices"

// serves reports whether p serves the model name m.
func (p *provider) serves(m string) bool {
	_, ok := slices.BinarySearch(p.models, m)
	return ok
}

// lacks returns the first capability of needs that p does not have, or "".
func (p *provider) lacks(needs []string) string {
	for _, n := range needs {
		has := p.capSet[n]
		if n == NeedChoices {
			has = p.path == nodev1.ExecutionPath_EXECUTION_PATH_TUNNEL
		}
		if !has {
			return n
		}
	}
	return ""
}

// conn is one accepted Connect stream of a node: one generation.
type conn struct {
	nodeID      string
	label       string
	version     string
	gen         uint64 // set by registry.add before the conn is shared
	connectedAt time.Time
	providers   []*provider // sorted by id
	byID        map[string]*provider
	// wake has one slot; enqueue fills it when the outbox gains a message.
	wake chan struct{}
	// superseded is closed when a newer connection of the node replaces
	// this one; broken when the outbox overflows.
	superseded, broken       chan struct{}
	supersedeOnce, breakOnce sync.Once

	mu       sync.Mutex // guards the fields below
	outbox   []*nodev1.EdgeMessage
	closed   bool
	lastSeen time.Time

	// draining: the node said Drain; its providers are no candidates.
	// Guarded by registry.mu.
	draining bool
}

// parseHello validates a Hello (DESIGN.md "Words": provider) and builds the
// connection it describes, not yet registered. Errors wrap errHelloInvalid
// and name the offending field; the text is sent to the node.
func parseHello(h *nodev1.Hello, now time.Time) (*conn, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{errHelloInvalid}, args...)...)
	}
	if h.GetNodeId() == "" {
		return nil, bad("empty node_id")
	}
	if h.GetRuntimeConcurrency() < 0 {
		return nil, bad("runtime_concurrency %d is negative", h.GetRuntimeConcurrency())
	}
	if len(h.GetProviders()) == 0 {
		return nil, bad("no providers")
	}
	defaultCapacity := int(h.GetRuntimeConcurrency())
	if defaultCapacity == 0 {
		defaultCapacity = 1
	}
	c := &conn{
		nodeID:      h.GetNodeId(),
		label:       h.GetLabel(),
		version:     h.GetVersion(),
		connectedAt: now,
		byID:        make(map[string]*provider, len(h.GetProviders())),
		wake:        make(chan struct{}, 1),
		superseded:  make(chan struct{}),
		broken:      make(chan struct{}),
		lastSeen:    now,
	}
	for i, hp := range h.GetProviders() {
		id := hp.GetId()
		if id == "" {
			return nil, bad("providers[%d]: empty id", i)
		}
		if c.byID[id] != nil {
			return nil, bad("duplicate provider id %q", id)
		}
		if len(hp.GetModels()) == 0 {
			return nil, bad("provider %q: no models", id)
		}
		if slices.Contains(hp.GetModels(), "") {
			return nil, bad("provider %q: empty model name", id)
		}
		if hp.GetCapacity() < 0 {
			return nil, bad("provider %q: capacity %d is negative", id, hp.GetCapacity())
		}
		if hp.GetLongCapacity() < 0 {
			return nil, bad("provider %q: long_capacity %d is negative", id, hp.GetLongCapacity())
		}
		switch hp.GetExecutionPath() {
		case nodev1.ExecutionPath_EXECUTION_PATH_TUNNEL, nodev1.ExecutionPath_EXECUTION_PATH_NORMALIZED:
		default:
			return nil, bad("provider %q: unknown execution_path %v", id, hp.GetExecutionPath())
		}
		capacity := int(hp.GetCapacity())
		if capacity == 0 {
			capacity = defaultCapacity
		}
		p := &provider{
			id:           id,
			typ:          hp.GetType(),
			models:       sortedUnique(hp.GetModels()),
			caps:         sortedUnique(hp.GetCapabilities()),
			path:         hp.GetExecutionPath(),
			healthy:      hp.GetHealthy(),
			capacity:     capacity,
			longCapacity: int(hp.GetLongCapacity()),
		}
		p.capSet = make(map[string]bool, len(p.caps))
		for _, cp := range p.caps {
			p.capSet[cp] = true
		}
		c.byID[id] = p
		c.providers = append(c.providers, p)
	}
	sort.Slice(c.providers, func(i, j int) bool { return c.providers[i].id < c.providers[j].id })
	return c, nil
}

func sortedUnique(in []string) []string {
	out := slices.Clone(in)
	sort.Strings(out)
	return slices.Compact(out)
}

// enqueue queues m for the connection's control stream, for the Connect
// handler to send. It never blocks. It reports false when the connection is
// closed or its outbox overflowed (which also closes it).
func (c *conn) enqueue(m *nodev1.EdgeMessage) bool {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return false
	}
	if len(c.outbox) >= maxOutbox {
		c.mu.Unlock()
		c.breakOnce.Do(func() { close(c.broken) })
		return false
	}
	c.outbox = append(c.outbox, m)
	c.mu.Unlock()
	select {
	case c.wake <- struct{}{}:
	default:
	}
	return true
}

// takeOutbox returns and clears the queued control messages.
func (c *conn) takeOutbox() []*nodev1.EdgeMessage {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := c.outbox
	c.outbox = nil
	return out
}

// close marks the connection closed: later enqueues fail.
func (c *conn) close() {
	c.mu.Lock()
	c.closed = true
	c.outbox = nil
	c.mu.Unlock()
}

func (c *conn) touch(now time.Time) {
	c.mu.Lock()
	c.lastSeen = now
	c.mu.Unlock()
}

func (c *conn) seen() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lastSeen
}

func (c *conn) supersede() { c.supersedeOnce.Do(func() { close(c.superseded) }) }

// servedBy is one provider of one connection serving a model name.
type servedBy struct {
	c *conn
	p *provider
}

// ForgetAfter is how long the edge remembers a node that is gone (its
// connection ended and no newer one replaced it) and a model name no
// current connection serves. Until then the gone node's providers count as
// configured (a request only they could meet is unavailable, 503, not
// rejected, 400: the node may come back), the model names stay known (no
// provider, 503, not unknown, 404), and the node's circuit breakers and
// metrics label values are kept. After that they are forgotten, at the next
// connect or disconnect of any node, so nodes that come and go leave no
// state behind. It is longer than DefaultBreakerMaxCool, so a node's open
// circuit outlives a quick restart.
const ForgetAfter = 10 * time.Minute

// registry holds the current connection of every node and an index of who
// serves which model name, and remembers gone nodes and model names for
// ForgetAfter. It is read under the scheduler's lock (resolvers, ownership
// checks), so it never calls the scheduler itself.
type registry struct {
	now func() time.Time // the edge's clock; immutable

	mu     sync.RWMutex // guards the fields below
	nodes  map[string]*conn
	served map[string][]servedBy // served model name → providers of current conns
	// lastServed holds the model names no current connection serves, with
	// the time the last one that did went away; gone the nodes without a
	// current connection, with their last one and the time it ended. Both
	// are forgotten ForgetAfter later (expiry, in time order).
	lastServed map[string]time.Time
	gone       map[string]goneNode
	expiry     []expiring
	lastGen    uint64
	changed    chan struct{} // closed and replaced on every change
}

// goneNode is a node's last connection, ended at at.
type goneNode struct {
	c  *conn
	at time.Time
}

// expiring is an entry of registry.lastServed (model) or registry.gone
// (node) as of at; it is forgotten at at + ForgetAfter unless it changed
// since.
type expiring struct {
	model, node string
	at          time.Time
}

func newRegistry(now func() time.Time) *registry {
	return &registry{
		now:        now,
		nodes:      make(map[string]*conn),
		served:     make(map[string][]servedBy),
		lastServed: make(map[string]time.Time),
		gone:       make(map[string]goneNode),
		changed:    make(chan struct{}),
	}
}

// knownLocked reports whether model is served by a current connection, or
// was until less than ForgetAfter ago.
func (r *registry) knownLocked(model string) bool {
	if len(r.served[model]) > 0 {
		return true
	}
	_, ok := r.lastServed[model]
	return ok
}

// forget drops the gone nodes and unserved model names older than
// ForgetAfter and returns the node ids it forgot. It costs O(1) per entry
// forgotten.
func (r *registry) forget() (nodes []string) {
	now := r.now()
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, e := range r.expiry {
		if now.Sub(e.at) < ForgetAfter {
			break
		}
		n++
		if e.node != "" {
			if g, ok := r.gone[e.node]; ok && g.at.Equal(e.at) {
				delete(r.gone, e.node)
				nodes = append(nodes, e.node)
			}
		} else if at, ok := r.lastServed[e.model]; ok && at.Equal(e.at) {
			delete(r.lastServed, e.model)
		}
	}
	r.expiry = dropHead(r.expiry, n)
	return nodes
}

// dropHead returns q without its first n entries. When they are most of
// it, the rest is copied to a new array, so the old one (and the names it
// holds) is freed; the copies cost O(1) per entry dropped.
func dropHead[T any](q []T, n int) []T {
	if n > 0 && len(q)-n < len(q)/4 {
		return slices.Clone(q[n:])
	}
	return q[n:]
}

// goneProviders calls f with each provider of a gone node's last
// connection, until f returns true; it reports whether one did.
func (r *registry) goneProvidersLocked(f func(*provider) bool) bool {
	for _, g := range r.gone {
		for _, p := range g.c.providers {
			if f(p) {
				return true
			}
		}
	}
	return false
}

// add makes c its node's current connection with a new generation, greater
// than every generation handed out before, and returns the connection it
// replaces, if any.
func (r *registry) add(c *conn) (old *conn) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lastGen++
	c.gen = r.lastGen
	old = r.nodes[c.nodeID]
	if old != nil {
		r.unindexLocked(old)
	}
	r.nodes[c.nodeID] = c
	delete(r.gone, c.nodeID)
	for _, p := range c.providers {
		for _, m := range p.models {
			r.served[m] = append(r.served[m], servedBy{c, p})
			delete(r.lastServed, m)
		}
	}
	r.notifyLocked()
	return old
}

// remove drops c if it is still its node's current connection, reporting
// whether it was.
func (r *registry) remove(c *conn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.nodes[c.nodeID] != c {
		return false
	}
	delete(r.nodes, c.nodeID)
	r.unindexLocked(c)
	now := r.now()
	r.gone[c.nodeID] = goneNode{c: c, at: now}
	r.expiry = append(r.expiry, expiring{node: c.nodeID, at: now})
	r.notifyLocked()
	return true
}

// unindexLocked drops c's providers from the served index; a model name
// left unserved is remembered as of now.
func (r *registry) unindexLocked(c *conn) {
	var now time.Time
	for _, p := range c.providers {
		for _, m := range p.models {
			list := slices.DeleteFunc(r.served[m], func(s servedBy) bool { return s.c == c })
			if len(list) > 0 {
				r.served[m] = list
				continue
			}
			delete(r.served, m)
			if now.IsZero() {
				now = r.now()
			}
			r.lastServed[m] = now
			r.expiry = append(r.expiry, expiring{model: m, at: now})
		}
	}
}

// isCurrent reports whether c is its node's current connection.
func (r *registry) isCurrent(c *conn) bool {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.nodes[c.nodeID] == c
}

// lookup returns the current connection of node if it has generation gen,
// and its provider providerID; nils otherwise.
func (r *registry) lookup(node string, gen uint64, providerID string) (*conn, *provider) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	c := r.nodes[node]
	if c == nil || c.gen != gen || c.byID[providerID] == nil {
		return nil, nil
	}
	return c, c.byID[providerID]
}

// specs returns the scheduler resources of c as they stand.
func (r *registry) specs(c *conn) []scheduler.ResourceSpec {
	r.mu.RLock()
	defer r.mu.RUnlock()
	specs := make([]scheduler.ResourceSpec, 0, len(c.providers))
	for _, p := range c.providers {
		specs = append(specs, scheduler.ResourceSpec{ProviderID: p.id, Capacity: p.capacity, LongCapacity: p.longCapacity})
	}
	return specs
}

// drain marks c draining if it is its node's current connection, and
// reports whether it did (false: replaced, or already draining).
func (r *registry) drain(c *conn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.nodes[c.nodeID] != c || c.draining {
		return false
	}
	c.draining = true
	r.notifyLocked()
	return true
}

// isDraining reports whether c said Drain.
func (r *registry) isDraining(c *conn) bool {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return c.draining
}

// providerChange is what a ProviderUpdate changed.
type providerChange struct {
	capacity, longCapacity int
	capacityChanged        bool
	healthChanged          bool
}

// update applies u to the provider of c it names, if c is current. ok is
// false for an unknown provider, a negative field, or a replaced c.
func (r *registry) update(c *conn, u *nodev1.ProviderUpdate) (ch providerChange, ok bool) {
	if u.GetCapacity() < 0 || u.GetLongCapacity() < 0 {
		return ch, false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	p := c.byID[u.GetProviderId()]
	if p == nil || r.nodes[c.nodeID] != c {
		return ch, false
	}
	if u.GetHealthy() != p.healthy {
		p.healthy = u.GetHealthy()
		ch.healthChanged = true
	}
	if n := int(u.GetCapacity()); n > 0 && n != p.capacity {
		p.capacity = n
		ch.capacityChanged = true
	}
	if n := int(u.GetLongCapacity()); n > 0 && n != p.longCapacity {
		p.longCapacity = n
		ch.capacityChanged = true
	}
	ch.capacity, ch.longCapacity = p.capacity, p.longCapacity
	if ch.healthChanged || ch.capacityChanged {
		r.notifyLocked()
	}
	return ch, true
}

func (r *registry) notifyLocked() {
	close(r.changed)
	r.changed = make(chan struct{})
}

// notify wakes everyone waiting on changes.
func (r *registry) notify() {
	r.mu.Lock()
	r.notifyLocked()
	r.mu.Unlock()
}

// changes returns a channel closed at the next change of the registry or
// of the scheduler state the edge drives (activation, fence, capacity).
func (r *registry) changes() <-chan struct{} {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.changed
}
