package process

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"iop/internal/auth"
	"iop/internal/cluster"
	"iop/internal/edge"
	"iop/internal/edge/api"
	"iop/internal/edge/api/admin"
	"iop/internal/edge/api/anthropic"
	batchapi "iop/internal/edge/api/batch"
	"iop/internal/edge/api/media"
	"iop/internal/edge/api/ollama"
	"iop/internal/edge/api/openai"
	responsesapi "iop/internal/edge/api/responses"
	"iop/internal/edge/api/runsapi"
	"iop/internal/ledger"
	"iop/internal/node"
	"iop/internal/quota"
	"iop/internal/responses"
	"iop/internal/runs"
	"iop/internal/scheduler"
	"iop/internal/tracing"
	"iop/internal/wire/memlink"
)

// edgeProcess is an edge (ModeEdge, and the edge of ModeDev): its node
// endpoint and HTTP API. Its resources are the steps of coreSteps, opened
// in that order; Shutdown closes them in reverse.
type edgeProcess struct {
	cfg    EdgeFile
	logger *slog.Logger
	// ModeEdge only: the profiler's address and the reload watch.
	pprofListen string
	reload      func(trigger string) // nil: nothing to read again
	configFile  string
	hangup      <-chan os.Signal
	// local, when set, is the node serving the edge's own providers
	// (Config.LocalProviders), in this process.
	local *localNode

	// Set by the open steps, in order; read-only once Open has returned.
	Service *edge.Service
	Ledger  *ledger.Ledger
	// Keys and AdminKeys are the HTTP API's keyrings; a reload swaps
	// their keys (edgeReloader).
	Keys, AdminKeys *auth.Keyring
	// Quota holds the keys' and teams' quota windows; a reload
	// reconfigures it (edgeReloader).
	Quota    *quota.Ledger
	HTTPAddr string // host:port the HTTP API listens on
	NodeAddr string // host:port the node endpoint listens on
	// Link is the in-memory node link to this edge (package memlink): a
	// node in this process connects through it, without gRPC.
	Link *memlink.Link

	obs           *observability
	srv           *edge.Server
	tr            *tracing.Tracing
	nodeLis       net.Listener
	usage         *ledger.Ledger
	usageOpen     chan struct{} // closed once usage is set
	responseStore *responses.SQLite
	runManager    *runs.Manager
	batches       *edgeBatches
	httpLis       net.Listener
	httpSrv       *http.Server
	stopGRPC      context.CancelFunc
	grpcDone      chan error    // nil until the serve step; then one value, put back by until
	httpDone      chan error    // likewise
	stopping      chan struct{} // closed when the edge ends what is still in flight
	draining      atomic.Bool   // set the moment the edge is told to stop
	handlers      sync.WaitGroup
	stopPprof     func()
	stopWatch     func()
	steps         steps

	keysMu           sync.Mutex             // serializes reloads; guards the fields below
	keyCfg, adminCfg []auth.Key             // the keys the keyrings were last given
	teamCfg          []auth.Team            // the teams the quota was last given
	priceCfg         map[string]quota.Price // the prices the quota was last given
}

// maxHeaderBytes caps a client request's header block; a larger one is
// answered 431 by net/http (RFC 6585 §5).
const maxHeaderBytes = 64 << 10

// idleTimeout is how long a client's keep-alive connection may sit idle
// between requests before the edge closes it (nginx's keepalive_timeout
// is 75 s).
const idleTimeout = 120 * time.Second

// Open opens the edge's steps (coreSteps, then ModeEdge's profiler and
// reload watch) and returns once both listeners serve. ctx is the run
// context: the stores and tracing are opened under it. Errors: a step
// that failed (keys, configuration, store, listener, watch); the steps
// opened before it are closed again.
func (e *edgeProcess) Open(ctx context.Context) error {
	var list []step
	if e.local == nil {
		list = e.coreSteps()
	} else {
		list = append(e.coreSteps(step{name: "in-process node", open: e.startLocal, close: e.local.drain}),
			step{name: "in-process node ready", open: e.local.await})
	}
	return e.steps.open(ctx, append(list,
		step{name: "profiler", open: e.openPprof, close: e.closePprof},
		step{name: "reload watcher", open: e.openWatch, close: e.closeWatch},
	))
}

