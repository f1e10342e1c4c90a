package benchrun

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"iop/internal/loadgen"
)

// Defaults applied to zero fields of Config.
const (
	DefaultDuration = 5 * time.Second
	DefaultWarmup   = time.Second
	DefaultWaiters  = 10000
	// DefaultTokens is the simulators' answer length in tokens: a streamed
	// answer is that many content chunks, the "20-chunk streamed request"
	// of the targets (non-streamed answers are the same 20 tokens in one body).
	DefaultTokens = 20
)

// Model names the benchmark's node serves, one per simulator.
const (
	modelTunnel     = "bench-openai" // sim --protocol openai: tunnel path
	modelNormalized = "bench-ollama" // sim --protocol ollama: normalized path
	modelHang       = "bench-hang"   // sim --hang, capacity 1: the memory phase
)

// providerCapacity is the capacity of the throughput providers: above every
// concurrency measured, so no request queues at the edge.
const providerCapacity = 256

// Config is one overhead benchmark.
type Config struct {
	// Binary is the iop executable to run as sim, edge and node. Required.
	Binary string
	// GatewayBinary, if set, is the iop executable run as edge and node
	// instead of Binary (e.g. another commit's build, for an A/B under the
	// same simulators and load); it needs the edge and node flags this
	// package passes (those of main at 605d215).
	GatewayBinary string
	// Duration is the length of each measured load run; default 5 s.
	Duration time.Duration
	// Warmup is the load run before each measured one (connections
	// established, caches and heaps grown); default 1 s.
	Warmup time.Duration
	// Concurrencies are the closed-loop concurrencies of the non-streamed
	// workloads; default 1 and 32 (the targets' "1 client" and "32 clients").
	Concurrencies []int
	// StreamConcurrencies are those of the streamed workloads; default 1
	// (added time to first token with 1 client) and 8 (the targets' "streamed
	// (20 chunks), 8 clients").
	StreamConcurrencies []int
	// Tokens is the length of every simulator answer in tokens (chunks,
	// when streamed); default DefaultTokens.
	Tokens int
	// Waiters is the number of queued requests of the memory phase; default
	// 10,000; negative skips the phase.
	Waiters int
	// ProfileDir, if set, receives CPU profiles of the edge and the node
	// (edge-<path>.pprof, node-<path>.pprof, with `go tool pprof -top`
	// summaries in .txt) taken during the highest-concurrency measured run
	// of non-streamed tunnel and streamed normalized requests, and the
	// edge's heap profile with the memory phase's requests queued
	// (edge-queued-heap.pprof; .txt with the runtime's memory statistics).
	ProfileDir string
	// MemoryOnly runs the memory phase and the Content-Length check only,
	// no load workload.
	MemoryOnly bool
	// GoBenchOutput, if set, is a file of `go test -bench` output (make
	// bench writes the scheduler's there) whose figures the report checks
	// against its targets: the scheduler's waiter bytes and
	// AdmitRelease. Overhead fails if it cannot be read.
	GoBenchOutput string
	// Log receives a line per step; nil discards them.
	Log io.Writer
}

// Cell is one workload measured directly against the simulator and through
// edge + node.
type Cell struct {
	// Path is "tunnel" (an OpenAI-protocol simulator, relayed byte for
	// byte) or "normalized" (an Ollama-protocol simulator, whose NDJSON the
	// node turns into run events the edge renders as OpenAI SSE/JSON).
	Path        string `json:"path"`
	Stream      bool   `json:"stream"`
	Concurrency int    `json:"concurrency"`
	// Direct is the run against the simulator (its own protocol), Through
	// the run against the edge (OpenAI chat completions).
	Direct  loadgen.Result `json:"direct"`
	Through loadgen.Result `json:"through"`
	// EdgeCPU and NodeCPU are the CPU time (user + system) the edge and the
	// node processes used during the Through run.
	EdgeCPU time.Duration `json:"edge_cpu_ns"`
	NodeCPU time.Duration `json:"node_cpu_ns"`
}

// AddedLatency is the through run's latency percentile minus the direct
// run's, for p50 and p99 (a difference of percentiles, not a percentile
// of differences).
func (c Cell) AddedLatency() (p50, p99 time.Duration) {
	return c.Through.Latency.P50 - c.Direct.Latency.P50, c.Through.Latency.P99 - c.Direct.Latency.P99
}

