package benchrun

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"iop/internal/loadgen"
)

// PeersConfig is the side-by-side benchmark of iop against other gateways
// (make bench-peers): the same mock model server and the same loads
// through each. Zero fields take the defaults in brackets.
type PeersConfig struct {
	// Binary is the iop executable run as sim, edge and node. Required.
	Binary string
	// Olla and Bifrost are the peers' executables (Olla's main package;
	// Bifrost's transports/bifrost-http); "" leaves that peer out.
	Olla, Bifrost string
	// OllaDir is Olla's working directory, holding its config/profiles
	// (the root of its source tree) [the directory of Olla].
	OllaDir string
	// Rounds is the number of rounds [3]; every round measures every
	// workload through every gateway, in an order rotated each round.
	Rounds int
	// Duration is each measured run [15s], Warmup the run before it [2s].
	Duration, Warmup time.Duration
	// Workloads are the loads measured [PeerWorkloads].
	Workloads []PeerWorkload
	// Log receives a line per run; nil discards them.
	Log io.Writer
}

// PeerWorkload is one load of the side-by-side table.
type PeerWorkload struct {
	Name        string `json:"name"`
	Concurrency int    `json:"concurrency"`
	Stream      bool   `json:"stream"`
	// PromptChars is the size of the one user message, in bytes.
	PromptChars int `json:"prompt_chars"`
}

// PeerWorkloads are the side-by-side workloads: non-streamed at 1 and 32
// clients, streamed (20 chunks an answer) at 8, and an agent's 100 KB
// request at 8.
var PeerWorkloads = []PeerWorkload{
	{Name: "1 client", Concurrency: 1, PromptChars: loadgen.DefaultPromptChars},
	{Name: "32 clients", Concurrency: 32, PromptChars: loadgen.DefaultPromptChars},
	{Name: "streamed, 8 clients", Concurrency: 8, Stream: true, PromptChars: loadgen.DefaultPromptChars},
	{Name: "100 KB, 8 clients", Concurrency: 8, PromptChars: 100_000},
}

// Gateway names in PeersReport, in the table's column order. GatewayDirect
// is the mock model server itself: the baseline of the added latency.
const (
	GatewayDirect        = "direct"
	GatewayOlla          = "olla"
	GatewayBifrost       = "bifrost"
	GatewayIOP           = "iop"
	GatewayIOPNormalized = "iop-normalized"
	// GatewayIOPInProcess is iop's tunnel path with the provider served
	// by the edge itself (its providers: section): the node in the edge's
	// process, on the in-memory link.
	GatewayIOPInProcess = "iop-in-process"
)

// PeerRun is one measured run: a workload through a gateway in a round.
type PeerRun struct {
	Gateway  string         `json:"gateway"`
	Workload string         `json:"workload"`
	Round    int            `json:"round"`
	Result   loadgen.Result `json:"result"`
	// CPU is the gateway's processes' CPU time (user + system) during
	// the run; 0 for the direct baseline.
	CPU time.Duration `json:"cpu_ns"`
	// LoadAvg is the machine's one-minute load average at the run's end.
	LoadAvg float64 `json:"load_avg"`
}

// PeersReport is what Peers measured.
type PeersReport struct {
	Config PeersConfig `json:"-"`
	// Gateways are those measured, in column order.
	Gateways []string  `json:"gateways"`
	Runs     []PeerRun `json:"runs"`
	// RSS is each gateway's resident memory (bytes; edge + node for iop)
	// after each round, by gateway.
	RSS map[string][]int64 `json:"rss_bytes"`
	// Missing says, by peer, why it was left out (no executable given).
	Missing map[string]string `json:"missing,omitempty"`
}

// peerGateway is one gateway under load.
type peerGateway struct {
	name  string
	url   string // loadgen's root URL
	model string
	api   loadgen.API
	procs []*process // whose CPU and memory count; none for direct
}

// Model names of the peers benchmark. Bifrost names a model
// "provider/model" and sends the part after the slash.
const (
	peersModel        = "bench-openai"
	peersOllamaModel  = "bench-ollama"
	peersBifrostModel = "openai/" + peersModel
)

