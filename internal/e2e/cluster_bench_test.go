package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"iop/internal/auth"
	"iop/internal/benchrun"
	"iop/internal/e2e/harness"
	"iop/internal/sim"
	"iop/internal/testenv"
	"iop/internal/testenv/etcdtest"
)

// costEdge is one `iop edge` process of BenchmarkClusterCost.
type costEdge struct {
	name string
	base string
	proc *harness.Command
}

// startCostEdge runs an edge with two client keys (hashes: bench, without
// limits, and limited, with limits it never reaches) and an admin key;
// clusterYAML, when not empty, is its cluster: section.
func startCostEdge(b *testing.B, bin, name string, keys [2]string, admin, nodeAddr, clusterYAML string) *costEdge {
	b.Helper()
	httpAddr := testenv.ProcessAddr(b)
	path := filepath.Join(b.TempDir(), name+".yaml")
	yaml := fmt.Sprintf(`listen: %s
node_listen: %s
database: ":memory:"
max_retries: 0
queue: {max_queue: 512, queue_timeout: 30s}
keys:
  - {name: bench, hash: %q}
  - {name: limited, hash: %q, max_concurrent: 1000, requests_per_minute: 1000000}
admin_keys:
  - {name: ops, hash: %q}
%s`, httpAddr, nodeAddr, keys[0], keys[1], admin, clusterYAML)
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		b.Fatal(err)
	}
	e := &costEdge{name: name, base: "http://" + httpAddr}
	e.proc = harness.StartProgram(b, nil, name, bin, "edge", "--config", path, "--log-level", "warn")
	return e
}

// startCostNode runs a node of the simulator at simURL (OpenAI protocol:
// the tunnel path) on every edge of nodeAddrs.
func startCostNode(b *testing.B, bin, id, simURL string, nodeAddrs ...string) {
	b.Helper()
	path := filepath.Join(b.TempDir(), id+".yaml")
	yaml := fmt.Sprintf(`node_id: %s
edges: [%s]
reconnect_min: 50ms
reconnect_max: 200ms
providers:
  - {id: p1, type: openai, base_url: %q, models: [m], capacity: 64}
`, id, strings.Join(nodeAddrs, ", "), simURL+"/v1")
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		b.Fatal(err)
	}
	harness.StartProgram(b, nil, id, bin, "node", "--config", path, "--log-level", "warn")
}

