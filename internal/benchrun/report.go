package benchrun

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"
)

// Targets of the benchmarks issue, on a 2-core machine with the simulator at
// zero latency.
const (
	targetAddedP50      = 250 * time.Microsecond // concurrency 1, non-streamed
	targetAddedP99      = time.Millisecond       // concurrency 1, non-streamed
	targetThroughput    = 3000.0                 // requests/s, concurrency 32, non-streamed
	targetRatio         = 0.5                    // of the direct figure, concurrency 32, non-streamed
	targetChunks        = 50000.0                // chunks/s through edge + node, streamed
	targetAddedTTFT     = 300 * time.Microsecond // p50, streamed, concurrency 1
	targetRSS           = 100 << 20              // bytes, with 10,000 queued waiters
	targetPerWaiter     = 4 << 10                // bytes per queued waiter
	targetConcurrencyLo = 1
	targetConcurrencyHi = 32
)

// WriteTable writes the report as a table, then each target of the
// benchmarks issue with the figure it is checked against.
func (r Report) WriteTable(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "path\tstream\tconc\tdirect req/s\tthrough req/s\tratio\tadded p50\tadded p99\tadded ttft p50\tthrough chunks/s\tedge cpu/req\tnode cpu/req\t")
	for _, c := range r.Cells {
		p50, p99 := c.AddedLatency()
		ttft, chunks := "-", "-"
		if c.Stream {
			t50, _ := c.AddedTTFT()
			ttft, chunks = us(t50), fmt.Sprintf("%.0f", c.Through.ChunksPerSecond)
		}
		e, n := c.CPUPerRequest()
		fmt.Fprintf(tw, "%s\t%v\t%d\t%.0f\t%.0f\t%.2f\t%s\t%s\t%s\t%s\t%s\t%s\t\n", c.Path, c.Stream, c.Concurrency,
			c.Direct.OKPerSecond, c.Through.OKPerSecond, c.ThroughputRatio(), us(p50), us(p99), ttft, chunks, us(e), us(n))
	}
	tw.Flush()
	if r.Memory != nil {
		m := r.Memory
		fmt.Fprintf(w, "\nedge memory: %.1f MB idle, %.1f MB with %d queued requests: %.0f bytes per queued request\n",
			mb(m.IdleRSS), mb(m.QueuedRSS), m.Waiters, m.PerWaiter())
	}
	fmt.Fprintln(w, "\ntargets:")
	for _, t := range r.targets() {
		verdict := "met"
		if !t.met {
			verdict = "MISSED"
		}
		fmt.Fprintf(w, "  %-6s %-62s %s\n", verdict, t.name, t.figure)
	}
	for _, f := range r.Profiles {
		fmt.Fprintf(w, "profile: %s\n", f)
	}
}

// us formats d in microseconds.
func us(d time.Duration) string {
	return fmt.Sprintf("%.0fµs", float64(d)/float64(time.Microsecond))
}

type target struct {
	name, figure string
	met          bool
}

// targets checks every target on each execution path measured.
func (r Report) targets() []target {
	var out []target
	find := func(path string, stream bool, conc int) (Cell, bool) {
		for _, c := range r.Cells {
			if c.Path == path && c.Stream == stream && c.Concurrency == conc {
				return c, true
			}
		}
		return Cell{}, false
	}
	for _, path := range []string{"tunnel", "normalized"} {
		if c, ok := find(path, false, targetConcurrencyLo); ok {
			p50, p99 := c.AddedLatency()
			out = append(out,
				target{path + ": added latency p50 ≤ 250µs (c=1, non-streamed)", us(p50), p50 <= targetAddedP50},
				target{path + ": added latency p99 ≤ 1ms (c=1, non-streamed)", us(p99), p99 <= targetAddedP99})
		}
		if c, ok := find(path, false, targetConcurrencyHi); ok {
			out = append(out,
				target{path + ": throughput ≥ 3,000 req/s (c=32, non-streamed)", fmt.Sprintf("%.0f req/s", c.Through.OKPerSecond), c.Through.OKPerSecond >= targetThroughput},
				target{path + ": throughput ≥ 50% of direct (c=32, non-streamed)", fmt.Sprintf("%.0f%%", 100*c.ThroughputRatio()), c.ThroughputRatio() >= targetRatio})
		}
		if c, ok := find(path, true, targetConcurrencyHi); ok {
			out = append(out, target{path + ": ≥ 50,000 chunks/s (c=32, streamed)", fmt.Sprintf("%.0f chunks/s", c.Through.ChunksPerSecond), c.Through.ChunksPerSecond >= targetChunks})
		}
		if c, ok := find(path, true, targetConcurrencyLo); ok {
			t50, _ := c.AddedTTFT()
			out = append(out, target{path + ": added ttft p50 ≤ 300µs (c=1, streamed)", us(t50), t50 <= targetAddedTTFT})
		}
	}
	if m := r.Memory; m != nil {
		out = append(out,
			target{fmt.Sprintf("edge RSS ≤ 100 MB with %d queued", m.Waiters), fmt.Sprintf("%.1f MB", mb(m.QueuedRSS)), m.QueuedRSS <= targetRSS},
			target{"≤ 4 KB per queued request", fmt.Sprintf("%.0f B", m.PerWaiter()), m.PerWaiter() <= targetPerWaiter})
	}
	return out
}
