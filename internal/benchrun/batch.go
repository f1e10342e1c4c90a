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
	"text/tabwriter"
	"time"

	"iop/internal/edge"
	"iop/internal/loadgen"
	iopprocess "iop/internal/process"
)

// BatchConfig is the batch-band benchmark (`iop bench --batch`): an
// interactive load at Load × the fleet's capacity on simulators, alone
// and beside a batch of Lines requests run by the edge's batch runner
// (uploaded with POST /v1/files, created with POST /v1/batches). Zero
// fields take the defaults in brackets.
type BatchConfig struct {
	// Binary is the iop executable the simulators and the node run from
	// (the edge runs in this process, so its scheduler can be sampled).
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
	// Lines is the batch's size [10000]. The batch always runs to its
	// end: after the window the interactive load stops and the rest of
	// the lines run on the whole fleet.
	Lines int
	// Headroom is the edge's queue.batch.headroom [0: the edge's default,
	// 1]; negative: none.
	Headroom int
	// Backoff is the edge's queue.batch.backoff [0: the edge's default,
	// 5s]; negative: none.
	Backoff time.Duration
	// Duration is the longest interactive window of a phase [60s]; in the
	// batch phase the window also ends when the batch leaves in_progress.
	Duration time.Duration
	// Log gets progress lines; nil means none.
	Log io.Writer
}

// BatchPhase is one phase's figures, over its interactive window.
type BatchPhase struct {
	// Name is "interactive" (the interactive load alone) or "batch" (with
	// the batch running).
	Name string `json:"name"`
	// Window is the window's length: Duration, or less when the batch
	// left in_progress first.
	Window time.Duration `json:"window_ns"`
	// Interactive is the interactive requests that arrived in the window,
	// as the edge's request log shows them (status, duration); Wait their
	// queue waits (queue_wait).
	Interactive loadgen.Result      `json:"interactive"`
	Wait        loadgen.Percentiles `json:"wait"`
	// BatchDone and BatchFailed count the batch lines that ended in the
	// window (the edge's request log, priority batch), answered 200 or
	// not.
	BatchDone   int `json:"batch_done"`
	BatchFailed int `json:"batch_failed"`
	// Slots and BatchSlots are the slots held, by every request and by
	// batch lines, averaged over the window: from the edge's request log,
	// each request holding its slot from its arrival plus its queue_wait
	// to its end. The targets are computed from these.
	Slots      float64 `json:"slots"`
	BatchSlots float64 `json:"batch_slots"`
	// InFlight and BatchInFlight are the same, sampled from the edge's
	// provider snapshots every 50 ms: a cross-check.
	InFlight      float64 `json:"in_flight"`
	BatchInFlight float64 `json:"batch_in_flight"`
	// Batch is the batch's own account, nil in the interactive phase.
	Batch *BatchRun `json:"batch,omitempty"`
}

// BatchRun is the batch as the batch API reported it at its end, and
// what its result files held.
type BatchRun struct {
	ID     string `json:"id"`
	Status string `json:"status"`
	// Total, Completed and Failed are its request_counts.
	Total     int `json:"total"`
	Completed int `json:"completed"`
	Failed    int `json:"failed"`
	// CreatedAt, InProgressAt and CompletedAt are its timestamps, Unix
	// seconds.
	CreatedAt    int64 `json:"created_at"`
	InProgressAt int64 `json:"in_progress_at"`
	CompletedAt  int64 `json:"completed_at"`
	// Output is the check of its result files.
	Output BatchOutput `json:"output"`
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
}

