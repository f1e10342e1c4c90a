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

// batchEdge is one `iop edge` process of a batch cluster (batchCluster),
// with the config it restarts from.
type batchEdge struct {
	name, base, cfgPath string
	proc                *harness.Command
}

// start starts (or starts again) e's process and waits for it to answer.
func (e *batchEdge) start(t *testing.T, bin string) {
	t.Helper()
	e.proc = harness.StartProgram(t, nil, e.name, bin, "edge", "--config", e.cfgPath, "--log-format", "json", "--log-level", "info")
	testenv.Eventually(t, e.name+" answers", func() bool { return getStatus(e.base+"/healthz") == http.StatusOK })
}

// progress is e's GET /admin/v1/batches entry of batch id.
func (e *batchEdge) progress(id string) (batchProgress, bool) {
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

// cluster is e's GET /admin/v1/cluster.
func (e *batchEdge) cluster() (clusterView, bool) {
	resp, err := http.Get(e.base + "/admin/v1/cluster")
	if err != nil {
		return clusterView{}, false
	}
	defer resp.Body.Close()
	var v clusterView
	return v, resp.StatusCode == http.StatusOK && json.NewDecoder(resp.Body).Decode(&v) == nil
}

// batchCluster starts three `iop edge` processes of one cluster (a real
// three-member etcd) sharing one real PostgreSQL (runs_dsn), each with its
// own `iop node` on one Ollama simulator serving "m" (capacity 4), and
// waits until each serves m. It returns them and the iop binary.
func batchCluster(t *testing.T) ([]*batchEdge, string) {
	t.Helper()
	dsn := testenv.Postgres(t)
	etcd := etcdtest.Start(t)
	bin := harness.IOP(t)
	_, simURL := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOllama, Models: []string{"m"}, TTFT: 20 * time.Millisecond, TokensPerSecond: 100, DefaultMaxTokens: 10})
	var edges []*batchEdge
	for i := range 3 {
		e := &batchEdge{name: fmt.Sprintf("edge-%d", i+1)}
		httpAddr, nodeAddr := testenv.ProcessAddr(t), testenv.ProcessAddr(t)
		e.base = "http://" + httpAddr
		dir := t.TempDir()
		e.cfgPath = filepath.Join(dir, "edge.yaml")
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
		for path, content := range map[string]string{e.cfgPath: yaml, nodePath: nodeYAML} {
			if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		e.start(t, bin)
		harness.StartProgram(t, nil, "node of "+e.name, bin, "node", "--config", nodePath, "--log-level", "info")
		e.waitModel(t)
		edges = append(edges, e)
	}
	return edges, bin
}

// waitModel waits until e lists model m.
func (e *batchEdge) waitModel(t *testing.T) {
	t.Helper()
	testenv.EventuallyWithin(t, time.Minute, "model m on "+e.name, func() bool {
		resp, err := http.Get(e.base + "/v1/models")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		var models struct{ Data []struct{ ID string } }
		return json.NewDecoder(resp.Body).Decode(&models) == nil && len(models.Data) == 1
	})
}

// checkBatchOutput waits, through e, for batch id of n lines k-0 … k-(n-1)
// to end and checks it completed with each custom_id once in its output
// file (resultLines fails on one twice) and no error line; it returns the
// lines lost (0 when it passes) and the batch.
func checkBatchOutput(t *testing.T, e *batchEdge, id string, n int) (int, map[string]any) {
	t.Helper()
	c := batchAPI{t: t, base: e.base}
	done := c.waitBatch(id, "completed", "failed", "expired", "cancelled")
	total, completed, failed := counts(done)
	out := c.resultLines(done["output_file_id"].(string))
	var errs map[string]map[string]any
	if ef, _ := done["error_file_id"].(string); ef != "" {
		errs = c.resultLines(ef)
	}
	lost := 0
	for i := range n {
		if out[fmt.Sprintf("k-%d", i)] == nil {
			lost++
		}
	}
	if done["status"] != "completed" || total != n || completed != n || failed != 0 || len(out) != n || lost != 0 || len(errs) != 0 {
		t.Errorf("batch %v, output %d lines, %d lost, errors %v", done, len(out), lost, errs)
	}
	return lost, done
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
	harness.ParallelLong(t)
	edges, _ := batchCluster(t)
	const n = 300
	first := batchAPI{t: t, base: edges[0].base}
	id := first.createBatch(first.uploadFile(chatLines("k", "m", n, 10)), "/v1/chat/completions")
	var before batchProgress
	testenv.EventuallyWithin(t, time.Minute, "edge-1 to run a tenth of the batch", func() bool {
		p, ok := edges[1].progress(id)
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
		p, ok := edges[1].progress(id)
		took = p
		return !ok || strings.HasPrefix(p.Runner, "edge-2/") || strings.HasPrefix(p.Runner, "edge-3/")
	})
	claimedIn := time.Since(killedAt)
	lost, done := checkBatchOutput(t, edges[2], id, n)
	_, completed, failed := counts(done)
	t.Logf("runner edge-1 SIGKILLed at %d of %d lines done; %s claimed it %s later; batch %s: %d completed, %d failed; lines lost %d, duplicated 0",
		before.Done, n, took.Runner, claimedIn.Round(100*time.Millisecond), done["status"], completed, failed, lost)
	fmt.Printf("batch runner kill: %d lines, runner SIGKILLed at %d done, taken over in %s; lost %d, duplicated 0\n",
		n, before.Done, claimedIn.Round(100*time.Millisecond), lost)
}

