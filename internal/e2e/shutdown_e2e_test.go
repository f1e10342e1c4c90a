package e2e

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"log/slog"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	_ "modernc.org/sqlite"

	"iop/internal/e2e/harness"
	"iop/internal/node"
	"iop/internal/process"
	"iop/internal/sim"
	"iop/internal/testenv"
)

// TestRegression_EdgeStopEndsRequestsWithAnAnswer: an edge stopped while a
// stream runs past its drain timeout and another request is queued behind
// it ends both with an answer that says it stopped, and records both. The
// stream gets an SSE error event with code edge_shutting_down and no
// [DONE]; the queued request gets 503 edge_shutting_down with Retry-After;
// each is in the usage ledger once, with the outcome edge_stopped (not
// client_gone, and not dropped as "usage entry after the ledger closed").
func TestRegression_EdgeStopEndsRequestsWithAnAnswer(t *testing.T) {
	harness.Parallel(t)
	_, url := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOpenAI, Models: []string{"slow"}, TokensPerSecond: 20, DefaultMaxTokens: 20_000})
	db := filepath.Join(t.TempDir(), "edge.db")
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	cfg := process.DefaultEdgeFile()
	cfg.Listen, cfg.NodeListen, cfg.Database = "127.0.0.1:0", "127.0.0.1:0", db
	cfg.DrainTimeout = 300 * time.Millisecond
	e, err := process.Start(ctx, process.Config{Mode: process.ModeEdge, Edge: cfg}, process.Deps{Logger: harness.Logger(t, "edge")})
	if err != nil {
		t.Fatal(err)
	}
	nodeCtx, stopNode := context.WithCancel(context.Background())
	defer stopNode()
	harness.Node(t, nodeCtx, node.Config{NodeID: "gpu-1", Edge: e.NodeAddr, Providers: []node.ProviderConfig{
		{ID: "v", Type: "vllm", BaseURL: url + "/v1", Models: []string{"slow"}, Capacity: 1}}})
	base := "http://" + e.HTTPAddr
	testenv.Eventually(t, "the node serves slow", func() bool {
		return len(e.Service.Snapshot().Providers) == 1
	})

	resp, err := http.Post(base+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"slow","stream":true,"messages":[{"role":"user","content":"go on"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	lines := bufio.NewScanner(resp.Body)
	if !lines.Scan() || !strings.HasPrefix(lines.Text(), "data: ") {
		t.Fatalf("stream did not start: %q %v", lines.Text(), lines.Err())
	}
	queued := make(chan *http.Response, 1)
	go func() {
		r, err := http.Post(base+"/v1/chat/completions", "application/json",
			strings.NewReader(`{"model":"slow","messages":[{"role":"user","content":"wait"}]}`))
		if err != nil {
			t.Error(err)
			r = nil
		}
		queued <- r
	}()
	testenv.Eventually(t, "the second request queued", func() bool { return e.Service.Snapshot().Waiters == 1 })

	stop() // SIGTERM
	var last string
	for lines.Scan() {
		if l := lines.Text(); l != "" {
			last = l
		}
	}
	if !strings.Contains(last, `"edge_shutting_down"`) || strings.Contains(last, "[DONE]") {
		t.Errorf("the stream ended with %q, want an error event with code edge_shutting_down and no [DONE]", last)
	}
	q := <-queued
	if q == nil {
		t.Fatal("the queued request got no answer")
	}
	var body struct {
		Error struct{ Code string } `json:"error"`
	}
	json.NewDecoder(q.Body).Decode(&body)
	q.Body.Close()
	if q.StatusCode != http.StatusServiceUnavailable || q.Header.Get("Retry-After") == "" || body.Error.Code != "edge_shutting_down" {
		t.Errorf("the queued request: %d Retry-After %q code %q, want 503 edge_shutting_down with Retry-After",
			q.StatusCode, q.Header.Get("Retry-After"), body.Error.Code)
	}
	if err := e.Wait(); err != nil {
		t.Fatal(err)
	}

	ldb, err := sql.Open("sqlite", "file:"+db+"?_pragma=busy_timeout(5000)")
	if err != nil {
		t.Fatal(err)
	}
	defer ldb.Close()
	rows, err := ldb.Query(`SELECT outcome, error_code FROM usage_ledger ORDER BY outcome`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var got []string
	for rows.Next() {
		var outcome, code string
		if err := rows.Scan(&outcome, &code); err != nil {
			t.Fatal(err)
		}
		got = append(got, outcome+"/"+code)
	}
	if len(got) != 2 || got[0] != "edge_stopped/edge_shutting_down" || got[1] != got[0] {
		t.Errorf("ledger rows %v, want two, edge_stopped with code edge_shutting_down", got)
	}
}

// TestRegression_EdgeStopDrainsBackgroundRuns: a background run (the runs
// API) in flight when the edge is told to stop was ended at once, as
// stopped with the edge, though the drain timeout had most of its time
// left. It runs to its end within the drain, is
// recorded complete with its whole output, and the edge then stops.
func TestRegression_EdgeStopDrainsBackgroundRuns(t *testing.T) {
	harness.Parallel(t)
	_, url := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOpenAI, Models: []string{"slow"}, TokensPerSecond: 20})
	db := filepath.Join(t.TempDir(), "edge.db")
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	cfg := process.DefaultEdgeFile()
	cfg.Listen, cfg.NodeListen, cfg.Database = "127.0.0.1:0", "127.0.0.1:0", db
	cfg.DrainTimeout = time.Minute // far more than the run needs
	e, err := process.Start(ctx, process.Config{Mode: process.ModeEdge, Edge: cfg}, process.Deps{Logger: harness.Logger(t, "edge")})
	if err != nil {
		t.Fatal(err)
	}
	nodeCtx, stopNode := context.WithCancel(context.Background())
	defer stopNode()
	harness.Node(t, nodeCtx, node.Config{NodeID: "gpu-1", Edge: e.NodeAddr, Providers: []node.ProviderConfig{
		{ID: "v", Type: "vllm", BaseURL: url + "/v1", Models: []string{"slow"}, Capacity: 1}}})
	testenv.Eventually(t, "the node serves slow", func() bool { return len(e.Service.Snapshot().Providers) == 1 })

	resp, err := http.Post("http://"+e.HTTPAddr+"/v1/runs", "application/json",
		strings.NewReader(`{"model":"slow","prompt":"count","background":true,"max_tokens":20}`))
	if err != nil {
		t.Fatal(err)
	}
	var run struct{ ID string }
	json.NewDecoder(resp.Body).Decode(&run)
	resp.Body.Close()
	if run.ID == "" {
		t.Fatalf("no run id (%d)", resp.StatusCode)
	}
	testenv.Eventually(t, "the run is in flight", func() bool { return len(e.Service.RunsInFlight()) == 1 })

	stop() // SIGTERM
	if err := e.Wait(); err != nil {
		t.Fatal(err)
	}
	rdb, err := sql.Open("sqlite", "file:"+db+"?_pragma=busy_timeout(5000)")
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	var state, outcome, output string
	if err := rdb.QueryRow(`SELECT state, outcome, output FROM runs WHERE id = ?`, run.ID).Scan(&state, &outcome, &output); err != nil {
		t.Fatal(err)
	}
	if state != "complete" || outcome != "completed" || strings.TrimSpace(output) == "" {
		t.Fatalf("run %s: state %q outcome %q output %q, want complete, completed, its answer", run.ID, state, outcome, output)
	}
}

// TestEdgeLameDuckFollowsItsSetting: a stopping edge with lame_duck 1h
// keeps its HTTP listener open, refusing each new request 503
// edge_shutting_down with "Connection: close" and a Retry-After past the
// setting (3601 s), and /readyz says 503; Abort then ends the lame duck at
// once and the edge stops cleanly. (That the lame duck's timer is the
// setting, cut at the drain timeout, is TestLameDuckIsCutAtTheDrainTimeout.)
func TestEdgeLameDuckFollowsItsSetting(t *testing.T) {
	harness.Parallel(t)
	cfg := harness.EdgeConfig(nil)
	cfg.LameDuck, cfg.DrainTimeout = time.Hour, time.Hour
	logs := &logRecorder{}
	e, err := process.Start(context.Background(), process.Config{Mode: process.ModeEdge, Edge: cfg}, process.Deps{Logger: slog.New(logs)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Abort(); _ = e.Wait() })
	base := "http://" + e.HTTPAddr
	e.Drain("test")
	waitLog(t, logs, map[string]string{"msg": "edge shutting down: draining requests in flight; a second signal stops it at once"})
	refused := func(when string) {
		t.Helper()
		resp, err := http.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`))
		if err != nil {
			t.Fatalf("%s: %v, want an answer: the listener stays open for the lame duck", when, err)
		}
		defer resp.Body.Close()
		var body struct {
			Error struct{ Code string } `json:"error"`
		}
		_ = json.NewDecoder(resp.Body).Decode(&body)
		if resp.StatusCode != http.StatusServiceUnavailable || body.Error.Code != "edge_shutting_down" || resp.Header.Get("Retry-After") != "3601" || !resp.Close {
			t.Fatalf("%s: %d code %q Retry-After %q close %v, want 503 edge_shutting_down, Retry-After 3601, Connection: close",
				when, resp.StatusCode, body.Error.Code, resp.Header.Get("Retry-After"), resp.Close)
		}
		ready, err := http.Get(base + "/readyz")
		if err != nil {
			t.Fatalf("%s: /readyz: %v", when, err)
		}
		ready.Body.Close()
		if ready.StatusCode != http.StatusServiceUnavailable {
			t.Fatalf("%s: /readyz %d, want 503", when, ready.StatusCode)
		}
	}
	refused("at once")
	refused("again") // the lame duck's Connection: close ended the first connection; a new one is still accepted
	if stopped(e) {
		t.Fatal("the edge stopped within its lame duck")
	}
	e.Abort()
	if err := waitDone(t, e); err != nil {
		t.Errorf("edge: %v", err)
	}
}