// Peers runs the side-by-side benchmark: one zero-latency `iop sim` of
// each protocol as the mock model server, iop (edge and node as separate
// processes; the tunnel path to the OpenAI simulator and, as its own edge
// and node, the normalized path to the Ollama one; and an edge serving the
// OpenAI simulator itself, its node in its process), Olla and Bifrost in
// front of the OpenAI simulator, and each workload through each of them
// (and directly against the simulator), round after round. Errors: a
// process that fails to start or exits, a gateway that does not answer
// within 60 s of its start, ctx's end. A run with failed requests is
// recorded, not an error.
func Peers(ctx context.Context, cfg PeersConfig) (PeersReport, error) {
	if cfg.Rounds == 0 {
		cfg.Rounds = 3
	}
	if cfg.Duration == 0 {
		cfg.Duration = 15 * time.Second
	}
	if cfg.Warmup == 0 {
		cfg.Warmup = 2 * time.Second
	}
	if len(cfg.Workloads) == 0 {
		cfg.Workloads = PeerWorkloads
	}
	if cfg.OllaDir == "" && cfg.Olla != "" {
		cfg.OllaDir = filepath.Dir(cfg.Olla)
	}
	if cfg.Log == nil {
		cfg.Log = io.Discard
	}
	rep := PeersReport{Config: cfg, RSS: map[string][]int64{}, Missing: map[string]string{}}
	dir, err := os.MkdirTemp("", "iop-bench-peers-")
	if err != nil {
		return rep, err
	}
	s := &setup{dir: dir}
	defer func() {
		for i := len(s.procs) - 1; i >= 0; i-- {
			s.procs[i].stop()
		}
	}()
	gws, err := startPeers(ctx, s, cfg, &rep)
	if err != nil {
		return rep, fmt.Errorf("%w (logs in %s)", err, dir)
	}
	for _, g := range gws {
		rep.Gateways = append(rep.Gateways, g.name)
	}
	fmt.Fprintf(cfg.Log, "peers: %s up; logs in %s\n", strings.Join(rep.Gateways, ", "), dir)

	for round := 1; round <= cfg.Rounds; round++ {
		for _, w := range cfg.Workloads {
			// Alternate: each round starts the workload at another
			// gateway, so none is always measured first (or last).
			for i := range gws {
				g := gws[(i+round-1)%len(gws)]
				run, err := peerRun(ctx, s, g, w, cfg)
				if err != nil {
					return rep, fmt.Errorf("round %d, %s through %s: %w (logs in %s)", round, w.Name, g.name, err, dir)
				}
				run.Round = round
				rep.Runs = append(rep.Runs, run)
				cpu := ""
				if len(g.procs) > 0 && run.Result.Requests > 0 {
					cpu = fmt.Sprintf(", %.0f µs CPU a request", float64(run.CPU.Microseconds())/float64(run.Result.Requests))
				}
				fmt.Fprintf(cfg.Log, "round %d %-20s %-15s %8.0f req/s, p50 %v%s, %d of %d ok, load %.1f\n", round, w.Name, g.name,
					run.Result.OKPerSecond, run.Result.Latency.P50.Round(time.Microsecond), cpu, run.Result.OK, run.Result.Requests, run.LoadAvg)
			}
		}
		for _, g := range gws {
			if len(g.procs) == 0 {
				continue
			}
			var sum int64
			for _, p := range g.procs {
				r, err := p.rss()
				if err != nil {
					return rep, err
				}
				sum += r
			}
			rep.RSS[g.name] = append(rep.RSS[g.name], sum)
			fmt.Fprintf(cfg.Log, "round %d %s resident memory %.1f MiB\n", round, g.name, mb(sum))
		}
	}
	os.RemoveAll(dir)
	return rep, nil
}

