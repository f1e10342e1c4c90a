package edge

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/proto"

	"iop/internal/edge/contract"
	"iop/internal/modelname"
	"iop/internal/scheduler"
	"iop/internal/wire/nodev1"
)

// maxOutbox is the most control messages (dispatches, cancels) that may wait
// for a node's control stream; one more means the node stopped reading it
// and the connection is closed.
const maxOutbox = 4096

// provider is one provider of one node connection, as its Hello or a later
// ProviderUpdate described it. It is never modified once built: an update
// that changes a provider publishes a copy with the change in the
// registry's state (registry.update), so readers need no lock.
type provider struct {
	id     string
	typ    string
	caps   []string // the provider's capabilities, sorted, unique
	capSet map[string]bool
	path   nodev1.ExecutionPath

	healthy      bool
	costWeight   float64  // GPU-time of one slot second (0 = 1)
	capacity     int      // ≥ 1
	longCapacity int      // 0 = follows capacity
	models       []string // served model names, sorted, unique
	// model holds the served models the node described one by one
	// (Provider.model_capabilities): their own capabilities and details.
	// A served model without an entry has the provider's capabilities.
	model map[string]*servedModel
	// loaded are the models its server holds loaded, as its node last read
	// them (Provider.loaded), sorted by name; loadedSet is false while its
	// node reads none (an OpenAI-compatible provider: it serves its models
	// always). Never modified.
	loaded    []*nodev1.LoadedModel
	loadedSet bool
	// maxLoaded is how many models its server holds at once, as its node
	// was configured (0: unknown).
	maxLoaded int
}

// ollamaAPI reports whether p's server speaks Ollama's API (an ollama
// provider, or a simulator in its Ollama mode), so that its node can ask
// it for /api/show.
func (p *provider) ollamaAPI() bool {
	return p.path == nodev1.ExecutionPath_EXECUTION_PATH_NORMALIZED && (p.typ == "ollama" || p.typ == "sim")
}

// servedModel is what a node said of one served model of a provider. It is
// never modified once built.
type servedModel struct {
	caps    []string // the model's capabilities, sorted, unique
	capSet  map[string]bool
	details *nodev1.ModelDetails // nil when the node said none
}

// capsOf returns the capabilities of p's served model m and whether they
// are the model's own (rather than the provider's). The set is never
// modified.
func (p *provider) capsOf(m string) (caps map[string]bool, own bool) {
	if sm := p.model[m]; sm != nil {
		return sm.capSet, true
	}
	return p.capSet, false
}

// meets reports whether p's served model m has every capability of needs.
func (p *provider) meets(m string, needs []string) bool {
	caps, own := p.capsOf(m)
	return lacks(p.path, p.typ, caps, own, needs) == ""
}

// NeedCompletion is the need of a chat or completion request: a model that
// generates text. A served model with its own capabilities (its server
// said them, e.g. Ollama's /api/show) has it only when they list
// "completion" (an embedding model does not); one with its provider's
// capabilities has it.
const NeedCompletion = "completion"

// NeedThinking is the need of a request that asks the model to think
// (Ollama's think, OpenAI's reasoning_effort). Like NeedCompletion, a
// served model with its own capabilities has it only when they list
// "thinking" (Ollama refuses think for any other model: "does not
// support thinking"); one with its provider's capabilities has it.
const NeedThinking = "thinking"

// NeedChoices is the need of a request for more than one choice (OpenAI's
// "n", or a completion's "best_of", above 1). No provider declares it: a
// tunnel-path (OpenAI-compatible) provider has it, since the request
// reaches it as sent; a normalized-path one (Ollama, a command) answers
// one choice per request and does not.
const NeedChoices = "choices"

// NeedToolChoice and NeedRemoteImages are, like NeedChoices, needs only a
// tunnel-path provider meets, since the request reaches it as sent:
// parallel_tool_calls false without a forced tool call (Ollama cannot keep
// a model to one call; a forced call it serves as one), and an image given by an
// http(s) URL (iop fetches nothing for an Ollama provider).
const (
	NeedToolChoice   = "tool_choice"
	NeedRemoteImages = "remote_images"
)

