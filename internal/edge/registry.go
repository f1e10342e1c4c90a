package edge

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	"iop/internal/edge/contract"
	"iop/internal/scheduler"
	"iop/internal/wire/nodev1"
)

// maxOutbox is the most control messages (dispatches, cancels) that may wait
// for a node's control stream; one more means the node stopped reading it
// and the connection is closed.
const maxOutbox = 4096

// provider is one provider of one node connection, as its Hello and later
// ProviderUpdates described it. The fields above the registry.mu-guarded
// ones are immutable.
type provider struct {
	id     string
	typ    string
	caps   []string // the provider's capabilities, sorted, unique
	capSet map[string]bool
	path   nodev1.ExecutionPath

	// Guarded by registry.mu. A models_set update replaces models and
	// model; the slice, the map and the values in it are never modified.
	healthy      bool
	capacity     int      // ≥ 1
	longCapacity int      // 0 = follows capacity
	models       []string // served model names, sorted, unique
	// model holds the served models the node described one by one
	// (Provider.model_capabilities): their own capabilities and details.
	// A served model without an entry has the provider's capabilities.
	model map[string]*servedModel
}

// servedModel is what a node said of one served model of a provider. It is
// never modified once built.
type servedModel struct {
	caps    []string // the model's capabilities, sorted, unique
	capSet  map[string]bool
	details *nodev1.ModelDetails // nil when the node said none
}

// capsOfLocked returns the capabilities of p's served model m and whether they
// are the model's own (rather than the provider's). The set is never
// modified. Callers hold registry.mu.
func (p *provider) capsOfLocked(m string) (caps map[string]bool, own bool) {
	if sm := p.model[m]; sm != nil {
		return sm.capSet, true
	}
	return p.capSet, false
}

// meetsLocked reports whether p's served model m has every capability of
// needs. Callers hold registry.mu.
func (p *provider) meetsLocked(m string, needs []string) bool {
	caps, own := p.capsOfLocked(m)
	return lacks(p.path, caps, own, needs) == ""
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
// tunnel-path provider meets, since the request reaches it as sent: a
// tool_choice of "required" or parallel_tool_calls false (Ollama cannot
// force a tool call nor keep a model to one), and an image given by an
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
// refused; it is never answered without them (a new user saw chat's
// logprobs dropped by an Ollama provider).
const NeedLogprobs = "logprobs"

// serves reports whether p serves the model name m. Call it under
// registry.mu (a provider update replaces p.models).
func (p *provider) serves(m string) bool {
	_, ok := slices.BinarySearch(p.models, m)
	return ok
}

// lacks returns the first capability of needs that a served model with
// capabilities caps (own: the model's own, else its provider's) on a
// provider answering on path does not have, or "".
func lacks(path nodev1.ExecutionPath, caps map[string]bool, own bool, needs []string) string {
	for _, n := range needs {
		has := caps[n]
		switch n {
		case NeedChoices, NeedToolChoice, NeedRemoteImages, NeedPromptBatch, NeedTokenInput, NeedLogprobs:
			has = path == nodev1.ExecutionPath_EXECUTION_PATH_TUNNEL
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
		instance:    h.GetInstance(),
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
		}
		p.capSet = setOf(p.caps)
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
		r.indexLocked(c, p)
	}
	r.notifyLocked()
	return old
}

// indexLocked adds p's served models to the index; a name served again is
// no longer remembered as unserved.
func (r *registry) indexLocked(c *conn, p *provider) {
	for _, m := range p.models {
		r.served[m] = append(r.served[m], servedBy{c, p})
		delete(r.lastServed, m)
	}
}

// unindexProviderLocked removes p's served models from the index; a model
// name left unserved is remembered as of now (unservedLocked).
func (r *registry) unindexProviderLocked(p *provider) {
	var now time.Time
	for _, m := range p.models {
		list := slices.DeleteFunc(r.served[m], func(s servedBy) bool { return s.p == p })
		if len(list) > 0 {
			r.served[m] = list
			continue
		}
		delete(r.served, m)
		if now.IsZero() {
			now = r.now()
		}
		r.unservedLocked(m, now)
	}
}

// unservedLocked remembers that no current connection serves m since now,
// until ForgetAfter later.
func (r *registry) unservedLocked(m string, now time.Time) {
	r.lastServed[m] = now
	r.expiry = append(r.expiry, expiring{model: m, at: now})
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
	for _, p := range c.providers {
		r.unindexProviderLocked(p)
	}
}

// current returns the registered connection of node, or nil.
func (r *registry) current(node string) *conn {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.nodes[node]
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

// describe returns, for the provider providerID of node's connection of
// generation gen, the first of targets it serves, that model's
// capabilities (see ModelProvider.Capabilities) and details; ok is false
// when that connection is not current or the provider serves none of them.
func (r *registry) describe(node string, gen uint64, providerID string, targets []string) (mp ModelProvider, ok bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	c := r.nodes[node]
	if c == nil || c.gen != gen || c.byID[providerID] == nil {
		return mp, false
	}
	p := c.byID[providerID]
	for _, t := range targets {
		if _, found := slices.BinarySearch(p.models, t); !found {
			continue
		}
		mp.Target = t
		if sm := p.model[t]; sm != nil {
			mp.Capabilities, mp.Details = slices.Clone(sm.caps), modelDetails(sm.details)
		} else {
			mp.Capabilities = sortedUnique(append(slices.Clone(p.caps), NeedCompletion))
		}
		return mp, true
	}
	return mp, false
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
	// modelsChanged: the served models, or what the node said of them
	// (capabilities, details), changed.
	modelsChanged bool
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
	p := c.byID[u.GetProviderId()]
	if p == nil || r.nodes[c.nodeID] != c {
		return ch, false
	}
	if !u.GetModelsSet() {
		models, model = p.models, p.model
	}
	if u.GetHealthy() && len(models) == 0 {
		return ch, false
	}
	if !slices.Equal(models, p.models) {
		r.unindexProviderLocked(p)
		p.models = models
		r.indexLocked(c, p)
		ch.modelsChanged = true
	}
	if !equalServed(model, p.model) {
		p.model = model
		ch.modelsChanged = true
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
	if ch.healthChanged || ch.capacityChanged || ch.modelsChanged {
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