// startLocal starts the node of the edge's own providers on its in-memory
// link, with the edge's tracer.
func (e *edgeProcess) startLocal(context.Context) error {
	e.local.opts = append(e.local.opts, node.WithTracer(e.tr.Tracer))
	return e.local.start(e.Link)
}

// Shutdown closes what Open opened, in reverse: it stops the reload watch
// and the profiler, then the edge (drain, see coreSteps). ctx ending cuts
// the drain short (Process.Abort). The errors are a server's failure or a
// store's that could not be flushed.
func (e *edgeProcess) Shutdown(ctx context.Context) error { return e.steps.close(ctx) }

// coreSteps are an edge's resources in open order; closing them in
// reverse is its drain order. ModeDev's in-process node (inProcess) is
// opened right after the node endpoint, so it drains after the HTTP API
// (its requests need it) and the stores, and before the node endpoint
// stops. Closing the serve step drains the HTTP API (up to
// cfg.DrainTimeout, or until Shutdown's context ends), ends what is still
// going with an answer that says so (edge.Service.Shutdown: 503, or a
// stream's error event; outcome edge_stopped), waits up to shutdownFinish
// for those answers (Abort does not cut this: they are the answers) and
// for every handler; then the background runs end, the response store
// and ledger flush, and the node endpoint stops.
func (e *edgeProcess) coreSteps(inProcess ...step) []step {
	list := []step{
		{name: "config", open: e.checkConfig},
		{name: "keys", open: e.openKeys},
		{name: "edge server", open: e.openServer},
		{name: "tracing", open: e.openTracing, close: e.closeTracing},
		{name: "history", open: e.startHistory, close: e.stopHistory},
		{name: "node endpoint", open: e.listenNodes, close: e.stopNodeEndpoint},
	}
	list = append(list, inProcess...)
	return append(list,
		step{name: "ledger", open: e.openLedger, close: e.closeLedger},
		step{name: "responses", open: e.openResponses, close: e.closeResponses},
		step{name: "runs", open: e.openRuns, close: e.closeRuns},
		step{name: "batches", open: e.openBatches, close: e.closeBatches},
		step{name: "http listener", open: e.listenHTTP, close: e.closeHTTPListener},
		step{name: "serve", open: e.serve, close: e.drain},
	)
}

// checkConfig refuses a configuration iop check refuses
// (EdgeFile.Validate: every part's problems at once, each wrapping
// edge.ErrInvalidConfig), so the edge does not start on a file it would
// refuse to reload.
func (e *edgeProcess) checkConfig(context.Context) error { return e.cfg.Validate() }

// openKeys reads the keys file and makes the keyrings. It refuses an
// open client API (no keys) on a non-loopback address unless
// cfg.InsecureOpen.
func (e *edgeProcess) openKeys(context.Context) error {
	cfg, err := e.cfg.AccessConfig.LoadKeysFile()
	if err != nil {
		return err
	}
	e.cfg.AccessConfig = cfg
	if e.Keys, err = auth.NewKeyring("keys", cfg.Keys, nil); err != nil {
		return err
	}
	if e.AdminKeys, err = auth.NewKeyring("admin_keys", cfg.AdminKeys, nil); err != nil {
		return err
	}
	e.keyCfg, e.adminCfg, e.teamCfg, e.priceCfg = cfg.Keys, cfg.AdminKeys, cfg.Teams, cfg.Prices
	e.Quota = quota.New(quota.Config{Logger: e.logger.With("component", "quota")})
	configureQuota(e.Quota, cfg)
	return checkOpenAPI(e.cfg, e.Keys.Len(), e.logger)
}

// configureQuota gives q the quotas of cfg's keys and teams and its
// prices.
func configureQuota(q *quota.Ledger, cfg AccessConfig) {
	keys, teams := auth.QuotaScopes(cfg.Keys, cfg.Teams)
	q.Configure(keys, teams, cfg.Prices)
}

