package benchrun

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"iop/internal/edge"
	"iop/internal/edge/contract"
	"iop/internal/loadgen"
	iopprocess "iop/internal/process"
)

// BatchConfig is the batch-band benchmark (`iop bench --batch`): an
// interactive load at Load × the fleet's capacity on simulators, alone
// and beside a batch of Lines requests at the batch priority submitted at
// once. Zero fields take the defaults in brackets.
type BatchConfig struct {
	// Binary is the iop executable the simulators and the node run from
	// (the edge runs in this process: the batch driver calls its dispatch).
	Binary string
	// Providers is the number of simulators, one provider each [2];
	// Capacity each provider's capacity [8].
	Providers, Capacity int
	// TTFT is the simulators' time to first token [1s] and TokensPerSecond
	// their token rate after it [20]: an interactive request's 4-token
	// answer takes S = TTFT + 3/TokensPerSecond, and the fleet serves
	// Providers × Capacity / S interactive requests a second. Batch line i
	// asks for 1 + i mod BatchMaxTokens tokens [40], so batch lines take
	// TTFT to TTFT + (BatchMaxTokens−1)/TokensPerSecond, as varied
	// generations do, and do not end in step.
	TTFT            time.Duration
	TokensPerSecond float64
	BatchMaxTokens  int
	// Load is the interactive rate as a fraction of that capacity [0.6].
	Load float64
	// Lines is the batch's size [10000]; the lines not done when the
	// interactive window ends are cancelled.
	Lines int
	// Headroom is the edge's queue.batch.headroom [0: the edge's default,
	// 1]; negative: none.
	Headroom int
	// Backoff is the edge's queue.batch.backoff [0: the edge's default,
	// 5s]; negative: none.
	Backoff time.Duration
	// Duration is each phase's interactive window [60s].
	Duration time.Duration
	// Driver submits the batch; nil: InProcessBatch on the edge's
	// dispatch.
	Driver func(svc *edge.Service, edgeURL string) BatchDriver
	// Log gets progress lines; nil means none.
	Log io.Writer
}

// BatchDriver runs one batch of lines at the batch priority. Today
// InProcessBatch calls the edge's dispatch; a driver that submits through
// POST /v1/files and POST /v1/batches fits the same interface.
type BatchDriver interface {
	// Run submits lines chat requests for model at once and returns when
	// each one ended (done is called once per line, with nil when it
	// completed) or ctx ended (the lines not done are cancelled).
	// Line i asks for 1 + i mod maxTokens tokens.
	Run(ctx context.Context, model string, lines, maxTokens int, done func(error))
}

// BatchPhase is one phase's figures, over its interactive window.
type BatchPhase struct {
	// Name is "interactive" (the interactive load alone) or "batch" (with
	// the batch running).
	Name string `json:"name"`
	// Interactive is the interactive load's result, as its client saw it;
	// Wait its requests' queue waits, as the edge logged them.
	Interactive loadgen.Result      `json:"interactive"`
	Wait        loadgen.Percentiles `json:"wait"`
	// BatchDone and BatchFailed count the batch lines that ended in the
	// window, completed or not.
	BatchDone   int `json:"batch_done"`
	BatchFailed int `json:"batch_failed"`
	// InFlight and BatchInFlight are the slots held, all and by batch
	// lines, averaged over the window (the edge's provider snapshots,
	// every 50 ms).
	InFlight      float64 `json:"in_flight"`
	BatchInFlight float64 `json:"batch_in_flight"`
}

// BatchReport is the benchmark's result.
type BatchReport struct {
	Config BatchConfig  `json:"-"`
	Phases []BatchPhase `json:"phases"`
}

const batchModel = "bench-batch"

