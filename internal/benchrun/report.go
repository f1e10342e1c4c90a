package benchrun

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"
)

// The overhead targets (BENCHMARKS.md), on a 2-core machine with the
// simulator at zero latency.
const (
	targetCPULo        = 200 * time.Microsecond // edge + node per request, c=1, non-streamed
	targetCPUHi        = 150 * time.Microsecond // edge + node per request, c=32, non-streamed
	targetCPUStream    = 250 * time.Microsecond // edge + node per 20-chunk streamed request, c=8
	targetAddedP50     = 200 * time.Microsecond // c=1, non-streamed
	targetAddedP99     = time.Millisecond       // c=1, non-streamed
	targetAddedTTFT    = 250 * time.Microsecond // p50, c=1, streamed
	targetSpeedup      = 2.0                    // × the baseline's requests/s, c=32, non-streamed
	targetPerWaiter    = 12000                  // bytes of edge RSS per queued request, 10,000 queued
	targetWaiterBytes  = 1000                   // bytes of it in the scheduler's waiter
	targetSchedulerOp  = time.Microsecond       // AdmitRelease at 10 and 10,000 waiters
	targetSchedulerRel = 2.0                    // AdmitRelease at 10,000 within this factor of 10 ("flat")

	targetConcLo     = 1  // "1 client"
	targetConcHi     = 32 // "32 clients"
	targetConcStream = 8  // "streamed (20 chunks), 8 clients"
)

// The earlier targets the overhead targets did not replace.
const (
	targetRatio  = 0.5       // of the direct figure, c=32, non-streamed
	targetChunks = 50000.0   // chunks/s through edge + node, c=32, streamed
	targetRSS    = 100 << 20 // bytes of edge RSS with 10,000 queued
)

// Baseline is the make bench figure the throughput targets multiply:
// requests/s through edge + node, non-streamed, 32 clients, measured at
// main 605d215 (`bin/iop bench --overhead`, load average about 2; 16-token
// answers). Throughput targets are targetSpeedup times these.
var Baseline = struct {
	Commit                   string
	TunnelRPS, NormalizedRPS float64
}{Commit: "605d215", TunnelRPS: 1599, NormalizedRPS: 1179}

func baselineRPS(path string) float64 {
	if path == "normalized" {
		return Baseline.NormalizedRPS
	}
	return Baseline.TunnelRPS
}

// WriteTable writes the report as a table, then each overhead target
// with the figure it is checked against, met or missed and by how much.
func (r Report) WriteTable(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "path\tstream\tconc\tdirect req/s\tthrough req/s\tratio\tadded p50\tadded p99\tadded ttft p50\tthrough chunks/s\tedge cpu/req\tnode cpu/req\tgateway cpu/req\t")
	for _, c := range r.Cells {
		p50, p99 := c.AddedLatency()
		ttft, chunks := "-", "-"
		if c.Stream {
			t50, _ := c.AddedTTFT()
			ttft, chunks = us(t50), fmt.Sprintf("%.0f", c.Through.ChunksPerSecond)
		}
		e, n := c.CPUPerRequest()
		fmt.Fprintf(tw, "%s\t%v\t%d\t%.0f\t%.0f\t%.2f\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", c.Path, c.Stream, c.Concurrency,
			c.Direct.OKPerSecond, c.Through.OKPerSecond, c.ThroughputRatio(), us(p50), us(p99), ttft, chunks, us(e), us(n), us(e+n))
	}
	tw.Flush()
	if m := r.Memory; m != nil {
		heap, stack, gs := m.PerWaiterRuntime()
		fmt.Fprintf(w, "\nedge memory: %.1f MB idle, %.1f MB with %d queued requests: %.0f bytes per queued request\n",
			mb(m.IdleRSS), mb(m.QueuedRSS), m.Waiters, m.PerWaiter())
		fmt.Fprintf(w, "  of which, per queued request (edge runtime after a GC): live heap %.0f B, goroutine stacks %.0f B, %.2f goroutines\n",
			heap, stack, gs)
	}
	if c := r.ContentLength; c != nil {
		fmt.Fprintf(w, "\nnon-streamed tunnel answer: Content-Length direct %s, through %s (body %d bytes)\n",
			contentLength(c.Direct), contentLength(c.Through), c.ThroughBody)
	}
	fmt.Fprintln(w, "\ntargets:")
	writeTargets(w, r.targets())
	if old := r.earlierTargets(); len(old) > 0 {
		fmt.Fprintln(w, "\nearlier targets still standing:")
		writeTargets(w, old)
	}
	for _, f := range r.Profiles {
		fmt.Fprintf(w, "profile: %s\n", f)
	}
}