// startPeers starts the simulators and every gateway and waits until each
// answers a chat request.
func startPeers(ctx context.Context, s *setup, cfg PeersConfig, rep *PeersReport) ([]*peerGateway, error) {
	addr := func() string {
		a, err := freeAddr()
		if err != nil {
			panic(err) // a loopback port: only an exhausted machine fails here
		}
		return a
	}
	run := func(name, bin, wd string, env []string, args ...string) (*process, error) {
		p, err := startProcessIn(s.dir, name, bin, wd, env, args...)
		if err == nil {
			s.procs = append(s.procs, p)
		}
		return p, err
	}
	simOpenAI, simOllama := addr(), addr()
	tokens := strconv.Itoa(DefaultTokens)
	if _, err := run("sim-openai", cfg.Binary, "", nil, "sim", "--protocol", "openai", "--listen", simOpenAI, "--model", peersModel, "--default-max-tokens", tokens, "--log-level", "warn"); err != nil {
		return nil, err
	}
	if _, err := run("sim-ollama", cfg.Binary, "", nil, "sim", "--protocol", "ollama", "--listen", simOllama, "--model", peersOllamaModel, "--default-max-tokens", tokens, "--log-level", "warn"); err != nil {
		return nil, err
	}
	gws := []*peerGateway{{name: GatewayDirect, url: "http://" + simOpenAI, model: peersModel, api: loadgen.APIOpenAI}}

	if cfg.Olla == "" {
		rep.Missing[GatewayOlla] = "no executable (see make bench-peers: OLLA_COMMIT)"
	} else {
		a := addr()
		host, port, _ := strings.Cut(a, ":")
		conf := fmt.Sprintf(`server:
  host: %q
  port: %s
  request_logging: false
  rate_limits: {global_requests_per_minute: 0, per_ip_requests_per_minute: 0, health_requests_per_minute: 0, burst_size: 0}
proxy: {engine: olla, profile: auto, load_balancer: least-connections}
discovery:
  type: static
  static:
    endpoints:
      - {url: "http://%s", name: sim, type: openai-compatible, priority: 100, model_url: /v1/models, health_check_url: /v1/models, check_interval: 2s, check_timeout: 1s}
logging: {level: warn, format: json, output: stdout}
dashboard: {enabled: false}
`, host, port, simOpenAI)
		file := filepath.Join(s.dir, "olla.yaml")
		if err := os.WriteFile(file, []byte(conf), 0o600); err != nil {
			return nil, err
		}
		p, err := run("olla", cfg.Olla, cfg.OllaDir, []string{"OLLA_CONFIG_FILE=" + file})
		if err != nil {
			return nil, err
		}
		gws = append(gws, &peerGateway{name: GatewayOlla, url: "http://" + a + "/olla/openai", model: peersModel, api: loadgen.APIOpenAI, procs: []*process{p}})
	}

	if cfg.Bifrost == "" {
		rep.Missing[GatewayBifrost] = "no executable (see make bench-peers: BIFROST_COMMIT)"
	} else {
		a := addr()
		host, port, _ := strings.Cut(a, ":")
		appDir := filepath.Join(s.dir, "bifrost")
		if err := os.MkdirAll(appDir, 0o755); err != nil {
			return nil, err
		}
		// No config store and no log store: Bifrost keeps no request log
		// (iop's edge does keep its ledger); the provider's concurrency
		// above every load, so no request waits in Bifrost's queue.
		conf, _ := json.Marshal(map[string]any{
			"config_store": map[string]any{"enabled": false},
			"logs_store":   map[string]any{"enabled": false},
			"client":       map[string]any{"drop_excess_requests": false},
			"providers": map[string]any{"openai": map[string]any{
				"keys":                        []any{map[string]any{"name": "bench", "value": "sk-bench", "models": []string{peersModel}, "weight": 1}},
				"network_config":              map[string]any{"base_url": "http://" + simOpenAI, "default_request_timeout_in_seconds": 60},
				"concurrency_and_buffer_size": map[string]any{"concurrency": providerCapacity, "buffer_size": 4 * providerCapacity},
			}},
		})
		if err := os.WriteFile(filepath.Join(appDir, "config.json"), conf, 0o600); err != nil {
			return nil, err
		}
		p, err := run("bifrost", cfg.Bifrost, appDir, nil, "-host", host, "-port", port, "-app-dir", appDir, "-log-level", "warn")
		if err != nil {
			return nil, err
		}
		gws = append(gws, &peerGateway{name: GatewayBifrost, url: "http://" + a, model: peersBifrostModel, api: loadgen.APIOpenAI, procs: []*process{p}})
	}

	// iop: one edge and one node per path, so each path's memory is its own.
	for _, path := range []struct{ name, provider, model string }{
		{GatewayIOP, fmt.Sprintf(`{id: sim, type: sim, protocol: openai, base_url: "http://%s/v1", models: [%s], capacity: %d}`, simOpenAI, peersModel, providerCapacity), peersModel},
		{GatewayIOPNormalized, fmt.Sprintf(`{id: sim, type: sim, protocol: ollama, base_url: "http://%s", models: [%s], capacity: %d}`, simOllama, peersOllamaModel, providerCapacity), peersOllamaModel},
	} {
		edgeHTTP, edgeNode := addr(), addr()
		edge, err := run(path.name+"-edge", cfg.Binary, "", nil, "edge", "--listen", edgeHTTP, "--node-listen", edgeNode,
			"--database", filepath.Join(s.dir, path.name+".db"), "--log-level", "warn")
		if err != nil {
			return nil, err
		}
		nodeFile := filepath.Join(s.dir, path.name+"-node.yaml")
		conf := fmt.Sprintf("node_id: bench\nedge: %s\nproviders:\n  - %s\n", edgeNode, path.provider)
		if err := os.WriteFile(nodeFile, []byte(conf), 0o600); err != nil {
			return nil, err
		}
		node, err := run(path.name+"-node", cfg.Binary, "", nil, "node", "--config", nodeFile, "--log-level", "warn")
		if err != nil {
			return nil, err
		}
		gws = append(gws, &peerGateway{name: path.name, url: "http://" + edgeHTTP, model: path.model, api: loadgen.APIOpenAI, procs: []*process{edge, node}})
	}

	// iop, the provider served by the edge itself: one process.
	edgeHTTP := addr()
	edgeFile := filepath.Join(s.dir, GatewayIOPInProcess+"-edge.yaml")
	conf := fmt.Sprintf("providers:\n  - {id: sim, type: sim, protocol: openai, base_url: \"http://%s/v1\", models: [%s], capacity: %d}\n", simOpenAI, peersModel, providerCapacity)
	if err := os.WriteFile(edgeFile, []byte(conf), 0o600); err != nil {
		return nil, err
	}
	inProcess, err := run(GatewayIOPInProcess, cfg.Binary, "", nil, "edge", "--config", edgeFile, "--listen", edgeHTTP, "--node-listen", addr(),
		"--database", filepath.Join(s.dir, GatewayIOPInProcess+".db"), "--log-level", "warn")
	if err != nil {
		return nil, err
	}
	gws = append(gws, &peerGateway{name: GatewayIOPInProcess, url: "http://" + edgeHTTP, model: peersModel, api: loadgen.APIOpenAI, procs: []*process{inProcess}})

	// A peer that does not come up is left out (Missing says why); iop
	// and the simulators must.
	var up []*peerGateway
	for _, g := range gws {
		lc := loadgen.Config{URL: g.url, API: g.api, Model: g.model, Concurrency: 1, Requests: 1, Timeout: 5 * time.Second}
		peer := g.name == GatewayOlla || g.name == GatewayBifrost
		procs := s.procs
		if peer {
			procs = g.procs
		}
		err := waitFor(ctx, time.Minute, procs, func() error {
			res, err := loadgen.Run(ctx, lc, nil)
			if err == nil && res.OK != 1 {
				err = fmt.Errorf("%s does not answer yet: %v %v", g.name, res.Outcomes, res.Errors)
			}
			return err
		})
		switch {
		case err == nil:
			up = append(up, g)
		case peer && ctx.Err() == nil:
			g.procs[0].stop()
			s.procs = slices.DeleteFunc(s.procs, func(p *process) bool { return p == g.procs[0] })
			rep.Missing[g.name] = fmt.Sprintf("did not come up: %v; its log ends: %s", err, tail(g.procs[0].log, 500))
		default:
			return nil, err
		}
	}
	return up, nil
}

