package process

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"iop/internal/auth"
	"iop/internal/edge"
	"iop/internal/edge/api"
	"iop/internal/edge/api/admin"
	"iop/internal/ledger"
	"iop/internal/responses"
	"iop/internal/runs"
	"iop/internal/scheduler"
	"iop/internal/tracing"
)

// EdgeDefaults is the configuration `iop edge` starts from: the edge's
// defaults (edge.DefaultConfig), with run records and the ledger kept in
// the file edge.DefaultDatabase (iop.db). A Config.Edge built from
// edge.DefaultConfig instead keeps them in memory.
func EdgeDefaults() edge.Config {
	cfg := edge.DefaultConfig()
	cfg.Database = edge.DefaultDatabase
	return cfg
}

// edgeRun is a running edge: its node endpoint and HTTP API.
type edgeRun struct {
	Service *edge.Service
	Ledger  *ledger.Ledger
	// Keys and AdminKeys are the HTTP API's keyrings; a reload swaps
	// their keys (edgeReloader).
	Keys, AdminKeys *auth.Keyring

	keysMu           sync.Mutex // serializes reloads; guards the fields below
	keyCfg, adminCfg []auth.Key // the keys the keyrings were last given
	HTTPAddr         string     // host:port the HTTP API listens on
	NodeAddr         string     // host:port the node endpoint listens on
	done             chan error
}

// maxHeaderBytes caps a client request's header block; a larger one is
// answered 431 by net/http (RFC 6585 §5).
const maxHeaderBytes = 64 << 10

// idleTimeout is how long a client's keep-alive connection may sit idle
// between requests before the edge closes it (nginx's keepalive_timeout
// is 75 s).
const idleTimeout = 120 * time.Second