func writeTargets(w io.Writer, ts []target) {
	for _, t := range ts {
		verdict := "met"
		if !t.met {
			verdict = "MISSED"
		}
		fmt.Fprintf(w, "  %-6s %-90s %-24s %s\n", verdict, t.name, t.figure, t.by)
	}
}

func contentLength(n int64) string {
	if n < 0 {
		return "none (chunked)"
	}
	return fmt.Sprint(n)
}

// us formats d in microseconds.
func us(d time.Duration) string {
	return fmt.Sprintf("%.0fµs", float64(d)/float64(time.Microsecond))
}

type target struct {
	name, figure string
	met          bool
	by           string // how far under or over the bound
}

// Target is one target checked against its figure, as WriteTable prints
// it.
type Target struct {
	Name   string `json:"name"`
	Figure string `json:"figure"`
	Met    bool   `json:"met"`
	// By says how far under or over the bound the figure is.
	By string `json:"by,omitempty"`
	// Earlier marks an earlier target the overhead targets left
	// standing.
	Earlier bool `json:"earlier,omitempty"`
}

// Targets returns every overhead target the report has a figure for,
// then the earlier ones still standing.
func (r Report) Targets() []Target {
	var out []Target
	for i, ts := range [][]target{r.targets(), r.earlierTargets()} {
		for _, t := range ts {
			out = append(out, Target{Name: t.name, Figure: t.figure, Met: t.met, By: t.by, Earlier: i == 1})
		}
	}
	return out
}

// atMost is the target "v ≤ bound".
func atMost(name, figure string, v, bound float64) target {
	t := target{name: name, figure: figure, met: v <= bound}
	switch {
	case t.met && bound > 0:
		t.by = fmt.Sprintf("%.0f%% under", 100*(bound-v)/bound)
	case t.met:
		t.by = "at the bound"
	default:
		t.by = fmt.Sprintf("missed by %.2f×", v/bound)
	}
	return t
}

// atLeast is the target "v ≥ bound".
func atLeast(name, figure string, v, bound float64) target {
	t := target{name: name, figure: figure, met: v >= bound}
	switch {
	case t.met:
		t.by = fmt.Sprintf("%.0f%% over", 100*(v-bound)/bound)
	case v > 0:
		t.by = fmt.Sprintf("missed by %.2f×", bound/v)
	default:
		t.by = "missed (none)"
	}
	return t
}

func (r Report) find(path string, stream bool, conc int) (Cell, bool) {
	for _, c := range r.Cells {
		if c.Path == path && c.Stream == stream && c.Concurrency == conc {
			return c, true
		}
	}
	return Cell{}, false
}

