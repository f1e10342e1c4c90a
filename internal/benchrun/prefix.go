package benchrun

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"iop/internal/loadgen"
)

// PrefixConfig is the prefix-routing benchmark (iop bench
// --prefix-compare): Providers simulators with a prefix cache behind one
// edge and one node, the sessions workload run once per routing (each on
// fresh simulators, caches cold), the figures side by side. Zero fields
// take the defaults of DefaultPrefixConfig.
type PrefixConfig struct {
	// Binary is the iop executable to run as sim, edge and node. Required.
	Binary string
	// Providers, each of Capacity, are simulators with CacheTokens of
	// prefix cache, PrefillRate prompt tokens a second of prefill, a fixed
	// TTFT and TokensPerSecond of decode; every answer is AnswerTokens.
	Providers, Capacity, CacheTokens int
	PrefillRate, TokensPerSecond     float64
	TTFT                             time.Duration
	AnswerTokens                     int
	// Sessions, Turns, SharedPrefixTokens and TurnTokens shape the load
	// (loadgen.WorkloadSessions) at Concurrency clients.
	Sessions, Turns, SharedPrefixTokens, TurnTokens, Concurrency int
	// Routings are the edge routings compared, in order.
	Routings []string
	// LoadSlack, when set, is the edge's prefix_load_slack (else its
	// default).
	LoadSlack *float64
	// SampleEvery is the period of the in-flight samples of
	// /admin/v1/providers.
	SampleEvery time.Duration
	// Log receives a line per step; nil discards them.
	Log io.Writer
}

// DefaultPrefixConfig is the configuration BENCHMARKS.md (prefix-cache-aware
// routing) records: 4 providers of capacity 4 with 100,000 tokens of cache each, a
// 2,000-token shared system prompt at 5,000 tokens/s of prefill (400 ms
// uncached), 32 sessions of 8 turns (100-token questions, 300-token
// answers at 1,000 tokens/s) at 12 clients.
func DefaultPrefixConfig() PrefixConfig {
	return PrefixConfig{
		Providers: 4, Capacity: 4, CacheTokens: 100_000, PrefillRate: 5000, TokensPerSecond: 1000,
		TTFT: 20 * time.Millisecond, AnswerTokens: 300,
		Sessions: 32, Turns: 8, SharedPrefixTokens: 2000, TurnTokens: 100, Concurrency: 12,
		Routings: []string{"least_loaded", "prefix"}, SampleEvery: 50 * time.Millisecond,
	}
}

func (c PrefixConfig) withDefaults() PrefixConfig {
	d := DefaultPrefixConfig()
	set := func(v *int, def int) {
		if *v == 0 {
			*v = def
		}
	}
	set(&c.Providers, d.Providers)
	set(&c.Capacity, d.Capacity)
	set(&c.CacheTokens, d.CacheTokens)
	set(&c.AnswerTokens, d.AnswerTokens)
	set(&c.Sessions, d.Sessions)
	set(&c.Turns, d.Turns)
	set(&c.SharedPrefixTokens, d.SharedPrefixTokens)
	set(&c.TurnTokens, d.TurnTokens)
	set(&c.Concurrency, d.Concurrency)
	if c.PrefillRate == 0 {
		c.PrefillRate = d.PrefillRate
	}
	if c.TokensPerSecond == 0 {
		c.TokensPerSecond = d.TokensPerSecond
	}
	if c.TTFT == 0 {
		c.TTFT = d.TTFT
	}
	if len(c.Routings) == 0 {
		c.Routings = d.Routings
	}
	if c.SampleEvery == 0 {
		c.SampleEvery = d.SampleEvery
	}
	if c.Log == nil {
		c.Log = io.Discard
	}
	return c
}