// Batch runs the batch-band benchmark: it starts cfg.Providers iop sim
// processes, an edge in this process and an iop node process, runs the
// interactive open-loop load (loadgen) alone, then again with the batch
// submitted through the edge's batch API, and stops them. Errors: a
// process that fails to start or exits, a setup step that times out, a
// batch API call that fails, ctx's end.
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
		// The node must not reach a simulator before it listens: its
		// provider's breaker would open, and the warm-up fail.
		if err := waitListening(ctx, addr, 30*time.Second, procs); err != nil {
			return rep, fmt.Errorf("sim%d: %w (logs in %s)", i, err, dir)
		}
		provs = append(provs, fmt.Sprintf(`  - {id: sim%d, type: sim, protocol: openai, base_url: "http://%s/v1", models: [%s], capacity: %d}`,
			i, addr, batchModel, cfg.Capacity))
	}

	ecfg := iopprocess.DefaultEdgeFile()
	ecfg.Listen, ecfg.NodeListen, ecfg.Database = "127.0.0.1:0", "127.0.0.1:0", ":memory:"
	ecfg.Queue.MaxQueue = 1024
	ecfg.Queue.QueueTimeout = 30 * time.Second
	ecfg.Queue.Batch = edge.BatchQueueConfig{Headroom: cfg.Headroom, Backoff: cfg.Backoff}
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
			if p.Capacity == cfg.Capacity && p.Healthy && p.Circuit != "open" {
				ready++
			}
		}
		if ready < cfg.Providers {
			return fmt.Errorf("%d of %d providers advertised, healthy and in rotation", ready, cfg.Providers)
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
		ph, err := batchPhase(ctx, cfg, svc, url, edgeLog.Name(), name)
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
// schedule) starts first and runs for batchWarmUp. In the "batch" phase
// the batch is then uploaded and created, and the phase waits until its
// lines fill the room the headroom leaves (at most 2 min) or it left
// in_progress. Then the window opens for cfg.Duration, or until the
// batch leaves in_progress: the slots held are sampled, and the requests
// of the edge's request log give the phase's figures. The load goes on
// until the window's requests ended, then stops; the batch runs to its
// end, and its result files are downloaded and checked. The phase ends
// when every slot is free again.
func batchPhase(ctx context.Context, cfg BatchConfig, svc *edge.Service, url, logPath, name string) (BatchPhase, error) {
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

	var job *batchJob
	running := func() (bool, error) { return true, nil }
	if name == "batch" {
		job = &batchJob{url: url}
		if err := job.submit(ctx, batchInput(batchModel, cfg.Lines, cfg.BatchMaxTokens)); err != nil {
			return out, err
		}
		fmt.Fprintf(cfg.Log, "phase %s: batch %s of %d lines created\n", name, job.id, cfg.Lines)
		var polled time.Time
		var still bool
		running = func() (bool, error) {
			if time.Since(polled) < 500*time.Millisecond {
				return still, nil
			}
			b, err := job.get(ctx)
			if err != nil {
				return false, err
			}
			polled, still = time.Now(), b.Status == "validating" || b.Status == "in_progress"
			return still, nil
		}
		headroom := cfg.Headroom
		if headroom == 0 {
			headroom = 1
		}
		room := cfg.Providers * max(min(headroom, cfg.Capacity-1), 0)
		// The room filled before the window opens: the batch's start is
		// not what the window measures.
		for deadline := time.Now().Add(2 * time.Minute); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			held := 0
			for _, p := range svc.Snapshot().Providers {
				held += p.InFlight
			}
			if held+room >= capacity {
				break
			}
			if on, err := running(); err != nil || !on {
				break
			}
		}
		fmt.Fprintf(cfg.Log, "phase %s: %d batch lines running\n", name, batchSlots(svc))
	}
	fmt.Fprintf(cfg.Log, "phase %s: window of at most %s\n", name, cfg.Duration)
	var samples int
	var inFlight, batchInFlight float64
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
		on, err := running()
		if err != nil {
			tick.Stop()
			return out, err
		}
		if !on {
			break
		}
	}
	tick.Stop()
	closed := time.Now()
	// The requests of the window end before the load stops.
	if err := sleepCtx(ctx, 2*cfg.service()+5*time.Second); err != nil {
		return out, err
	}
	stopLoad()
	if err := <-loadDone; err != nil {
		return out, err
	}
	if job != nil {
		run, err := finishBatch(ctx, cfg, job)
		if err != nil {
			return out, err
		}
		out.Batch = &run
	}
	reqs, err := requestsIn(logPath)
	if err != nil {
		return out, err
	}
	out.Window = closed.Sub(open)
	out.Interactive, out.Wait = reqs.interactive(open, closed).result(rate, out.Window)
	out.Slots, out.BatchSlots = reqs.slots(open, closed)
	out.BatchDone, out.BatchFailed = reqs.batchEnded(open, closed)
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