// openServer makes the metrics, event hub and history, and the edge
// (scheduler and node endpoint's gRPC service; nothing runs yet).
func (e *edgeProcess) openServer(context.Context) error {
	obs, err := newObservability()
	if err != nil {
		return err
	}
	e.usageOpen = make(chan struct{})
	srv, err := edge.NewServer(e.cfg.Config, edge.Deps{Logger: e.logger, Clock: scheduler.RealClock(), Observer: obs.observer(), Quota: e.quotaDeps()})
	if err != nil {
		return err
	}
	obs.registry.MustRegister(quota.NewCollector(e.Quota))
	e.obs, e.srv, e.Service = obs, srv, srv.Service()
	e.Link = memlink.New(srv.NodeGateway())
	obs.svc = e.Service
	return nil
}

func (e *edgeProcess) openTracing(ctx context.Context) (err error) {
	e.tr, err = tracing.Start(ctx, e.cfg.Tracing, nil, "iop-edge", e.logger)
	return err
}

// closeTracing exports the last requests' spans.
func (e *edgeProcess) closeTracing(context.Context) error {
	shutdownTracing(e.tr, e.logger)
	return nil
}

// startHistory starts the dashboard's sampler; it reads the service each
// second.
func (e *edgeProcess) startHistory(context.Context) error {
	e.obs.history.Start()
	return nil
}

func (e *edgeProcess) stopHistory(context.Context) error {
	e.obs.history.Stop()
	return nil
}

func (e *edgeProcess) listenNodes(context.Context) (err error) {
	if e.nodeLis, err = net.Listen("tcp", e.cfg.NodeListen); err != nil {
		return fmt.Errorf("node endpoint: %w", err)
	}
	e.NodeAddr = e.nodeLis.Addr().String()
	return nil
}

// stopNodeEndpoint stops the gRPC server (its error is the edge's), or
// closes its listener if it never served; then it waits for the handlers
// of the in-memory link (Link), which the server's end ended.
func (e *edgeProcess) stopNodeEndpoint(context.Context) error {
	defer e.Link.Close()
	if e.grpcDone == nil {
		e.nodeLis.Close()
		return nil
	}
	e.stopGRPC()
	return <-e.grpcDone
}

// openLedger opens the usage ledger: in PostgreSQL with cfg.LedgerDSN,
// else in cfg.Database (":memory:" when unset).
func (e *edgeProcess) openLedger(ctx context.Context) error {
	var store ledger.Store
	var err error
	if e.cfg.LedgerDSN != "" {
		store, err = ledger.OpenPostgres(ctx, e.cfg.LedgerDSN)
	} else {
		store, err = ledger.OpenSQLite(e.cfg.database())
	}
	if err != nil {
		return err
	}
	e.usage = ledger.New(store, e.logger)
	e.Ledger = e.usage
	close(e.usageOpen)
	return nil
}

// closeLedger flushes the ledger; every handler has returned by then.
func (e *edgeProcess) closeLedger(context.Context) error { return e.usage.Close() }

func (e *edgeProcess) openResponses(context.Context) (err error) {
	e.responseStore, err = responses.OpenSQLite(e.cfg.database())
	return err
}

// closeResponses closes the response store, after the background runs,
// which save their responses.
func (e *edgeProcess) closeResponses(context.Context) error {
	e.responseStore.Close()
	return nil
}

// openRuns opens the run records (in PostgreSQL with cfg.RunsDSN, under
// the edge's name; else in cfg.Database) and the runs API's manager.
func (e *edgeProcess) openRuns(ctx context.Context) error {
	var store runs.Store
	var err error
	runsCfg := runs.Config{Logger: e.logger.With("component", "runs")}
	if e.cfg.RunsDSN != "" {
		name := e.cfg.Name
		if name == "" && e.cfg.Cluster != nil {
			name = e.cfg.Cluster.Name // one name per edge, for the records as for the election
		}
		if name == "" {
			if name, err = os.Hostname(); err != nil {
				return fmt.Errorf("runs_dsn: name unset and no host name: %w", err)
			}
		}
		var shared *runs.Postgres
		shared, err = runs.OpenPostgres(ctx, e.cfg.RunsDSN, name, e.logger.With("component", "runs"))
		store, runsCfg.Shared = shared, shared
	} else {
		var own *runs.SQLite
		own, err = runs.OpenSQLite(e.cfg.database())
		store, runsCfg.Store = own, own
	}
	if err != nil {
		return err
	}
	if e.runManager, err = runs.NewManager(ctx, runsCfg); err != nil {
		store.Close()
		return err
	}
	return nil
}