// PrefixRun is one routing's figures.
type PrefixRun struct {
	Routing string         `json:"routing"`
	Load    loadgen.Result `json:"load"`
	// Sims are the simulators' own counters at the end (GET /stats): cache
	// hits and misses, the most requests each had in flight, 429s.
	Sims []SimStats `json:"sims"`
	// Samples counts the in-flight samples; MeanInFlight and MaxInFlight
	// are per provider over them (the edge's counters); IdleWhileQueued
	// counts samples in which a provider had a free slot while a request
	// waited (must be 0); OverCapacity samples with a provider above its
	// capacity (must be 0).
	Samples         int       `json:"samples"`
	MeanInFlight    []float64 `json:"mean_in_flight"`
	MaxInFlight     []int     `json:"max_in_flight"`
	IdleWhileQueued int       `json:"idle_while_queued"`
	OverCapacity    int       `json:"over_capacity"`
}

// SimStats is the part of a simulator's GET /stats the benchmark reads.
type SimStats struct {
	MaxInFlight      int   `json:"max_in_flight"`
	Rejected         int64 `json:"rejected"`
	PrefixHitTokens  int64 `json:"prefix_hit_tokens"`
	PrefixMissTokens int64 `json:"prefix_miss_tokens"`
}

// HitRatio is the simulators' cache hit ratio over every prompt token.
func (r PrefixRun) HitRatio() float64 {
	var hit, all int64
	for _, s := range r.Sims {
		hit += s.PrefixHitTokens
		all += s.PrefixHitTokens + s.PrefixMissTokens
	}
	if all == 0 {
		return 0
	}
	return float64(hit) / float64(all)
}

// PrefixReport is every routing's run.
type PrefixReport struct {
	Config PrefixConfig `json:"-"`
	Runs   []PrefixRun  `json:"runs"`
}

// PrefixCompare runs cfg's benchmark once per routing.
func PrefixCompare(ctx context.Context, cfg PrefixConfig) (PrefixReport, error) {
	cfg = cfg.withDefaults()
	rep := PrefixReport{Config: cfg}
	for _, routing := range cfg.Routings {
		run, err := prefixRun(ctx, cfg, routing)
		if err != nil {
			return rep, fmt.Errorf("routing %s: %w", routing, err)
		}
		rep.Runs = append(rep.Runs, run)
	}
	return rep, nil
}

// prefixModel is the model the simulators serve.
const prefixModel = "sessions"

