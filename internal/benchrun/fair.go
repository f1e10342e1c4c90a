package benchrun

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"text/tabwriter"
	"time"

	"iop/internal/auth"
	"iop/internal/loadgen"
)

// FairConfig is the fair-sharing benchmark: one key floods a
// model at Flood × its capacity while a second key sends at Light × it.
// Zero fields take the defaults in brackets.
type FairConfig struct {
	// Binary is the iop executable the simulator, edge and node run from.
	Binary string
	// Capacity is the provider's capacity [2]; TTFT the simulator's time to
	// first token [100ms], which with 4-token answers at unlimited rate is
	// the service time S, so the model serves Capacity/S requests a second.
	Capacity int
	TTFT     time.Duration
	// Flood and Light are the two keys' rates as fractions of that
	// capacity [10 and 0.1].
	Flood, Light float64
	// Duration is each phase's length [40s].
	Duration time.Duration
	// MaxQueue and QueueTimeout are the model's queue policy [32, 10s].
	MaxQueue     int
	QueueTimeout time.Duration
	// Log gets progress lines; nil means none.
	Log io.Writer
}

// FairPhase is one phase's figures.
type FairPhase struct {
	// Name is "alone" (the light key only, fairness on), "fair" (both keys,
	// fairness on) or "fifo" (both keys, fairness: off).
	Name string `json:"name"`
	// Light and Flood are the keys' load results, as the clients saw them.
	Light loadgen.Result  `json:"light"`
	Flood *loadgen.Result `json:"flood,omitempty"`
	// LightWait and FloodWait are the queue waits of the requests the edge
	// admitted, from its request log lines (queue_wait, by key).
	LightWait, FloodWait loadgen.Percentiles
	// LightSlots and FloodSlots count the requests the edge admitted to a
	// slot in the phase, by key.
	LightSlots, FloodSlots int
}

// FairReport is the benchmark's result.
type FairReport struct {
	Config FairConfig  `json:"-"`
	Phases []FairPhase `json:"phases"`
}

// Fair runs the fair-sharing benchmark: for each phase it starts iop sim,
// iop edge (two keys, fairness on or off) and iop node as processes of
// cfg.Binary on loopback ports, runs the two keys' open-loop loads
// (loadgen, one client per key), reads the edge's JSON request log for the
// queue waits, and stops the processes. Errors: a process that fails to
// start or exits, a setup step that times out, ctx's end.
func Fair(ctx context.Context, cfg FairConfig) (FairReport, error) {
	if cfg.Capacity == 0 {
		cfg.Capacity = 2
	}
	if cfg.TTFT == 0 {
		cfg.TTFT = 100 * time.Millisecond
	}
	if cfg.Flood == 0 {
		cfg.Flood = 10
	}
	if cfg.Light == 0 {
		cfg.Light = 0.1
	}
	if cfg.Duration == 0 {
		cfg.Duration = 40 * time.Second
	}
	if cfg.MaxQueue == 0 {
		cfg.MaxQueue = 32
	}
	if cfg.QueueTimeout == 0 {
		cfg.QueueTimeout = 10 * time.Second
	}
	if cfg.Log == nil {
		cfg.Log = io.Discard
	}
	rep := FairReport{Config: cfg}
	for _, phase := range []string{"alone", "fair", "fifo"} {
		p, err := fairPhase(ctx, cfg, phase)
		if err != nil {
			return rep, fmt.Errorf("phase %s: %w", phase, err)
		}
		rep.Phases = append(rep.Phases, p)
	}
	return rep, nil
}

const (
	fairModel       = "bench-fair"
	fairLightSecret = "iop-bench-light"
	fairFloodSecret = "iop-bench-flood"
)