// startEdge listens on cfg.Listen and cfg.NodeListen and serves until ctx
// ends, with run records and the usage ledger in cfg.Database (the ledger
// in PostgreSQL with cfg.LedgerDSN, the run records with cfg.RunsDSN). It returns once both listeners
// are open. It refuses an open client API (no keys) on a non-loopback
// address unless cfg.InsecureOpen. When ctx ends it drains the HTTP API
// (up to cfg.DrainTimeout, or until abort ends), then ends what is still
// going with an answer that says so (edge.Service.Shutdown: 503, or a
// stream's error event; outcome edge_stopped), waits up to shutdownFinish
// for those answers (abort does not cut this: they are the answers), ends
// the background runs (runs.Manager.Close), flushes the ledger once every
// handler has returned, calls afterDrain (if set; iop dev stops its
// in-process node there), then stops the node endpoint.
func startEdge(ctx, abort context.Context, cfg edge.Config, logger *slog.Logger, afterDrain func()) (_ *edgeRun, err error) {
	cfg, err = cfg.LoadKeysFile()
	if err != nil {
		return nil, err
	}
	keys, err := auth.NewKeyring("keys", cfg.Keys, nil)
	if err != nil {
		return nil, err
	}
	adminKeys, err := auth.NewKeyring("admin_keys", cfg.AdminKeys, nil)
	if err != nil {
		return nil, err
	}
	if err := checkOpenAPI(cfg, keys.Len(), logger); err != nil {
		return nil, err
	}
	obs, err := newObservability()
	if err != nil {
		return nil, err
	}
	srv, err := edge.NewServer(cfg, edge.Deps{Logger: logger, Clock: scheduler.RealClock(), Observer: obs.observer()})
	if err != nil {
		return nil, err
	}
	obs.svc = srv.Service()
	var undo []func() // on failure, in reverse order

	// The history's sampler reads obs.svc each second.
	obs.history.Start()
	undo = append(undo, obs.history.Stop)
	defer func() {
		if err != nil {
			for i := len(undo) - 1; i >= 0; i-- {
				undo[i]()
			}
		}
	}()
	if cfg.Database == "" {
		cfg.Database = ":memory:"
	}
	var runStore runs.Store
	runsCfg := runs.Config{Logger: logger.With("component", "runs")}
	if cfg.RunsDSN != "" {
		name := cfg.Name
		if name == "" && cfg.Cluster != nil {
			name = cfg.Cluster.Name // one name per edge, for the records as for the election
		}
		if name == "" {
			if name, err = os.Hostname(); err != nil {
				return nil, fmt.Errorf("runs_dsn: name unset and no host name: %w", err)
			}
		}
		var shared *runs.Postgres
		shared, err = runs.OpenPostgres(ctx, cfg.RunsDSN, name, logger.With("component", "runs"))
		runStore, runsCfg.Shared = shared, shared
	} else {
		var own *runs.SQLite
		own, err = runs.OpenSQLite(cfg.Database)
		runStore, runsCfg.Store = own, own
	}
	if err != nil {
		return nil, err
	}
	runManager, err := runs.NewManager(ctx, runsCfg)
	if err != nil {
		runStore.Close()
		return nil, err
	}
	undo = append(undo, func() { runManager.Close() })
	responseStore, err := responses.OpenSQLite(cfg.Database)
	if err != nil {
		return nil, err
	}
	undo = append(undo, func() { responseStore.Close() })
	var ledgerStore ledger.Store
	if cfg.LedgerDSN != "" {
		ledgerStore, err = ledger.OpenPostgres(ctx, cfg.LedgerDSN)
	} else {
		ledgerStore, err = ledger.OpenSQLite(cfg.Database)
	}
	if err != nil {
		return nil, err
	}
	usage := ledger.New(ledgerStore, logger)
	undo = append(undo, func() { usage.Close() })
	nodeLis, err := net.Listen("tcp", cfg.NodeListen)
	if err != nil {
		return nil, fmt.Errorf("node endpoint: %w", err)
	}
	undo = append(undo, func() { nodeLis.Close() })
	httpLis, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("HTTP API: %w", err)
	}
	svc := srv.Service()
	tr, err := tracing.Start(ctx, cfg.Tracing, nil, "iop-edge", logger)
	if err != nil {
		return nil, err
	}
	undo = append(undo, func() { shutdownTracing(tr, logger) })
	stopping := make(chan struct{}) // closed when the edge ends what is still in flight
	var draining atomic.Bool        // set the moment the edge is told to stop
	handler := api.New(obs.apiConfig(api.Config{
		Stopping:        stopping,
		MaxBodyBytes:    cfg.MaxBodyBytes,
		MaxAnswerBytes:  cfg.MaxAnswerBytes,
		WriteTimeout:    cfg.WriteTimeout,
		Ready:           func() bool { return !draining.Load() && svc.Ready() },
		Runs:            runManager,
		Keys:            keys,
		AdminKeys:       adminKeys,
		Ledger:          usage,
		Responses:       responseStore,
		Flow:            cfg.Fairness.Flow,
		Tracer:          tr.Tracer,
		KeyAdmit:        clusterKeyAdmit(cfg, svc, keys),
		ReasoningSecret: reasoningSecret(cfg),
		Catalog:         svc,
		Shower:          svc,
		Known:           svc.Known,
		Routes:          admin.Routes(obs.adminConfig(admin.Config{Snapshots: svc, Usage: usage, Logger: logger})),
	}), svc, logger)
	var handlers sync.WaitGroup // handlers running, so the ledger closes after the last one
	counted := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		handlers.Add(1)
		defer handlers.Done()
		if draining.Load() && r.Method != http.MethodGet && r.Method != http.MethodHead {
			refuseStopping(w)
			return
		}
		handler.ServeHTTP(w, r)
	})
	// IdleTimeout closes a keep-alive connection idle that long between
	// requests (a break-it report: idle connections stayed open for good);
	// a request's body has api.Config.BodyReadTimeout, its headers
	// ReadHeaderTimeout.
	httpSrv := &http.Server{Handler: counted, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: idleTimeout, MaxHeaderBytes: maxHeaderBytes,
		ErrorLog: slog.NewLogLogger(logger.Handler(), slog.LevelDebug)}
	httpSrv.RegisterOnShutdown(obs.hub.Close) // ends the events streams, which would hold up the drain
	e := &edgeRun{Service: svc, Ledger: usage, Keys: keys, AdminKeys: adminKeys, keyCfg: cfg.Keys, adminCfg: cfg.AdminKeys, HTTPAddr: httpLis.Addr().String(), NodeAddr: nodeLis.Addr().String(), done: make(chan error, 1)}
	// The node endpoint outlives ctx until the HTTP API has drained, so the
	// requests in flight at shutdown can finish.
	grpcCtx, stopGRPC := context.WithCancel(context.Background())
	grpcDone := make(chan error, 1)
	go func() { grpcDone <- srv.Serve(grpcCtx, nodeLis) }()
	httpDone := make(chan error, 1)
	go func() { httpDone <- httpSrv.Serve(httpLis) }()
	go func() {
		var err error
		select {
		case <-ctx.Done():
		case err = <-httpDone:
			httpDone <- err
		case err = <-grpcDone:
			grpcDone <- err
		}
		grace := cfg.DrainTimeout
		if grace <= 0 {
			grace = edge.DefaultDrainTimeout
		}
		// From now on /readyz is 503 and every new request is answered 503
		// with Retry-After (for stopLameDuck, with the listener still
		// open, so a request already on its way on a kept-alive
		// connection gets that answer rather than a closed connection).
		draining.Store(true)
		logger.Info("edge shutting down: draining requests in flight; a second signal stops it at once", "drain_timeout", grace)
		drainCtx, cancel := context.WithTimeout(context.Background(), grace)
		defer cancel()
		defer context.AfterFunc(abort, cancel)()
		lame := time.NewTimer(min(stopLameDuck, grace))
		select {
		case <-lame.C:
		case <-drainCtx.Done():
			lame.Stop()
		}
		derr := httpSrv.Shutdown(drainCtx)
		if derr == nil {
			// Background runs (the runs API) have the rest of the grace
			// too; the edge still dispatches and relays them meanwhile.
			derr = runManager.Drain(drainCtx)
		}
		// What is still going now (requests past the grace, queued ones,
		// background runs) ends with an answer that says the edge stopped
		// (503, or a stream's error event), recorded as edge_stopped:
		// never a cut connection.
		if derr != nil {
			logger.Warn("drain timeout over: ending the requests still in flight", "drain_timeout", grace)
		}
		close(stopping)
		svc.Shutdown()
		if derr != nil {
			finishCtx, cancelFinish := context.WithTimeout(context.Background(), shutdownFinish)
			if httpSrv.Shutdown(finishCtx) != nil {
				logger.Warn("requests still writing after the edge ended them were cut", "after", shutdownFinish)
				httpSrv.Close()
			}
			cancelFinish()
		}
		if herr := <-httpDone; !errors.Is(herr, http.ErrServerClosed) && err == nil {
			err = herr
		}
		handlers.Wait() // Close does not wait for its handlers; their records go to the ledger first
		// Background runs still going end now (recorded as stopped with the
		// edge), while their nodes can still be told to stop them.
		if rerr := runManager.Close(); rerr != nil && err == nil {
			err = rerr
		}
		responseStore.Close() // after the background runs, which save their responses
		if lerr := usage.Close(); lerr != nil && err == nil {
			err = lerr
		}
		if afterDrain != nil {
			afterDrain()
		}
		stopGRPC()
		if gerr := <-grpcDone; err == nil {
			err = gerr
		}
		obs.history.Stop()
		shutdownTracing(tr, logger) // exports the last requests' spans
		e.done <- err
	}()
	return e, nil
}

