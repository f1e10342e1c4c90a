package process

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"iop/internal/edge"
	"iop/internal/node"
	"iop/internal/sim"
)

// SoakConfig configures Soak (`iop soak`).
type SoakConfig struct {
	Clients         int           // concurrent clients, each sending one request after another
	Capacity        int           // the provider's capacity
	MaxQueue        int           // the model's max_queue
	QueueTimeout    time.Duration // the model's queue_timeout
	Duration        time.Duration // how long clients send requests
	TokensPerSecond float64       // the simulator's token rate
	MaxTokens       int           // tokens per answer
	Stream          bool          // ask for streamed answers
}

// soakModel is the model the soak's clients ask for.
const soakModel = "soak"

// SoakResult is what a soak run saw; Write prints it.
type SoakResult struct {
	cfg      SoakConfig
	elapsed  time.Duration
	requests int
	// outcomes counts requests by HTTP status, or by "error: <kind>" for
	// those that got no answer.
	outcomes map[string]int
	// What the edge's snapshot held after the run: unreleased leases,
	// queued requests, and in-flight counts summed over providers.
	leases, waiters, inFlight int
	goroutinesBefore          int
	goroutinesAfter           int
}

// Leaked reports whether a slot was still held or queued after the run
// (a lease, a waiter or an in-flight count not back to zero).
func (r SoakResult) Leaked() bool { return r.leases != 0 || r.waiters != 0 || r.inFlight != 0 }

// Write prints the result to w as a short table: the requests and their
// rate, the outcomes by status, the leaked slots and the goroutines before
// and after.
func (r SoakResult) Write(w io.Writer) {
	c := r.cfg
	fmt.Fprintf(w, "soak: %d clients, capacity %d, max_queue %d, queue_timeout %s, %s\n",
		c.Clients, c.Capacity, c.MaxQueue, c.QueueTimeout, r.elapsed.Round(time.Millisecond))
	fmt.Fprintf(w, "requests      %d (%.0f/s)\n", r.requests, float64(r.requests)/r.elapsed.Seconds())
	keys := make([]string, 0, len(r.outcomes))
	for k := range r.outcomes {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		fmt.Fprintf(w, "  %-11s %d\n", k, r.outcomes[k])
	}
	fmt.Fprintf(w, "leaked slots  %d (leases %d, in flight %d, queued %d)\n", r.leases+r.inFlight+r.waiters, r.leases, r.inFlight, r.waiters)
	fmt.Fprintf(w, "goroutines    before %d, after %d\n", r.goroutinesBefore, r.goroutinesAfter)
}

// Soak runs the soak (`iop soak`): it starts a simulator, an edge and a
// node in this process, with one provider of cfg.Capacity slots and a model
// of cfg.MaxQueue and cfg.QueueTimeout, runs cfg.Clients clients (each
// sending one chat request after the other) for cfg.Duration, lets the
// requests in flight finish, and reads the edge's snapshot once the edge
// is idle (or after a bounded wait). It counts the goroutines before it
// starts anything and after it stopped everything (or after a bounded
// wait). Errors: a non-positive setting, or what failed to start; ctx
// ending stops the clients.
func Soak(ctx context.Context, cfg SoakConfig, logger *slog.Logger) (SoakResult, error) {
	if cfg.Clients < 1 || cfg.Capacity < 1 || cfg.MaxQueue < 1 || cfg.QueueTimeout <= 0 || cfg.Duration <= 0 || cfg.MaxTokens < 1 {
		return SoakResult{}, errors.New("--clients, --capacity, --max-queue, --queue-timeout, --duration and --max-tokens must be positive")
	}
	raiseFileLimit(uint64(4*cfg.Clients + 256))
	quiet := slog.New(slog.DiscardHandler)
	res := SoakResult{cfg: cfg, outcomes: map[string]int{}, goroutinesBefore: runtime.NumGoroutine()}
	err := soakRun(ctx, cfg, logger, quiet, &res)
	// Everything the run started is stopped: the count must come back.
	waitUntil(5*time.Second, func() bool {
		res.goroutinesAfter = runtime.NumGoroutine()
		return res.goroutinesAfter <= res.goroutinesBefore
	})
	return res, err
}