// AddedTTFT is the same for time to first token.
func (c Cell) AddedTTFT() (p50, p99 time.Duration) {
	return c.Through.TTFT.P50 - c.Direct.TTFT.P50, c.Through.TTFT.P99 - c.Direct.TTFT.P99
}

// ThroughputRatio is the through run's successful requests per second over
// the direct run's.
func (c Cell) ThroughputRatio() float64 {
	if c.Direct.OKPerSecond == 0 {
		return 0
	}
	return c.Through.OKPerSecond / c.Direct.OKPerSecond
}

// CPUPerRequest is the edge's and the node's CPU time per request of the
// through run.
func (c Cell) CPUPerRequest() (edge, node time.Duration) {
	if c.Through.Requests == 0 {
		return 0, 0
	}
	n := time.Duration(c.Through.Requests)
	return c.EdgeCPU / n, c.NodeCPU / n
}

// Memory is the edge's resident memory with queued requests.
type Memory struct {
	// Waiters is the number of requests queued behind one in flight.
	Waiters int `json:"waiters"`
	// IdleRSS is the edge's resident memory (bytes) before the requests,
	// QueuedRSS with all of them queued.
	IdleRSS   int64 `json:"idle_rss_bytes"`
	QueuedRSS int64 `json:"queued_rss_bytes"`
	// Idle and Queued are the edge runtime's own figures at the same two
	// moments, read after a forced GC (so the heap is what is live).
	Idle   RuntimeMem `json:"idle"`
	Queued RuntimeMem `json:"queued"`
}

// RuntimeMem is what the edge's Go runtime reports (runtime.MemStats, via
// /debug/pprof/heap?debug=1&gc=1, and the goroutine profile's total).
type RuntimeMem struct {
	// HeapAlloc is the bytes of live heap objects just after a GC.
	HeapAlloc int64 `json:"heap_alloc_bytes"`
	// StackInuse is the bytes of goroutine stacks.
	StackInuse int64 `json:"stack_inuse_bytes"`
	// Goroutines is the number of goroutines.
	Goroutines int `json:"goroutines"`
}

// PerWaiterRuntime is the growth of the live heap and of the goroutine
// stacks per queued request (bytes), and the goroutines each adds.
func (m Memory) PerWaiterRuntime() (heap, stack, goroutines float64) {
	if m.Waiters == 0 {
		return 0, 0, 0
	}
	n := float64(m.Waiters)
	return float64(m.Queued.HeapAlloc-m.Idle.HeapAlloc) / n, float64(m.Queued.StackInuse-m.Idle.StackInuse) / n,
		float64(m.Queued.Goroutines-m.Idle.Goroutines) / n
}

// PerWaiter is the growth of the edge's resident memory per queued request,
// in bytes: everything the edge holds for it (connection, goroutine, parsed
// request, scheduler waiter).
func (m Memory) PerWaiter() float64 {
	if m.Waiters == 0 {
		return 0
	}
	return float64(m.QueuedRSS-m.IdleRSS) / float64(m.Waiters)
}

// Report is what Overhead measured.
type Report struct {
	Cells  []Cell  `json:"cells"`
	Memory *Memory `json:"memory,omitempty"`
	// ContentLength is the check of one non-streamed tunnel answer's
	// Content-Length, direct and through edge + node.
	ContentLength *ContentLength `json:"content_length,omitempty"`
	// GoBench holds the figures read from `go test -bench` output
	// (Config's GoBenchOutput; make bench passes the scheduler's).
	GoBench  []GoBenchmark `json:"go_bench,omitempty"`
	Profiles []string      `json:"profiles,omitempty"`
}

// ContentLength is what one non-streamed tunnel answer carried: the
// provider's Content-Length (direct) and the edge's (through); -1 when the
// answer had none (chunked).
type ContentLength struct {
	Direct  int64 `json:"direct"`
	Through int64 `json:"through"`
	// ThroughBody is the length of the body received through the edge.
	ThroughBody int `json:"through_body_bytes"`
}

// Kept reports whether the through answer kept a Content-Length, equal to
// its body (the provider's answer had one: the simulator's small JSON
// answers do, net/http sets it).
func (c ContentLength) Kept() bool {
	return c.Direct >= 0 && c.Through >= 0 && c.Through == int64(c.ThroughBody)
}

// setup is the running processes of a benchmark.
type setup struct {
	cfg                  Config
	dir                  string
	procs                []*process
	edge, node           *process
	edgeURL, edgePprof   string
	nodePprof            string
	simTunnel, simOllama string // base URLs
}

