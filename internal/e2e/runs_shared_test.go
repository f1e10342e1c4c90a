package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"iop/internal/e2e/harness"
	"iop/internal/node"
	"iop/internal/process"
	"iop/internal/sim"
	"iop/internal/testenv"
)

// startSharedRunsEdge starts an edge named name whose run records live in
// the PostgreSQL database dsn.
func startSharedRunsEdge(t *testing.T, dsn, name string) *process.Process {
	t.Helper()
	cfg := process.DefaultEdgeFile()
	cfg.Listen, cfg.NodeListen, cfg.Database = "127.0.0.1:0", "127.0.0.1:0", ":memory:"
	cfg.RunsDSN, cfg.Name = dsn, name
	ctx, cancel := context.WithCancel(context.Background())
	e, err := process.Start(ctx, process.Config{Mode: process.ModeEdge, Edge: cfg}, process.Deps{Logger: harness.Logger(t, "edge")})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	harness.StopAtCleanup(t, cancel, e)
	return e
}

// TestRunsSharedBetweenEdges: two real edges share one real PostgreSQL
// (runs_dsn). A run submitted through edge A, which holds it (the node is
// on A alone), is read through edge B, its events are streamed through B
// from the first one and live, and B cancels it: A's node stops the
// provider, the record is cancelled on both edges and B's stream ends
// with the run's error event. A finished run's events replay through B
// exactly as through A.
func TestRunsSharedBetweenEdges(t *testing.T) {
	harness.Parallel(t)
	dsn := testenv.Postgres(t)
	s, url := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOpenAI, Models: []string{"m"}, TokensPerSecond: 50, DefaultMaxTokens: 30_000})
	a, b := startSharedRunsEdge(t, dsn, "edge-a"), startSharedRunsEdge(t, dsn, "edge-b")
	ctx, stopNode := context.WithCancel(context.Background())
	defer stopNode()
	harness.Node(t, ctx, node.Config{NodeID: "gpu-1", Edge: a.NodeAddr, Providers: []node.ProviderConfig{
		{ID: "v", Type: "vllm", BaseURL: url + "/v1", Models: []string{"m"}, Capacity: 2}}})
	baseA, baseB := "http://"+a.HTTPAddr, "http://"+b.HTTPAddr

	done := submit(t, baseA, `{"model":"m","prompt":"kept","max_tokens":5}`, http.StatusOK)
	if r := getRun(t, baseB, done.ID); r.State != "complete" || r.Output != done.Output || r.Output == "" {
		t.Fatalf("a finished run read through B: %+v, want %+v", r, done)
	}
	contentA, doneA, _ := runEvents(t, baseA, done.ID)
	contentB, doneB, _ := runEvents(t, baseB, done.ID)
	if !doneA || !doneB || contentA != contentB || contentB != done.Output {
		t.Fatalf("a finished run's events: through A %q %v, through B %q %v, output %q", contentA, doneA, contentB, doneB, done.Output)
	}

	long := submit(t, baseA, `{"model":"m","prompt":"x","background":true}`, http.StatusAccepted)
	var seen runJSON
	testenv.Eventually(t, "the run running, read through B", func() bool {
		seen = getRun(t, baseB, long.ID)
		return seen.State == "running" || seen.State == "error" || seen.State == "complete"
	})
	if seen.State != "running" {
		t.Fatalf("the long run through B: %+v", seen)
	}
	resp, err := http.Get(baseB + "/v1/runs/" + long.ID + "/events")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("events through B: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	events := make(chan string, 1024)
	go func() {
		defer close(events)
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			if line, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
				events <- line
			}
		}
	}()
	// Live: more chunks than the first few keep coming through B.
	for n := 0; n < 10; {
		ev, ok := <-events
		if !ok {
			t.Fatal("B's stream of a running run ended")
		}
		if strings.Contains(ev, `"chat.completion.chunk"`) {
			n++
		}
	}
	if st := s.Stats(); st.InFlight != 1 {
		t.Fatalf("sim in flight %d, want the run's 1", st.InFlight)
	}

	status, body := call(t, context.Background(), http.MethodDelete, baseB+"/v1/runs/"+long.ID, "")
	var rec runJSON
	if status != http.StatusOK || json.Unmarshal(body, &rec) != nil || rec.State != "cancelled" {
		t.Fatalf("DELETE through B: %d %s, want 200 and the cancelled record", status, body)
	}
	// A answers from its live record, final a moment after the store's.
	testenv.Eventually(t, "the run cancelled on A", func() bool { return getRun(t, baseA, long.ID).State == "cancelled" })
	last := ""
	for ev := range events {
		last = ev
	}
	if !strings.Contains(last, `"error"`) || !strings.Contains(last, "cancel") {
		t.Errorf("B's stream ended with %s, want the run's error event", last)
	}
	testenv.Eventually(t, "the provider request stopped", func() bool { return s.Stats().InFlight == 0 })
	waitIdle(t, a)
}