func prefixRun(ctx context.Context, cfg PrefixConfig, routing string) (PrefixRun, error) {
	dir, err := os.MkdirTemp("", "iop-prefix-bench-")
	if err != nil {
		return PrefixRun{}, err
	}
	var procs []*process
	defer func() {
		for i := len(procs) - 1; i >= 0; i-- {
			procs[i].stop()
		}
		os.RemoveAll(dir)
	}()
	start := func(name string, args ...string) error {
		p, err := startProcess(dir, name, cfg.Binary, append(args, "--log-level", "warn")...)
		if err == nil {
			procs = append(procs, p)
		}
		return err
	}
	var simURLs []string
	var provs strings.Builder
	for i := range cfg.Providers {
		addr, err := freeAddr()
		if err != nil {
			return PrefixRun{}, err
		}
		if err := start(fmt.Sprintf("sim-%d", i), "sim", "--protocol", "openai", "--listen", addr, "--model", prefixModel,
			"--ttft", cfg.TTFT.String(), "--tokens-per-second", fmt.Sprint(cfg.TokensPerSecond),
			"--default-max-tokens", strconv.Itoa(cfg.AnswerTokens), "--max-concurrent", strconv.Itoa(cfg.Capacity),
			"--prefix-cache-tokens", strconv.Itoa(cfg.CacheTokens), "--prefill-tokens-per-second", fmt.Sprint(cfg.PrefillRate)); err != nil {
			return PrefixRun{}, err
		}
		simURLs = append(simURLs, "http://"+addr)
		fmt.Fprintf(&provs, "  - {id: sim-%d, type: openai, base_url: \"http://%s/v1\", models: [%s], capacity: %d}\n", i, addr, prefixModel, cfg.Capacity)
	}
	httpAddr, err1 := freeAddr()
	nodeAddr, err2 := freeAddr()
	if err1 != nil || err2 != nil {
		return PrefixRun{}, fmt.Errorf("free address: %v %v", err1, err2)
	}
	edgeFile := filepath.Join(dir, "edge.yaml")
	edgeYAML := fmt.Sprintf("listen: %s\nnode_listen: %s\ndatabase: \":memory:\"\nrouting: %s\nqueue: {max_queue: %d, queue_timeout: 10m}\n",
		httpAddr, nodeAddr, routing, cfg.Concurrency+16)
	if cfg.LoadSlack != nil {
		edgeYAML += fmt.Sprintf("prefix_load_slack: %v\n", *cfg.LoadSlack)
	}
	if err := os.WriteFile(edgeFile, []byte(edgeYAML), 0o600); err != nil {
		return PrefixRun{}, err
	}
	if err := start("edge", "edge", "--config", edgeFile); err != nil {
		return PrefixRun{}, err
	}
	nodeFile := filepath.Join(dir, "node.yaml")
	if err := os.WriteFile(nodeFile, []byte(fmt.Sprintf("node_id: bench\nedge: %s\nproviders:\n%s", nodeAddr, provs.String())), 0o600); err != nil {
		return PrefixRun{}, err
	}
	if err := start("node", "node", "--config", nodeFile); err != nil {
		return PrefixRun{}, err
	}
	edgeURL := "http://" + httpAddr
	if err := waitFor(ctx, 30*time.Second, procs, func() error {
		ps, err := providers(ctx, edgeURL)
		if err == nil && len(ps) < cfg.Providers {
			err = fmt.Errorf("edge lists %d providers, want %d", len(ps), cfg.Providers)
		}
		return err
	}); err != nil {
		return PrefixRun{}, err
	}
	fmt.Fprintf(cfg.Log, "routing %s: %d sims, edge %s and node started; logs in %s\n", routing, cfg.Providers, edgeURL, dir)

	run := PrefixRun{Routing: routing, MeanInFlight: make([]float64, cfg.Providers), MaxInFlight: make([]int, cfg.Providers)}
	sampleCtx, stopSampling := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { sampleInFlight(sampleCtx, edgeURL, cfg, &run) })
	client := loadgen.NewClient(cfg.Concurrency)
	res, err := loadgen.Run(ctx, loadgen.Config{URL: edgeURL, API: loadgen.APIOpenAI, Model: prefixModel, Stream: true,
		Concurrency: cfg.Concurrency, Timeout: 5 * time.Minute, Client: client, MaxTokens: cfg.AnswerTokens,
		Workload: loadgen.WorkloadSessions, Sessions: cfg.Sessions, Turns: cfg.Turns,
		SharedPrefixTokens: cfg.SharedPrefixTokens, TurnTokens: cfg.TurnTokens}, nil)
	stopSampling()
	wg.Wait()
	client.CloseIdleConnections()
	if err != nil {
		return PrefixRun{}, err
	}
	run.Load = res
	if run.Samples > 0 {
		for i := range run.MeanInFlight {
			run.MeanInFlight[i] /= float64(run.Samples)
		}
	}
	for _, u := range simURLs {
		b, err := get(ctx, u+"/stats")
		if err != nil {
			return PrefixRun{}, err
		}
		var st SimStats
		if err := json.Unmarshal(b, &st); err != nil {
			return PrefixRun{}, err
		}
		run.Sims = append(run.Sims, st)
	}
	return run, nil
}

// providerSample is the part of GET /admin/v1/providers the samples read.
type providerSample struct {
	ProviderID string `json:"provider_id"`
	Capacity   int    `json:"capacity"`
	InFlight   int    `json:"in_flight"`
	Queued     int    `json:"queued"`
}

func providers(ctx context.Context, edgeURL string) ([]providerSample, error) {
	b, err := get(ctx, edgeURL+"/admin/v1/providers")
	if err != nil {
		return nil, err
	}
	var ps []providerSample
	if err := json.Unmarshal(b, &ps); err != nil {
		var wrapped struct {
			Providers []providerSample `json:"providers"`
		}
		if err2 := json.Unmarshal(b, &wrapped); err2 != nil {
			return nil, err
		}
		ps = wrapped.Providers
	}
	return ps, nil
}

