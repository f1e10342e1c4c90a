package benchrun

import (
	"bytes"
	"os"
	"os/exec"
	"reflect"
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

// WriteTable checks each overhead target against the right figure: the
// right cell, edge + node CPU together, the baseline's throughput doubled,
// the go test -bench figures, the Content-Length check.
func TestReportTargets(t *testing.T) {
	us := func(v float64) time.Duration { return time.Duration(v * float64(time.Microsecond)) }
	res := func(requests int, rps, p50us, p99us, ttftus float64) loadgen.Result {
		return loadgen.Result{Requests: requests, OK: requests, OKPerSecond: rps,
			Latency: loadgen.Percentiles{P50: us(p50us), P99: us(p99us)}, TTFT: loadgen.Percentiles{P50: us(ttftus)}}
	}
	cpu := func(requests int, perReqUs float64) time.Duration { return time.Duration(requests) * us(perReqUs) }
	rep := Report{
		Cells: []Cell{
			// c=1: added p50 300-100 = 200 (at the bound), p99 1900-200 = 1700 (missed); CPU 120 + 70 = 190 ≤ 200.
			{Path: "tunnel", Concurrency: 1, Direct: res(100, 5000, 100, 200, 0), Through: res(100, 3000, 300, 1900, 0),
				EdgeCPU: cpu(100, 120), NodeCPU: cpu(100, 70)},
			// c=32: 3300 req/s ≥ 2 × 1599; CPU 100 + 60 = 160 > 150.
			{Path: "tunnel", Concurrency: 32, Direct: res(1000, 8000, 0, 0, 0), Through: res(1000, 3300, 0, 0, 0),
				EdgeCPU: cpu(1000, 100), NodeCPU: cpu(1000, 60)},
			// streamed c=1: added ttft 290-50 = 240 ≤ 250.
			{Path: "tunnel", Stream: true, Concurrency: 1, Direct: res(10, 1, 0, 0, 50), Through: res(10, 1, 0, 0, 290)},
			// streamed c=8: CPU 150 + 150 = 300 > 250.
			{Path: "tunnel", Stream: true, Concurrency: 8, Direct: res(10, 1, 0, 0, 0), Through: res(10, 1, 0, 0, 0),
				EdgeCPU: cpu(10, 150), NodeCPU: cpu(10, 150)},
			// normalized c=32: 2000 req/s < 2 × 1179.
			{Path: "normalized", Concurrency: 32, Direct: res(10, 4000, 0, 0, 0), Through: res(10, 2000, 0, 0, 0)},
		},
		Memory:        &Memory{Waiters: 10000, IdleRSS: 10 << 20, QueuedRSS: 10<<20 + 10000*11000},
		ContentLength: &ContentLength{Direct: 300, Through: -1, ThroughBody: 300},
		GoBench: []GoBenchmark{
			{Name: "BenchmarkQueuedWaiterMemory", Metrics: map[string]float64{"B/waiter": 1100}},
			{Name: "BenchmarkAdmitRelease/waiters=10", Metrics: map[string]float64{"ns/op": 600}},
			{Name: "BenchmarkAdmitRelease/waiters=10000", Metrics: map[string]float64{"ns/op": 900}},
		},
	}
	var out bytes.Buffer
	rep.WriteTable(&out)
	got := out.String()
	for _, want := range [][]string{
		{"met", "tunnel: gateway CPU ≤ 200µs/request (edge + node, c=1, non-streamed)", "190µs (120µs + 70µs)", "5% under"},
		{"met", "tunnel: added latency p50 ≤ 200µs (c=1, non-streamed)", "200µs", "0% under"},
		{"MISSED", "tunnel: added latency p99 ≤ 1ms (c=1, non-streamed)", "1700µs", "missed by 1.70×"},
		{"MISSED", "tunnel: gateway CPU ≤ 150µs/request (edge + node, c=32, non-streamed)", "160µs (100µs + 60µs)", "missed by 1.07×"},
		{"met", "tunnel: throughput ≥ 2× 1599 = 3198 req/s (c=32, non-streamed; 1599 at 605d215)", "3300 req/s (2.06×)", "3% over"},
		{"met", "tunnel: added ttft p50 ≤ 250µs (c=1, streamed)", "240µs", "4% under"},
		{"MISSED", "tunnel: gateway CPU ≤ 250µs/request (edge + node, c=8, streamed)", "300µs (150µs + 150µs)", "missed by 1.20×"},
		{"MISSED", "normalized: throughput ≥ 2× 1179 = 2358 req/s (c=32, non-streamed; 1179 at 605d215)", "2000 req/s (1.70×)", "missed by 1.18×"},
		{"met", "≤ 12 KB edge RSS per queued request (10000 queued)", "11000 B", "8% under"},
		{"MISSED", "≤ 1 KB of it in the scheduler's waiter (10000 queued)", "1100 B", "missed by 1.10×"},
		{"MISSED", "a non-streamed passthrough answer keeps the provider's Content-Length", "no", "through: none (chunked)"},
		{"met", "scheduler AdmitRelease < 1µs (10000 waiters)", "900 ns", "10% under"},
		{"met", "scheduler AdmitRelease flat: 10000 waiters within 2× of 10", "1.50×", "25% under"},
		{"MISSED", "tunnel: throughput ≥ 50% of direct (c=32, non-streamed)", "41%", "missed by 1.21×"},
		{"MISSED", "edge RSS ≤ 100 MB with 10000 queued", "114.9 MB", "missed by 1.15×"},
	} {
		if !containsLine(got, want) {
			t.Errorf("report lacks a line with %q:\n%s", want, got)
		}
	}
	// Cells the report does not have give no target line.
	for _, absent := range []string{"normalized: added latency", "normalized: gateway CPU ≤ 200µs", "chunks/s (c=32, streamed)"} {
		if strings.Contains(got, absent) {
			t.Errorf("report has %q without its cell:\n%s", absent, got)
		}
	}

	// Targets holds the same verdicts, the earlier targets marked.
	var missed, earlier int
	for _, tg := range rep.Targets() {
		if !tg.Met {
			missed++
		}
		if tg.Earlier {
			earlier++
		}
	}
	if missed != 8 || earlier != 3 {
		t.Errorf("Targets: %d missed, %d earlier; want 8 and 3: %+v", missed, earlier, rep.Targets())
	}

	rep.ContentLength.Through = 300
	out.Reset()
	rep.WriteTable(&out)
	if !containsLine(out.String(), []string{"met", "a non-streamed passthrough answer keeps the provider's Content-Length", "yes"}) {
		t.Errorf("a kept Content-Length is not met:\n%s", out.String())
	}
}

// containsLine reports whether one line of s holds every part, in order.
func containsLine(s string, parts []string) bool {
	for line := range strings.Lines(s) {
		rest, ok := line, true
		for _, p := range parts {
			i := strings.Index(rest, p)
			if i < 0 {
				ok = false
				break
			}
			rest = rest[i+len(p):]
		}
		if ok {
			return true
		}
	}
	return false
}

// ParseGoBench reads go test -bench output as the benchmark format
// describes it: the -P suffix dropped, medians over -count runs, custom
// units kept, other lines skipped.
func TestParseGoBench(t *testing.T) {
	in := `goos: linux
pkg: iop/internal/scheduler
BenchmarkAdmitRelease/waiters=10-2         	 1737721	       701.3 ns/op	     416 B/op	       2 allocs/op
BenchmarkAdmitRelease/waiters=10-2         	 1879070	       657.7 ns/op	     416 B/op	       2 allocs/op
BenchmarkAdmitRelease/waiters=10-2         	 1667862	       696.2 ns/op	     416 B/op	       2 allocs/op
BenchmarkQueuedWaiterMemory-2   	      14	  87760667 ns/op	       617.0 B/waiter
BenchmarkQueuedWaiterMemory-2   	      13	  79906270 ns/op	       619.0 B/waiter
BenchmarkAdmitRelease/waiters=10000-16 	 2031234	       573.3 ns/op
BenchmarkBroken says something
PASS
ok  	iop/internal/scheduler	3.420s
`
	got, err := ParseGoBench(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	want := []GoBenchmark{
		{Name: "BenchmarkAdmitRelease/waiters=10", Runs: 3, Metrics: map[string]float64{"ns/op": 696.2, "B/op": 416, "allocs/op": 2}},
		{Name: "BenchmarkQueuedWaiterMemory", Runs: 2, Metrics: map[string]float64{"ns/op": (87760667 + 79906270) / 2.0, "B/waiter": 618}},
		{Name: "BenchmarkAdmitRelease/waiters=10000", Runs: 1, Metrics: map[string]float64{"ns/op": 573.3}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got  %+v\nwant %+v", got, want)
	}
}
