package benchrun

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"iop/internal/auth"
	"iop/internal/loadgen"
)

// ResidencyConfig is the model-residency benchmark: clients
// alternating between Models models over Providers simulated Ollama
// servers that hold MaxLoaded models each and take LoadTime to load one,
// the same trace with residency-aware routing and with least-loaded
// routing. Zero fields take the defaults in brackets.
type ResidencyConfig struct {
	// Binary is the iop executable the simulators, edge and node run from.
	Binary string
	// Models [3], Providers [2], MaxLoaded [1] models held per provider,
	// Capacity [2] concurrent requests per provider.
	Models, Providers, MaxLoaded, Capacity int
	// LoadTime is a model load [2s]; Service a request's time at a
	// provider holding its model [250ms] (the simulator's TTFT).
	LoadTime, Service time.Duration
	// Rate is the trace's arrivals per second [2]; Duration its length
	// [60s]; Seed makes it [1].
	Rate     float64
	Duration time.Duration
	Seed     uint64
	// MaxExtraWait is the residency policy's bound [10s].
	MaxExtraWait time.Duration
	// Warmup is the start of the trace left out of the steady-state
	// latency [10s]: every model's first load falls in it.
	Warmup time.Duration
	// Log gets progress lines; nil means none.
	Log io.Writer
	// Ollamas, when set, are the providers instead of simulators: the
	// base URLs of Ollama servers already serving models m1..mModels
	// (Providers is their number), not started or stopped here. Loads
	// then come from CountLoads (the servers' loads so far, summed), and
	// over capacity is not measured (an Ollama queues what it cannot run).
	Ollamas    []string
	CountLoads func() int64
}

func (c *ResidencyConfig) setDefaults() {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&c.Models, 3)
	if len(c.Ollamas) > 0 {
		c.Providers = len(c.Ollamas)
	}
	def(&c.Providers, 2)
	def(&c.MaxLoaded, 1)
	def(&c.Capacity, 2)
	if c.LoadTime == 0 {
		c.LoadTime = 2 * time.Second
	}
	if c.Service == 0 {
		c.Service = 250 * time.Millisecond
	}
	if c.Rate == 0 {
		c.Rate = 2
	}
	if c.Duration == 0 {
		c.Duration = 60 * time.Second
	}
	if c.Seed == 0 {
		c.Seed = 1
	}
	if c.MaxExtraWait == 0 {
		c.MaxExtraWait = 10 * time.Second
	}
	if c.Warmup == 0 {
		c.Warmup = 10 * time.Second
	}
	if c.Log == nil {
		c.Log = io.Discard
	}
}

// ResidencyPhase is one policy's figures over the trace.
type ResidencyPhase struct {
	// Name is "residency" (residency-aware) or "least_loaded".
	Name string `json:"name"`
	// Latency is each request's time from send to its whole answer;
	// Steady that of the requests sent after the warm-up.
	Latency loadgen.Percentiles `json:"latency"`
	Steady  loadgen.Percentiles `json:"steady"`
	// QueueWait is the edge's queue wait of each admitted request: the
	// longest is the most any request was passed over or held back.
	QueueWait loadgen.Percentiles `json:"queue_wait"`
	// Requests sent, OK answered 200, Failed otherwise.
	Requests, OK, Failed int `json:"-"`
	// Loads and Evictions are the simulators' (GET /stats), summed.
	Loads, Evictions int64
	// OverCapacity counts requests a simulator refused at its capacity
	// (429) plus any in-flight peak above it: 0 when iop kept capacity.
	OverCapacity int64
}

// ResidencyReport is the benchmark's result.
type ResidencyReport struct {
	Config ResidencyConfig  `json:"-"`
	Phases []ResidencyPhase `json:"phases"`
}

// traced is one request of the trace: when it is sent (from the start)
// and the model it names.
type traced struct {
	at    time.Duration
	model string
}

