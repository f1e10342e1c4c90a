package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"iop/internal/e2e/harness"
	"iop/internal/sim"
	"iop/internal/testenv"
	"iop/internal/testenv/etcdtest"
)

// batchProgress is one entry of GET /admin/v1/batches.
type batchProgress struct {
	ID     string `json:"id"`
	Status string `json:"status"`
	Total  int    `json:"total"`
	Done   int    `json:"done"`
	Failed int    `json:"failed"`
	Runner string `json:"runner"`
}

// TestBatchSurvivesTheRunnerEdgeKill: three `iop edge` processes of one
// cluster (a real etcd) share one real PostgreSQL (runs_dsn), each with
// its own `iop node` on one simulator. A batch created through edge-1
// runs there (it holds the batch's lease); edge-1 is SIGKILLed with lines
// in flight. Another edge claims the batch once the lease lapses, runs
// the lines without a result (those in flight at the kill again) and
// completes it: the output file, read through a third edge, has every
// custom_id exactly once and no error line (lines lost 0, duplicated 0).
func TestBatchSurvivesTheRunnerEdgeKill(t *testing.T) {
	t.Parallel()
	dsn := testenv.Postgres(t)
	etcd := etcdtest.Start(t)
	bin := harness.IOP(t)
	_, simURL := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOllama, Models: []string{"m"}, TTFT: 20 * time.Millisecond, TokensPerSecond: 100, DefaultMaxTokens: 10})
	type edgeProc struct {
		name, base string
		proc       *harness.Command
	}
	var edges []*edgeProc
	for i := range 3 {
		e := &edgeProc{name: fmt.Sprintf("edge-%d", i+1)}
		httpAddr, nodeAddr := testenv.ProcessAddr(t), testenv.ProcessAddr(t)
		e.base = "http://" + httpAddr
		dir := t.TempDir()
		cfgPath := filepath.Join(dir, "edge.yaml")
		yaml := fmt.Sprintf(`listen: %s
node_listen: %s
database: ":memory:"
runs_dsn: %q
heartbeat_interval: 1s
queue: {max_queue: 512, queue_timeout: 30s}
cluster:
  etcd: [%s]
  name: %s
  advertise: %s
  session_ttl: 2s
  id: e2e-batch
`, httpAddr, nodeAddr, dsn, strings.Join(etcd.Endpoints(), ", "), e.name, testenv.ProcessAddr(t))
		nodePath := filepath.Join(dir, "node.yaml")
		nodeYAML := fmt.Sprintf("node_id: n1\nedge: %s\nreconnect_min: 50ms\nreconnect_max: 200ms\nproviders:\n  - {id: p1, type: ollama, base_url: %q, models: [m], capacity: 4}\n", nodeAddr, simURL)
		for path, content := range map[string]string{cfgPath: yaml, nodePath: nodeYAML} {
			if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		e.proc = harness.StartProgram(t, nil, e.name, bin, "edge", "--config", cfgPath, "--log-format", "json", "--log-level", "info")
		testenv.Eventually(t, e.name+" answers", func() bool { return getStatus(e.base+"/healthz") == http.StatusOK })
		harness.StartProgram(t, nil, "node of "+e.name, bin, "node", "--config", nodePath, "--log-level", "info")
		testenv.EventuallyWithin(t, time.Minute, "model m on "+e.name, func() bool {
			resp, err := http.Get(e.base + "/v1/models")
			if err != nil {
				return false
			}
			defer resp.Body.Close()
			var models struct{ Data []struct{ ID string } }
			return json.NewDecoder(resp.Body).Decode(&models) == nil && len(models.Data) == 1
		})
		edges = append(edges, e)
	}
	progress := func(e *edgeProc, id string) (batchProgress, bool) {
		resp, err := http.Get(e.base + "/admin/v1/batches")
		if err != nil {
			return batchProgress{}, false
		}
		defer resp.Body.Close()
		var list []batchProgress
		if json.NewDecoder(resp.Body).Decode(&list) != nil {
			return batchProgress{}, false
		}
		for _, p := range list {
			if p.ID == id {
				return p, true
			}
		}
		return batchProgress{}, false
	}

	const n = 300
	first := batchAPI{t: t, base: edges[0].base}
	id := first.createBatch(first.uploadFile(chatLines("k", "m", n, 10)), "/v1/chat/completions")
	var before batchProgress
	testenv.EventuallyWithin(t, time.Minute, "edge-1 to run a tenth of the batch", func() bool {
		p, ok := progress(edges[1], id)
		before = p
		return ok && p.Done >= n/10
	})
	if !strings.HasPrefix(before.Runner, "edge-1/") || before.Done+before.Failed >= n {
		t.Fatalf("before the kill: %+v, want edge-1 running it, unfinished", before)
	}
	edges[0].proc.Signal(t, syscall.SIGKILL)
	killedAt := time.Now()
	_ = edges[0].proc.Wait(t, 10*time.Second)

	var took batchProgress
	testenv.EventuallyWithin(t, time.Minute, "another edge to claim the batch", func() bool {
		p, ok := progress(edges[1], id)
		took = p
		return !ok || strings.HasPrefix(p.Runner, "edge-2/") || strings.HasPrefix(p.Runner, "edge-3/")
	})
	claimedIn := time.Since(killedAt)
	third := batchAPI{t: t, base: edges[2].base}
	done := third.waitBatch(id, "completed", "failed", "expired", "cancelled")
	total, completed, failed := counts(done)
	out := third.resultLines(done["output_file_id"].(string)) // fails on a custom_id twice
	var errs map[string]map[string]any
	if ef, _ := done["error_file_id"].(string); ef != "" {
		errs = third.resultLines(ef)
	}
	lost := 0
	for i := range n {
		if out[fmt.Sprintf("k-%d", i)] == nil {
			lost++
		}
	}
	t.Logf("runner edge-1 SIGKILLed at %d of %d lines done; %s claimed it %s later; batch %s: %d completed, %d failed; lines lost %d, duplicated 0",
		before.Done, n, took.Runner, claimedIn.Round(100*time.Millisecond), done["status"], completed, failed, lost)
	fmt.Printf("batch runner kill: %d lines, runner SIGKILLed at %d done, taken over in %s; lost %d, duplicated 0\n",
		n, before.Done, claimedIn.Round(100*time.Millisecond), lost)
	if done["status"] != "completed" || total != n || completed != n || failed != 0 || len(out) != n || lost != 0 || len(errs) != 0 {
		t.Fatalf("after the kill: %v, output %d lines, errors %v", done, len(out), errs)
	}
}
