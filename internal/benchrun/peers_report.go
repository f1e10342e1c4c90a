package benchrun

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
)

// The targets against the best peer of each row.
const (
	peersThroughputTarget = 1.2 // iop's req/s ≥ 1.2 × the best peer's
	peersCPUTarget        = 0.8 // iop's CPU a request ≤ 0.8 × the best peer's
)

// runs returns the runs of workload through gateway, in round order.
func (r PeersReport) runs(gateway, workload string) []PeerRun {
	var out []PeerRun
	for _, x := range r.Runs {
		if x.Gateway == gateway && x.Workload == workload {
			out = append(out, x)
		}
	}
	return out
}

// Throughput is the mean over rounds of the successful requests a second
// of workload through gateway; 0 when it was not measured.
func (r PeersReport) Throughput(gateway, workload string) float64 {
	return mean(r.runs(gateway, workload), func(x PeerRun) float64 { return x.Result.OKPerSecond })
}

// CPUPerRequest is the mean over rounds of the gateway's CPU time per
// request of workload, in microseconds; 0 for the direct baseline.
func (r PeersReport) CPUPerRequest(gateway, workload string) float64 {
	return mean(r.runs(gateway, workload), func(x PeerRun) float64 {
		if x.Result.Requests == 0 {
			return 0
		}
		return float64(x.CPU.Microseconds()) / float64(x.Result.Requests)
	})
}

// AddedP50 is the mean over rounds of the gateway's p50 latency of
// workload minus the mock model server's own (the direct runs').
func (r PeersReport) AddedP50(gateway, workload string) time.Duration {
	p50 := func(g string) float64 {
		return mean(r.runs(g, workload), func(x PeerRun) float64 { return float64(x.Result.Latency.P50) })
	}
	return time.Duration(p50(gateway) - p50(GatewayDirect))
}

// Failed counts the requests of gateway that did not succeed, over all runs.
func (r PeersReport) Failed(gateway string) (failed, total int) {
	for _, x := range r.Runs {
		if x.Gateway == gateway {
			failed += x.Result.Requests - x.Result.OK
			total += x.Result.Requests
		}
	}
	return failed, total
}

// LoadAvg is the lowest, mean and highest one-minute load average at the
// end of the runs.
func (r PeersReport) LoadAvg() (low, avg, high float64) {
	if len(r.Runs) == 0 {
		return 0, 0, 0
	}
	low, high = r.Runs[0].LoadAvg, r.Runs[0].LoadAvg
	for _, x := range r.Runs {
		low, high = min(low, x.LoadAvg), max(high, x.LoadAvg)
	}
	return low, mean(r.Runs, func(x PeerRun) float64 { return x.LoadAvg }), high
}

func mean[T any](xs []T, f func(T) float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	var sum float64
	for _, x := range xs {
		sum += f(x)
	}
	return sum / float64(len(xs))
}

// peerColumns are the table's gateways, in order, with their headings.
var peerColumns = []struct{ gateway, heading string }{
	{GatewayOlla, "Olla"},
	{GatewayBifrost, "Bifrost"},
	{GatewayIOP, "iop"},
	{GatewayIOPNormalized, "iop, normalized path (Ollama provider)"},
	{GatewayIOPInProcess, "iop, node in the edge's process (in memory)"},
}