func (c *BatchConfig) defaults() {
	if c.Providers == 0 {
		c.Providers = 2
	}
	if c.Capacity == 0 {
		c.Capacity = 8
	}
	if c.TTFT == 0 {
		c.TTFT = time.Second
	}
	if c.TokensPerSecond == 0 {
		c.TokensPerSecond = 20
	}
	if c.BatchMaxTokens == 0 {
		c.BatchMaxTokens = 40
	}
	if c.Load == 0 {
		c.Load = 0.6
	}
	if c.Lines == 0 {
		c.Lines = 10000
	}
	if c.Duration == 0 {
		c.Duration = 60 * time.Second
	}
	if c.Log == nil {
		c.Log = io.Discard
	}
	if c.Driver == nil {
		c.Driver = func(svc *edge.Service, _ string) BatchDriver { return &InProcessBatch{Service: svc} }
	}
}

// Batch runs the batch-band benchmark: it starts cfg.Providers iop sim
// processes, an edge in this process and an iop node process, runs the
// interactive open-loop load (loadgen) alone, then again with the batch
// submitted just before it, and stops them. Errors: a process that fails
// to start or exits, a setup step that times out, ctx's end.
func Batch(ctx context.Context, cfg BatchConfig) (BatchReport, error) {
	cfg.defaults()
	rep := BatchReport{Config: cfg}
	dir, err := os.MkdirTemp("", "iop-bench-batch-")
	if err != nil {
		return rep, err
	}
	var procs []*process
	defer func() {
		for i := len(procs) - 1; i >= 0; i-- {
			procs[i].stop()
		}
	}()
	var provs []string
	for i := range cfg.Providers {
		addr, err := freeAddr()
		if err != nil {
			return rep, err
		}
		p, err := startProcess(dir, fmt.Sprintf("sim%d", i), cfg.Binary, "sim", "--protocol", "openai", "--listen", addr,
			"--model", batchModel, "--ttft", cfg.TTFT.String(), "--tokens-per-second", fmt.Sprint(cfg.TokensPerSecond),
			"--default-max-tokens", "4", "--log-level", "warn")
		if err != nil {
			return rep, err
		}
		procs = append(procs, p)
		provs = append(provs, fmt.Sprintf(`  - {id: sim%d, type: sim, protocol: openai, base_url: "http://%s/v1", models: [%s], capacity: %d}`,
			i, addr, batchModel, cfg.Capacity))
	}

	ecfg := iopprocess.DefaultEdgeFile()
	ecfg.Listen, ecfg.NodeListen, ecfg.Database = "127.0.0.1:0", "127.0.0.1:0", ":memory:"
	ecfg.Queue.MaxQueue = 1024
	ecfg.Queue.QueueTimeout = 30 * time.Second
	ecfg.Queue.Batch = edge.BatchQueueConfig{Headroom: cfg.Headroom, MaxQueue: cfg.Lines, Backoff: cfg.Backoff}
	edgeLog, err := os.Create(filepath.Join(dir, "edge.log"))
	if err != nil {
		return rep, err
	}
	defer edgeLog.Close()
	ectx, stopEdge := context.WithCancel(context.WithoutCancel(ctx))
	e, err := iopprocess.Start(ectx, iopprocess.Config{Mode: iopprocess.ModeEdge, Edge: ecfg},
		iopprocess.Deps{Logger: slog.New(slog.NewJSONHandler(edgeLog, &slog.HandlerOptions{Level: slog.LevelInfo}))})
	if err != nil {
		stopEdge()
		return rep, fmt.Errorf("edge: %w", err)
	}
	defer func() {
		stopEdge()
		_ = e.Wait()
	}()
	nodeFile := filepath.Join(dir, "node.yaml")
	nodeCfg := fmt.Sprintf("node_id: bench\nedge: %s\nproviders:\n%s\n", e.NodeAddr, strings.Join(provs, "\n"))
	if err := os.WriteFile(nodeFile, []byte(nodeCfg), 0o600); err != nil {
		return rep, err
	}
	p, err := startProcess(dir, "node", cfg.Binary, "node", "--config", nodeFile, "--log-level", "warn")
	if err != nil {
		return rep, err
	}
	procs = append(procs, p)
	svc := e.Service
	if err := waitFor(ctx, 30*time.Second, procs, func() error {
		ready := 0
		for _, p := range svc.Snapshot().Providers {
			if p.Capacity == cfg.Capacity {
				ready++
			}
		}
		if ready < cfg.Providers {
			return fmt.Errorf("%d of %d providers connected", ready, cfg.Providers)
		}
		return nil
	}); err != nil {
		return rep, fmt.Errorf("%w (logs in %s)", err, dir)
	}
	url := "http://" + e.HTTPAddr
	// One request through the HTTP API end to end before the phases.
	if err := waitFor(ctx, 30*time.Second, procs, func() error {
		res, err := loadgen.Run(ctx, loadgen.Config{URL: url, API: loadgen.APIOpenAI, Model: batchModel, PromptChars: 16,
			Concurrency: 1, Requests: 1, Timeout: 10 * time.Second}, nil)
		if err == nil && res.OK != 1 {
			err = fmt.Errorf("warm-up request: %v", res.Outcomes)
		}
		return err
	}); err != nil {
		return rep, fmt.Errorf("%w (logs in %s)", err, dir)
	}
	fmt.Fprintf(cfg.Log, "batch: %d sims (capacity %d each), edge %s and node up; logs in %s\n", cfg.Providers, cfg.Capacity, url, dir)

	for _, name := range []string{"interactive", "batch"} {
		var driver BatchDriver
		if name == "batch" {
			driver = cfg.Driver(svc, url)
		}
		ph, err := batchPhase(ctx, cfg, svc, url, edgeLog.Name(), name, driver)
		if err != nil {
			return rep, fmt.Errorf("phase %s: %w (logs in %s)", name, err, dir)
		}
		rep.Phases = append(rep.Phases, ph)
		for _, p := range procs {
			if err := p.exited(); err != nil {
				return rep, err
			}
		}
	}
	os.RemoveAll(dir)
	return rep, nil
}