// Overhead starts two zero-latency simulators (OpenAI and Ollama
// protocols; plus a hanging one for the memory phase), an edge and a node
// as separate processes of cfg.Binary on loopback ports, and measures the
// same closed-loop load directly against each simulator and through the
// edge, for non-streamed and streamed requests at each concurrency; then
// the edge's memory with cfg.Waiters queued requests. The processes are
// stopped before it returns. Errors: a process that fails to start or
// exits, a setup step that times out, ctx's end.
func Overhead(ctx context.Context, cfg Config) (Report, error) {
	if cfg.Duration == 0 {
		cfg.Duration = DefaultDuration
	}
	if cfg.Warmup == 0 {
		cfg.Warmup = DefaultWarmup
	}
	if len(cfg.Concurrencies) == 0 {
		cfg.Concurrencies = []int{1, 32}
	}
	if len(cfg.StreamConcurrencies) == 0 {
		cfg.StreamConcurrencies = []int{1, 8}
	}
	if cfg.Tokens == 0 {
		cfg.Tokens = DefaultTokens
	}
	if cfg.Waiters == 0 {
		cfg.Waiters = DefaultWaiters
	}
	if cfg.Log == nil {
		cfg.Log = io.Discard
	}
	var rep Report
	if cfg.GoBenchOutput != "" {
		f, err := os.Open(cfg.GoBenchOutput)
		if err != nil {
			return rep, err
		}
		rep.GoBench, err = ParseGoBench(f)
		f.Close()
		if err != nil {
			return rep, fmt.Errorf("%s: %w", cfg.GoBenchOutput, err)
		}
	}
	dir, err := os.MkdirTemp("", "iop-bench-")
	if err != nil {
		return rep, err
	}
	s := &setup{cfg: cfg, dir: dir}
	defer func() {
		for i := len(s.procs) - 1; i >= 0; i-- {
			s.procs[i].stop()
		}
	}()
	if err := s.start(ctx); err != nil {
		return rep, fmt.Errorf("%w (logs in %s)", err, dir)
	}

	if cfg.Waiters > 0 {
		m, err := s.memory(ctx)
		if err != nil {
			return rep, fmt.Errorf("memory phase: %w (logs in %s)", err, dir)
		}
		rep.Memory = &m
	}
	cl, err := s.contentLength(ctx)
	if err != nil {
		return rep, fmt.Errorf("content length check: %w (logs in %s)", err, dir)
	}
	rep.ContentLength = &cl
	for _, path := range paths {
		if cfg.MemoryOnly {
			break
		}
		for _, stream := range []bool{false, true} {
			concs := cfg.Concurrencies
			if stream {
				concs = cfg.StreamConcurrencies
			}
			for _, conc := range concs {
				profile := ""
				if cfg.ProfileDir != "" && conc == slices.Max(concs) && (path == "tunnel") != stream {
					profile = path
					if stream {
						profile += "-stream"
					}
				}
				c, files, err := s.cell(ctx, path, stream, conc, profile)
				if err != nil {
					return rep, fmt.Errorf("%s stream=%v concurrency %d: %w (logs in %s)", path, stream, conc, err, dir)
				}
				rep.Cells = append(rep.Cells, c)
				rep.Profiles = append(rep.Profiles, files...)
			}
		}
	}
	os.RemoveAll(dir)
	return rep, nil
}

// gatewayBinary is the executable of the edge and the node.
func (s *setup) gatewayBinary() string {
	if s.cfg.GatewayBinary != "" {
		return s.cfg.GatewayBinary
	}
	return s.cfg.Binary
}

// paths are the execution paths measured, in order.
var paths = []string{"tunnel", "normalized"}