// peerRun warms g up with w, then measures w through it.
func peerRun(ctx context.Context, s *setup, g *peerGateway, w PeerWorkload, cfg PeersConfig) (PeerRun, error) {
	out := PeerRun{Gateway: g.name, Workload: w.Name}
	lc := loadgen.Config{URL: g.url, API: g.api, Model: g.model, Stream: w.Stream, PromptChars: w.PromptChars,
		Concurrency: w.Concurrency, Client: loadgen.NewClient(w.Concurrency)}
	defer lc.Client.CloseIdleConnections()
	lc.Duration = cfg.Warmup
	if _, err := loadgen.Run(ctx, lc, nil); err != nil {
		return out, err
	}
	cpu := func() (time.Duration, error) {
		var sum time.Duration
		for _, p := range g.procs {
			t, err := p.cpuTime()
			if err != nil {
				return 0, err
			}
			sum += t
		}
		return sum, nil
	}
	cpu0, err := cpu()
	if err != nil {
		return out, err
	}
	lc.Duration = cfg.Duration
	if out.Result, err = loadgen.Run(ctx, lc, nil); err != nil {
		return out, err
	}
	cpu1, err := cpu()
	if err != nil {
		return out, err
	}
	out.CPU = cpu1 - cpu0
	out.LoadAvg, _ = loadAvg()
	for _, p := range s.procs {
		if err := p.exited(); err != nil {
			return out, err
		}
	}
	return out, ctx.Err()
}

// loadAvg returns the machine's one-minute load average, the first field
// of /proc/loadavg (proc(5)).
func loadAvg() (float64, error) {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0, err
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0, errors.New("empty /proc/loadavg")
	}
	return strconv.ParseFloat(f[0], 64)
}