// residencyTrace is the workload: Poisson arrivals at Rate, each from one
// of 2 × Models clients in turn, client c alternating between models c
// and c+1 (mod Models), as Aider's architect mode alternates two models.
func residencyTrace(cfg ResidencyConfig) []traced {
	rng := rand.New(rand.NewPCG(cfg.Seed, 32))
	clients := 2 * cfg.Models
	turn := make([]int, clients)
	var out []traced
	at := time.Duration(0)
	for i := 0; ; i++ {
		at += time.Duration(rng.ExpFloat64() / cfg.Rate * float64(time.Second))
		if at >= cfg.Duration {
			return out
		}
		c := i % clients
		m := (c + turn[c]) % cfg.Models
		turn[c] ^= 1
		out = append(out, traced{at: at, model: fmt.Sprintf("m%d", m+1)})
	}
}

// Residency runs the residency benchmark: for each policy it starts
// Providers `iop sim` processes (Ollama protocol, every model, residency
// on), `iop edge` (routing least_loaded, residency on or off) and one
// `iop node` driving them, replays the same trace, and reads the
// simulators' loads and the edge's queue waits; then it adds the
// reference row, llama-swap's policy on one host for the same trace
// (llamaSwapPhase, simulated). Errors: a process that
// fails to start or exits, a setup step that times out, ctx's end.
func Residency(ctx context.Context, cfg ResidencyConfig) (ResidencyReport, error) {
	cfg.setDefaults()
	rep := ResidencyReport{Config: cfg}
	trace := residencyTrace(cfg)
	for _, phase := range []string{"residency", "least_loaded"} {
		p, err := residencyPhase(ctx, cfg, phase, trace)
		if err != nil {
			return rep, fmt.Errorf("phase %s: %w", phase, err)
		}
		rep.Phases = append(rep.Phases, p)
	}
	if len(cfg.Ollamas) == 0 { // its load and service times are the simulators'
		rep.Phases = append(rep.Phases, llamaSwapPhase(cfg, trace))
	}
	return rep, nil
}

const residencySecret = "iop-bench-residency"