// closeRuns ends the background runs still going (recorded as stopped
// with the edge), while their nodes can still be told to stop them.
func (e *edgeProcess) closeRuns(context.Context) error { return e.runManager.Close() }

func (e *edgeProcess) listenHTTP(context.Context) (err error) {
	if e.httpLis, err = net.Listen("tcp", e.cfg.Listen); err != nil {
		return fmt.Errorf("HTTP API: %w", err)
	}
	e.HTTPAddr = e.httpLis.Addr().String()
	return nil
}

// closeHTTPListener closes the HTTP listener if it never served (the
// HTTP server closed it otherwise).
func (e *edgeProcess) closeHTTPListener(context.Context) error {
	if e.httpDone == nil {
		e.httpLis.Close()
	}
	return nil
}

// teamOf is the team of the client key named key as the keys are now
// (after any reload), "" for a key in no team or no longer configured.
func (e *edgeProcess) teamOf(key string) string {
	if c := e.Keys.ByName(key); c != nil {
		return c.Team()
	}
	return ""
}

// serve builds the HTTP API over the opened stores and starts the gRPC
// and HTTP servers on their listeners.
func (e *edgeProcess) serve(ctx context.Context) error {
	svc := e.Service
	e.stopping = make(chan struct{})
	routes := admin.Routes(e.obs.adminConfig(admin.Config{Snapshots: svc, Usage: e.usage, Residency: svc, Quotas: e.Quota,
		TeamOf: e.teamOf, Logger: e.logger}))
	maps.Copy(routes, batchapi.Routes(e.batches.svc, e.logger))
	mediaRoutes, bodyLimits := media.Routes(media.Config{MaxUploadBytes: e.cfg.MaxUploadBytes, UploadIdleTimeout: e.cfg.UploadIdleTimeout})
	maps.Copy(routes, mediaRoutes)
	handler := api.New(e.obs.apiConfig(api.Config{
		Stopping:       e.stopping,
		MaxBodyBytes:   e.cfg.MaxBodyBytes,
		MaxAnswerBytes: e.cfg.MaxAnswerBytes,
		WriteTimeout:   e.cfg.WriteTimeout,
		Ready:          func() bool { return !e.draining.Load() && svc.Ready() },
		Keys:           e.Keys,
		AdminKeys:      e.AdminKeys,
		Ledger:         e.usage,
		Quota:          e.apiQuota(ctx),
		Flow:           e.cfg.Fairness.Flow,
		Tracer:         e.tr.Tracer,
		KeyAdmit:       clusterKeyAdmit(e.cfg.Cluster, svc, e.Keys),
		Known:          svc.Known,
		Routes:         routes,
		APIs: []api.API{openai.Routes, anthropic.Routes, runsapi.Routes(runsapi.Config{Runs: e.runManager}), responsesapi.Routes(responsesapi.Config{Store: e.responseStore, Runs: e.runManager,
			ReasoningSecret: reasoningSecret(e.cfg.Cluster)}),
			ollama.Routes(ollama.Config{Catalog: svc, Shower: svc})},
		BodyLimits: bodyLimits,
	}), svc, e.logger)
	if err := e.startBatches(ctx, handler); err != nil {
		return err
	}
	retryAfter := retryAfterPast(e.lameDuck())
	counted := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		e.handlers.Add(1)
		defer e.handlers.Done()
		if e.draining.Load() && r.Method != http.MethodGet && r.Method != http.MethodHead {
			refuseStopping(w, retryAfter)
			return
		}
		handler.ServeHTTP(&closeWhenDraining{ResponseWriter: w, draining: &e.draining}, r)
	})
	// IdleTimeout closes a keep-alive connection idle that long between
	// requests; a request's body has api.Config.BodyReadTimeout, its
	// headers ReadHeaderTimeout.
	e.httpSrv = &http.Server{Handler: counted, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: idleTimeout, MaxHeaderBytes: maxHeaderBytes,
		ErrorLog: slog.NewLogLogger(e.logger.Handler(), slog.LevelDebug)}
	e.httpSrv.RegisterOnShutdown(e.obs.hub.Close) // ends the events streams, which would hold up the drain
	// The node endpoint outlives the run context until the HTTP API has
	// drained, so the requests in flight at shutdown can finish.
	grpcCtx, stopGRPC := context.WithCancel(context.Background())
	e.stopGRPC = stopGRPC
	e.grpcDone = make(chan error, 1)
	go func() { e.grpcDone <- e.srv.Serve(grpcCtx, e.nodeLis) }()
	e.httpDone = make(chan error, 1)
	go func() { e.httpDone <- e.httpSrv.Serve(e.httpLis) }()
	return nil
}