// targets checks every overhead target that the report has a figure
// for, on each execution path measured.
func (r Report) targets() []target {
	var out []target
	cpu := func(path, workload string, c Cell, bound time.Duration) target {
		e, n := c.CPUPerRequest()
		return atMost(fmt.Sprintf("%s: gateway CPU ≤ %s/request (edge + node, %s)", path, us(bound), workload),
			fmt.Sprintf("%s (%s + %s)", us(e+n), us(e), us(n)), float64(e+n), float64(bound))
	}
	for _, path := range []string{"tunnel", "normalized"} {
		if c, ok := r.find(path, false, targetConcLo); ok {
			p50, p99 := c.AddedLatency()
			out = append(out,
				cpu(path, "c=1, non-streamed", c, targetCPULo),
				atMost(path+": added latency p50 ≤ 200µs (c=1, non-streamed)", us(p50), float64(p50), float64(targetAddedP50)),
				atMost(path+": added latency p99 ≤ 1ms (c=1, non-streamed)", us(p99), float64(p99), float64(targetAddedP99)))
		}
		if c, ok := r.find(path, false, targetConcHi); ok {
			base := baselineRPS(path)
			out = append(out,
				cpu(path, "c=32, non-streamed", c, targetCPUHi),
				atLeast(fmt.Sprintf("%s: throughput ≥ 2× %.0f = %.0f req/s (c=32, non-streamed; %.0f at %s)", path, base, targetSpeedup*base, base, Baseline.Commit),
					fmt.Sprintf("%.0f req/s (%.2f×)", c.Through.OKPerSecond, c.Through.OKPerSecond/base), c.Through.OKPerSecond, targetSpeedup*base))
		}
		if c, ok := r.find(path, true, targetConcLo); ok {
			t50, _ := c.AddedTTFT()
			out = append(out, atMost(path+": added ttft p50 ≤ 250µs (c=1, streamed)", us(t50), float64(t50), float64(targetAddedTTFT)))
		}
		if c, ok := r.find(path, true, targetConcStream); ok {
			out = append(out, cpu(path, "c=8, streamed", c, targetCPUStream))
		}
	}
	if m := r.Memory; m != nil {
		out = append(out, atMost(fmt.Sprintf("≤ 12 KB edge RSS per queued request (%d queued)", m.Waiters),
			fmt.Sprintf("%.0f B", m.PerWaiter()), m.PerWaiter(), targetPerWaiter))
	}
	if v, ok := r.goBench("BenchmarkQueuedWaiterMemory", "B/waiter"); ok {
		out = append(out, atMost("≤ 1 KB of it in the scheduler's waiter (10000 queued)", fmt.Sprintf("%.0f B", v), v, targetWaiterBytes))
	}
	if c := r.ContentLength; c != nil {
		t := target{name: "a non-streamed passthrough answer keeps the provider's Content-Length", figure: "no", by: "through: " + contentLength(c.Through)}
		if c.Kept() {
			t.figure, t.met, t.by = "yes", true, ""
		}
		out = append(out, t)
	}
	lo, okLo := r.goBench("BenchmarkAdmitRelease/waiters=10", "ns/op")
	hi, okHi := r.goBench("BenchmarkAdmitRelease/waiters=10000", "ns/op")
	if okLo && okHi {
		ns := float64(targetSchedulerOp)
		out = append(out,
			atMost("scheduler AdmitRelease < 1µs (10 waiters)", fmt.Sprintf("%.0f ns", lo), lo, ns),
			atMost("scheduler AdmitRelease < 1µs (10000 waiters)", fmt.Sprintf("%.0f ns", hi), hi, ns),
			atMost("scheduler AdmitRelease flat: 10000 waiters within 2× of 10", fmt.Sprintf("%.2f×", hi/lo), hi/lo, targetSchedulerRel))
	}
	return out
}

// earlierTargets checks the earlier targets still standing: the
// throughput ratio, chunks/s and edge RSS (their latency, throughput, TTFT
// and per-request memory bounds were replaced by the overhead targets).
func (r Report) earlierTargets() []target {
	var out []target
	for _, path := range []string{"tunnel", "normalized"} {
		if c, ok := r.find(path, false, targetConcHi); ok {
			out = append(out, atLeast(path+": throughput ≥ 50% of direct (c=32, non-streamed)",
				fmt.Sprintf("%.0f%%", 100*c.ThroughputRatio()), c.ThroughputRatio(), targetRatio))
		}
		if c, ok := r.find(path, true, targetConcHi); ok {
			out = append(out, atLeast(path+": ≥ 50,000 chunks/s (c=32, streamed)",
				fmt.Sprintf("%.0f chunks/s", c.Through.ChunksPerSecond), c.Through.ChunksPerSecond, targetChunks))
		}
	}
	if m := r.Memory; m != nil {
		out = append(out, atMost(fmt.Sprintf("edge RSS ≤ 100 MB with %d queued", m.Waiters),
			fmt.Sprintf("%.1f MB", mb(m.QueuedRSS)), float64(m.QueuedRSS), targetRSS))
	}
	return out
}