// NeedPromptBatch and NeedTokenInput are, like NeedChoices, needs only a
// tunnel-path provider meets: a completions request with more than one
// prompt, and a completions prompt or embeddings input given as token
// ids. Ollama takes one prompt string (/api/generate; its /v1/completions
// too) and embeds text only (/api/embed: a string or strings), and a
// command takes text.
const (
	NeedPromptBatch = "prompt_batch"
	NeedTokenInput  = "token_input"
)

// NeedLogprobs is, like NeedChoices, a need only a tunnel-path provider
// meets: a request for log probabilities (chat's logprobs true or
// top_logprobs, a completion's logprobs). The translation to Ollama's API
// returns none, so the request goes to an OpenAI-compatible provider or is
// refused; it is never answered without them.
const NeedLogprobs = "logprobs"

// NeedOllamaLogprobs is the need of an Ollama client's request for log
// probabilities (logprobs true or top_logprobs above 0): only a provider
// speaking Ollama's API (type ollama, or sim on the normalized path) has
// it, since the node relays Ollama's logprobs as they come; no provider
// declares it.
const NeedOllamaLogprobs = "ollama_logprobs"

// serves reports whether p serves the model name m exactly.
func (p *provider) serves(m string) bool {
	_, ok := slices.BinarySearch(p.models, m)
	return ok
}

// servedName returns p's own spelling of the model m names under the name
// rule (package modelname: "x" and "x:latest" are one model), and whether p
// serves it; m itself when p serves that spelling.
func (p *provider) servedName(m string) (string, bool) {
	if p.serves(m) {
		return m, true
	}
	if alt := modelname.Alternative(m); alt != "" && p.serves(alt) {
		return alt, true
	}
	return "", false
}

// spellings are m and its other spelling under the name rule
// (modelname.Alternative), "" when it has none: the keys under which the
// served-name index holds the providers serving m.
func spellings(m string) [2]string { return [2]string{m, modelname.Alternative(m)} }