func (e *edgeProcess) export(p *Process) {
	p.HTTPAddr, p.NodeAddr, p.Service, p.Ledger, p.NodeLink = e.HTTPAddr, e.NodeAddr, e.Service, e.Ledger, e.Link
	if e.local != nil {
		p.Agent = e.local.Agent
	}
	e.logger.Info("edge ready", "http", "http://"+e.HTTPAddr, "node_endpoint", e.NodeAddr)
}

// until blocks until ctx ends or a server fails (its error stays for
// Shutdown).
func (e *edgeProcess) until(ctx context.Context) error {
	select {
	case <-ctx.Done():
	case err := <-e.httpDone:
		e.httpDone <- err
	case err := <-e.grpcDone:
		e.grpcDone <- err
	}
	return nil
}

// drain stops the HTTP API (the serve step's close): /readyz is 503 and
// every new request is answered 503 with Retry-After at once; after the
// lame duck (lameDuck) the listener closes and the requests in flight, then the
// background runs, have the rest of cfg.DrainTimeout (cut short when
// abort ends); what is still going then ends with an answer that says so.
// It returns once every handler has returned, with the HTTP server's
// failure if it had one.
func (e *edgeProcess) drain(abort context.Context) error {
	grace := e.drainTimeout()
	// For the lame duck the listener stays open, so a request already on
	// its way on a kept-alive connection gets that answer rather than a
	// closed connection.
	e.draining.Store(true)
	e.batches.stopRunner() // its lines in flight stay pending: the next start runs them
	e.logger.Info("edge shutting down: draining requests in flight; a second signal stops it at once", "drain_timeout", grace, "lame_duck", e.lameDuck())
	drainCtx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	defer context.AfterFunc(abort, cancel)()
	lame := time.NewTimer(e.lameDuck())
	select {
	case <-lame.C:
	case <-drainCtx.Done():
		lame.Stop()
	}
	derr := e.httpSrv.Shutdown(drainCtx)
	if derr == nil {
		// Background runs (the runs API) have the rest of the grace
		// too; the edge still dispatches and relays them meanwhile.
		derr = e.runManager.Drain(drainCtx)
	}
	// What is still going now (requests past the grace, queued ones,
	// background runs) ends with an answer that says the edge stopped
	// (503, or a stream's error event), recorded as edge_stopped: never a
	// cut connection.
	switch {
	case derr != nil && abort.Err() != nil:
		e.logger.Warn("drain cut short (a second signal): ending the requests still in flight", "drain_timeout", grace)
	case derr != nil:
		e.logger.Warn("drain timeout over: ending the requests still in flight", "drain_timeout", grace)
	}
	close(e.stopping)
	e.Service.Shutdown()
	if derr != nil {
		finishCtx, cancelFinish := context.WithTimeout(context.Background(), shutdownFinish)
		if e.httpSrv.Shutdown(finishCtx) != nil {
			e.logger.Warn("requests still writing after the edge ended them were cut", "after", shutdownFinish)
			e.httpSrv.Close()
		}
		cancelFinish()
	}
	var err error
	if herr := <-e.httpDone; !errors.Is(herr, http.ErrServerClosed) {
		err = herr
	}
	e.handlers.Wait() // Close does not wait for its handlers; their records go to the ledger first
	return err
}

