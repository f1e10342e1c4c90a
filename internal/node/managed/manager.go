package managed

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"sync"
	"time"

	"iop/internal/clock"
	"iop/internal/node/adapter"
	"iop/internal/wire/nodev1"
)

// Loaded is one model whose server is up and healthy.
type Loaded struct {
	Model string
	Since time.Time // when its health URL first answered 200
	PID   int
}

// Deps are what a Manager is given rather than configured with.
type Deps struct {
	// Logger receives the lifecycle of every server and its output, line
	// by line (model=<name> stream=stdout|stderr); nil discards.
	Logger *slog.Logger
	// Clock times the health polls, start timeouts, TTLs and kill graces;
	// nil means clock.Real().
	Clock clock.Clock
}

// Manager runs the model servers of one managed provider and relays runs to
// them on the tunnel path: it is the provider's adapter.Tunneler.
type Manager struct {
	cfg    Config
	logger *slog.Logger
	clock  clock.Clock
	health *http.Client // health polls; no keep-alive, so no idle connection outlives a poll
	wg     sync.WaitGroup

	mu       sync.Mutex        // guards the fields below
	children map[string]*child // by model: starting, ready or stopping (until its process exited)
	changed  chan struct{}     // closed and replaced when a child exits or has no run left
	// rooms counts, by model, the places a stop made for that model's
	// start (acquire): once the stopped server has exited, its place is
	// the model's, not another's that arrived meanwhile.
	rooms map[string]int
	// roomsHeld is the sum of rooms.
	roomsHeld int
	onChange  func([]Loaded) // SetOnChange's; called with mu held
}

var _ adapter.Tunneler = (*Manager)(nil)

// New returns the Manager of cfg (defaults applied). It starts nothing until
// a run arrives. Errors: cfg's problems, joined.
func New(cfg Config, deps Deps) (*Manager, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if deps.Logger == nil {
		deps.Logger = slog.New(slog.DiscardHandler)
	}
	if deps.Clock == nil {
		deps.Clock = clock.Real()
	}
	return &Manager{
		cfg:      cfg,
		logger:   deps.Logger,
		clock:    deps.Clock,
		health:   &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: healthTimeout},
		rooms:    map[string]int{},
		children: make(map[string]*child),
		changed:  make(chan struct{}),
	}, nil
}

// SetOnChange makes m call f with the models loaded (sorted by name) each
// time a server becomes healthy or stops. f is called with m's lock held:
// it must be quick and must not call m. Call it before the first run.
func (m *Manager) SetOnChange(f func([]Loaded)) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.onChange = f
}

// Loaded returns the models whose server is up and healthy, sorted by name.
func (m *Manager) Loaded() []Loaded {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.loadedLocked()
}

func (m *Manager) loadedLocked() []Loaded {
	out := []Loaded{}
	for _, model := range slices.Sorted(maps.Keys(m.children)) {
		if c := m.children[model]; c.state == stateReady {
			out = append(out, Loaded{Model: model, Since: c.since, PID: c.pid})
		}
	}
	return out
}

// notifyLocked tells onChange what is loaded now.
func (m *Manager) notifyLocked() {
	if m.onChange != nil {
		m.onChange(m.loadedLocked())
	}
}

// broadcastLocked wakes every run waiting for a place (acquire).
func (m *Manager) broadcastLocked() {
	close(m.changed)
	m.changed = make(chan struct{})
}

// Path is EXECUTION_PATH_TUNNEL.
func (m *Manager) Path() nodev1.ExecutionPath { return nodev1.ExecutionPath_EXECUTION_PATH_TUNNEL }

// acquire returns the ready server of model with one more run counted on
// it, starting it when none runs. When MaxLoaded servers run it stops the
// least recently used one with no run in flight and waits for its exit;
// when every one has runs in flight it waits until one has none. A run
// that waits for a start and ends (ctx) leaves the start going: the server
// serves the next run, or is stopped as idle after its TTL. Waiters for a
// place are woken together, not in arrival order. The caller calls
// release(c) once.
func (m *Manager) acquire(ctx context.Context, model string) (*child, error) {
	return m.acquireFor(ctx, model, false)
}