func fairPhase(ctx context.Context, cfg FairConfig, phase string) (FairPhase, error) {
	out := FairPhase{Name: phase}
	dir, err := os.MkdirTemp("", "iop-bench-fair-")
	if err != nil {
		return out, err
	}
	s := &setup{dir: dir}
	defer func() {
		for i := len(s.procs) - 1; i >= 0; i-- {
			s.procs[i].stop()
		}
	}()
	addrs := make([]string, 3)
	for i := range addrs {
		if addrs[i], err = freeAddr(); err != nil {
			return out, err
		}
	}
	simAddr, edgeHTTP, edgeNode := addrs[0], addrs[1], addrs[2]
	s.edgeURL = "http://" + edgeHTTP
	run := func(name string, args ...string) error {
		p, err := startProcess(dir, name, cfg.Binary, args...)
		if err == nil {
			s.procs = append(s.procs, p)
		}
		return err
	}
	if err := run("sim", "sim", "--protocol", "openai", "--listen", simAddr, "--model", fairModel,
		"--ttft", cfg.TTFT.String(), "--default-max-tokens", "4", "--log-level", "warn"); err != nil {
		return out, err
	}
	mode := "on"
	if phase == "fifo" {
		mode = "off"
	}
	edgeCfg := fmt.Sprintf(`listen: %s
node_listen: %s
queue: {max_queue: %d, queue_timeout: %s}
fairness: %s
keys:
  - {name: light, hash: "%s"}
  - {name: flood, hash: "%s"}
`, edgeHTTP, edgeNode, cfg.MaxQueue, cfg.QueueTimeout, mode, auth.Hash(fairLightSecret), auth.Hash(fairFloodSecret))
	edgeFile := filepath.Join(dir, "edge.yaml")
	if err := os.WriteFile(edgeFile, []byte(edgeCfg), 0o600); err != nil {
		return out, err
	}
	if err := run("edge", "edge", "--config", edgeFile, "--log-format", "json", "--log-level", "info"); err != nil {
		return out, err
	}
	nodeCfg := fmt.Sprintf(`node_id: bench
edge: %s
providers:
  - {id: sim, type: sim, protocol: openai, base_url: "http://%s/v1", models: [%s], capacity: %d}
`, edgeNode, simAddr, fairModel, cfg.Capacity)
	nodeFile := filepath.Join(dir, "node.yaml")
	if err := os.WriteFile(nodeFile, []byte(nodeCfg), 0o600); err != nil {
		return out, err
	}
	if err := run("node", "node", "--config", nodeFile, "--log-level", "warn"); err != nil {
		return out, err
	}
	if err := waitFor(ctx, 30*time.Second, s.procs, func() error {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.edgeURL+"/v1/models", nil)
		req.Header.Set("Authorization", "Bearer "+fairLightSecret)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		var list struct {
			Data []struct {
				ID string `json:"id"`
			} `json:"data"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
			return err
		}
		if len(list.Data) < 1 {
			return fmt.Errorf("edge lists no model yet")
		}
		return nil
	}); err != nil {
		return out, fmt.Errorf("%w (logs in %s)", err, dir)
	}
	fmt.Fprintf(cfg.Log, "phase %s: sim, edge (%s, fairness %s) and node up; logs in %s\n", phase, s.edgeURL, mode, dir)

	capacityRate := float64(cfg.Capacity) / cfg.TTFT.Seconds()
	load := func(secret string, rate float64) loadgen.Config {
		return loadgen.Config{URL: s.edgeURL, API: loadgen.APIOpenAI, Model: fairModel, PromptChars: loadgen.DefaultPromptChars,
			Rate: rate, Duration: cfg.Duration, Timeout: cfg.QueueTimeout + 30*time.Second, MaxInFlight: loadgen.DefaultMaxInFlight,
			Header: http.Header{"Authorization": {"Bearer " + secret}}}
	}
	type res struct {
		r   loadgen.Result
		err error
	}
	floodDone := make(chan res, 1)
	if phase != "alone" {
		go func() {
			r, err := loadgen.Run(ctx, load(fairFloodSecret, cfg.Flood*capacityRate), nil)
			floodDone <- res{r, err}
		}()
	}
	light, err := loadgen.Run(ctx, load(fairLightSecret, cfg.Light*capacityRate), nil)
	if err != nil {
		return out, err
	}
	out.Light = light
	if phase != "alone" {
		f := <-floodDone
		if f.err != nil {
			return out, f.err
		}
		out.Flood = &f.r
	}
	for _, p := range s.procs {
		if err := p.exited(); err != nil {
			return out, err
		}
	}
	// Stop the edge so its log is complete, then read it.
	for i := len(s.procs) - 1; i >= 0; i-- {
		s.procs[i].stop()
	}
	s.procs = nil
	waits, err := queueWaits(filepath.Join(dir, "edge.log"))
	if err != nil {
		return out, err
	}
	out.LightWait, out.LightSlots = percentilesOf(waits["light"]), len(waits["light"])
	out.FloodWait, out.FloodSlots = percentilesOf(waits["flood"]), len(waits["flood"])
	os.RemoveAll(dir)
	return out, nil
}

// queueWaits reads an edge's JSON log and returns the queue_wait of every
// admitted request ("request" lines with queue_reason immediate or
// queued), by key.
func queueWaits(path string) (map[string][]time.Duration, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string][]time.Duration{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var line struct {
			Msg         string `json:"msg"`
			Key         string `json:"key"`
			QueueReason string `json:"queue_reason"`
			QueueWait   int64  `json:"queue_wait"` // nanoseconds (slog's JSON of a Duration)
		}
		if json.Unmarshal(sc.Bytes(), &line) != nil || line.Msg != "request" {
			continue
		}
		if line.QueueReason == "immediate" || line.QueueReason == "queued" {
			out[line.Key] = append(out[line.Key], time.Duration(line.QueueWait))
		}
	}
	return out, sc.Err()
}

func percentilesOf(ds []time.Duration) loadgen.Percentiles {
	if len(ds) == 0 {
		return loadgen.Percentiles{}
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	at := func(q float64) time.Duration { return s[min(len(s)-1, int(q*float64(len(s))))] }
	return loadgen.Percentiles{N: len(s), P50: at(0.50), P90: at(0.90), P99: at(0.99), Max: s[len(s)-1]}
}

// phase returns the phase named name, or nil.
func (r FairReport) phase(name string) *FairPhase {
	for i := range r.Phases {
		if r.Phases[i].Name == name {
			return &r.Phases[i]
		}
	}
	return nil
}

// WriteTable writes the phases and the benchmark's two targets, each met or
// missed: the light key's p99 time at the gateway (queue wait + service,
// its latency) within 2× of what it is alone, and its share of slots at
// least its weighted share (with weights 1:1, min(its demand, half the
// slots): so every request it sent is served).
func (r FairReport) WriteTable(w io.Writer) {
	c := r.Config
	capacityRate := float64(c.Capacity) / c.TTFT.Seconds()
	fmt.Fprintf(w, "fair sharing: capacity %d, service %s (%.0f req/s); flood key %.0f req/s (%.0f×), light key %.1f req/s (%.0f%%); %s a phase, max_queue %d, queue_timeout %s\n\n",
		c.Capacity, c.TTFT, capacityRate, c.Flood*capacityRate, c.Flood, c.Light*capacityRate, c.Light*100, c.Duration, c.MaxQueue, c.QueueTimeout)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PHASE\tLIGHT SENT\tLIGHT OK\tLIGHT 429\tLIGHT LAT p50/p99\tLIGHT WAIT p50/p99\tLIGHT SLOTS\tFLOOD SENT\tFLOOD OK\tFLOOD 429\tFLOOD WAIT p50/p99\tFLOOD SLOTS")
	for _, p := range r.Phases {
		fl := "-\t-\t-\t-\t-"
		if p.Flood != nil {
			fl = fmt.Sprintf("%d\t%d\t%d\t%s/%s\t%d", p.Flood.Requests, p.Flood.OK, p.Flood.Outcomes["429"],
				roundFair(p.FloodWait.P50), roundFair(p.FloodWait.P99), p.FloodSlots)
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%s/%s\t%s/%s\t%d\t%s\n", p.Name, p.Light.Requests, p.Light.OK, p.Light.Outcomes["429"],
			roundFair(p.Light.Latency.P50), roundFair(p.Light.Latency.P99), roundFair(p.LightWait.P50), roundFair(p.LightWait.P99), p.LightSlots, fl)
	}
	tw.Flush()
	alone, fair, fifo := r.phase("alone"), r.phase("fair"), r.phase("fifo")
	if alone == nil || fair == nil || fifo == nil {
		return
	}
	fmt.Fprintln(w)
	for _, t := range []struct {
		name string
		p    *FairPhase
	}{{"fairness on", fair}, {"fairness off", fifo}} {
		ratio := float64(t.p.Light.Latency.P99) / float64(max(alone.Light.Latency.P99, 1))
		fmt.Fprintf(w, "%s: light p99 latency %s = %.2f× alone (%s): target ≤ 2×: %s\n", t.name,
			roundFair(t.p.Light.Latency.P99), ratio, roundFair(alone.Light.Latency.P99), metOr(ratio <= 2))
		served := float64(t.p.Light.OK) / float64(max(t.p.Light.Requests, 1))
		fmt.Fprintf(w, "%s: light served %d of %d (%.1f%%), %d slots of %d (%.1f%%); its weighted share is all it asks (%.0f%% of capacity < 50%%): target all served: %s\n",
			t.name, t.p.Light.OK, t.p.Light.Requests, 100*served, t.p.LightSlots, t.p.LightSlots+t.p.FloodSlots,
			100*float64(t.p.LightSlots)/float64(max(t.p.LightSlots+t.p.FloodSlots, 1)), c.Light*100, metOr(t.p.Light.OK == t.p.Light.Requests))
	}
}

func metOr(ok bool) string {
	if ok {
		return "met"
	}
	return "missed"
}

// roundFair shortens d for a table: to 0.1 ms below a second, else to 1 ms.
func roundFair(d time.Duration) time.Duration {
	if d < time.Second {
		return d.Round(100 * time.Microsecond)
	}
	return d.Round(time.Millisecond)
}