// lameDuck is cfg.LameDuck (DefaultLameDuck when unset), cut short at
// the drain timeout.
func (e *edgeProcess) lameDuck() time.Duration {
	d := e.cfg.LameDuck
	if d <= 0 {
		d = DefaultLameDuck
	}
	return min(d, e.drainTimeout())
}

// drainTimeout is cfg.DrainTimeout, or DefaultDrainTimeout when unset.
func (e *edgeProcess) drainTimeout() time.Duration {
	if e.cfg.DrainTimeout <= 0 {
		return DefaultDrainTimeout
	}
	return e.cfg.DrainTimeout
}

// openPprof serves the profiler at pprofListen (if set) until Shutdown.
func (e *edgeProcess) openPprof(context.Context) (err error) {
	e.stopPprof, err = servePprof(e.pprofListen)
	return err
}

func (e *edgeProcess) closePprof(context.Context) error {
	e.stopPprof()
	return nil
}

// openWatch reloads the configuration at each SIGHUP and change of the
// config file, until Shutdown.
func (e *edgeProcess) openWatch(context.Context) (err error) {
	e.stopWatch, err = watchConfig(e.configFile, e.reload, e.logger, e.hangup)
	return err
}

func (e *edgeProcess) closeWatch(context.Context) error {
	e.stopWatch()
	return nil
}

// checkOpenAPI refuses a client API without keys on an address other
// hosts can reach, unless cfg.InsecureOpen, and says in the log what is
// open: the client API without keys, the admin API without admin keys, a
// plaintext node endpoint off loopback.
func checkOpenAPI(cfg EdgeFile, keys int, logger *slog.Logger) error {
	if keys == 0 {
		if !isLoopback(cfg.Listen) && !cfg.InsecureOpen {
			return fmt.Errorf("refusing to serve the HTTP API on %s without API keys: anyone who can reach it could use your models. "+
				"Add client keys (iop keys create NAME; keys: or keys_file: in the config), listen on a loopback address, or start with --insecure-open", cfg.Listen)
		}
		level := slog.LevelInfo // loopback: only this machine can call
		if !isLoopback(cfg.Listen) {
			level = slog.LevelWarn
		}
		logger.Log(context.Background(), level, "client API is open: no API keys are configured, every caller is served", "listen", cfg.Listen, "insecure_open", cfg.InsecureOpen)
	} else if len(cfg.AdminKeys) == 0 {
		logger.Info("admin API disabled: no admin_keys are configured", "listen", cfg.Listen)
	}
	if cfg.TLSCert == "" && !isLoopback(cfg.NodeListen) {
		logger.Warn("node endpoint is plaintext gRPC: node tokens travel in the clear (set tls_cert and tls_key)", "node_listen", cfg.NodeListen)
	}
	if c := cfg.Cluster; c != nil && !c.TLS() {
		listen := c.Listen
		if listen == "" {
			listen = c.Advertise
		}
		if !isLoopback(listen) {
			logger.Warn("admission between edges is plaintext gRPC: the cluster token and every admission travel in the clear (set cluster.tls_cert, tls_key and tls_ca)", "cluster_listen", listen)
		}
	}
	return nil
}

// isLoopback reports whether a host:port listen address is on a loopback
// interface only: "localhost" or a loopback IP. An empty host, 0.0.0.0,
// :: and names are not.
func isLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// retryAfterPast is a Retry-After, in whole seconds, one more than d
// rounded up: refuseStopping's, past the lame duck.
func retryAfterPast(d time.Duration) string {
	secs := d / time.Second
	if d%time.Second > 0 {
		secs++
	}
	return strconv.FormatInt(int64(secs)+1, 10)
}