// acquireFor is acquire; with preload, instead of stopping a server or
// waiting for a place it fails with ErrNoRoom.
func (m *Manager) acquireFor(ctx context.Context, model string, preload bool) (*child, error) {
	srv, ok := m.cfg.Servers[model]
	if !ok {
		return nil, fmt.Errorf("%w: %q", ErrUnknownModel, model)
	}
	held := 0 // rooms this call made for model and has not used
	for {
		m.mu.Lock()
		c := m.children[model]
		var wait <-chan struct{}
		switch {
		case c != nil && c.state != stateStopping:
			m.dropRoomsLocked(model, held)
			c.inFlight++
			c.lastUsed = m.clock.Now()
			c.stopIdleLocked()
			m.mu.Unlock()
			return m.await(ctx, c)
		case c != nil:
			wait = c.exited
		case len(m.children) < m.cfg.MaxLoaded && (m.rooms[model] > 0 || len(m.children)+m.roomsHeld < m.cfg.MaxLoaded):
			if m.rooms[model] > 0 {
				m.dropRoomsLocked(model, 1)
				held = max(held-1, 0)
			}
			m.dropRoomsLocked(model, held)
			c = m.startLocked(model, srv)
			c.inFlight++
			m.mu.Unlock()
			return m.await(ctx, c)
		case preload:
			m.dropRoomsLocked(model, held)
			running := len(m.children)
			m.mu.Unlock()
			return nil, fmt.Errorf("%w: %d of %d running", ErrNoRoom, running, m.cfg.MaxLoaded)
		default:
			// A room made for model, or held for another, is coming: wait
			// for it rather than stop another server.
			if v := m.lruIdleLocked(); v != nil && m.rooms[model] == 0 && len(m.children) >= m.cfg.MaxLoaded {
				m.logger.Info("stopping a model server to make room", "model", v.model, "for", model, "max_loaded_models", m.cfg.MaxLoaded)
				m.stopLocked(v)
				m.rooms[model]++
				m.roomsHeld++
				held++
				wait = v.exited
			} else {
				wait = m.changed
			}
		}
		m.mu.Unlock()
		select {
		case <-wait:
		case <-ctx.Done():
			m.mu.Lock()
			m.dropRoomsLocked(model, held)
			m.mu.Unlock()
			return nil, fmt.Errorf("%w: %w", adapter.ErrCancelled, context.Cause(ctx))
		}
	}
}

// dropRoomsLocked gives back up to n of the rooms made for model, waking
// the waiters if it gave any.
func (m *Manager) dropRoomsLocked(model string, n int) {
	n = min(n, m.rooms[model])
	if n <= 0 {
		return
	}
	if m.rooms[model] -= n; m.rooms[model] == 0 {
		delete(m.rooms, model)
	}
	m.roomsHeld -= n
	m.broadcastLocked()
}

// await waits for c, counted by acquire, to leave its start.
func (m *Manager) await(ctx context.Context, c *child) (*child, error) {
	select {
	case <-c.ready:
	case <-ctx.Done():
		m.release(c)
		return nil, fmt.Errorf("%w: %w", adapter.ErrCancelled, context.Cause(ctx))
	}
	m.mu.Lock()
	err := c.startErr
	m.mu.Unlock()
	if err != nil {
		m.release(c)
		return nil, err
	}
	return c, nil
}

// release ends one run of c: with none left, c's TTL starts and waiters
// for a place are woken.
func (m *Manager) release(c *child) {
	m.mu.Lock()
	defer m.mu.Unlock()
	c.inFlight--
	c.lastUsed = m.clock.Now()
	if c.inFlight == 0 {
		if c.state == stateReady {
			m.armIdleLocked(c)
		}
		m.broadcastLocked()
	}
}

// lruIdleLocked is the server with no run in flight that was used least
// recently (not one already stopping), or nil.
func (m *Manager) lruIdleLocked() *child {
	var v *child
	for _, c := range m.children {
		if c.state == stateStopping || c.inFlight > 0 {
			continue
		}
		if v == nil || c.lastUsed.Before(v.lastUsed) {
			v = c
		}
	}
	return v
}

// armIdleLocked starts c's TTL (none when its TTL is 0).
func (m *Manager) armIdleLocked(c *child) {
	c.stopIdleLocked()
	if c.srv.TTL <= 0 {
		return
	}
	seq := c.idleSeq
	c.idle = m.clock.AfterFunc(c.srv.TTL, func() { m.idleOver(c, seq) })
}

// idleOver stops c if its TTL armed as seq ran out with no run since.
func (m *Manager) idleOver(c *child, seq uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if c.idleSeq != seq || c.inFlight > 0 || c.state != stateReady {
		return
	}
	m.logger.Info("stopping an idle model server", "model", c.model, "ttl", c.srv.TTL)
	m.stopLocked(c)
}