// checkOpenAPI refuses a client API without keys on an address other
// hosts can reach, unless cfg.InsecureOpen, and says in the log what is
// open: the client API without keys, the admin API without admin keys, a
// plaintext node endpoint off loopback.
func checkOpenAPI(cfg edge.Config, keys int, logger *slog.Logger) error {
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

// stopLameDuck is how long a stopping edge keeps its HTTP listener and
// idle connections open, answering every new request 503 with
// Retry-After and "Connection: close", before it closes them: the load
// balancer's health check (/readyz, 503 from the first instant) takes the
// edge out of rotation meanwhile, and a request racing the stop gets an
// answer.
const stopLameDuck = time.Second

// refuseStopping answers a request that arrives while the edge stops:
// 503 edge_shutting_down with Retry-After, closing the connection.
func refuseStopping(w http.ResponseWriter) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Retry-After", "1")
	h.Set("Connection", "close")
	w.WriteHeader(http.StatusServiceUnavailable)
	_, _ = w.Write([]byte(`{"error":{"message":"the edge is stopping: retry on another edge","type":"server_error","param":null,"code":"edge_shutting_down"}}` + "\n"))
}

// shutdownFinish bounds how long a stopping edge, past its drain timeout,
// waits for the requests it ended to write their last answer (a client
// that stopped reading holds its handler; after this its connection is
// closed).
const shutdownFinish = 5 * time.Second

// Wait blocks until the edge has stopped and returns why.
func (e *edgeRun) Wait() error { return <-e.done }

// clusterKeyAdmit makes a key's limits global with several edges
// (cfg.Cluster): the scheduler leader counts every edge's requests of a
// key (edge.Service.AdmitKey), taking them from its own keyring by name;
// a key without limits is counted by each edge alone (no call to the
// leader). nil for a single edge: each request takes its slot from its key here.
func clusterKeyAdmit(cfg edge.Config, svc *edge.Service, keys *auth.Keyring) func(context.Context, *auth.Caller) (func(), bool, error) {
	if cfg.Cluster == nil {
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
func reasoningSecret(cfg edge.Config) []byte {
	if cfg.Cluster == nil || cfg.Cluster.Token == "" {
		return nil
	}
	return []byte(cfg.Cluster.Token)
}