// lacks returns the first capability of needs that a served model with
// capabilities caps (own: the model's own, else its provider's) on a
// provider answering on path does not have, or "".
func lacks(path nodev1.ExecutionPath, typ string, caps map[string]bool, own bool, needs []string) string {
	for _, n := range needs {
		has := caps[n]
		switch n {
		case NeedChoices, NeedToolChoice, NeedRemoteImages, NeedPromptBatch, NeedTokenInput, NeedLogprobs:
			has = path == nodev1.ExecutionPath_EXECUTION_PATH_TUNNEL
		case NeedOllamaLogprobs:
			has = path == nodev1.ExecutionPath_EXECUTION_PATH_NORMALIZED && (typ == "ollama" || typ == "sim")
		case NeedCompletion, NeedThinking:
			has = has || !own
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
	instance    string // Hello.instance: the node process's random id, "" if it sent none
	gen         uint64 // set by registry.add before the conn is shared
	connectedAt time.Time
	// hello holds the providers as the Hello described them, sorted by
	// id: the connection's first state, which registry.add publishes.
	// Their ids are the connection's for its lifetime; what they are now
	// (health, capacity, models) is the registry state's (state).
	hello []*provider
	// state is the connection's state as the registry last published it
	// (set under registry.mu, with the registry state that holds it); it
	// keeps the last one after the connection left the registry. Nil
	// before registry.add.
	state atomic.Pointer[connState]
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
	// shows are the ShowRequests sent and not yet answered, by request id
	// (show.go); nextShow is the last id given.
	shows    map[uint64]*showWait
	nextShow uint64
	// keeps are the ResidencyRequests sent and not yet answered, by
	// request id (residency_keep.go); nextKeep is the last id given.
	keeps    map[uint64]chan error
	nextKeep uint64
	// idle lists the node's warm Run streams waiting for a run (warm.go);
	// noIdle is set once the connection drains or closes: it lists none
	// from then on.
	idle   []*warmStream
	noIdle bool
}

// connState is one connection as a registry state has it: its providers
// as they stand and whether its node said Drain. It is never modified once
// published; a change publishes a new one.
type connState struct {
	c *conn
	// draining: the node said Drain; its providers are no candidates.
	draining  bool
	providers []*provider // sorted by id
	byID      map[string]*provider
}

// withProvider returns cs with p in place of its provider of p's id.
func (cs *connState) withProvider(p *provider) *connState {
	out := &connState{c: cs.c, draining: cs.draining, providers: slices.Clone(cs.providers), byID: maps.Clone(cs.byID)}
	for i, q := range out.providers {
		if q.id == p.id {
			out.providers[i] = p
		}
	}
	out.byID[p.id] = p
	return out
}

// parseHello validates a Hello (DESIGN.md "Words": provider) and builds the
// connection it describes, not yet registered. Errors wrap errHelloInvalid
// and name the offending field; the text is sent to the node.
//
// Rules: a non-empty node_id; at least one provider; provider ids
// non-empty and unique; a healthy provider serves at least one model (an
// unhealthy one may come with none: its node discovers them later); no
// empty model name; model_capabilities entries named, one per model at
// most; capacity and long_capacity ≥ 0; a known execution path. A
// capacity of 0 is the Hello's runtime_concurrency, else 1; a
// long_capacity of 0 is the capacity (scheduler.ResourceSpec).
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
		instance:    h.GetInstance(),
		connectedAt: now,
		wake:        make(chan struct{}, 1),
		superseded:  make(chan struct{}),
		broken:      make(chan struct{}),
		lastSeen:    now,
	}
	ids := make(map[string]bool, len(h.GetProviders()))
	for i, hp := range h.GetProviders() {
		id := hp.GetId()
		if id == "" {
			return nil, bad("providers[%d]: empty id", i)
		}
		if ids[id] {
			return nil, bad("duplicate provider id %q", id)
		}
		// A provider whose node discovers its models may not know them
		// yet (its server did not answer): it comes unhealthy, and a
		// ProviderUpdate brings the models.
		if len(hp.GetModels()) == 0 && hp.GetHealthy() {
			return nil, bad("provider %q: no models", id)
		}
		if slices.Contains(hp.GetModels(), "") {
			return nil, bad("provider %q: empty model name", id)
		}
		model, err := servedModels(hp.GetModels(), hp.GetModelCapabilities())
		if err != nil {
			return nil, bad("provider %q: %w", id, err)
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
			model:        model,
			loaded:       hp.GetLoaded(),
			loadedSet:    hp.GetLoadedSet(),
			maxLoaded:    int(max(hp.GetMaxLoadedModels(), 0)),
			costWeight:   hp.GetCostWeight(),
		}
		p.capSet = setOf(p.caps)
		ids[id] = true
		c.hello = append(c.hello, p)
	}
	sort.Slice(c.hello, func(i, j int) bool { return c.hello[i].id < c.hello[j].id })
	return c, nil
}

func sortedUnique(in []string) []string {
	out := slices.Clone(in)
	sort.Strings(out)
	return slices.Compact(out)
}

func setOf(in []string) map[string]bool {
	set := make(map[string]bool, len(in))
	for _, s := range in {
		set[s] = true
	}
	return set
}

// servedModels builds a provider's per-model entries from a node's
// model_capabilities for the served models: an entry for a model not
// served is dropped, an entry without a model name or a second entry for
// one model is an error. Details are copied, so the message may be reused.
func servedModels(models []string, entries []*nodev1.ModelCapabilities) (map[string]*servedModel, error) {
	if len(entries) == 0 {
		return nil, nil
	}
	out := make(map[string]*servedModel, len(entries))
	for _, e := range entries {
		m := e.GetModel()
		if m == "" {
			return nil, fmt.Errorf("model_capabilities without a model")
		}
		if out[m] != nil {
			return nil, fmt.Errorf("model_capabilities of %q twice", m)
		}
		if !slices.Contains(models, m) {
			continue
		}
		sm := &servedModel{caps: sortedUnique(e.GetCapabilities())}
		sm.capSet = setOf(sm.caps)
		if d := e.GetDetails(); d != nil {
			sm.details = proto.Clone(d).(*nodev1.ModelDetails)
		}
		out[m] = sm
	}
	return out, nil
}