// WriteTable writes the side-by-side table as Markdown: per workload req/s and
// CPU µs a request, the added p50 at one client, the resident memory after
// a round, each for Olla, Bifrost, iop (tunnel path) and iop on the
// normalized path, and iop's ratio to the best peer with the target met or
// missed; then the load averages and any failed requests.
func (r PeersReport) WriteTable(w io.Writer) {
	c := r.Config
	low, avg, high := r.LoadAvg()
	fmt.Fprintf(w, "%d rounds, each workload %s (after %s of warm-up) through every gateway in an order rotated each round; mock model server: iop sim, zero latency, %d-token answers; load average %.1f (%.1f–%.1f)\n\n",
		c.Rounds, c.Duration, c.Warmup, DefaultTokens, avg, low, high)
	var cols []string
	for _, col := range peerColumns {
		if slices.Contains(r.Gateways, col.gateway) {
			cols = append(cols, col.gateway)
		}
	}
	heading := func(g string) string {
		for _, col := range peerColumns {
			if col.gateway == g {
				return col.heading
			}
		}
		return g
	}
	var hs []string
	for _, g := range cols {
		hs = append(hs, heading(g))
	}
	fmt.Fprintf(w, "| workload | %s | iop ÷ best peer | target |\n", strings.Join(hs, " | "))
	fmt.Fprintf(w, "|---|%s---|---|\n", strings.Repeat("---|", len(cols)))
	peers := []string{}
	for _, g := range cols {
		if g == GatewayOlla || g == GatewayBifrost {
			peers = append(peers, g)
		}
	}
	// row writes one line; higher says whether more is better (the best
	// peer is then the highest); target is the ratio iop must reach.
	row := func(name string, value func(g string) float64, format func(float64) string, higher bool, target float64) {
		cells := make([]string, len(cols))
		for i, g := range cols {
			cells[i] = format(value(g))
		}
		ratio, verdict := "–", "–"
		if len(peers) > 0 && slices.Contains(cols, GatewayIOP) {
			best := value(peers[0])
			for _, p := range peers[1:] {
				if v := value(p); (higher && v > best) || (!higher && v < best) {
					best = v
				}
			}
			if best > 0 {
				x := value(GatewayIOP) / best
				ratio = fmt.Sprintf("%.2f×", x)
				if target > 0 {
					verdict = fmt.Sprintf("%s %.1f×: %s", map[bool]string{true: "≥", false: "≤"}[higher], target, metOr((higher && x >= target) || (!higher && x <= target)))
				}
			}
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s |\n", name, strings.Join(cells, " | "), ratio, verdict)
	}
	intf := func(v float64) string { return thousands(int64(v + 0.5)) }
	for _, wl := range c.Workloads {
		row("req/s, "+wl.Name, func(g string) float64 { return r.Throughput(g, wl.Name) }, intf, true, peersThroughputTarget)
		row("CPU µs/request, "+wl.Name, func(g string) float64 { return r.CPUPerRequest(g, wl.Name) }, intf, false, peersCPUTarget)
	}
	if len(c.Workloads) > 0 {
		one := c.Workloads[0]
		row("added p50, "+one.Name, func(g string) float64 { return float64(r.AddedP50(g, one.Name)) },
			func(v float64) string { return fmt.Sprintf("%.2f ms", v/1e6) }, false, 0)
	}
	rss := func(g string) float64 { return float64(slices.Max(append([]int64{0}, r.RSS[g]...))) }
	cells := make([]string, len(cols))
	for i, g := range cols {
		if len(r.RSS[g]) > 0 {
			cells[i] = fmt.Sprintf("%.0f–%.0f MiB", mb(slices.Min(r.RSS[g])), mb(slices.Max(r.RSS[g])))
		}
	}
	ratio := "–"
	if len(peers) > 0 && len(r.RSS[GatewayIOP]) > 0 {
		best := rss(peers[0])
		for _, p := range peers[1:] {
			best = min(best, rss(p))
		}
		if best > 0 {
			ratio = fmt.Sprintf("%.1f×", rss(GatewayIOP)/best)
		}
	}
	fmt.Fprintf(w, "| resident memory after a round (iop: edge + node) | %s | %s | ≤ 50 MiB: %s |\n", strings.Join(cells, " | "), ratio,
		metOr(len(r.RSS[GatewayIOP]) > 0 && rss(GatewayIOP) <= 50<<20))
	fmt.Fprintln(w)
	for _, g := range append([]string{GatewayDirect}, cols...) {
		if f, n := r.Failed(g); f > 0 {
			fmt.Fprintf(w, "%s: %d of %d requests failed\n", g, f, n)
		}
	}
	for _, g := range []string{GatewayOlla, GatewayBifrost} {
		if why, ok := r.Missing[g]; ok {
			fmt.Fprintf(w, "%s not measured: %s\n", g, why)
		}
	}
}

// thousands formats n with commas between groups of three digits.
func thousands(n int64) string {
	s := fmt.Sprint(n)
	if n < 0 {
		return "-" + thousands(-n)
	}
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}
