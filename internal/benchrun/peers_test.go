package benchrun

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"iop/internal/loadgen"
)

// The table takes means over rounds, compares iop with the best peer of
// each row (the highest req/s, the lowest CPU) and says which target is
// met; the added p50 is against the direct runs.
func TestPeersTable(t *testing.T) {
	w := PeerWorkload{Name: "1 client", Concurrency: 1}
	run := func(g string, round int, rps float64, p50 time.Duration, cpu time.Duration, n int) PeerRun {
		return PeerRun{Gateway: g, Workload: w.Name, Round: round, CPU: cpu, LoadAvg: float64(round),
			Result: loadgen.Result{Requests: n, OK: n, OKPerSecond: rps, Latency: loadgen.Percentiles{P50: p50}}}
	}
	rep := PeersReport{
		Config:   PeersConfig{Rounds: 2, Duration: time.Second, Warmup: time.Second, Workloads: []PeerWorkload{w}},
		Gateways: []string{GatewayDirect, GatewayOlla, GatewayBifrost, GatewayIOP},
		Runs: []PeerRun{
			run(GatewayDirect, 1, 5000, time.Millisecond, 0, 5000),
			run(GatewayDirect, 2, 5000, time.Millisecond, 0, 5000),
			run(GatewayOlla, 1, 1000, 2*time.Millisecond, 500*time.Millisecond, 1000), // 500 µs a request
			run(GatewayOlla, 2, 1000, 2*time.Millisecond, 500*time.Millisecond, 1000),
			run(GatewayBifrost, 1, 2000, 1500*time.Microsecond, 600*time.Millisecond, 2000), // 300 µs
			run(GatewayBifrost, 2, 2000, 1500*time.Microsecond, 600*time.Millisecond, 2000),
			run(GatewayIOP, 1, 2000, 1300*time.Microsecond, 400*time.Millisecond, 2000), // 200 µs
			run(GatewayIOP, 2, 3000, 1300*time.Microsecond, 600*time.Millisecond, 3000),
		},
		RSS:     map[string][]int64{GatewayOlla: {30 << 20, 35 << 20}, GatewayBifrost: {80 << 20, 90 << 20}, GatewayIOP: {40 << 20, 45 << 20}},
		Missing: map[string]string{},
	}
	if got := rep.Throughput(GatewayIOP, w.Name); got != 2500 {
		t.Errorf("iop throughput %v, want the mean 2500", got)
	}
	if got := rep.AddedP50(GatewayIOP, w.Name); got != 300*time.Microsecond {
		t.Errorf("iop added p50 %v, want 300µs", got)
	}
	var b bytes.Buffer
	rep.WriteTable(&b)
	out := b.String()
	for _, want := range []string{
		"| req/s, 1 client | 1,000 | 2,000 | 2,500 | 1.25× | ≥ 1.2×: met |",
		"| CPU µs/request, 1 client | 500 | 300 | 200 | 0.67× | ≤ 0.8×: met |",
		"| added p50, 1 client | 1.00 ms | 0.50 ms | 0.30 ms | 0.60× | – |",
		"| resident memory after a round (iop: edge + node) | 30–35 MiB | 80–90 MiB | 40–45 MiB | 1.3× | ≤ 50 MiB: met |",
		"load average 1.5 (1.0–2.0)",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
}