// start runs the simulators, the edge and the node, and waits until the
// edge lists every model.
func (s *setup) start(ctx context.Context) error {
	addrs := make([]string, 7)
	for i := range addrs {
		a, err := freeAddr()
		if err != nil {
			return err
		}
		addrs[i] = a
	}
	simTunnel, simOllama, simHang, edgeHTTP, edgeNode, edgePprof, nodePprof := addrs[0], addrs[1], addrs[2], addrs[3], addrs[4], addrs[5], addrs[6]
	s.simTunnel, s.simOllama = "http://"+simTunnel, "http://"+simOllama
	s.edgeURL, s.edgePprof, s.nodePprof = "http://"+edgeHTTP, "http://"+edgePprof, "http://"+nodePprof

	run := func(name string, args ...string) (*process, error) {
		bin := s.cfg.Binary
		if args[0] != "sim" {
			bin = s.gatewayBinary()
		}
		p, err := startProcess(s.dir, name, bin, append(args, "--log-level", "warn")...)
		if err == nil {
			s.procs = append(s.procs, p)
		}
		return p, err
	}
	// Zero latency: --ttft and --tokens-per-second default to 0 (none,
	// unlimited); every answer is cfg.Tokens tokens.
	tokens := strconv.Itoa(s.cfg.Tokens)
	if _, err := run("sim-openai", "sim", "--protocol", "openai", "--listen", simTunnel, "--model", modelTunnel, "--default-max-tokens", tokens); err != nil {
		return err
	}
	if _, err := run("sim-ollama", "sim", "--protocol", "ollama", "--listen", simOllama, "--model", modelNormalized, "--default-max-tokens", tokens); err != nil {
		return err
	}
	if _, err := run("sim-hang", "sim", "--protocol", "openai", "--listen", simHang, "--model", modelHang, "--hang"); err != nil {
		return err
	}
	var err error
	s.edge, err = run("edge", "edge", "--listen", edgeHTTP, "--node-listen", edgeNode, "--pprof-listen", edgePprof,
		"--max-queue", strconv.Itoa(max(s.cfg.Waiters, 0)+16), "--queue-timeout", "10m")
	if err != nil {
		return err
	}
	nodeCfg := fmt.Sprintf(`node_id: bench
edge: %s
providers:
  - {id: sim-openai, type: sim, protocol: openai, base_url: "http://%s/v1", models: [%s], capacity: %d}
  - {id: sim-ollama, type: sim, protocol: ollama, base_url: "http://%s", models: [%s], capacity: %d}
  - {id: sim-hang, type: sim, protocol: openai, base_url: "http://%s/v1", models: [%s], capacity: 1}
`, edgeNode, simTunnel, modelTunnel, providerCapacity, simOllama, modelNormalized, providerCapacity, simHang, modelHang)
	nodeFile := filepath.Join(s.dir, "node.yaml")
	if err := os.WriteFile(nodeFile, []byte(nodeCfg), 0o600); err != nil {
		return err
	}
	if s.node, err = run("node", "node", "--config", nodeFile, "--pprof-listen", nodePprof); err != nil {
		return err
	}
	fmt.Fprintf(s.cfg.Log, "started sims, edge (%s) and node; logs in %s\n", s.edgeURL, s.dir)
	return waitFor(ctx, 30*time.Second, s.procs, func() error {
		b, err := get(ctx, s.edgeURL+"/v1/models")
		if err != nil {
			return err
		}
		var list struct {
			Data []struct {
				ID string `json:"id"`
			} `json:"data"`
		}
		if err := json.Unmarshal(b, &list); err != nil {
			return err
		}
		if len(list.Data) < 3 {
			return fmt.Errorf("edge lists %d models, want 3", len(list.Data))
		}
		return nil
	})
}

// contentLength sends one non-streamed chat completion to the OpenAI
// simulator and the same through the edge, and returns their
// Content-Length headers.
func (s *setup) contentLength(ctx context.Context) (ContentLength, error) {
	one := func(base, model string) (int64, int, error) {
		body := `{"model":"` + model + `","messages":[{"role":"user","content":"hello"}]}`
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body))
		if err != nil {
			return 0, 0, err
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, 0, err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err == nil && resp.StatusCode != http.StatusOK {
			err = fmt.Errorf("POST %s: %s: %s", base, resp.Status, b)
		}
		// net/http's client sets ContentLength to -1 for a chunked answer.
		return resp.ContentLength, len(b), err
	}
	var c ContentLength
	var err error
	if c.Direct, _, err = one(s.simTunnel, modelTunnel); err != nil {
		return c, err
	}
	if c.Through, c.ThroughBody, err = one(s.edgeURL, modelTunnel); err != nil {
		return c, err
	}
	fmt.Fprintf(s.cfg.Log, "content length: direct %d, through %d (body %d bytes)\n", c.Direct, c.Through, c.ThroughBody)
	return c, nil
}

// load runs one closed-loop load; a run with failed requests is an error.
func (s *setup) load(ctx context.Context, cfg loadgen.Config) (loadgen.Result, error) {
	res, err := loadgen.Run(ctx, cfg, nil)
	if err != nil {
		return res, err
	}
	if res.OK != res.Requests || res.Requests == 0 {
		return res, fmt.Errorf("%s %s: %d of %d requests failed: outcomes %v, errors %v", cfg.URL, cfg.Model, res.Requests-res.OK, res.Requests, res.Outcomes, res.Errors)
	}
	return res, nil
}