// batchPhase runs one phase: the interactive load (open loop, fixed
// schedule) starts first and runs for batchWarmUp; with a driver, the
// batch is then submitted at once, and the phase waits until every line
// is queued, running or ended and they fill the room the headroom leaves
// (at most 2 min). Then the window opens for cfg.Duration: the slots held
// are sampled, and the interactive requests that arrive in it are the
// phase's figures (the edge's request log: each one's duration and queue
// wait). The load goes on until they ended; then the batch is cancelled
// and the phase waits for every slot to be free again.
func batchPhase(ctx context.Context, cfg BatchConfig, svc *edge.Service, url, logPath, name string, driver BatchDriver) (BatchPhase, error) {
	out := BatchPhase{Name: name}
	capacity := cfg.Providers * cfg.Capacity
	rate := cfg.Load * float64(capacity) / cfg.service().Seconds()
	fmt.Fprintf(cfg.Log, "phase %s: interactive load %.1f req/s\n", name, rate)
	lctx, stopLoad := context.WithCancel(ctx)
	defer stopLoad()
	loadDone := make(chan error, 1)
	go func() {
		_, err := loadgen.Run(lctx, loadgen.Config{URL: url, API: loadgen.APIOpenAI, Model: batchModel, PromptChars: loadgen.DefaultPromptChars,
			Rate: rate, Duration: 24 * time.Hour, Timeout: time.Minute, MaxInFlight: loadgen.DefaultMaxInFlight}, nil)
		loadDone <- err
	}()
	if err := sleepCtx(ctx, batchWarmUp(cfg)); err != nil {
		return out, err
	}

	var windowOpen atomic.Bool
	var done, failed atomic.Int64
	bctx, stopBatch := context.WithCancel(ctx)
	defer stopBatch()
	var wg sync.WaitGroup
	if driver != nil {
		var ended atomic.Int64
		wg.Add(1)
		go func() {
			defer wg.Done()
			driver.Run(bctx, batchModel, cfg.Lines, cfg.BatchMaxTokens, func(err error) {
				ended.Add(1)
				if !windowOpen.Load() {
					return
				}
				if err != nil && bctx.Err() == nil {
					failed.Add(1)
				} else if err == nil {
					done.Add(1)
				}
			})
		}()
		headroom := cfg.Headroom
		if headroom == 0 {
			headroom = 1
		}
		room := cfg.Providers * max(min(headroom, cfg.Capacity-1), 0)
		// Every line submitted (queued, running or ended) and the room
		// filled before the window opens: the submission itself is not
		// what the window measures.
		for deadline := time.Now().Add(2 * time.Minute); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			snap := svc.Snapshot()
			running, held := 0, 0
			for _, p := range snap.Providers {
				running += p.BatchInFlight
				held += p.InFlight
			}
			if held+room >= capacity && snap.Waiters+running+int(ended.Load()) >= cfg.Lines {
				break
			}
		}
		fmt.Fprintf(cfg.Log, "phase %s: %d batch lines running\n", name, batchSlots(svc))
	}
	fmt.Fprintf(cfg.Log, "phase %s: window of %s\n", name, cfg.Duration)
	var samples int
	var inFlight, batchInFlight float64
	windowOpen.Store(true)
	open := time.Now()
	tick := time.NewTicker(50 * time.Millisecond)
	for closeAt := open.Add(cfg.Duration); time.Now().Before(closeAt); {
		select {
		case <-ctx.Done():
			tick.Stop()
			return out, ctx.Err()
		case <-tick.C:
		}
		snap := svc.Snapshot()
		samples++
		for _, p := range snap.Providers {
			inFlight += float64(p.InFlight)
			batchInFlight += float64(p.BatchInFlight)
		}
	}
	tick.Stop()
	closed := time.Now()
	windowOpen.Store(false)
	// The requests of the window end before the load stops.
	if err := sleepCtx(ctx, 2*cfg.service()+5*time.Second); err != nil {
		return out, err
	}
	stopLoad()
	loadErr := <-loadDone
	stopBatch()
	wg.Wait()
	if loadErr != nil {
		return out, loadErr
	}
	reqs, err := requestsIn(logPath, open, closed)
	if err != nil {
		return out, err
	}
	out.Interactive, out.Wait = reqs.result(rate, closed.Sub(open))
	out.BatchDone, out.BatchFailed = int(done.Load()), int(failed.Load())
	if samples > 0 {
		out.InFlight, out.BatchInFlight = inFlight/float64(samples), batchInFlight/float64(samples)
	}
	// Every slot free again before the next phase.
	for deadline := time.Now().Add(30 * time.Second); svc.Snapshot().Leases > 0; {
		if time.Now().After(deadline) {
			return out, errors.New("slots still held 30s after the phase")
		}
		time.Sleep(20 * time.Millisecond)
	}
	return out, nil
}