// finishBatch polls job until its batch ended (a progress line every
// 10 s), then downloads its result files and checks them against the
// input's cfg.Lines custom_ids. Past a bound of twice the time its lines
// take on the whole fleet plus 2 min it cancels the batch and fails.
func finishBatch(ctx context.Context, cfg BatchConfig, job *batchJob) (BatchRun, error) {
	longest := cfg.TTFT + time.Duration(float64(cfg.BatchMaxTokens-1)/cfg.TokensPerSecond*float64(time.Second))
	bound := 2*time.Duration(cfg.Lines/(cfg.Providers*cfg.Capacity)+1)*longest + 2*time.Minute
	var b batchObject
	var err error
	for start, said := time.Now(), time.Now(); ; {
		if b, err = job.get(ctx); err != nil {
			return BatchRun{}, err
		}
		if terminal(b.Status) {
			break
		}
		if time.Since(start) > bound {
			_ = job.cancel(context.WithoutCancel(ctx))
			return BatchRun{}, fmt.Errorf("batch %s not done %s after the window: %d of %d lines", job.id, bound, b.RequestCounts.Completed+b.RequestCounts.Failed, b.RequestCounts.Total)
		}
		if time.Since(said) >= 10*time.Second {
			said = time.Now()
			fmt.Fprintf(cfg.Log, "batch %s: %s, %d done, %d failed of %d\n", job.id, b.Status, b.RequestCounts.Completed, b.RequestCounts.Failed, b.RequestCounts.Total)
		}
		if err := sleepCtx(ctx, 500*time.Millisecond); err != nil {
			_ = job.cancel(context.WithoutCancel(ctx))
			return BatchRun{}, err
		}
	}
	run := BatchRun{ID: b.ID, Status: b.Status, Total: b.RequestCounts.Total, Completed: b.RequestCounts.Completed, Failed: b.RequestCounts.Failed,
		CreatedAt: b.CreatedAt, InProgressAt: b.InProgressAt, CompletedAt: b.CompletedAt}
	if run.Output, err = job.checkOutput(ctx, b, cfg.Lines); err != nil {
		return run, err
	}
	fmt.Fprintf(cfg.Log, "batch %s: %s; output %d result lines, %d missing, %d duplicated\n", b.ID, b.Status, run.Output.Lines, run.Output.Missing, run.Output.Duplicated)
	return run, nil
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
	batch    bool // priority batch: a line of the batch runner
}

// arrived is when the request reached the edge.
func (r loggedRequest) arrived() time.Time { return r.end.Add(-r.duration) }

// loggedRequests are requests of the edge's log.
type loggedRequests []loggedRequest

// requestsIn reads the edge's JSON log at path and returns its requests.
func requestsIn(path string) (loggedRequests, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return readRequests(f)
}

// readRequests parses the "request" lines of an edge's JSON log.
func readRequests(r io.Reader) (loggedRequests, error) {
	var out loggedRequests
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var line struct {
			Time      time.Time `json:"time"`
			Msg       string    `json:"msg"`
			Status    int       `json:"status"`
			Duration  int64     `json:"duration"`   // nanoseconds (slog's JSON of a Duration)
			QueueWait int64     `json:"queue_wait"` // nanoseconds
			Priority  string    `json:"priority"`
		}
		if json.Unmarshal(sc.Bytes(), &line) != nil || line.Msg != "request" {
			continue
		}
		out = append(out, loggedRequest{end: line.Time, duration: time.Duration(line.Duration), wait: time.Duration(line.QueueWait),
			status: line.Status, batch: line.Priority == "batch"})
	}
	return out, sc.Err()
}

// interactive returns the requests other than batch lines that arrived in
// [from, to).
func (rs loggedRequests) interactive(from, to time.Time) loggedRequests {
	var out loggedRequests
	for _, r := range rs {
		if at := r.arrived(); !r.batch && !at.Before(from) && at.Before(to) {
			out = append(out, r)
		}
	}
	return out
}

// slots returns the slots held on average over [from, to), by every
// request and by batch lines: each request holds one from its arrival
// plus its queue wait to its end.
func (rs loggedRequests) slots(from, to time.Time) (all, batch float64) {
	window := to.Sub(from).Seconds()
	if window <= 0 {
		return 0, 0
	}
	for _, r := range rs {
		start, end := r.arrived().Add(r.wait), r.end
		if start.Before(from) {
			start = from
		}
		if end.After(to) {
			end = to
		}
		if held := end.Sub(start).Seconds(); held > 0 {
			all += held
			if r.batch {
				batch += held
			}
		}
	}
	return all / window, batch / window
}

