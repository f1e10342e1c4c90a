package node

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/experimental"
	"google.golang.org/grpc/status"

	"iop/internal/clock"
	"iop/internal/node/adapter"
	"iop/internal/wire/nodev1"
)

// DefaultHeartbeatInterval is used when a Welcome names no interval.
const DefaultHeartbeatInterval = 5 * time.Second

// helloTimeout bounds the wait for Welcome or HelloRefused after Hello.
const helloTimeout = 10 * time.Second

// missedHeartbeats is how many heartbeat intervals of silence from the edge
// fence the connection.
const missedHeartbeats = 3

// MaxBodyBytes caps a run's request body as received from the edge.
const MaxBodyBytes = 64 << 20

// maxRecvMsgBytes caps one gRPC message from the edge.
const maxRecvMsgBytes = 16 << 20

// Agent is a node agent: it dials the edge, says hello, keeps the
// connection alive with heartbeats, answers dispatches by running them on
// its providers, and reconnects when the connection ends.
type Agent struct {
	cfg       Config
	instance  string // Hello.instance: drawn once by New, the same on every connection
	logger    *slog.Logger
	clock     clock.Clock                                      // heartbeats, liveness, hello timeout, backoff
	jitter    func(max time.Duration) time.Duration            // full jitter: uniform in [0, max]
	providers map[string]*provider                             // by provider id; never written after New
	tracer    trace.Tracer                                     // WithTracer; nil: runs are not traced
	order     []*provider                                      // the providers in config order; never written after New
	creds     atomic.Pointer[credentials.TransportCredentials] // plaintext or TLS to the edge; Reload swaps it for the next dial
	warm      int                                              // warm Run streams per connection (WarmStreams; tests change it before Run)
	ready     chan struct{}                                    // closed at the first Welcome
	readyOnce sync.Once
	running   atomic.Bool
	resolver  *net.Resolver            // looks up the names of Config.Edges; nil: net.DefaultResolver
	gateway   nodev1.NodeGatewayClient // WithGateway: the one edge, in this process; nil: dial Config.Edge(s)
	inflight  *inFlight                // node-wide runs in flight (several edges: inflight.go)
	// draining is closed by the first Drain, after drainReason is set.
	draining    chan struct{}
	drainOnce   sync.Once
	drainReason string

	// afterRound, when set (tests only, before Run), is called at the end of
	// every discovery round, on its goroutine, with whether the round
	// changed the provider's advert.
	afterRound func(providerID string, changed bool)
	// noResidency, when set (tests only, before Run), reads no provider's
	// /api/ps: tests of other things whose fake servers answer only what
	// they test.
	noResidency bool

	reloadMu sync.Mutex // serializes Reload

	mu         sync.Mutex              // guards the fields below
	gens       map[*link]uint64        // generation of each welcomed connection, by its link
	links      map[string]*link        // the links running, by edge address (edges.go)
	genChanged chan struct{}           // closed and replaced whenever gens changes
	stopRun    context.CancelCauseFunc // ends the active Run's context; nil outside Run
	drainTimer clock.Timer             // the drain's grace period, once Drain was called

	// slotMu guards inFlight (every run of every connection, capacity.go);
	// slots (by provider id, a pool of max(capacity, long_capacity) slots,
	// one held per run) is never written after New (Reload resizes a pool).
	slotMu   sync.Mutex
	inFlight map[*run]struct{}
	slots    map[string]*slotPool

	advMu   sync.Mutex             // guards the fields below
	adverts map[string]*advertised // by provider id: what the edge is told of each provider
	// residency holds, by provider id, the models an Ollama provider's
	// server holds loaded, as last read (residency.go); none before the
	// first reading.
	residency  map[string]*resident
	advChanged chan struct{} // closed and replaced at every change of an advert or of residency
}

// provider is one configured model server and its adapter.
type provider struct {
	cfg     ProviderConfig
	path    nodev1.ExecutionPath
	adapter adapter.Adapter // an adapter.Normalizer or adapter.Tunneler, as path says
	// lister reads what the server serves, for a provider that omits its
	// models (nil otherwise). It and rounds belong to the provider's
	// discovery goroutine (one round at a time).
	lister *lister
	rounds int // discovery rounds run
	// interval is the discovery interval (Reload changes it; read before
	// each wait).
	interval atomic.Int64
	// meta asks an Ollama provider's server for /api/show and /api/ps (nil
	// for other providers); kick (one slot) asks its residency goroutine
	// for a reading of /api/ps.
	meta *ollamaMeta
	kick chan struct{}
}

// Option changes how New builds an Agent.
type Option func(*Agent)