// Close stops every server (SIGTERM to its process group, SIGKILL after
// KillGrace) and returns when all have exited. Runs in flight on them fail.
// Unlike other adapters' Close, it ends calls in flight; m stays usable (a
// later run starts its server again).
func (m *Manager) Close() {
	for {
		m.mu.Lock()
		var waits []<-chan struct{}
		for _, c := range m.children {
			m.stopLocked(c)
			waits = append(waits, c.exited)
		}
		m.mu.Unlock()
		if len(waits) == 0 {
			break
		}
		for _, w := range waits {
			<-w
		}
	}
	m.wg.Wait()
}

// Load starts the server of model, as a run would, and returns once it
// is healthy (nil), its start failed, or ctx ended; it counts no run, so
// the server's TTL starts at once. For a preload (keep_loaded, an admin
// load): unlike a run it never stops another model's server, and fails
// with ErrNoRoom when MaxLoaded servers run or start.
func (m *Manager) Load(ctx context.Context, model string) error {
	c, err := m.acquireFor(ctx, model, true)
	if err != nil {
		return err
	}
	m.release(c)
	return nil
}

// Unload stops the server of model unless runs are in flight on it
// (ErrBusy); a model without a server changes nothing. It returns at once;
// the server leaves Loaded at once and exits within KillGrace.
func (m *Manager) Unload(model string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	c := m.children[model]
	switch {
	case c == nil || c.state == stateStopping:
		return nil
	case c.inFlight > 0:
		return fmt.Errorf("%w: %d runs of %q in flight", ErrBusy, c.inFlight, model)
	}
	m.logger.Info("stopping a model server: unloaded", "model", model)
	m.stopLocked(c)
	return nil
}

// crashWait bounds how long a run whose relay broke waits to learn whether
// the server exited, to say so.
const crashWait = time.Second

// Tunnel relays req to the server of req.ServedModel (started on demand,
// see acquire) as adapter.OpenAI.Tunnel does, with the served model as the
// body's model. A server that cannot start fails the run before its
// first byte: an *adapter.Error of status 502 (504 when it was not
// healthy within start_timeout) naming the model. A server that exits
// during the run ends it with a 502 "model server ... exited"; the next run
// starts a new one. Both are the model's failures (ModelFailure), not the
// provider's.
func (m *Manager) Tunnel(ctx context.Context, req adapter.Request, sink adapter.TunnelSink) error {
	c, err := m.acquire(ctx, req.ServedModel)
	if err != nil {
		return runError(req.ServedModel, err)
	}
	defer m.release(c)
	err = c.relay.Tunnel(ctx, req, sink)
	var aerr *adapter.Error
	if err == nil || !errors.As(err, &aerr) || !(errors.Is(err, adapter.ErrProviderStream) || errors.Is(err, adapter.ErrProviderUnreachable)) {
		return err
	}
	woke := make(chan struct{})
	t := m.clock.AfterFunc(crashWait, func() { close(woke) })
	defer t.Stop()
	select {
	case <-c.exited:
		return &adapter.Error{Kind: aerr.Kind, Status: http.StatusBadGateway, ModelFailure: true,
			Message: fmt.Sprintf("model server of %q exited (%s) during the run: %s", req.ServedModel, c.exitText, aerr.Message)}
	case <-woke:
		return err
	}
}

// runError is the adapter outcome of err, acquire's. A server that could
// not start (or was not healthy in time, or exited or was stopped while
// starting) is its model's failure (adapter.Error.ModelFailure): the
// provider's other models have servers of their own, so it must not take
// the provider out of rotation.
func runError(model string, err error) error {
	switch {
	case errors.Is(err, adapter.ErrCancelled):
		return err
	case errors.Is(err, ErrUnknownModel):
		return &adapter.Error{Kind: adapter.ErrBadRequest, Status: http.StatusNotFound, Message: err.Error()}
	case errors.Is(err, ErrStartTimeout):
		return &adapter.Error{Kind: adapter.ErrProviderTimeout, Status: http.StatusGatewayTimeout, Message: err.Error(), ModelFailure: true}
	default:
		return &adapter.Error{Kind: adapter.ErrProviderUnreachable, Status: http.StatusBadGateway, Message: err.Error(), ModelFailure: true}
	}
}