// batchEnded counts the batch lines that ended in [from, to), answered
// 200 or not.
func (rs loggedRequests) batchEnded(from, to time.Time) (done, failed int) {
	for _, r := range rs {
		if !r.batch || r.end.Before(from) || !r.end.Before(to) {
			continue
		}
		if r.status == http.StatusOK {
			done++
		} else {
			failed++
		}
	}
	return done, failed
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
// (capacity − the interactive requests' mean slots, in the batch phase;
// both from the edge's request log). It also gives the batch's use of the
// idle slots beyond the headroom, which is all the band may take by
// design, and the batch's own account: its status, counts, timestamps and
// the check of its result files.
func (r BatchReport) WriteTable(w io.Writer) {
	c := r.Config
	capacity := c.Providers * c.Capacity
	headroom := c.Headroom
	if headroom == 0 {
		headroom = 1
	}
	headroom = max(min(headroom, c.Capacity-1), 0)
	fmt.Fprintf(w, "batch band: %d providers × capacity %d, interactive service %s (%.0f req/s); interactive %.0f%% (%.1f req/s); batch %d lines of %s to %s through POST /v1/files and /v1/batches; headroom %d per provider; windows of at most %s\n\n",
		c.Providers, c.Capacity, c.service().Round(time.Millisecond), float64(capacity)/c.service().Seconds(), c.Load*100, c.Load*float64(capacity)/c.service().Seconds(),
		c.Lines, c.TTFT, c.TTFT+time.Duration(float64(c.BatchMaxTokens-1)/c.TokensPerSecond*float64(time.Second)), headroom, c.Duration)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PHASE\tWINDOW\tSENT\tOK\tNOT OK\tLATENCY p50/p99\tWAIT p50/p99\tSLOTS\tBATCH SLOTS\tSAMPLED\tBATCH LINES DONE\tBATCH FAILED\tBATCH LINES/s")
	for _, p := range r.Phases {
		perSecond := 0.0
		if p.Window > 0 {
			perSecond = float64(p.BatchDone) / p.Window.Seconds()
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%s/%s\t%s/%s\t%.2f\t%.2f\t%.2f/%.2f\t%d\t%d\t%.1f\n", p.Name, p.Window.Round(100*time.Millisecond),
			p.Interactive.Requests, p.Interactive.OK, p.Interactive.Requests-p.Interactive.OK,
			roundFair(p.Interactive.Latency.P50), roundFair(p.Interactive.Latency.P99), roundFair(p.Wait.P50), roundFair(p.Wait.P99),
			p.Slots, p.BatchSlots, p.InFlight, p.BatchInFlight, p.BatchDone, p.BatchFailed, perSecond)
	}
	tw.Flush()
	fmt.Fprintln(w, "(SLOTS, BATCH SLOTS: mean slots held, from the edge's request log; SAMPLED: the same from its provider snapshots every 50 ms)")
	alone, with := r.phase("interactive"), r.phase("batch")
	if alone == nil || with == nil {
		return
	}
	fmt.Fprintln(w)
	ratio := float64(with.Interactive.Latency.P99) / float64(max(alone.Interactive.Latency.P99, 1))
	fmt.Fprintf(w, "interactive p99 with the batch %s = %.2f× without (%s): target ≤ 1.1×: %s\n",
		roundFair(with.Interactive.Latency.P99), ratio, roundFair(alone.Interactive.Latency.P99), metOr(ratio <= 1.1))
	interactive := with.Slots - with.BatchSlots
	idle := float64(capacity) - interactive
	use := with.BatchSlots / max(idle, 1e-9)
	fmt.Fprintf(w, "batch held %.2f slots of the %.2f the interactive load left idle (%d − %.2f): %.0f%%: target ≥ 85%%: %s\n",
		with.BatchSlots, idle, capacity, interactive, 100*use, metOr(use >= 0.85))
	if usable := idle - float64(c.Providers*headroom); usable > 0 {
		fmt.Fprintf(w, "of the idle slots beyond the headroom (%.2f − %d × %d = %.2f), the batch held %.0f%%\n",
			idle, c.Providers, headroom, usable, 100*with.BatchSlots/usable)
	}
	if b := with.Batch; b != nil {
		fmt.Fprintf(w, "batch %s: %s, %d completed, %d failed of %d", b.ID, b.Status, b.Completed, b.Failed, b.Total)
		if b.InProgressAt > 0 && b.CompletedAt >= b.InProgressAt {
			secs := b.CompletedAt - b.InProgressAt
			fmt.Fprintf(w, "; in progress %d s (its own timestamps; the interactive load stopped after the window)", secs)
		}
		o := b.Output
		fmt.Fprintf(w, "\nbatch output: %d result lines (%d answered 200), %d error lines, %d custom_ids missing, %d duplicated: %s\n",
			o.Lines, o.OK, o.Errors, o.Missing, o.Duplicated, okOr(o.Complete(c.Lines), "each of the %d lines once", c.Lines))
	}
	for _, p := range r.Phases {
		if p.Interactive.OK != p.Interactive.Requests {
			fmt.Fprintf(w, "phase %s: interactive outcomes %v\n", p.Name, p.Interactive.Outcomes)
		}
	}
}

// okOr is "ok: " and the claim when ok, else "NOT " and it.
func okOr(ok bool, format string, args ...any) string {
	if ok {
		return "ok: " + fmt.Sprintf(format, args...)
	}
	return "NOT " + fmt.Sprintf(format, args...)
}