// soakRun is Soak between the goroutine counts: it starts the
// simulator, edge and node, runs the clients, reads the edge's snapshot
// into res, and stops what it started.
func soakRun(ctx context.Context, cfg SoakConfig, logger, quiet *slog.Logger, res *SoakResult) error {

	s, err := sim.New(sim.Config{Protocol: sim.ProtocolOllama, Models: []string{"m"}, TokensPerSecond: cfg.TokensPerSecond,
		DefaultMaxTokens: cfg.MaxTokens}, quiet)
	if err != nil {
		return err
	}
	simURL, stopSim, err := s.Start("127.0.0.1:0")
	if err != nil {
		return err
	}
	defer stopSim()

	edgeCtx, stopEdge := context.WithCancel(context.Background())
	ecfg := DefaultEdgeFile()
	ecfg.Listen, ecfg.NodeListen, ecfg.Database = "127.0.0.1:0", "127.0.0.1:0", ":memory:"
	ecfg.Models = map[string]edge.ModelConfig{soakModel: {Targets: []string{"m"}, MaxQueue: cfg.MaxQueue, QueueTimeout: cfg.QueueTimeout}}
	e, err := Start(edgeCtx, Config{Mode: ModeEdge, Edge: ecfg}, Deps{Logger: logger})
	if err != nil {
		stopEdge()
		return err
	}
	defer func() {
		stopEdge()
		_ = e.Wait()
	}()

	agent, err := node.New(node.Config{NodeID: "soak-node", Edge: e.NodeAddr, Providers: []node.ProviderConfig{
		{ID: "sim", Type: node.TypeSim, Protocol: string(sim.ProtocolOllama), BaseURL: simURL, Models: []string{"m"}, Capacity: cfg.Capacity},
	}}, logger)
	if err != nil {
		return err
	}
	nodeCtx, stopNode := context.WithCancel(context.Background())
	nodeDone := make(chan error, 1)
	go func() { nodeDone <- agent.Run(nodeCtx) }()
	defer func() {
		stopNode()
		<-nodeDone
	}()
	select {
	case <-agent.Ready():
	case err := <-nodeDone:
		nodeDone <- err
		return fmt.Errorf("node: %w", err)
	case <-ctx.Done():
		return ctx.Err()
	}

	tr := &http.Transport{MaxIdleConns: cfg.Clients, MaxIdleConnsPerHost: cfg.Clients}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	body := fmt.Sprintf(`{"model":%q,"max_tokens":%d,"stream":%v,"messages":[{"role":"user","content":"soak"}]}`, soakModel, cfg.MaxTokens, cfg.Stream)
	url := "http://" + e.HTTPAddr + "/v1/chat/completions"

	// Clients start no request after the deadline; the ones in flight
	// finish (their wait is bounded by the queue timeout and the answer).
	runCtx, stopRun := context.WithTimeout(ctx, cfg.Duration)
	defer stopRun()
	var (
		mu sync.Mutex // guards res.outcomes and res.requests
		wg sync.WaitGroup
	)
	start := time.Now()
	for range cfg.Clients {
		wg.Go(func() {
			for runCtx.Err() == nil {
				outcome := soakRequest(ctx, client, url, body)
				mu.Lock()
				res.requests++
				res.outcomes[outcome]++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	res.elapsed = time.Since(start)
	tr.CloseIdleConnections()

	// Let the edge settle: every slot given back (bounded: a leak stays).
	waitUntil(5*time.Second, func() bool {
		snap := e.Service.Snapshot()
		res.leases, res.waiters, res.inFlight = snap.Leases, snap.Waiters, 0
		for _, p := range snap.Providers {
			res.inFlight += p.InFlight
		}
		return !res.Leaked()
	})
	return nil
}

// waitUntil calls done every 10 ms until it returns true or limit has passed.
func waitUntil(limit time.Duration, done func() bool) {
	deadline := time.Now().Add(limit)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !done() && time.Now().Before(deadline) {
		<-tick.C
	}
}

// soakRequest sends one request and returns its outcome: the status, or
// "error: <what>" when no answer came. The whole body is read.
func soakRequest(ctx context.Context, client *http.Client, url, body string) string {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return "error: request"
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return "error: interrupted"
		}
		return "error: transport"
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return "error: body"
	}
	return strconv.Itoa(resp.StatusCode)
}

// raiseFileLimit raises the soft limit on open files to want, or to the
// hard limit if that is lower; a failure leaves the limit as it was.
func raiseFileLimit(want uint64) {
	var lim syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim) != nil || lim.Cur >= want {
		return
	}
	lim.Cur = min(want, lim.Max)
	_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
}