func residencyPhase(ctx context.Context, cfg ResidencyConfig, phase string, trace []traced) (ResidencyPhase, error) {
	out := ResidencyPhase{Name: phase}
	dir, err := os.MkdirTemp("", "iop-bench-residency-")
	if err != nil {
		return out, err
	}
	var procs []*process
	defer func() {
		for i := len(procs) - 1; i >= 0; i-- {
			procs[i].stop()
		}
	}()
	run := func(name string, args ...string) error {
		p, err := startProcess(dir, name, cfg.Binary, args...)
		if err == nil {
			procs = append(procs, p)
		}
		return err
	}
	var models []string
	for i := range cfg.Models {
		models = append(models, fmt.Sprintf("m%d", i+1))
	}
	var sims []string
	var providers strings.Builder
	for i, url := range cfg.Ollamas {
		fmt.Fprintf(&providers, "  - {id: p%d, type: ollama, base_url: %q, models: [%s], capacity: %d, max_loaded_models: %d}\n",
			i+1, url, strings.Join(models, ", "), cfg.Capacity, cfg.MaxLoaded)
	}
	for i := range cfg.Providers {
		if len(cfg.Ollamas) > 0 {
			break
		}
		addr, err := freeAddr()
		if err != nil {
			return out, err
		}
		args := []string{"sim", "--protocol", "ollama", "--listen", addr, "--ttft", cfg.Service.String(),
			"--default-max-tokens", "4", "--max-concurrent", fmt.Sprint(cfg.Capacity),
			"--max-loaded-models", fmt.Sprint(cfg.MaxLoaded), "--load-time", cfg.LoadTime.String(), "--log-level", "warn"}
		for _, m := range models {
			args = append(args, "--model", m)
		}
		if err := run(fmt.Sprintf("sim%d", i+1), args...); err != nil {
			return out, err
		}
		sims = append(sims, "http://"+addr)
		fmt.Fprintf(&providers, "  - {id: p%d, type: ollama, base_url: \"http://%s\", models: [%s], capacity: %d, max_loaded_models: %d}\n",
			i+1, addr, strings.Join(models, ", "), cfg.Capacity, cfg.MaxLoaded)
	}
	edgeHTTP, err := freeAddr()
	if err != nil {
		return out, err
	}
	edgeNode, err := freeAddr()
	if err != nil {
		return out, err
	}
	residency := fmt.Sprintf("{mode: on, max_extra_wait: %s, load_time: %s}", cfg.MaxExtraWait, cfg.LoadTime)
	if phase == "least_loaded" {
		residency = "off"
	}
	edgeCfg := fmt.Sprintf(`listen: %s
node_listen: %s
queue: {max_queue: 256, queue_timeout: 5m}
routing: least_loaded
residency: %s
keys:
  - {name: bench, hash: "%s"}
`, edgeHTTP, edgeNode, residency, auth.Hash(residencySecret))
	edgeFile := filepath.Join(dir, "edge.yaml")
	if err := os.WriteFile(edgeFile, []byte(edgeCfg), 0o600); err != nil {
		return out, err
	}
	if err := run("edge", "edge", "--config", edgeFile, "--log-format", "json", "--log-level", "info"); err != nil {
		return out, err
	}
	nodeCfg := fmt.Sprintf("node_id: bench\nedge: %s\ndiscovery_interval: 5s\nproviders:\n%s", edgeNode, providers.String())
	nodeFile := filepath.Join(dir, "node.yaml")
	if err := os.WriteFile(nodeFile, []byte(nodeCfg), 0o600); err != nil {
		return out, err
	}
	if err := run("node", "node", "--config", nodeFile, "--log-level", "warn"); err != nil {
		return out, err
	}
	edgeURL := "http://" + edgeHTTP
	if err := waitFor(ctx, 30*time.Second, procs, func() error {
		var list struct {
			Data []struct {
				ID string `json:"id"`
			} `json:"data"`
		}
		if err := getAuthJSON(ctx, edgeURL+"/v1/models", &list); err != nil {
			return err
		}
		if len(list.Data) < cfg.Models {
			return fmt.Errorf("edge lists %d models yet", len(list.Data))
		}
		return nil
	}); err != nil {
		return out, fmt.Errorf("%w (logs in %s)", err, dir)
	}
	fmt.Fprintf(cfg.Log, "phase %s: %d sims, edge (%s) and node up; %d requests over %s; logs in %s\n",
		phase, cfg.Providers, edgeURL, len(trace), cfg.Duration, dir)

	var loadsBefore int64
	if cfg.CountLoads != nil {
		loadsBefore = cfg.CountLoads()
	}
	lat, ok := replay(ctx, edgeURL, trace)
	out.Requests = len(trace)
	var ds, steady []time.Duration
	for i, d := range lat {
		if ok[i] {
			out.OK++
			ds = append(ds, d)
			if trace[i].at >= cfg.Warmup {
				steady = append(steady, d)
			}
		} else {
			out.Failed++
		}
	}
	out.Latency, out.Steady = percentilesOf(ds), percentilesOf(steady)
	if cfg.CountLoads != nil {
		out.Loads = cfg.CountLoads() - loadsBefore
	}
	for i, u := range sims {
		var st struct {
			Loads       int64 `json:"loads"`
			Evictions   int64 `json:"evictions"`
			Rejected    int64 `json:"rejected"`
			MaxInFlight int   `json:"max_in_flight"`
		}
		if err := getAuthJSON(ctx, u+"/stats", &st); err != nil {
			return out, fmt.Errorf("sim%d stats: %w", i+1, err)
		}
		out.Loads += st.Loads
		out.Evictions += st.Evictions
		out.OverCapacity += st.Rejected + int64(max(st.MaxInFlight-cfg.Capacity, 0))
	}
	for _, p := range procs {
		if err := p.exited(); err != nil {
			return out, err
		}
	}
	for i := len(procs) - 1; i >= 0; i-- {
		procs[i].stop()
	}
	procs = nil
	waits, err := queueWaits(filepath.Join(dir, "edge.log"))
	if err != nil {
		return out, err
	}
	out.QueueWait = percentilesOf(waits["bench"])
	os.RemoveAll(dir)
	return out, nil
}