// sampleInFlight samples the edge's providers every cfg.SampleEvery until
// ctx ends. One GET is one scheduler snapshot, so in-flight and queued of
// a sample are consistent with each other.
func sampleInFlight(ctx context.Context, edgeURL string, cfg PrefixConfig, run *PrefixRun) {
	t := time.NewTicker(cfg.SampleEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		ps, err := providers(ctx, edgeURL)
		if err != nil || len(ps) != cfg.Providers {
			continue
		}
		run.Samples++
		queued, free := false, false
		for _, p := range ps {
			i, err := strconv.Atoi(strings.TrimPrefix(p.ProviderID, "sim-"))
			if err != nil || i < 0 || i >= cfg.Providers {
				continue
			}
			run.MeanInFlight[i] += float64(p.InFlight)
			run.MaxInFlight[i] = max(run.MaxInFlight[i], p.InFlight)
			queued = queued || p.Queued > 0
			free = free || p.InFlight < p.Capacity
			if p.InFlight > p.Capacity {
				run.OverCapacity++
			}
		}
		if queued && free {
			run.IdleWhileQueued++
		}
	}
}

// WriteText writes the runs side by side and the benchmark's targets.
func (r PrefixReport) WriteText(w io.Writer) {
	c := r.Config
	fmt.Fprintf(w, "prefix routing benchmark: %d providers × capacity %d, cache %d tokens each, prefill %.0f tokens/s, ttft %v, decode %.0f tokens/s, answers %d tokens\n",
		c.Providers, c.Capacity, c.CacheTokens, c.PrefillRate, c.TTFT, c.TokensPerSecond, c.AnswerTokens)
	fmt.Fprintf(w, "workload: %d sessions × %d turns, shared prefix %d tokens, %d tokens a user turn, %d clients, streamed\n\n",
		c.Sessions, c.Turns, c.SharedPrefixTokens, c.TurnTokens, c.Concurrency)
	fmt.Fprintf(w, "%-13s %9s %9s %9s %9s %10s %9s %9s  %-22s %-16s %s\n", "routing", "ttft p50", "ttft p95", "lat p50", "req/s", "ok", "sim hit", "max/cap", "mean in-flight", "max in-flight", "idle-while-queued")
	for _, run := range r.Runs {
		maxSim := 0
		for _, s := range run.Sims {
			maxSim = max(maxSim, s.MaxInFlight)
		}
		mean := make([]string, len(run.MeanInFlight))
		for i, m := range run.MeanInFlight {
			mean[i] = fmt.Sprintf("%.1f", m)
		}
		maxes := make([]string, len(run.MaxInFlight))
		for i, m := range run.MaxInFlight {
			maxes[i] = strconv.Itoa(m)
		}
		fmt.Fprintf(w, "%-13s %9v %9v %9v %9.2f %5d/%-4d %8.1f%% %5d/%-3d  %-22s %-16s %d of %d samples\n", run.Routing,
			roundPrefix(run.Load.TTFT.P50), roundPrefix(run.Load.TTFT.P95), roundPrefix(run.Load.Latency.P50), run.Load.Throughput,
			run.Load.OK, run.Load.Requests, 100*run.HitRatio(), maxSim, c.Capacity,
			strings.Join(mean, " "), strings.Join(maxes, " "), run.IdleWhileQueued, run.Samples)
	}
	if len(r.Runs) == 2 {
		a, b := r.Runs[0], r.Runs[1]
		ratio := float64(a.Load.TTFT.P50) / float64(max(b.Load.TTFT.P50, 1))
		fmt.Fprintf(w, "\nttft p50 %s / %s = %.2f× (target ≥ 2×); throughput %s / %s = %.2f (target ≥ 1)\n",
			a.Routing, b.Routing, ratio, b.Routing, a.Routing, b.Load.Throughput/max(a.Load.Throughput, 1e-9))
	}
}

// roundPrefix shortens d for a table: to 10 µs below 10 ms, else to 0.1 ms.
func roundPrefix(d time.Duration) time.Duration {
	if d < 10*time.Millisecond {
		return d.Round(10 * time.Microsecond)
	}
	return d.Round(100 * time.Microsecond)
}