// batchWarmUp is how long the interactive load runs before the batch is
// submitted (and, alone, before the window opens): three interactive
// service times, at least 3 s, so its slots are in their steady state.
func batchWarmUp(cfg BatchConfig) time.Duration {
	return max(3*cfg.service(), 3*time.Second)
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// loggedRequest is one "request" line of the edge's log.
type loggedRequest struct {
	end      time.Time
	duration time.Duration // the edge's, from the request's arrival to its end
	wait     time.Duration // queue_wait
	status   int
}

// loggedRequests are the requests of a window.
type loggedRequests []loggedRequest

// requestsIn reads the edge's JSON log at path and returns its requests
// that arrived (end − duration) in [from, to).
func requestsIn(path string, from, to time.Time) (loggedRequests, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out loggedRequests
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var line struct {
			Time      time.Time `json:"time"`
			Msg       string    `json:"msg"`
			Status    int       `json:"status"`
			Duration  int64     `json:"duration"`   // nanoseconds (slog's JSON of a Duration)
			QueueWait int64     `json:"queue_wait"` // nanoseconds
		}
		if json.Unmarshal(sc.Bytes(), &line) != nil || line.Msg != "request" {
			continue
		}
		r := loggedRequest{end: line.Time, duration: time.Duration(line.Duration), wait: time.Duration(line.QueueWait), status: line.Status}
		if at := r.end.Add(-r.duration); !at.Before(from) && at.Before(to) {
			out = append(out, r)
		}
	}
	return out, sc.Err()
}