// equalServed reports whether two per-model maps say the same.
func equalServed(a, b map[string]*servedModel) bool {
	return maps.EqualFunc(a, b, func(x, y *servedModel) bool {
		return slices.Equal(x.caps, y.caps) && proto.Equal(x.details, y.details)
	})
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

// close marks the connection closed: later enqueues fail, and its idle
// streams end.
func (c *conn) close() {
	c.mu.Lock()
	c.closed = true
	c.outbox = nil
	c.failShowsLocked()
	c.failKeepsLocked()
	c.mu.Unlock()
	c.endIdle()
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

// servedBy is one provider of one connection serving a model name, as a
// registry state has them.
type servedBy struct {
	cs *connState
	p  *provider
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
// ForgetAfter.
//
// All of it is one immutable regState behind an atomic pointer: readers
// (the resolvers and ownership checks the scheduler calls under its lock,
// the catalog, snapshots, the service) load it and take no lock, so no
// lock is ever taken inside a scheduler callback. Writers (add, remove,
// drain, update, forget) take mu, which serializes them, build the next
// state copy-on-write (the maps are cowMaps, so a change copies only what
// it changes) and publish it before they let go of mu. The registry never
// calls the scheduler.
type registry struct {
	now func() time.Time // the edge's clock; immutable

	state atomic.Pointer[regState] // the published state; never modified, replaced under mu
	// changed is closed and replaced (notify) after every change of the
	// registry or of the scheduler state the edge drives.
	changed atomic.Pointer[chan struct{}]

	mu sync.Mutex // serializes the writers; guards the fields below
	// expiry lists the entries of regState.lastServed (model) and
	// regState.gone (node) in time order; each is forgotten ForgetAfter
	// after it was made, unless it changed since.
	expiry  []expiring
	lastGen uint64
}

// regState is the registry as it stands at one instant. It is never
// modified once published (registry.state): writers publish a new one.
type regState struct {
	nodes  cowMap[string, *connState] // node id → its current connection
	served cowMap[string, []servedBy] // served model name → providers of current conns; a list is never modified
	// lastServed holds the model names no current connection serves, with
	// the time the last one that did went away; gone the nodes without a
	// current connection, with their last one and the time it ended.
	lastServed cowMap[string, time.Time]
	gone       cowMap[string, goneNode]
}

// goneNode is a node's last connection, as it stood when it ended at at.
type goneNode struct {
	cs *connState
	at time.Time
}

// expiring is an entry of regState.lastServed (model) or regState.gone
// (node) as of at; it is forgotten at at + ForgetAfter unless it changed
// since.
type expiring struct {
	model, node string
	at          time.Time
}

func newRegistry(now func() time.Time) *registry {
	r := &registry{now: now}
	r.state.Store(&regState{})
	changed := make(chan struct{})
	r.changed.Store(&changed)
	return r
}

// load returns the published state. It takes no lock.
func (r *registry) load() *regState { return r.state.Load() }

// known reports whether model is served by a current connection, or was
// until less than ForgetAfter ago.
func (st *regState) known(model string) bool {
	if l, _ := st.served.get(model); len(l) > 0 {
		return true
	}
	_, ok := st.lastServed.get(model)
	return ok
}

// current returns the current connection of node, or nil.
func (st *regState) current(node string) *connState {
	cs, _ := st.nodes.get(node)
	return cs
}

// publishLocked makes st the registry's state; callers hold r.mu.
func (r *registry) publishLocked(st *regState) { r.state.Store(st) }

// setConnLocked makes cs its node's current connection in st, and the
// state its connection was last published in.
func (r *registry) setConnLocked(st *regState, cs *connState) {
	st.nodes = st.nodes.with(cs.c.nodeID, cs)
	cs.c.state.Store(cs)
}

// forget drops the gone nodes and unserved model names older than
// ForgetAfter and returns the node ids it forgot. It costs O(1) per entry
// forgotten.
func (r *registry) forget() (nodes []string) {
	now := r.now()
	r.mu.Lock()
	defer r.mu.Unlock()
	old := r.load()
	st := *old
	n := 0
	for _, e := range r.expiry {
		if now.Sub(e.at) < ForgetAfter {
			break
		}
		n++
		if e.node != "" {
			if g, ok := st.gone.get(e.node); ok && g.at.Equal(e.at) {
				st.gone = st.gone.without(e.node)
				nodes = append(nodes, e.node)
			}
		} else if at, ok := st.lastServed.get(e.model); ok && at.Equal(e.at) {
			st.lastServed = st.lastServed.without(e.model)
		}
	}
	r.expiry = dropHead(r.expiry, n)
	if st != *old {
		r.publishLocked(&st)
	}
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
func (st *regState) goneProviders(f func(*provider) bool) bool {
	for _, g := range st.gone.all() {
		for _, p := range g.cs.providers {
			if f(p) {
				return true
			}
		}
	}
	return false
}

// add makes c its node's current connection with a new generation, greater
// than every generation handed out before, with its providers as its Hello
// described them, and returns the connection it replaces, if any.
func (r *registry) add(c *conn) (old *conn) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lastGen++
	c.gen = r.lastGen
	cs := &connState{c: c, providers: c.hello, byID: make(map[string]*provider, len(c.hello))}
	for _, p := range c.hello {
		cs.byID[p.id] = p
	}
	st := *r.load()
	if prev := st.current(c.nodeID); prev != nil {
		r.unindexLocked(&st, prev)
		old = prev.c
	}
	r.setConnLocked(&st, cs)
	st.gone = st.gone.without(c.nodeID)
	for _, p := range cs.providers {
		r.indexLocked(&st, cs, p)
	}
	r.publishLocked(&st)
	r.notify()
	return old
}

// indexLocked adds p's served models to st's index, at the end of each
// model's list; a name served again is no longer remembered as unserved.
func (r *registry) indexLocked(st *regState, cs *connState, p *provider) {
	for _, m := range p.models {
		list, _ := st.served.get(m)
		st.served = st.served.with(m, append(slices.Clip(list), servedBy{cs, p}))
		st.lastServed = st.lastServed.without(m)
	}
}

// unindexProviderLocked removes p's served models from st's index; a model
// name left unserved is remembered as of now (unservedLocked).
func (r *registry) unindexProviderLocked(st *regState, p *provider) {
	var now time.Time
	for _, m := range p.models {
		list, _ := st.served.get(m)
		list = slices.DeleteFunc(slices.Clone(list), func(s servedBy) bool { return s.p == p })
		if len(list) > 0 {
			st.served = st.served.with(m, list)
			continue
		}
		st.served = st.served.without(m)
		if now.IsZero() {
			now = r.now()
		}
		r.unservedLocked(st, m, now)
	}
}

// repointLocked makes st's index entries of cs's connection name cs and
// its providers as they are in cs, in place (a model's list keeps its
// order), for every provider but skip's.
func (r *registry) repointLocked(st *regState, cs *connState, skip string) {
	for _, p := range cs.providers {
		if p.id == skip {
			continue
		}
		for _, m := range p.models {
			list, _ := st.served.get(m)
			list = slices.Clone(list)
			for i, s := range list {
				if s.cs.c == cs.c && s.p.id == p.id {
					list[i] = servedBy{cs, p}
				}
			}
			st.served = st.served.with(m, list)
		}
	}
}

// unservedLocked remembers that no current connection serves m since now,
// until ForgetAfter later.
func (r *registry) unservedLocked(st *regState, m string, now time.Time) {
	st.lastServed = st.lastServed.with(m, now)
	r.expiry = append(r.expiry, expiring{model: m, at: now})
}

// remove drops c if it is still its node's current connection, reporting
// whether it was.
func (r *registry) remove(c *conn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	st := *r.load()
	cs := st.current(c.nodeID)
	if cs == nil || cs.c != c {
		return false
	}
	st.nodes = st.nodes.without(c.nodeID)
	r.unindexLocked(&st, cs)
	now := r.now()
	st.gone = st.gone.with(c.nodeID, goneNode{cs: cs, at: now})
	r.expiry = append(r.expiry, expiring{node: c.nodeID, at: now})
	r.publishLocked(&st)
	r.notify()
	return true
}

// unindexLocked drops cs's providers from st's served index; a model name
// left unserved is remembered as of now.
func (r *registry) unindexLocked(st *regState, cs *connState) {
	for _, p := range cs.providers {
		r.unindexProviderLocked(st, p)
	}
}

// current returns the registered connection of node, or nil.
func (r *registry) current(node string) *conn {
	if cs := r.load().current(node); cs != nil {
		return cs.c
	}
	return nil
}

// isCurrent reports whether c is its node's current connection.
func (r *registry) isCurrent(c *conn) bool {
	cs := r.load().current(c.nodeID)
	return cs != nil && cs.c == c
}

// lookup returns the current connection of node if it has generation gen,
// and its provider providerID; nils otherwise.
func (r *registry) lookup(node string, gen uint64, providerID string) (*conn, *provider) {
	cs := r.load().current(node)
	if cs == nil || cs.c.gen != gen || cs.byID[providerID] == nil {
		return nil, nil
	}
	return cs.c, cs.byID[providerID]
}

// describe returns, for the provider providerID of node's connection of
// generation gen, the first of targets it serves (under the name rule, as
// the provider spells it), that model's
// capabilities (see ModelProvider.Capabilities) and details; ok is false
// when that connection is not current or the provider serves none of them.
func (r *registry) describe(node string, gen uint64, providerID string, targets []string) (mp contract.ModelProvider, ok bool) {
	_, p := r.lookup(node, gen, providerID)
	if p == nil {
		return mp, false
	}
	for _, target := range targets {
		t, found := p.servedName(target)
		if !found {
			continue
		}
		mp.Target, mp.OllamaAPI = t, p.ollamaAPI()
		if sm := p.model[t]; sm != nil {
			mp.Capabilities, mp.Details = slices.Clone(sm.caps), modelDetails(sm.details)
		} else {
			mp.Capabilities = sortedUnique(append(slices.Clone(p.caps), NeedCompletion))
		}
		return mp, true
	}
	return mp, false
}

// lastState returns c's state as the registry last published it (its
// Hello's, before registry.add).
func (c *conn) lastState() *connState {
	if cs := c.state.Load(); cs != nil {
		return cs
	}
	return &connState{c: c, providers: c.hello}
}

// specs returns the scheduler resources of c as they stand.
func (r *registry) specs(c *conn) []scheduler.ResourceSpec {
	cs := c.lastState()
	specs := make([]scheduler.ResourceSpec, 0, len(cs.providers))
	for _, p := range cs.providers {
		specs = append(specs, scheduler.ResourceSpec{ProviderID: p.id, Capacity: p.capacity, LongCapacity: p.longCapacity})
	}
	return specs
}

// drain marks c draining if it is its node's current connection, and
// reports whether it did (false: replaced, or already draining).
func (r *registry) drain(c *conn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	st := *r.load()
	cs := st.current(c.nodeID)
	if cs == nil || cs.c != c || cs.draining {
		return false
	}
	next := &connState{c: c, draining: true, providers: cs.providers, byID: cs.byID}
	r.setConnLocked(&st, next)
	r.repointLocked(&st, next, "")
	r.publishLocked(&st)
	r.notify()
	return true
}

// isDraining reports whether c said Drain.
func (r *registry) isDraining(c *conn) bool { return c.lastState().draining }

// providerChange is what a ProviderUpdate changed.
type providerChange struct {
	capacity, longCapacity int
	capacityChanged        bool
	healthChanged          bool
	// modelsChanged: the served models, or what the node said of them
	// (capabilities, details), changed.
	modelsChanged bool
	// loadedChanged: the models the provider holds loaded changed (no
	// concern of the scheduler).
	loadedChanged bool
}

// update applies u to the provider of c it names, if c is current. ok is
// false, and nothing changes, for an unknown provider, a negative field, a
// replaced c, or a models_set update that is invalid (an empty model name,
// a model_capabilities entry without a model or twice for one) or would
// leave the provider healthy with no model.
func (r *registry) update(c *conn, u *nodev1.ProviderUpdate) (ch providerChange, ok bool) {
	if u.GetCapacity() < 0 || u.GetLongCapacity() < 0 {
		return ch, false
	}
	var models []string
	var model map[string]*servedModel
	if u.GetModelsSet() {
		if slices.Contains(u.GetModels(), "") {
			return ch, false
		}
		models = sortedUnique(u.GetModels())
		var err error
		if model, err = servedModels(models, u.GetModelCapabilities()); err != nil {
			return ch, false
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	st := *r.load()
	cs := st.current(c.nodeID)
	if cs == nil || cs.c != c || cs.byID[u.GetProviderId()] == nil {
		return ch, false
	}
	p := cs.byID[u.GetProviderId()]
	if !u.GetModelsSet() {
		models, model = p.models, p.model
	}
	if u.GetHealthy() && len(models) == 0 {
		return ch, false
	}
	next := *p
	servedChanged := !slices.Equal(models, p.models)
	if servedChanged {
		next.models = models
		ch.modelsChanged = true
	}
	if !equalServed(model, p.model) {
		next.model = model
		ch.modelsChanged = true
	}
	if u.GetHealthy() != p.healthy {
		next.healthy = u.GetHealthy()
		ch.healthChanged = true
	}
	if n := int(u.GetCapacity()); n > 0 && n != p.capacity {
		next.capacity = n
		ch.capacityChanged = true
	}
	if n := int(u.GetLongCapacity()); n > 0 && n != p.longCapacity {
		next.longCapacity = n
		ch.capacityChanged = true
	}
	if u.GetLoadedSet() && (!p.loadedSet || !slices.EqualFunc(u.GetLoaded(), p.loaded, func(a, b *nodev1.LoadedModel) bool { return proto.Equal(a, b) })) {
		next.loaded, next.loadedSet = u.GetLoaded(), true
		ch.loadedChanged = true
	}
	ch.capacity, ch.longCapacity = next.capacity, next.longCapacity
	if !ch.healthChanged && !ch.capacityChanged && !ch.modelsChanged && !ch.loadedChanged {
		return ch, true
	}
	ncs := cs.withProvider(&next)
	r.setConnLocked(&st, ncs)
	if servedChanged {
		// Its entries move to the end of each list, as a provider newly
		// serving the models; the others' stay where they are.
		r.unindexProviderLocked(&st, p)
		r.repointLocked(&st, ncs, p.id)
		r.indexLocked(&st, ncs, &next)
	} else {
		r.repointLocked(&st, ncs, "")
	}
	r.publishLocked(&st)
	r.notify()
	return ch, true
}

// notify wakes everyone waiting on changes. It takes no lock (a writer
// calls it under mu, a connection after its Welcome without): the swap is
// atomic, so each channel is closed once, by the notify that replaced it.
func (r *registry) notify() {
	next := make(chan struct{})
	close(*r.changed.Swap(&next))
}

// changes returns a channel closed at the next change of the registry or
// of the scheduler state the edge drives (activation, fence, capacity). It
// takes no lock.
func (r *registry) changes() <-chan struct{} { return *r.changed.Load() }

// modelDetails is what a node said of a model (d, nil for nothing) as the
// contract says it.
func modelDetails(d *nodev1.ModelDetails) *contract.ModelDetails {
	if d == nil {
		return nil
	}
	return &contract.ModelDetails{
		Size: d.GetSize(), Digest: d.GetDigest(), ModifiedAt: d.GetModifiedAt(), Format: d.GetFormat(),
		Family: d.GetFamily(), Families: slices.Clone(d.GetFamilies()), ParameterSize: d.GetParameterSize(),
		QuantizationLevel: d.GetQuantizationLevel(), ParentModel: d.GetParentModel(), ContextLength: d.GetContextLength(),
	}
}