// WithClock makes the agent take time from c instead of the system clock:
// heartbeats, the liveness check, the hello timeout and reconnect backoff
// all go through it, so tests can drive them with a clock.Fake.
func WithClock(c clock.Clock) Option { return func(a *Agent) { a.clock = c } }

// WithRand makes the agent draw its reconnect backoff jitter from r instead
// of the process-wide source, so a test can replay one node's delays (the
// agent's Run loop is r's only user). Nodes that share no source (the
// default) wait different times after one edge restart, so they do not
// all dial it again at the same instant.
func WithRand(r *rand.Rand) Option {
	return func(a *Agent) {
		a.jitter = func(d time.Duration) time.Duration {
			if d <= 0 {
				return 0
			}
			return time.Duration(r.Int64N(int64(d) + 1))
		}
	}
}

// InProcessEdge is the edge address an agent made WithGateway reports
// (Generations, logs): its edge is in its own process.
const InProcessEdge = "in-process"

// WithGateway makes the agent's one edge the one gw reaches, an edge in
// the agent's own process (package memlink's Link), instead of dialing
// Config.Edge or Edges, which must then be empty. The connection is the
// same as over gRPC (Hello, generations, heartbeats, warm streams, drain,
// reconnects), only in memory.
func WithGateway(gw nodev1.NodeGatewayClient) Option { return func(a *Agent) { a.gateway = gw } }

// New validates cfg (with defaults applied), reads each provider's API key
// from its api_key_env once, and builds the adapters. A nil logger
// discards. Errors wrap ErrInvalidConfig.
func New(cfg Config, logger *slog.Logger, opts ...Option) (*Agent, error) {
	cfg = cfg.withDefaults()
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Version == "" {
		cfg.Version = buildVersion()
	}
	a := &Agent{
		cfg:        cfg,
		instance:   fmt.Sprintf("%016x", rand.Uint64()),
		logger:     logger.With("component", "node", "node_id", cfg.NodeID),
		clock:      clock.Real(),
		jitter:     fullJitter,
		warm:       WarmStreams,
		providers:  make(map[string]*provider, len(cfg.Providers)),
		inflight:   newInFlight(),
		ready:      make(chan struct{}),
		genChanged: make(chan struct{}),
		gens:       make(map[*link]uint64),
		links:      make(map[string]*link),
		slots:      make(map[string]*slotPool, len(cfg.Providers)),
		inFlight:   make(map[*run]struct{}),
		draining:   make(chan struct{}),
		adverts:    make(map[string]*advertised, len(cfg.Providers)),
		residency:  make(map[string]*resident, len(cfg.Providers)),
		advChanged: make(chan struct{}),
	}
	for _, o := range opts {
		o(a)
	}
	if err := cfg.validate(a.gateway != nil); err != nil {
		return nil, err
	}
	creds, err := transportCredentials(cfg)
	if err != nil {
		return nil, err
	}
	a.creds.Store(&creds)
	for _, pc := range cfg.Providers {
		p, err := newProvider(pc, adapterDeps{logger: a.logger, clock: a.clock})
		if err != nil {
			a.closeAdapters()
			return nil, err
		}
		a.reportManaged(p)
		a.providers[pc.ID] = p
		a.slots[pc.ID] = newSlotPool(max(pc.Capacity, pc.LongCapacity))
		a.order = append(a.order, p)
		if p.lister != nil {
			// Unknown until the first discovery round: unhealthy, no models.
			a.adverts[pc.ID] = &advertised{advert: advert{capacity: pc.Capacity, longCapacity: pc.LongCapacity, models: []string{}}}
		} else {
			a.adverts[pc.ID] = &advertised{advert: configuredAdvert(pc)}
		}
	}
	return a, nil
}

func newProvider(pc ProviderConfig, deps adapterDeps) (*provider, error) {
	ac := adapter.Config{BaseURL: pc.BaseURL, Timeout: pc.Timeout, MaxConns: max(pc.Capacity, pc.LongCapacity)}
	if pc.APIKeyEnv != "" {
		ac.APIKey = os.Getenv(pc.APIKeyEnv)
		if ac.APIKey == "" {
			return nil, fmt.Errorf("%w: provider %q: environment variable %s is empty or unset", ErrInvalidConfig, pc.ID, pc.APIKeyEnv)
		}
	}
	p := &provider{cfg: pc, path: pc.path()}
	p.interval.Store(int64(pc.DiscoveryInterval))
	if pc.discovers() {
		p.lister = newLister(pc, ac.APIKey)
	}
	if pc.protocol() == protocolOllama {
		p.meta, p.kick = newOllamaMeta(pc, ac.APIKey), make(chan struct{}, 1)
	}
	k, ok := kindOf(pc.Type)
	if !ok {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, unknownKind(fmt.Sprintf("provider %q", pc.ID), pc.Type))
	}
	var err error
	p.adapter, err = k.newAdapter(pc, k.protocol(pc), ac, deps)
	if err != nil {
		return nil, fmt.Errorf("%w: provider %q: %w", ErrInvalidConfig, pc.ID, err)
	}
	return p, nil
}

