package edge

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/experimental"
	"google.golang.org/grpc/keepalive"

	"iop/internal/edge/lifecycle"
	"iop/internal/scheduler"
	"iop/internal/wire/nodev1"
)

// Deps are the edge core's injected dependencies; zero fields take
// defaults.
type Deps struct {
	// Logger gets the edge's logs; nil discards them.
	Logger *slog.Logger
	// Clock drives heartbeats, dispatch timeouts and queue timeouts; nil
	// means real time.
	Clock scheduler.Clock
	// Observer is told of node and run lifecycle events (package
	// lifecycle); nil means none. It is called with no edge lock held, on
	// the goroutine where the event happened. A run's RunEnded is
	// published once, after its caller closed it with the request's
	// outcome (Run.Close); an attempt Dispatch drops is published without
	// an outcome.
	Observer lifecycle.Observer
	// ClusterListener, with Config.Cluster, is the listener of this edge's
	// Admission service (Serve serves on it and closes it); nil means
	// Serve listens on cluster.listen.
	ClusterListener net.Listener
	// Quota is the quota ledger the scheduler leader keeps for every edge
	// (with Config.Cluster; cluster_quota.go).
	Quota QuotaDeps
}

// Server is the edge core: node registry, catalog, scheduler and the gRPC
// NodeGateway endpoint nodes connect to. Create it with NewServer.
type Server struct {
	svc  *Service
	tls  *tls.Config  // nil: plaintext
	clis net.Listener // Deps.ClusterListener
}

// NewServer wires the edge core for cfg (zero fields take their defaults).
// It returns an error wrapping ErrInvalidConfig when cfg does not validate.
func NewServer(cfg Config, deps Deps) (*Server, error) {
	cfg.SetDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	log := deps.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	clk := deps.Clock
	if clk == nil {
		clk = scheduler.RealClock()
	}
	sched, err := scheduler.New(cfg.schedulerConfig(clk))
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	var tlsCfg *tls.Config
	if cfg.TLSCert != "" {
		if tlsCfg, err = serverTLS(cfg.TLSCert, cfg.TLSKey, cfg.ClientCA); err != nil {
			return nil, err
		}
	}
	reg := newRegistry(clk.Now)
	log = log.With("component", "edge")
	svc := &Service{
		trust:     newTrust(cfg.Tokens),
		cfg:       cfg,
		log:       log,
		clock:     clk,
		sched:     sched,
		reg:       reg,
		cat:       newCatalog(cfg.Models, reg),
		shutdown:  make(chan struct{}),
		runs:      make(map[string]*Run),
		observer:  deps.Observer,
		breakers:  newBreakers(cfg.CircuitBreaker, clk, log),
		retries:   make(map[string]uint64),
		requested: make(map[string]bool),
		prefix:    newPrefixIndex(cfg.PrefixIndexBlocks),
	}
	svc.routing.Store(newRoutingPolicy(cfg))
	svc.setKept(cfg.Models)
	svc.cat.awayFor.Store(int64(cfg.maxReconnectGrace()))
	svc.breakers.onBack = svc.rotationChanged
	svc.stopping, svc.stopRequests = context.WithCancelCause(context.Background())
	svc.adm = localAdmission{s: svc}
	svc.quotaDeps = deps.Quota
	if cfg.Cluster != nil {
		if svc.cl, err = newClusterMode(svc, *cfg.Cluster); err != nil {
			return nil, fmt.Errorf("%w: cluster: %w", ErrInvalidConfig, err)
		}
		svc.adm = svc.cl
	}
	return &Server{tls: tlsCfg, svc: svc, clis: deps.ClusterListener}, nil
}

// Service returns the dispatch surface the HTTP API uses.
func (s *Server) Service() *Service { return s.svc }

// NodeGateway returns the handlers of the NodeGateway service that Serve
// serves over gRPC, for a node in the edge's own process to reach them
// without gRPC (package memlink): its connections are the edge's like any
// other, and end when Serve returns.
func (s *Server) NodeGateway() nodev1.NodeGatewayServer { return &grpcServer{s: s.svc} }

// The edge's HTTP/2 flow-control windows for what nodes send it (runs'
// answers): static, so each run stays flow-controlled on its own, with at
// most grpcStreamWindow bytes sent that the edge has not read
// (TestStalledRunDoesNotHoldUpItsConnection), and gRPC's dynamic window
// estimate is off: it sent a BDP ping with the first data frame after
// each acknowledged one, about one ping and its acknowledgement per short
// run, 25% of the reads and 15% of the writes of a c=1 request.
const (
	grpcStreamWindow = 256 << 10
	grpcConnWindow   = 4 << 20
)

// Serve serves the NodeGateway gRPC service on lis (over TLS when the
// config names a certificate; mutual TLS with client_ca) until ctx ends, then
// ends every node connection (fencing it) and run, and returns nil. It
// returns grpc.Server.Serve's error if serving fails first. Call it once.
func (s *Server) Serve(ctx context.Context, lis net.Listener) error {
	opts := []grpc.ServerOption{
		// Nodes may ping an idle connection every 10s; the edge pings a
		// silent one after 30s and drops it 10s later (dead NAT mappings).
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 10 * time.Second}),
		// Stop returns only after every handler did, so a Serve that
		// returned has settled every connection.
		grpc.WaitForHandlers(true),
		grpc.StaticStreamWindowSize(grpcStreamWindow),
		grpc.StaticConnWindowSize(grpcConnWindow),
		experimental.BufferPool(nodev1.BufferPool),
		grpc.ForceServerCodecV2(nodev1.Codec),
	}
	if s.tls != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(s.tls)))
	}
	gs := grpc.NewServer(opts...)
	nodev1.RegisterNodeGatewayServer(gs, &grpcServer{s: s.svc})
	defer s.svc.checkAliasesAtStart()()
	errc := make(chan error, 1)
	go func() { errc <- gs.Serve(lis) }()
	kctx, stopKeep := context.WithCancel(ctx)
	kdone := make(chan struct{})
	go func() { defer close(kdone); s.svc.keepLoaded(kctx) }()
	defer func() { stopKeep(); <-kdone }()
	if cm := s.svc.cl; cm != nil {
		// Several edges: this edge's Admission service, for the others
		// while it leads, on cluster.listen; the election ends with Serve.
		defer cm.close()
		clis, err := s.clis, error(nil)
		if clis == nil {
			clis, err = net.Listen("tcp", cm.cfg.Listen)
		}
		if err != nil {
			s.svc.stop()
			gs.Stop()
			<-errc
			return fmt.Errorf("cluster.listen %s: %w", cm.cfg.Listen, err)
		}
		actx, cancel := context.WithCancel(ctx)
		adone := make(chan struct{})
		go func() { defer close(adone); _ = cm.serveAdmission(actx, clis) }()
		defer func() { cancel(); <-adone }()
	}
	select {
	case <-ctx.Done():
		s.svc.stop()
		gs.Stop()
		if err := <-errc; err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			return err
		}
		return nil
	case err := <-errc:
		s.svc.stop()
		gs.Stop()
		return err
	}
}

// stop makes every Connect and Run handler return.
func (s *Service) stop() { s.stopOnce.Do(func() { close(s.shutdown) }) }