// result sums rs as a loadgen.Result (counts by status, latency over the
// 200s) and their queue waits.
func (rs loggedRequests) result(rate float64, window time.Duration) (loadgen.Result, loadgen.Percentiles) {
	res := loadgen.Result{API: loadgen.APIOpenAI, Model: batchModel, Rate: rate, Requests: len(rs), Outcomes: map[string]int{}, Elapsed: window}
	var lat, wait []time.Duration
	for _, r := range rs {
		res.Outcomes[strconv.Itoa(r.status)]++
		wait = append(wait, r.wait)
		if r.status == http.StatusOK {
			res.OK++
			lat = append(lat, r.duration)
		}
	}
	res.Latency = percentilesOf(lat)
	return res, percentilesOf(wait)
}

// batchSlots is how many slots batch requests hold now.
func batchSlots(svc *edge.Service) int {
	n := 0
	for _, p := range svc.Snapshot().Providers {
		n += p.BatchInFlight
	}
	return n
}

// InProcessBatch runs batch lines through the edge's own dispatch
// (edge.Service.Dispatch) at contract.PriorityBatch: the scheduler path
// the batch runner takes, without the HTTP batch API.
type InProcessBatch struct {
	Service *edge.Service
}

var _ BatchDriver = (*InProcessBatch)(nil)

// Run submits lines requests at once, one goroutine each.
func (d *InProcessBatch) Run(ctx context.Context, model string, lines, maxTokens int, done func(error)) {
	var wg sync.WaitGroup
	for i := range lines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			done(d.line(ctx, model, i, 1+i%maxTokens))
		}()
	}
	wg.Wait()
}

// line runs batch line i to its end: nil when the provider answered 2xx.
func (d *InProcessBatch) line(ctx context.Context, model string, i, tokens int) error {
	body := fmt.Appendf(nil, `{"model":%q,"messages":[{"role":"user","content":"batch line %d"}],"max_tokens":%d}`, model, i, tokens)
	run, err := d.Service.Dispatch(ctx, contract.Request{Model: model, Operation: contract.OperationChat, Body: body,
		Priority: contract.PriorityBatch, Flow: "batch", Weight: 1, EstimatedInputTokens: 4})
	if err != nil {
		return err
	}
	status := 0
	for {
		m, err := run.Recv()
		if err != nil {
			run.Close(contract.OutcomeError)
			return err
		}
		if m.Tunnel && m.Part.Kind == contract.EventHead {
			status = m.Part.Status
		}
		if m.Tunnel && m.Part.Kind == contract.EventFailure {
			run.Close(contract.OutcomeUpstreamError)
			return fmt.Errorf("line %d: %s", i, m.Part.Message)
		}
		if m.Ends {
			break
		}
	}
	if status/100 != 2 {
		run.Close(contract.OutcomeUpstreamError)
		return fmt.Errorf("line %d: status %d", i, status)
	}
	run.Close(contract.OutcomeCompleted)
	return nil
}

// service is an interactive request's service time: the time to first
// token and 3 more tokens.
func (c BatchConfig) service() time.Duration {
	return c.TTFT + time.Duration(3/c.TokensPerSecond*float64(time.Second))
}