func (a *Agent) closeAdapters() {
	for _, p := range a.providers {
		p.adapter.Close()
		if p.lister != nil {
			p.lister.close()
		}
		if p.meta != nil {
			p.meta.close()
		}
	}
}

// buildVersion is the main module's version, or "dev".
func buildVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "dev"
}

// fullJitter is uniform in [0, d].
func fullJitter(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	return time.Duration(rand.Int64N(int64(d) + 1))
}

// Generation is the generation of the node's connection to the edge, 0
// when not connected. With several edges (Config.Edges) it is that of the
// welcomed connection whose edge address sorts first; Generations has
// every one.
func (a *Agent) Generation() uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	var first *link
	for l := range a.gens {
		if first == nil || l.addr < first.addr {
			first = l
		}
	}
	if first == nil {
		return 0
	}
	return a.gens[first]
}

// Ready is closed when the agent is first welcomed by an edge.
func (a *Agent) Ready() <-chan struct{} { return a.ready }

// setGeneration publishes g as the generation of l's connection (0: it
// ended) and wakes waitGeneration. Keyed by link, not address: a link
// retired and one made again for its address (a name that resolves to it
// again) may overlap while the first drains.
func (a *Agent) setGeneration(l *link, g uint64) {
	a.mu.Lock()
	if g == 0 {
		delete(a.gens, l)
	} else {
		a.gens[l] = g
	}
	close(a.genChanged)
	a.genChanged = make(chan struct{})
	a.mu.Unlock()
}

// generationChanged returns a channel closed at the next generation change.
func (a *Agent) generationChanged() <-chan struct{} {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.genChanged
}

// Drain stops the agent gracefully (`iop node` calls it on SIGTERM or
// SIGINT). On its connection the agent sends Drain{reason}, so that the
// edge takes the node's providers out of rotation and sends new requests
// elsewhere; refuses every Dispatch that still arrives with
// DispatchRefused (ErrDraining), which the edge admits again elsewhere;
// and lets the runs in flight finish. When none is left it closes the
// connection and Run returns nil, without reconnecting; a connection lost
// meanwhile is not made again. Runs still going when Config.DrainTimeout
// has passed on the agent's clock (from this call) are aborted as when
// Run's context ends: the agent closes the connection without a last
// frame for them, so the edge ends each with its node gone. Drain returns
// at once; later calls change nothing. After a Drain, Run returns nil at
// once.
func (a *Agent) Drain(reason string) {
	a.drainOnce.Do(func() {
		a.drainReason = reason
		close(a.draining)
		t := a.clock.AfterFunc(a.cfg.DrainTimeout, func() { a.abortRun(ErrDrainTimeout) })
		a.mu.Lock()
		a.drainTimer = t
		a.mu.Unlock()
	})
}

// isDraining reports whether Drain was called.
func (a *Agent) isDraining() bool {
	select {
	case <-a.draining:
		return true
	default:
	}
	return false
}

// abortRun ends the active Run's context with cause: every run in flight
// is aborted and Run returns.
func (a *Agent) abortRun(cause error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.stopRun != nil {
		a.stopRun(cause)
	}
}

// stableSession is how long a welcomed connection must last for the next
// reconnect to start from ReconnectMin again.
const stableSession = 10 * time.Second

// Run connects to the edge (to every edge of Config.Edges, one connection
// each, see edges.go) and serves it until ctx ends, reconnecting after
// every lost connection with exponential backoff (ReconnectMin doubling up
// to ReconnectMax, full jitter; reset after a connection that lasted
// stableSession, so a connection replaced at once keeps backing off), each
// connection on its own. It returns nil when ctx ends (the runs in flight
// are aborted) or a drain is over on every connection (see Drain), after
// every run and goroutine it started has finished; ErrAlreadyRunning if
// another Run is active; or an error if an edge address cannot be used at
// all.
//
// Providers that omit their models are discovered first (one round each,
// at once, see startDiscovery), then again every discovery interval while
// Run runs; every connection says hello with what is known then and sends
// a ProviderUpdate whenever a round changes it.
func (a *Agent) Run(ctx context.Context) error {
	if !a.running.CompareAndSwap(false, true) {
		return ErrAlreadyRunning
	}
	defer a.running.Store(false)
	defer a.closeAdapters()
	ctx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	a.mu.Lock()
	a.stopRun = stop
	a.mu.Unlock()
	defer func() {
		a.mu.Lock()
		a.stopRun = nil
		if a.drainTimer != nil {
			a.drainTimer.Stop()
		}
		a.mu.Unlock()
	}()
	dctx, stopDiscovery := context.WithCancel(ctx)
	waitDiscovery := a.startDiscovery(dctx)
	waitResidency := a.startResidency(dctx)
	defer func() {
		stopDiscovery()
		waitDiscovery()
		waitResidency()
	}()

	return a.superviseEdges(ctx)
}