// replay sends each request of trace at its time (open loop): a
// non-streamed Ollama chat to the edge. It returns each one's latency
// and whether it was answered 200.
func replay(ctx context.Context, edgeURL string, trace []traced) ([]time.Duration, []bool) {
	lat := make([]time.Duration, len(trace))
	ok := make([]bool, len(trace))
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256}}
	defer client.CloseIdleConnections()
	start := time.Now()
	var wg sync.WaitGroup
	for i, tr := range trace {
		if wait := tr.at - time.Since(start); wait > 0 {
			select {
			case <-time.After(wait):
			case <-ctx.Done():
				wg.Wait()
				return lat, ok
			}
		}
		wg.Go(func() {
			body, _ := json.Marshal(map[string]any{"model": tr.model, "stream": false,
				"messages": []any{map[string]any{"role": "user", "content": fmt.Sprintf("request %d", i)}}})
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, edgeURL+"/api/chat", bytes.NewReader(body))
			if err != nil {
				return
			}
			req.Header.Set("Authorization", "Bearer "+residencySecret)
			t0 := time.Now()
			resp, err := client.Do(req)
			if err != nil {
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			lat[i], ok[i] = time.Since(t0), resp.StatusCode == http.StatusOK
		})
	}
	wg.Wait()
	return lat, ok
}

func getAuthJSON(ctx context.Context, url string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+residencySecret)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: status %d", url, resp.StatusCode)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

// WriteTable writes both phases and the targets, each met or
// missed: loads ≥ 5× fewer, p50 ≥ 3× lower, p99 ≥ 2× lower with
// residency, no over-capacity.
func (r ResidencyReport) WriteTable(w io.Writer) {
	c := r.Config
	fmt.Fprintf(w, "residency: %d models over %d providers holding %d each (capacity %d), load %s, service %s, %.1f req/s for %s, max_extra_wait %s\n",
		c.Models, c.Providers, c.MaxLoaded, c.Capacity, c.LoadTime, c.Service, c.Rate, c.Duration, c.MaxExtraWait)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "policy\trequests\tok\tloads\tevictions\tp50\tp99\tmax\tp50 after %s\tp99 after %s\tqueue wait p99\tqueue wait max\tover capacity\n", c.Warmup, c.Warmup)
	for _, p := range r.Phases {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\n", p.Name, p.Requests, p.OK, p.Loads, p.Evictions,
			roundFair(p.Latency.P50), roundFair(p.Latency.P99), roundFair(p.Latency.Max), roundFair(p.Steady.P50), roundFair(p.Steady.P99),
			roundFair(p.QueueWait.P99), roundFair(p.QueueWait.Max), p.OverCapacity)
	}
	tw.Flush()
	if len(r.Phases) < 2 {
		return
	}
	on, off := r.Phases[0], r.Phases[1]
	ratio := func(a, b float64) float64 {
		if b == 0 {
			return 0
		}
		return a / b
	}
	loads := ratio(float64(off.Loads), float64(on.Loads))
	p50 := ratio(float64(off.Latency.P50), float64(on.Latency.P50))
	p99 := ratio(float64(off.Latency.P99), float64(on.Latency.P99))
	steady99 := ratio(float64(off.Steady.P99), float64(on.Steady.P99))
	bound := c.MaxExtraWait + c.LoadTime
	fmt.Fprintf(w, "loads %.1f× fewer (target ≥ 5×: %s); p50 %.1f× lower (≥ 3×: %s); p99 %.1f× lower (≥ 2×: %s), after the warm-up %.1f× (%s); longest queue wait %s (≤ max_extra_wait + a load, %s: %s); over capacity %d (0: %s)\n",
		loads, metOr(loads >= 5), p50, metOr(p50 >= 3), p99, metOr(p99 >= 2), steady99, metOr(steady99 >= 2),
		roundFair(on.QueueWait.Max), bound, metOr(on.QueueWait.Max <= bound), on.OverCapacity+off.OverCapacity,
		metOr(on.OverCapacity+off.OverCapacity == 0))
}