// BenchmarkClusterCost measures what several edges cost per request, on
// real processes (`iop edge`, `iop node`; an in-process `iop sim` of no
// latency on the tunnel path; a real three-member etcd): one client sends
// non-streamed chat requests one at a time with a key (no limits).
//
//   - single: through one edge without cluster: (today's path).
//   - follower: through the follower of a two-edge cluster: the leader
//     admits each request (the key's slot and the lease) over gRPC and
//     takes its release; the follower relays it.
//
// Per request it reports p50-ns (the client's latency, median),
// edge-cpu-ns/op (CPU of the edge the client calls: HTTP, relay and, on a
// follower, its admission calls), leader-cpu-ns/op (follower only: CPU of
// the leader, which serves no client here: the admissions and releases it
// does for the follower, less its idle CPU, leader-idle-cpu-ms/s, measured
// over 3 s before) and edge/leader, their
// ratio: how many edges' worth of requests one leader can admit with the
// CPU one edge spends relaying (the cluster's throughput tends to that
// many single edges as edges are added, when the leader's core is the
// bottleneck). CPU is read from /proc (10 ms resolution): use a
// -benchtime of a few thousand requests.
func BenchmarkClusterCost(b *testing.B) {
	bin := harness.IOP(b)
	s, err := sim.New(sim.Config{Protocol: sim.ProtocolOpenAI, Models: []string{"m"}, DefaultMaxTokens: 4}, slog.New(slog.DiscardHandler))
	if err != nil {
		b.Fatal(err)
	}
	simURL, stopSim, err := s.Start("127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(stopSim)
	var keys, hashes [2]string
	keys[0], hashes[0] = auth.Generate()
	keys[1], hashes[1] = auth.Generate()
	admin, adminHash := auth.Generate()

	body := `{"model":"m","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`
	client := &http.Client{Timeout: 30 * time.Second}
	ask := func(base, key string) error {
		req, _ := http.NewRequest(http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("%s: %s", base, resp.Status)
		}
		return err
	}
	cpu := func(p *harness.Command) time.Duration {
		d, err := benchrun.CPUTime(p.Cmd.Process.Pid)
		if err != nil {
			b.Fatal(err)
		}
		return d
	}
	// measure sends b.N requests to e, after a warm-up, and reports the
	// figures; leader, when not nil, is the leader's process.
	measure := func(b *testing.B, e *costEdge, leader *harness.Command, key string) {
		for range 200 {
			if err := ask(e.base, key); err != nil {
				b.Fatal(err)
			}
		}
		// The leader's CPU with no request (etcd session, the follower's
		// session beats, node heartbeats, the runtime), per second: taken
		// off its figure below.
		var idlePerSec float64
		if leader != nil {
			c0, t0 := cpu(leader), time.Now()
			time.Sleep(3 * time.Second) // the measurement: an idle interval
			idlePerSec = float64(cpu(leader)-c0) / time.Since(t0).Seconds()
		}
		times := make([]time.Duration, 0, b.N)
		edge0 := cpu(e.proc)
		var leader0 time.Duration
		if leader != nil {
			leader0 = cpu(leader)
		}
		start := time.Now()
		b.ResetTimer()
		for range b.N {
			start := time.Now()
			if err := ask(e.base, key); err != nil {
				b.Fatal(err)
			}
			times = append(times, time.Since(start))
		}
		b.StopTimer()
		slices.Sort(times)
		n := float64(b.N)
		b.ReportMetric(float64(times[len(times)/2].Nanoseconds()), "p50-ns")
		edgeCPU := float64((cpu(e.proc) - edge0).Nanoseconds()) / n
		b.ReportMetric(edgeCPU, "edge-cpu-ns/op")
		if leader != nil {
			idle := idlePerSec * time.Since(start).Seconds()
			leaderCPU := (float64((cpu(leader) - leader0).Nanoseconds()) - idle) / n
			b.ReportMetric(leaderCPU, "leader-cpu-ns/op")
			b.ReportMetric(idlePerSec/1e6, "leader-idle-cpu-ms/s")
			if leaderCPU > 0 {
				b.ReportMetric(edgeCPU/leaderCPU, "edge/leader")
			}
		}
	}
	ready := func(e *costEdge) {
		testenv.Eventually(b, e.name+" ready", func() bool { return getStatus(e.base+"/readyz") == http.StatusOK })
	}

	b.Run("single", func(b *testing.B) {
		nodeAddr := testenv.ProcessAddr(b)
		e := startCostEdge(b, bin, "single", hashes, adminHash, nodeAddr, "")
		startCostNode(b, bin, "n-single", simURL, nodeAddr)
		ready(e)
		b.Run("key", func(b *testing.B) { measure(b, e, nil, keys[0]) })
		b.Run("limited-key", func(b *testing.B) { measure(b, e, nil, keys[1]) })
	})

	b.Run("follower", func(b *testing.B) {
		etcd := etcdtest.Start(b)
		var edges []*costEdge
		var nodeAddrs []string
		for i := range 2 {
			nodeAddr := testenv.ProcessAddr(b)
			nodeAddrs = append(nodeAddrs, nodeAddr)
			cl := fmt.Sprintf(`cluster:
  etcd: [%s]
  name: edge-%d
  advertise: %s
  session_ttl: 3s
  id: bench
`, strings.Join(etcd.Endpoints(), ", "), i+1, testenv.ProcessAddr(b))
			edges = append(edges, startCostEdge(b, bin, fmt.Sprintf("edge-%d", i+1), hashes, adminHash, nodeAddr, cl))
		}
		startCostNode(b, bin, "n1", simURL, nodeAddrs...)
		var leader, follower *costEdge
		testenv.Eventually(b, "a ready leader and a ready follower", func() bool {
			leader, follower = nil, nil
			for _, e := range edges {
				var v clusterView
				req, _ := http.NewRequest(http.MethodGet, e.base+"/admin/v1/cluster", nil)
				req.Header.Set("Authorization", "Bearer "+admin)
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				resp, err := http.DefaultClient.Do(req.WithContext(ctx))
				if err == nil {
					err = json.NewDecoder(resp.Body).Decode(&v)
					resp.Body.Close()
				}
				cancel()
				if err != nil || getStatus(e.base+"/readyz") != http.StatusOK {
					return false
				}
				if v.Leader && v.Ready {
					leader = e
				} else if !v.Leader {
					follower = e
				}
			}
			return leader != nil && follower != nil
		})
		b.Run("key", func(b *testing.B) { measure(b, follower, leader.proc, keys[0]) })
		b.Run("limited-key", func(b *testing.B) { measure(b, follower, leader.proc, keys[1]) })
	})
}