// TestBatchSurvivesAnEdgeRestartAndALeaderKill: the batch cluster of
// TestBatchSurvivesTheRunnerEdgeKill (three edges, a real etcd, one real
// PostgreSQL), a batch of 300 lines created through edge-1. At a sixth
// done, its runner edge is restarted (SIGTERM: it lets the lease go, then
// the same config starts again); at a third done, the cluster's leader is
// SIGKILLed with lines in flight (whichever edge leads: it may run the
// batch or not). The batch completes with every custom_id exactly once in
// its output file and no error line: lines lost 0, duplicated 0.
func TestBatchSurvivesAnEdgeRestartAndALeaderKill(t *testing.T) {
	harness.ParallelLong(t)
	edges, bin := batchCluster(t)
	const n = 300
	first := batchAPI{t: t, base: edges[0].base}
	id := first.createBatch(first.uploadFile(chatLines("k", "m", n, 10)), "/v1/chat/completions")
	runner := func(p batchProgress) *batchEdge {
		for _, e := range edges {
			if strings.HasPrefix(p.Runner, e.name+"/") {
				return e
			}
		}
		return nil
	}
	// at waits, reading through any edge that answers, until the batch has
	// done lines and a runner; it returns its progress.
	at := func(what string, done int) batchProgress {
		var p batchProgress
		testenv.EventuallyWithin(t, 2*time.Minute, what, func() bool {
			for _, e := range edges {
				if q, ok := e.progress(id); ok {
					p = q
					return q.Done >= done && runner(q) != nil
				}
			}
			return false
		})
		if p.Done+p.Failed >= n {
			t.Fatalf("%s: the batch already ended (%+v)", what, p)
		}
		return p
	}

	before := at("a sixth of the batch done", n/6)
	restarted := runner(before)
	restarted.proc.Signal(t, syscall.SIGTERM)
	if err := restarted.proc.Wait(t, 40*time.Second); err != nil {
		t.Logf("%s stopped: %v", restarted.name, err)
	}
	restarted.start(t, bin)
	restarted.waitModel(t)

	mid := at("a third of the batch done after the restart", n/3)
	leader := -1
	testenv.EventuallyWithin(t, time.Minute, "one ready leader", func() bool {
		leader = -1
		for i, e := range edges {
			if v, ok := e.cluster(); ok && v.Leader && v.Ready {
				leader = i
			}
		}
		return leader >= 0
	})
	killed := edges[leader]
	midRunner := runner(mid).name
	killed.proc.Signal(t, syscall.SIGKILL)
	_ = killed.proc.Wait(t, 10*time.Second)
	reader := edges[(leader+1)%len(edges)]

	lost, done := checkBatchOutput(t, reader, id, n)
	_, completed, failed := counts(done)
	t.Logf("%d lines: %s (runner) restarted at %d done; leader %s SIGKILLed at %d done (runner then %s); batch %s: %d completed, %d failed; lost %d, duplicated 0",
		n, restarted.name, before.Done, killed.name, mid.Done, midRunner, done["status"], completed, failed, lost)
	fmt.Printf("batch edge restart and leader kill: %d lines, runner %s restarted at %d done, leader %s SIGKILLed at %d done (runner %s); lost %d, duplicated 0\n",
		n, restarted.name, before.Done, killed.name, mid.Done, midRunner, lost)
}