// refuseStopping answers a request that arrives while the edge stops:
// 503 edge_shutting_down, closing the connection, with retryAfter (past
// the lame duck, retryAfterPast): a client that honors it comes back once
// the listener is closed and is refused at connect (nothing sent, safe to retry), not at
// the instant it closes, when the kernel resets a connection still in the
// listener's backlog after the client sent its request.
func refuseStopping(w http.ResponseWriter, retryAfter string) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Retry-After", retryAfter)
	h.Set("Connection", "close")
	w.WriteHeader(http.StatusServiceUnavailable)
	_, _ = w.Write([]byte(`{"error":{"message":"the edge is stopping: retry on another edge","type":"server_error","param":null,"code":"edge_shutting_down"}}` + "\n"))
}

// closeWhenDraining is a request's http.ResponseWriter that adds
// "Connection: close" to an answer whose header is written once the edge
// drains: the client then opens a new connection for its next request
// (to another edge) instead of sending it on this one as the server
// closes it, which would leave that request with no answer (RFC 9112
// §9.6). Flush, FlushError and Unwrap keep http.ResponseController
// working through it.
type closeWhenDraining struct {
	http.ResponseWriter
	draining *atomic.Bool
	wrote    bool
}

func (w *closeWhenDraining) header() {
	if w.wrote {
		return
	}
	w.wrote = true
	if w.draining.Load() {
		w.ResponseWriter.Header().Set("Connection", "close")
	}
}

func (w *closeWhenDraining) WriteHeader(code int) {
	if code >= 200 {
		w.header()
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *closeWhenDraining) Write(b []byte) (int, error) {
	w.header()
	return w.ResponseWriter.Write(b)
}

func (w *closeWhenDraining) Flush() { _ = w.FlushError() }

func (w *closeWhenDraining) FlushError() error {
	w.header()
	return http.NewResponseController(w.ResponseWriter).Flush()
}

func (w *closeWhenDraining) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// shutdownFinish bounds how long a stopping edge, past its drain timeout,
// waits for the requests it ended to write their last answer (a client
// that stopped reading holds its handler; after this its connection is
// closed).
const shutdownFinish = 5 * time.Second

// clusterKeyAdmit makes a key's limits global with several edges
// (cfg.Cluster): the scheduler leader counts every edge's requests of a
// key (edge.Service.AdmitKey), taking them from its own keyring by name;
// a key without limits is counted by each edge alone (no call to the
// leader). nil for a single edge: each request takes its slot from its key here.
func clusterKeyAdmit(cluster *cluster.Config, svc *edge.Service, keys *auth.Keyring) func(context.Context, *auth.Caller) (func(), bool, error) {
	if cluster == nil {
		return nil
	}
	svc.SetKeyAdmitter(func(name string) (func(), error) {
		c := keys.ByName(name)
		if c == nil {
			return nil, fmt.Errorf("unknown key %q at the scheduler leader (every edge must have the same keys)", name)
		}
		p, err := c.Admit()
		if err != nil {
			return nil, err
		}
		return p.Release, nil
	})
	svc.SetKeyLeader(func(name string) func() {
		c := keys.ByName(name)
		if c == nil {
			return func() {}
		}
		return c.Adopt().Release
	}, keys.ExhaustRates)
	return func(ctx context.Context, c *auth.Caller) (func(), bool, error) {
		if !c.Limited() {
			// Nothing to count across edges: the slot is taken here, with
			// no AdmitKey round trip before the request's admission.
			return nil, true, nil
		}
		local, release, err := svc.AdmitKey(ctx, c.Name())
		var kl *edge.KeyLimitError
		if errors.As(err, &kl) {
			return nil, false, &auth.LimitError{Limit: kl.Limit, Max: kl.Max, RetryAfter: kl.RetryAfter}
		}
		return release, local, err
	}
}

// reasoningSecret is what the edge seals Responses reasoning items under
// (api.Config.ReasoningSecret): the cluster's token, shared by every edge
// of the deployment, or none (a key made at start).
func reasoningSecret(cluster *cluster.Config) []byte {
	if cluster == nil || cluster.Token == "" {
		return nil
	}
	return []byte(cluster.Token)
}