// phase returns the phase named name, or nil.
func (r BatchReport) phase(name string) *BatchPhase {
	for i := range r.Phases {
		if r.Phases[i].Name == name {
			return &r.Phases[i]
		}
	}
	return nil
}

// WriteTable writes the phases and the two targets, each met or missed:
// the interactive p99 latency with the batch within 1.1× of without it,
// and the batch using ≥ 85% of the slots the interactive load leaves idle
// (capacity − its mean in-flight, in the batch phase). It also gives the
// batch's use of the idle slots beyond the headroom, which is all the band
// may take by design.
func (r BatchReport) WriteTable(w io.Writer) {
	c := r.Config
	capacity := c.Providers * c.Capacity
	headroom := c.Headroom
	if headroom == 0 {
		headroom = 1
	}
	headroom = max(min(headroom, c.Capacity-1), 0)
	fmt.Fprintf(w, "batch band: %d providers × capacity %d, interactive service %s (%.0f req/s); interactive %.0f%% (%.1f req/s); batch %d lines of %s to %s; headroom %d per provider; %s a phase\n\n",
		c.Providers, c.Capacity, c.service().Round(time.Millisecond), float64(capacity)/c.service().Seconds(), c.Load*100, c.Load*float64(capacity)/c.service().Seconds(),
		c.Lines, c.TTFT, c.TTFT+time.Duration(float64(c.BatchMaxTokens-1)/c.TokensPerSecond*float64(time.Second)), headroom, c.Duration)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PHASE\tSENT\tOK\tNOT OK\tLATENCY p50/p99\tWAIT p50/p99\tIN FLIGHT\tBATCH IN FLIGHT\tBATCH LINES DONE\tBATCH FAILED\tBATCH LINES/s")
	for _, p := range r.Phases {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%s/%s\t%s/%s\t%.2f\t%.2f\t%d\t%d\t%.1f\n", p.Name, p.Interactive.Requests, p.Interactive.OK,
			p.Interactive.Requests-p.Interactive.OK, roundFair(p.Interactive.Latency.P50), roundFair(p.Interactive.Latency.P99),
			roundFair(p.Wait.P50), roundFair(p.Wait.P99),
			p.InFlight, p.BatchInFlight, p.BatchDone, p.BatchFailed, float64(p.BatchDone)/c.Duration.Seconds())
	}
	tw.Flush()
	alone, with := r.phase("interactive"), r.phase("batch")
	if alone == nil || with == nil {
		return
	}
	fmt.Fprintln(w)
	ratio := float64(with.Interactive.Latency.P99) / float64(max(alone.Interactive.Latency.P99, 1))
	fmt.Fprintf(w, "interactive p99 with the batch %s = %.2f× without (%s): target ≤ 1.1×: %s\n",
		roundFair(with.Interactive.Latency.P99), ratio, roundFair(alone.Interactive.Latency.P99), metOr(ratio <= 1.1))
	interactive := with.InFlight - with.BatchInFlight
	idle := float64(capacity) - interactive
	use := with.BatchInFlight / max(idle, 1e-9)
	fmt.Fprintf(w, "batch held %.2f slots of the %.2f the interactive load left idle (%d − %.2f): %.0f%%: target ≥ 85%%: %s\n",
		with.BatchInFlight, idle, capacity, interactive, 100*use, metOr(use >= 0.85))
	if usable := idle - float64(c.Providers*headroom); usable > 0 {
		fmt.Fprintf(w, "of the idle slots beyond the headroom (%.2f − %d × %d = %.2f), the batch held %.0f%%\n",
			idle, c.Providers, headroom, usable, 100*with.BatchInFlight/usable)
	}
	for _, p := range r.Phases {
		if p.Interactive.OK != p.Interactive.Requests {
			fmt.Fprintf(w, "phase %s: interactive outcomes %v\n", p.Name, p.Interactive.Outcomes)
		}
	}
}