// refusalHint says what to change when err, an edge's HelloRefused, is
// one of its token refusals (the reasons the edge sends), else "".
func refusalHint(err error) string {
	msg := err.Error()
	switch {
	case strings.Contains(msg, "node token not accepted for this node id"):
		return "the edge accepts this token only from the node ids listed with it (tokens: [{token: ..., nodes: [...]}] in the edge config): set node_id to one of them, or add this node's id"
	case strings.Contains(msg, "node token not accepted"):
		return "set the node's token to one of the edge's tokens (tokens: in the edge config, read again when that file changes)"
	case strings.Contains(msg, "bound to another token"):
		return "this node id joined the edge with another token before: use that token, or list this node id under the new token's nodes (tokens: [{token: ..., nodes: [...]}]) while rotating"
	}
	return ""
}

// handshakeHint says what to check when err, a failed connection's, is
// the mark of a TLS mismatch between node and edge, else "". gRPC reports a
// plaintext node at a TLS endpoint as "error reading server preface: EOF"
// (the edge drops the connection and logs nothing), and a TLS node at a
// plaintext one as "first record does not look like a TLS handshake";
// neither names its cause.
func handshakeHint(err error) string {
	if status.Code(err) != codes.Unavailable {
		return ""
	}
	msg := status.Convert(err).Message()
	if msg := status.Convert(err).Message(); strings.Contains(msg, "x509: certificate is valid for") || strings.Contains(msg, "doesn't contain any IP SANs") {
		return "the edge's certificate does not name the address dialed: set tls_server_name to a name it has (or dial that name)"
	}
	if strings.Contains(msg, "looked like an HTTP/1.1 header") {
		return "this is an HTTP/1.1 server, such as the edge's HTTP API port: point the node at the edge's node endpoint (node_listen), not its listen address"
	}
	for _, mark := range []string{"server preface", "does not look like a TLS handshake", "authentication handshake failed"} {
		if strings.Contains(msg, mark) {
			return "check that node and edge agree on TLS: a node sets tls_ca when the edge's node endpoint has tls_cert, none when it has none, and tls_cert/tls_key when the edge sets client_ca"
		}
	}
	return ""
}

// The node's HTTP/2 flow-control windows for what the edge sends it
// (dispatches, bodies, cancels): static, so gRPC's dynamic window estimate
// (a BDP ping after the first data frame each time the previous one is
// acknowledged) is off; each run stream keeps its own window.
const (
	grpcStreamWindow = 256 << 10
	grpcConnWindow   = 4 << 20
)

// dialOptions are how every link dials its edge.
func (a *Agent) dialOptions() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithTransportCredentials(*a.creds.Load()),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff: backoff.Config{
				BaseDelay:  a.cfg.ReconnectMin,
				Multiplier: 1.6,
				Jitter:     0.2,
				MaxDelay:   a.cfg.ReconnectMax,
			},
			MinConnectTimeout: 20 * time.Second,
		}),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxRecvMsgBytes), grpc.ForceCodecV2(nodev1.Codec)),
		grpc.WithStaticStreamWindowSize(grpcStreamWindow),
		grpc.WithStaticConnWindowSize(grpcConnWindow),
		experimental.WithBufferPool(nodev1.BufferPool),
	}
}

// backoff is the wait before reconnect attempt+1.
func (a *Agent) backoff(attempt int) time.Duration {
	d := a.cfg.ReconnectMax
	if attempt < 32 {
		if s := a.cfg.ReconnectMin << attempt; s > 0 && s < d {
			d = s
		}
	}
	return a.jitter(d)
}

// sleepOn waits d on the agent's clock; false if ctx ended or draining
// was closed first.
func (a *Agent) sleepOn(ctx context.Context, draining <-chan struct{}, d time.Duration) bool {
	woke := make(chan struct{})
	t := a.clock.AfterFunc(d, func() { close(woke) })
	defer t.Stop()
	select {
	case <-woke:
		return true
	case <-ctx.Done():
		return false
	case <-draining:
		return false
	}
}
