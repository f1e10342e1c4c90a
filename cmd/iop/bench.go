package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"

	"github.com/spf13/cobra"

	"iop/internal/benchrun"
	"iop/internal/loadgen"
)

// benchFlags are the flags of `iop bench`.
type benchFlags struct {
	load       loadgen.Config
	api        string
	apiKey     string
	jsonOut    bool
	quiet      bool
	overhead   bool
	waiters    int
	profileDir string
	goBench    string
	memoryOnly bool
	gateway    string
	fair       fairFlags
	batch      batchFlags
	peers      peersFlags
	residency  residencyFlags
	prefix     bool
	prefixCfg  benchrun.PrefixConfig
	// prefixSlack is --prefix-load-slack; negative means the edge's default.
	prefixSlack float64
}

func newBenchCommand(_ *string) *cobra.Command {
	f := benchFlags{
		load: loadgen.Config{URL: "http://127.0.0.1:8080", PromptChars: loadgen.DefaultPromptChars, Duration: 10 * time.Second,
			Timeout: loadgen.DefaultTimeout, MaxInFlight: loadgen.DefaultMaxInFlight},
		api:     string(loadgen.APIOpenAI),
		waiters: benchrun.DefaultWaiters,
	}
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Load an OpenAI- or Ollama-compatible chat endpoint and report throughput and latency",
		Long: `Load an OpenAI-compatible (POST /v1/chat/completions) or Ollama-compatible
(POST /api/chat) chat endpoint with a fixed concurrency (closed loop) or a
fixed rate (open loop), for a duration or a request count, and report
throughput, latency, time to first token and inter-token latency percentiles,
and outcomes by status. A progress line goes to stderr.

With --overhead it runs the overhead benchmark instead (make bench): iop sim,
iop edge and iop node as separate processes of this binary, the same load
directly against the simulator and through edge + node (non-streamed at 1
and 32 clients, streamed with 20 chunks per answer at 1 and 8 clients, on the
tunnel and the normalized path), whether a non-streamed answer keeps its
Content-Length, and the edge's memory with --waiters queued requests; it
prints each figure with its target, met or missed and by how much.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if f.overhead {
				return runOverhead(cmd, f)
			}
			if f.fair.on {
				return runFair(cmd, f)
			}
			if f.batch.on {
				return runBatch(cmd, f)
			}
			if f.peers.on {
				return runPeers(cmd, f)
			}
			if f.residency.on {
				return runResidency(cmd, f)
			}
			if f.prefix {
				return runPrefixCompare(cmd, f)
			}
			return runBench(cmd, f)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.load.URL, "url", f.load.URL, "server root, http://host:port")
	fl.StringVar(&f.api, "api", f.api, "endpoint protocol: openai (/v1/chat/completions) or ollama (/api/chat)")
	fl.StringVar(&f.load.Model, "model", "", "model every request names")
	fl.BoolVar(&f.load.Stream, "stream", false, "ask for streamed answers")
	fl.IntVar(&f.load.PromptChars, "prompt-chars", f.load.PromptChars, "size of the user message, in bytes")
	fl.IntVar(&f.load.MaxTokens, "max-tokens", 0, "cap each answer at this many tokens (0 = the server's default)")
	fl.IntVarP(&f.load.Concurrency, "concurrency", "c", 0, "closed loop: requests in flight (default 1 unless --rate)")
	fl.Float64Var(&f.load.Rate, "rate", 0, "open loop: requests started per second, on a fixed schedule")
	fl.IntVar(&f.load.MaxInFlight, "max-in-flight", f.load.MaxInFlight, "open loop: most requests in flight; more are dropped and counted")
	fl.DurationVarP(&f.load.Duration, "duration", "d", f.load.Duration, "run length (0 = until --requests; with --overhead: each measured run, 5s unless set)")
	fl.IntVarP(&f.load.Requests, "requests", "n", 0, "stop after this many requests (0 = until --duration)")
	fl.DurationVar(&f.load.Timeout, "timeout", f.load.Timeout, "bound of one request")
	fl.StringVar(&f.apiKey, "api-key", "", "send Authorization: Bearer KEY")
	fl.BoolVar(&f.jsonOut, "json", false, "print the result as JSON")
	fl.BoolVarP(&f.quiet, "quiet", "q", false, "no progress line")
	fl.BoolVar(&f.overhead, "overhead", false, "run the edge + node overhead benchmark (Linux; starts its own sim, edge and node)")
	fl.IntVar(&f.waiters, "waiters", f.waiters, "with --overhead: queued requests of the memory phase (negative skips it)")
	fl.StringVar(&f.profileDir, "profile-dir", "", "with --overhead: write CPU profiles of the edge and node here")
	fl.BoolVar(&f.memoryOnly, "memory-only", false, "with --overhead: only the memory phase and the Content-Length check, no load workload")
	fl.StringVar(&f.gateway, "gateway-binary", "", "with --overhead: run the edge and the node from this iop binary (e.g. another commit's build) under this one's simulators and load")
	fl.StringVar(&f.load.Workload, "workload", loadgen.WorkloadFixed, "fixed (one message, every request alike) or sessions (conversations growing turn by turn; see --sessions)")
	fl.IntVar(&f.load.Sessions, "sessions", 0, "with --workload sessions or --prefix-compare: conversations (default 32 with --prefix-compare)")
	fl.IntVar(&f.load.Turns, "turns", 0, "with --workload sessions or --prefix-compare: turns of each conversation (default 8 with --prefix-compare)")
	fl.IntVar(&f.load.SharedPrefixTokens, "shared-prefix-tokens", 0, "with --workload sessions or --prefix-compare: words of the system prompt every conversation shares (default 2000 with --prefix-compare)")
	fl.IntVar(&f.load.TurnTokens, "turn-tokens", 0, "with --workload sessions or --prefix-compare: words of each user message (default 64; 100 with --prefix-compare)")
	fl.BoolVar(&f.prefix, "prefix-compare", false, "run the prefix-routing benchmark (Linux): its own 4 caching sims, edge and node, the sessions workload with routing least_loaded then prefix")
	fl.IntVar(&f.prefixCfg.Providers, "providers", 0, "with --prefix-compare: simulated providers (default 4)")
	fl.IntVar(&f.prefixCfg.Capacity, "capacity", 0, "with --prefix-compare: capacity of each provider (default 4)")
	fl.IntVar(&f.prefixCfg.CacheTokens, "prefix-cache-tokens", 0, "with --prefix-compare: each simulator's prefix cache, in tokens (default 100000)")
	fl.Float64Var(&f.prefixCfg.PrefillRate, "prefill-tokens-per-second", 0, "with --prefix-compare: the simulators' prefill rate (default 5000)")
	fl.Float64Var(&f.prefixSlack, "prefix-load-slack", -1, "with --prefix-compare: the edge's prefix_load_slack (default: the edge's default, 0.5)")
	fl.StringVar(&f.goBench, "go-bench", "", "with --overhead: a `file` of go test -bench output whose scheduler figures (waiter bytes, AdmitRelease) are checked against their targets too")
	f.fair.register(fl)
	f.batch.register(fl)
	f.peers.register(fl)
	f.residency.register(fl)
	return cmd
}

func runBench(cmd *cobra.Command, f benchFlags) error {
	cfg := f.load
	cfg.API = loadgen.API(f.api)
	if cfg.Rate == 0 && cfg.Concurrency == 0 {
		cfg.Concurrency = 1
	}
	if cfg.Workload == loadgen.WorkloadSessions && !cmd.Flags().Changed("duration") {
		cfg.Duration = 0 // until every session had its turns
	}
	if f.apiKey != "" {
		cfg.Header = http.Header{"Authorization": {"Bearer " + f.apiKey}}
	}
	ctx, stop := signalContext(cmd.Context())
	defer stop()
	var progress func(loadgen.Progress)
	if !f.quiet {
		progress = func(p loadgen.Progress) {
			fmt.Fprintf(os.Stderr, "\r%5.0fs  %d requests (%d ok), %d in flight, %.0f/s   ",
				p.Elapsed.Seconds(), p.Requests, p.OK, p.InFlight, float64(p.Requests)/p.Elapsed.Seconds())
		}
	}
	res, err := loadgen.Run(ctx, cfg, progress)
	if progress != nil {
		fmt.Fprintln(os.Stderr)
	}
	if err != nil {
		return err
	}
	if f.jsonOut {
		enc := json.NewEncoder(cmd.OutOrStdout())
		enc.SetIndent("", "  ")
		return enc.Encode(res)
	}
	res.WriteText(cmd.OutOrStdout())
	if res.OK == 0 {
		return errors.New("no request succeeded")
	}
	return nil
}

func runPrefixCompare(cmd *cobra.Command, f benchFlags) error {
	own, err := ownRunOf(cmd, f)
	if err != nil {
		return err
	}
	cfg := f.prefixCfg
	cfg.Binary, cfg.Log = own.binary, own.log
	cfg.Sessions, cfg.Turns, cfg.SharedPrefixTokens, cfg.TurnTokens = f.load.Sessions, f.load.Turns, f.load.SharedPrefixTokens, f.load.TurnTokens
	cfg.Concurrency, cfg.AnswerTokens = f.load.Concurrency, f.load.MaxTokens
	if f.prefixSlack >= 0 {
		cfg.LoadSlack = &f.prefixSlack
	}
	ctx, stop := signalContext(cmd.Context())
	defer stop()
	rep, err := benchrun.PrefixCompare(ctx, cfg)
	if err != nil {
		return err
	}
	return writeReport(cmd, f, rep, rep.WriteText)
}

func runOverhead(cmd *cobra.Command, f benchFlags) error {
	own, err := ownRunOf(cmd, f)
	if err != nil {
		return err
	}
	cfg := benchrun.Config{Binary: own.binary, Duration: own.duration, Waiters: f.waiters, ProfileDir: f.profileDir, GoBenchOutput: f.goBench, MemoryOnly: f.memoryOnly, GatewayBinary: f.gateway, Log: own.log}
	if cfg.ProfileDir != "" {
		if err := os.MkdirAll(cfg.ProfileDir, 0o755); err != nil {
			return err
		}
	}
	ctx, stop := signalContext(cmd.Context())
	defer stop()
	rep, err := benchrun.Overhead(ctx, cfg)
	if err != nil {
		return err
	}
	return writeReport(cmd, f, struct {
		benchrun.Report
		Targets []benchrun.Target `json:"targets"`
	}{rep, rep.Targets()}, rep.WriteTable)
}

// ownRun is what a benchmark that starts its own sims, edges and nodes
// takes from the command line: this executable, which it runs as each of
// them; --duration when it was given (0: the benchmark's own default);
// where its progress goes (nil with --quiet).
type ownRun struct {
	binary   string
	duration time.Duration
	log      io.Writer
}

func ownRunOf(cmd *cobra.Command, f benchFlags) (ownRun, error) {
	bin, err := os.Executable()
	if err != nil {
		return ownRun{}, err
	}
	own := ownRun{binary: bin}
	if cmd.Flags().Changed("duration") {
		own.duration = f.load.Duration
	}
	if !f.quiet {
		own.log = os.Stderr
	}
	return own, nil
}

// writeReport writes rep to the command's output: indented JSON with
// --json, else as table writes it.
func writeReport(cmd *cobra.Command, f benchFlags, rep any, table func(io.Writer)) error {
	if f.jsonOut {
		enc := json.NewEncoder(cmd.OutOrStdout())
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	table(cmd.OutOrStdout())
	return nil
}
