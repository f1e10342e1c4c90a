package benchrun

import (
	"bytes"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"iop/internal/loadgen"
)

// The /proc readers work on a real process: this test's own.
func TestProcReadersOnOwnProcess(t *testing.T) {
	self := &process{name: "self", cmd: &exec.Cmd{Process: &os.Process{Pid: os.Getpid()}}}
	before, err := self.cpuTime()
	if err != nil {
		t.Fatal(err)
	}
	// Burn CPU until the 10 ms clock of /proc moves.
	deadline := time.Now().Add(10 * time.Second)
	after := before
	for after <= before && time.Now().Before(deadline) {
		for i := 0; i < 1e6; i++ {
			_ = strings.Repeat("x", i%7)
		}
		if after, err = self.cpuTime(); err != nil {
			t.Fatal(err)
		}
	}
	if after <= before {
		t.Errorf("CPU time did not grow: %v then %v", before, after)
	}
	rss, err := self.rss()
	if err != nil || rss < 1<<20 {
		t.Errorf("rss = %d, %v; want at least 1 MiB", rss, err)
	}
}

// WriteTable checks each target against the right figure.
func TestReportTargets(t *testing.T) {
	res := func(rps, p50us, p99us, chunks, ttftus float64) loadgen.Result {
		us := func(v float64) time.Duration { return time.Duration(v * float64(time.Microsecond)) }
		return loadgen.Result{Requests: 100, OK: 100, OKPerSecond: rps, ChunksPerSecond: chunks,
			Latency: loadgen.Percentiles{P50: us(p50us), P99: us(p99us)}, TTFT: loadgen.Percentiles{P50: us(ttftus)}}
	}
	rep := Report{
		Cells: []Cell{
			{Path: "tunnel", Concurrency: 1, Direct: res(5000, 100, 200, 0, 0), Through: res(3000, 400, 900, 0, 0)},
			{Path: "tunnel", Concurrency: 32, Direct: res(8000, 0, 0, 0, 0), Through: res(4100, 0, 0, 0, 0)},
			{Path: "tunnel", Stream: true, Concurrency: 1, Direct: res(1, 0, 0, 0, 50), Through: res(1, 0, 0, 0, 300)},
			{Path: "tunnel", Stream: true, Concurrency: 32, Direct: res(1, 0, 0, 0, 0), Through: res(1, 0, 0, 49000, 0)},
		},
		Memory: &Memory{Waiters: 10000, IdleRSS: 10 << 20, QueuedRSS: 10<<20 + 10000*4000},
	}
	var out bytes.Buffer
	rep.WriteTable(&out)
	for _, want := range []string{
		"MISSED tunnel: added latency p50 ≤ 250µs (c=1, non-streamed)          300µs",
		"met    tunnel: added latency p99 ≤ 1ms (c=1, non-streamed)            700µs",
		"met    tunnel: throughput ≥ 3,000 req/s (c=32, non-streamed)          4100 req/s",
		"met    tunnel: throughput ≥ 50% of direct (c=32, non-streamed)        51%",
		"MISSED tunnel: ≥ 50,000 chunks/s (c=32, streamed)                     49000 chunks/s",
		"met    tunnel: added ttft p50 ≤ 300µs (c=1, streamed)                 250µs",
		"met    ≤ 4 KB per queued request",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}
}