// cell measures one workload directly and through the edge; with profile
// set it takes CPU profiles of the edge and the node during the latter.
func (s *setup) cell(ctx context.Context, path string, stream bool, conc int, profile string) (Cell, []string, error) {
	c := Cell{Path: path, Stream: stream, Concurrency: conc}
	direct := loadgen.Config{URL: s.simTunnel, API: loadgen.APIOpenAI, Model: modelTunnel, Stream: stream, Concurrency: conc}
	through := loadgen.Config{URL: s.edgeURL, API: loadgen.APIOpenAI, Model: modelTunnel, Stream: stream, Concurrency: conc}
	if path == "normalized" {
		direct.URL, direct.API, direct.Model = s.simOllama, loadgen.APIOllama, modelNormalized
		through.Model = modelNormalized
	}
	direct.Client, through.Client = loadgen.NewClient(conc), loadgen.NewClient(conc)
	defer direct.Client.CloseIdleConnections()
	defer through.Client.CloseIdleConnections()

	measure := func(lc loadgen.Config, during func()) (loadgen.Result, error) {
		lc.Duration = s.cfg.Warmup
		if _, err := s.load(ctx, lc); err != nil {
			return loadgen.Result{}, fmt.Errorf("warm-up: %w", err)
		}
		if during != nil {
			during()
		}
		lc.Duration = s.cfg.Duration
		return s.load(ctx, lc)
	}
	var err error
	if c.Direct, err = measure(direct, nil); err != nil {
		return c, nil, err
	}

	var edge0, node0 time.Duration
	var profiles chan []string
	c.Through, err = measure(through, func() {
		if profile != "" {
			profiles = make(chan []string, 1)
			go func() { profiles <- s.profile(ctx, profile) }()
		}
		edge0, _ = s.edge.cpuTime()
		node0, _ = s.node.cpuTime()
	})
	if err != nil {
		return c, nil, err
	}
	edge1, err1 := s.edge.cpuTime()
	node1, err2 := s.node.cpuTime()
	if err := errors.Join(err1, err2); err != nil {
		return c, nil, err
	}
	c.EdgeCPU, c.NodeCPU = edge1-edge0, node1-node0
	var files []string
	if profiles != nil {
		files = <-profiles
	}
	e50, e99 := c.AddedLatency()
	fmt.Fprintf(s.cfg.Log, "%-10s stream=%-5v c=%-3d direct %8.0f/s through %8.0f/s, added p50 %v p99 %v\n",
		path, stream, conc, c.Direct.OKPerSecond, c.Through.OKPerSecond, e50, e99)
	return c, files, nil
}

// profile takes a CPU profile of the edge and of the node at once, lasting
// most of a measured run, writes them and their `go tool pprof -top`
// summaries to ProfileDir, and returns the files written (a failure is
// logged, not returned: profiles are an extra).
func (s *setup) profile(ctx context.Context, name string) []string {
	secs := max(int(s.cfg.Duration/time.Second)-1, 1)
	type fetched struct {
		who  string
		data []byte
	}
	ch := make(chan fetched, 2)
	for _, p := range []struct{ who, url string }{{"edge", s.edgePprof}, {"node", s.nodePprof}} {
		go func() {
			b, err := get(ctx, fmt.Sprintf("%s/debug/pprof/profile?seconds=%d", p.url, secs))
			if err != nil {
				fmt.Fprintf(s.cfg.Log, "profile of the %s: %v\n", p.who, err)
			}
			ch <- fetched{p.who, b}
		}()
	}
	var files []string
	for range 2 {
		f := <-ch
		if f.data == nil {
			continue
		}
		file := filepath.Join(s.cfg.ProfileDir, f.who+"-"+name+".pprof")
		if err := os.WriteFile(file, f.data, 0o644); err != nil {
			fmt.Fprintf(s.cfg.Log, "profile: %v\n", err)
			continue
		}
		files = append(files, file)
		top, err := exec.CommandContext(ctx, "go", "tool", "pprof", "-top", "-nodecount=30", s.gatewayBinary(), file).Output()
		if err != nil {
			fmt.Fprintf(s.cfg.Log, "go tool pprof -top %s: %v\n", file, err)
			continue
		}
		txt := strings.TrimSuffix(file, ".pprof") + ".txt"
		if os.WriteFile(txt, top, 0o644) == nil {
			files = append(files, txt)
		}
	}
	return files
}
