package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"iop/internal/auth"
	"iop/internal/e2e/harness"
	"iop/internal/node"
	"iop/internal/process"
	"iop/internal/runs"
	"iop/internal/sim"
	"iop/internal/sse"
	"iop/internal/testenv"
)

// runJSON is the part of a runs API record the tests read.
type runJSON struct {
	ID         string            `json:"id"`
	Object     string            `json:"object"`
	State      string            `json:"state"`
	Model      string            `json:"model"`
	SessionID  *string           `json:"session_id"`
	Background bool              `json:"background"`
	Metadata   map[string]string `json:"metadata"`
	Dispatch   *struct {
		NodeID        string `json:"node_id"`
		ProviderID    string `json:"provider_id"`
		ServedModel   string `json:"served_model"`
		ExecutionPath string `json:"execution_path"`
		QueueReason   string `json:"queue_reason"`
	} `json:"dispatch"`
	Usage struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
	} `json:"usage"`
	Timing struct {
		DurationMs *int64 `json:"duration_ms"`
	} `json:"timing"`
	Output       string  `json:"output"`
	FinishReason *string `json:"finish_reason"`
	Error        *string `json:"error"`
}

// call sends one request to base+path and returns the status and body.
func call(t *testing.T, ctx context.Context, method, url, body string) (int, []byte) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, []byte(err.Error())
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b
}

// submit posts a run and decodes its record; it fails unless the status is want.
func submit(t *testing.T, base, body string, want int) runJSON {
	t.Helper()
	status, b := call(t, context.Background(), http.MethodPost, base+"/v1/runs", body)
	if status != want {
		t.Fatalf("POST /v1/runs %s: %d %s, want %d", body, status, b, want)
	}
	var r runJSON
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatalf("%v in %s", err, b)
	}
	return r
}

func getRun(t *testing.T, base, id string) runJSON {
	t.Helper()
	status, b := call(t, context.Background(), http.MethodGet, base+"/v1/runs/"+id, "")
	if status != http.StatusOK {
		t.Fatalf("GET run %s: %d %s", id, status, b)
	}
	var r runJSON
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatal(err)
	}
	return r
}

// runEvents reads a run's event stream to its end: the content deltas of
// choice 0, whether it ended with [DONE], and the error event's code, if any.
func runEvents(t *testing.T, base, id string) (content string, done bool, errCode string) {
	t.Helper()
	resp, err := http.Get(base + "/v1/runs/" + id + "/events")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("events: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	sc := sse.NewScanner(resp.Body)
	for {
		e, err := sc.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		data := string(e.Data)
		if done {
			t.Fatalf("event after [DONE]: %s", data)
		}
		if data == "[DONE]" {
			done = true
			continue
		}
		var ev struct {
			Choices []struct {
				Delta struct{ Content string } `json:"delta"`
			} `json:"choices"`
			Error *struct{ Code string } `json:"error"`
		}
		if err := json.Unmarshal([]byte(data), &ev); err != nil {
			t.Fatalf("event %s: %v", data, err)
		}
		if ev.Error != nil {
			errCode = ev.Error.Code
		}
		for _, c := range ev.Choices {
			content += c.Delta.Content
		}
	}
	return content, done, errCode
}

func waitRun(t *testing.T, base, id string, state string) runJSON {
	t.Helper()
	var r runJSON
	testenv.Eventually(t, "run "+id+" is "+state, func() bool { r = getRun(t, base, id); return r.State == state })
	return r
}

// TestRunsAPI drives the runs API on both execution paths: background and
// synchronous runs, replay for a late reader and a live one, cancellation
// by DELETE and by a leaving submitter, listing, and bad input.
func TestRunsAPI(t *testing.T) {
	harness.Parallel(t)
	e, paths := startCancelStack(t, process.DefaultEdgeFile(), 2, sim.Config{TokensPerSecond: 200})
	base := "http://" + e.HTTPAddr
	for _, p := range paths {
		t.Run(p.name+"/background run, late reader", func(t *testing.T) {
			r := submit(t, base, fmt.Sprintf(`{"model":%q,"prompt":"hello there","max_tokens":5,"background":true,"metadata":{"team":"search"}}`, p.model), http.StatusAccepted)
			if r.Object != "run" || !r.Background || r.Metadata["team"] != "search" || (r.State != "queued" && r.State != "running") {
				t.Fatalf("submitted %+v", r)
			}
			done := waitRun(t, base, r.ID, "complete")
			content, sawDone, errCode := runEvents(t, base, r.ID)
			if !sawDone || errCode != "" || content != done.Output || len(strings.Fields(content)) != 5 {
				t.Fatalf("replay %q done=%v err=%q; record output %q", content, sawDone, errCode, done.Output)
			}
			d := done.Dispatch
			if d == nil || d.NodeID != "gpu-1" || d.ServedModel != p.model || d.ExecutionPath != p.name || d.QueueReason != "immediate" {
				t.Fatalf("dispatch %+v", d)
			}
			if done.Usage.PromptTokens != 2 || done.Usage.CompletionTokens != 5 || *done.FinishReason != "length" || done.Timing.DurationMs == nil {
				t.Fatalf("record %+v", done)
			}
		})

		t.Run(p.name+"/live reader", func(t *testing.T) {
			r := submit(t, base, fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"go"}],"max_tokens":40,"background":true}`, p.model), http.StatusAccepted)
			content, sawDone, _ := runEvents(t, base, r.ID)
			if !sawDone || len(strings.Fields(content)) != 40 {
				t.Fatalf("live events %q done=%v", content, sawDone)
			}
			if got := getRun(t, base, r.ID); got.State != "complete" || got.Output != content {
				t.Fatalf("record %+v", got)
			}
		})

		t.Run(p.name+"/synchronous run", func(t *testing.T) {
			r := submit(t, base, fmt.Sprintf(`{"model":%q,"prompt":"x","max_tokens":3,"session_id":"sess-1"}`, p.model), http.StatusOK)
			if r.State != "complete" || len(strings.Fields(r.Output)) != 3 || r.SessionID == nil || *r.SessionID != "sess-1" {
				t.Fatalf("record %+v", r)
			}
		})

		t.Run(p.name+"/DELETE cancels a running run", func(t *testing.T) {
			before := p.backend.Stats().Cancelled
			r := submit(t, base, fmt.Sprintf(`{"model":%q,"prompt":"x","max_tokens":200000,"background":true}`, p.model), http.StatusAccepted)
			waitRun(t, base, r.ID, "running")
			// Cancelled before its request reached the backend, a run would
			// leave it nothing to abort.
			testenv.Eventually(t, "the run reaches the backend", func() bool { return p.backend.Stats().InFlight == 1 })
			status, b := call(t, context.Background(), http.MethodDelete, base+"/v1/runs/"+r.ID, "")
			var got runJSON
			if status != http.StatusOK || json.Unmarshal(b, &got) != nil || got.State != "cancelled" {
				t.Fatalf("DELETE: %d %s", status, b)
			}
			testenv.Eventually(t, "the backend sees the abort", func() bool { return p.backend.Stats().Cancelled == before+1 })
			waitIdle(t, e)
			if _, sawDone, code := runEvents(t, base, r.ID); sawDone || code != "run_cancelled" {
				t.Fatalf("events of a cancelled run: done=%v code=%q", sawDone, code)
			}
		})

		t.Run(p.name+"/a leaving submitter cancels its synchronous run", func(t *testing.T) {
			before := p.backend.Stats()
			ctx, cancel := context.WithCancel(context.Background())
			go func() {
				testenv.Eventually(t, "the run reaches the backend", func() bool { return p.backend.Stats().InFlight == 1 })
				cancel()
			}()
			call(t, ctx, http.MethodPost, base+"/v1/runs", fmt.Sprintf(`{"model":%q,"prompt":"x","max_tokens":200000}`, p.model))
			testenv.Eventually(t, "the backend sees the abort", func() bool { return p.backend.Stats().Cancelled == before.Cancelled+1 })
			waitIdle(t, e)
			var page struct{ Data []runJSON }
			getJSON(t, e, "/v1/runs?state=cancelled&model="+p.model, &page)
			if len(page.Data) != 2 || page.Data[0].Error == nil || !strings.Contains(*page.Data[0].Error, "submitter gone") {
				t.Fatalf("cancelled runs %+v", page.Data)
			}
		})
	}

	t.Run("list pages and filters", func(t *testing.T) {
		var page struct {
			Object  string    `json:"object"`
			Data    []runJSON `json:"data"`
			HasMore bool      `json:"has_more"`
			LastID  string    `json:"last_id"`
		}
		getJSON(t, e, "/v1/runs?state=complete&limit=4", &page)
		if page.Object != "list" || len(page.Data) != 4 || !page.HasMore || page.LastID != page.Data[3].ID {
			t.Fatalf("first page %+v", page)
		}
		// Lists leave the output out (README), rather than "output":"".
		var raw struct{ Data []map[string]json.RawMessage }
		getJSON(t, e, "/v1/runs?state=complete&limit=4", &raw)
		for _, r := range raw.Data {
			if _, ok := r["output"]; ok {
				t.Fatalf("a listed run has an output: %s", r["output"])
			}
		}
		first := page.Data
		getJSON(t, e, "/v1/runs?state=complete&limit=4&after="+page.LastID, &page)
		if len(page.Data) != 2 || page.HasMore {
			t.Fatalf("second page %+v", page)
		}
		for _, r := range append(first, page.Data...) {
			if r.State != "complete" {
				t.Fatalf("filter let through %+v", r)
			}
		}
		getJSON(t, e, "/v1/runs?model=slow-openai", &page)
		if len(page.Data) != 5 {
			t.Fatalf("model filter: %d runs", len(page.Data))
		}
	})

	t.Run("bad input", func(t *testing.T) {
		for _, tc := range []struct {
			method, path, body string
			status             int
			code               string
		}{
			{"POST", "/v1/runs", `{"model":"slow-openai","prompt":"x","messages":[]}`, 400, "invalid_request"},
			{"POST", "/v1/runs", `{"model":"slow-openai","prompt":7}`, 400, "invalid_request"},
			{"POST", "/v1/runs", `{"model":"slow-openai","prompt":"x","metadata":{"k":1}}`, 400, "invalid_request"},
			{"POST", "/v1/runs", `{"model":"slow-openai","prompt":"x","background":"yes"}`, 400, "invalid_request"},
			{"POST", "/v1/runs", `[]`, 400, "invalid_request"},
			{"GET", "/v1/runs/run_nope", "", 404, "run_not_found"},
			{"GET", "/v1/runs/run_nope/events", "", 404, "run_not_found"},
			{"DELETE", "/v1/runs/run_nope", "", 404, "run_not_found"},
			{"POST", "/v1/runs/run_nope", "", 405, "method_not_allowed"},
			{"GET", "/v1/runs?state=bogus", "", 400, "invalid_request"},
			{"GET", "/v1/runs?limit=0", "", 400, "invalid_request"},
			{"GET", "/v1/runs?after=run_nope", "", 400, "invalid_request"},
		} {
			status, b := call(t, context.Background(), tc.method, base+tc.path, tc.body)
			var eb struct{ Error struct{ Code string } }
			if status != tc.status || json.Unmarshal(b, &eb) != nil || eb.Error.Code != tc.code {
				t.Errorf("%s %s %s: %d %s, want %d %s", tc.method, tc.path, tc.body, status, b, tc.status, tc.code)
			}
		}
		// A run of an unknown model is recorded as failed, with the error.
		r := submit(t, base, `{"model":"no-such-model","prompt":"x","background":true}`, http.StatusAccepted)
		failed := waitRun(t, base, r.ID, "error")
		if failed.Error == nil || !strings.Contains(*failed.Error, "does not exist") {
			t.Fatalf("record %+v", failed)
		}
		if _, sawDone, code := runEvents(t, base, r.ID); sawDone || code != "model_not_found" {
			t.Fatalf("events: done=%v code=%q", sawDone, code)
		}
		waitIdle(t, e)
	})
}

// TestRunsSessionAffinity: a session's run goes back to the provider of
// its previous run when that one has a free slot, even where the least
// loaded rule would choose another.
func TestRunsSessionAffinity(t *testing.T) {
	harness.Parallel(t)
	_, url := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOllama, Models: []string{"m"}, TokensPerSecond: 200, DefaultMaxTokens: 100_000})
	ctx, cancel := context.WithCancel(context.Background())
	e := harness.Edge(t, ctx, harness.EdgeConfig(nil))
	t.Cleanup(cancel)
	harness.Node(t, ctx, node.Config{NodeID: "gpu-1", Edge: e.NodeAddr, Providers: []node.ProviderConfig{
		{ID: "a", Type: node.TypeOllama, BaseURL: url, Models: []string{"m"}, Capacity: 2},
		{ID: "b", Type: node.TypeOllama, BaseURL: url, Models: []string{"m"}, Capacity: 2},
	}})
	base := "http://" + e.HTTPAddr
	provider := func(r runJSON) string {
		if r.Dispatch == nil {
			t.Fatalf("run not dispatched: %+v", r)
		}
		return r.Dispatch.ProviderID
	}

	// A long run holds one slot of a (ties go to the lowest provider id), so
	// the session's first run goes to the less loaded b.
	hold := submit(t, base, `{"model":"m","prompt":"x","max_tokens":200000,"background":true}`, http.StatusAccepted)
	if got := provider(waitRun(t, base, hold.ID, "running")); got != "a" {
		t.Fatalf("holding run on %s", got)
	}
	first := submit(t, base, `{"model":"m","prompt":"x","max_tokens":2,"session_id":"s"}`, http.StatusOK)
	if got := provider(first); got != "b" {
		t.Fatalf("the session's first run went to %s, want the less loaded b", got)
	}
	call(t, context.Background(), http.MethodDelete, base+"/v1/runs/"+hold.ID, "")
	waitIdle(t, e)

	// Both idle now: the least loaded rule says a, the session says b.
	if got := provider(submit(t, base, `{"model":"m","prompt":"x","max_tokens":2,"session_id":"s"}`, http.StatusOK)); got != "b" {
		t.Fatalf("the session's second run went to %s, want b", got)
	}
	if got := provider(submit(t, base, `{"model":"m","prompt":"x","max_tokens":2}`, http.StatusOK)); got != "a" {
		t.Fatalf("a run without a session went to %s, want a", got)
	}
}

// TestRunsOutliveTheEdgeProcess: run records are in the database; a
// graceful stop ends runs in flight as error "the edge stopped ..."; an
// edge process killed with runs in flight leaves them to its successor,
// which marks them error "edge restarted" and still lists the finished
// ones with their output.
func TestRunsOutliveTheEdgeProcess(t *testing.T) {
	harness.ParallelLong(t)
	_, url := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOpenAI, Models: []string{"m"}, TokensPerSecond: 200, DefaultMaxTokens: 100_000})
	db := filepath.Join(t.TempDir(), "runs.db")

	t.Run("graceful stop", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		cfg := process.DefaultEdgeFile()
		cfg.Listen, cfg.NodeListen, cfg.Database = "127.0.0.1:0", "127.0.0.1:0", db
		e, err := process.Start(ctx, process.Config{Mode: process.ModeEdge, Edge: cfg}, process.Deps{Logger: harness.Logger(t, "edge")})
		if err != nil {
			t.Fatal(err)
		}
		nodeCtx, stopNode := context.WithCancel(context.Background())
		defer stopNode()
		harness.Node(t, nodeCtx, node.Config{NodeID: "gpu-1", Edge: e.NodeAddr, Providers: []node.ProviderConfig{
			{ID: "v", Type: "vllm", BaseURL: url + "/v1", Models: []string{"m"}, Capacity: 2}}})
		base := "http://" + e.HTTPAddr
		submit(t, base, `{"model":"m","prompt":"kept","max_tokens":3}`, http.StatusOK)
		long := submit(t, base, `{"model":"m","prompt":"x","max_tokens":200000,"background":true}`, http.StatusAccepted)
		waitRun(t, base, long.ID, "running")
		cancel()
		if err := e.Wait(); err != nil {
			t.Fatal(err)
		}
		store, err := runs.OpenSQLite(db)
		if err != nil {
			t.Fatal(err)
		}
		defer store.Close()
		rec, err := store.Get(context.Background(), long.ID)
		if err != nil || rec.State != runs.StateError || rec.Error != runs.ErrStopping.Error() {
			t.Fatalf("run in flight at a graceful stop: %+v %v", rec, err)
		}
	})

	t.Run("killed and restarted", func(t *testing.T) {
		bin := harness.IOP(t)
		httpAddr, nodeAddr := testenv.ProcessAddr(t), testenv.ProcessAddr(t)
		first := startEdgeProcess(t, bin, httpAddr, nodeAddr, db)
		ctx, stopNode := context.WithCancel(context.Background())
		defer stopNode()
		harness.Node(t, ctx, node.Config{NodeID: "gpu-1", Edge: nodeAddr, Providers: []node.ProviderConfig{
			{ID: "v", Type: "vllm", BaseURL: url + "/v1", Models: []string{"m"}, Capacity: 2}}})
		base := "http://" + httpAddr
		done := submit(t, base, `{"model":"m","prompt":"kept","max_tokens":4,"metadata":{"k":"v"}}`, http.StatusOK)
		inFlight := submit(t, base, `{"model":"m","prompt":"x","max_tokens":200000,"background":true}`, http.StatusAccepted)
		waitRun(t, base, inFlight.ID, "running")
		if err := first.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		_ = first.Wait()

		startEdgeProcess(t, bin, httpAddr, nodeAddr, db)
		var page struct{ Data []runJSON }
		status, b := call(t, context.Background(), http.MethodGet, base+"/v1/runs?limit=100", "")
		if status != http.StatusOK || json.Unmarshal(b, &page) != nil {
			t.Fatalf("list after restart: %d %s", status, b)
		}
		byID := map[string]runJSON{}
		for _, r := range page.Data {
			byID[r.ID] = r
		}
		if r := getRun(t, base, done.ID); r.State != "complete" || r.Output != done.Output || r.Metadata["k"] != "v" || byID[done.ID].State != "complete" {
			t.Fatalf("finished run after restart: %+v", r)
		}
		if r := byID[inFlight.ID]; r.State != "error" || r.Error == nil || *r.Error != "edge restarted" {
			t.Fatalf("run in flight at the kill: %+v", r)
		}
		// Its events replay from the record.
		if content, sawDone, _ := runEvents(t, base, done.ID); !sawDone || content != done.Output {
			t.Fatalf("replay after restart: %q %v", content, sawDone)
		}
	})
}

// startEdgeProcess runs `iop edge` as a child process and waits until its
// HTTP API answers; the process is killed at cleanup.
func startEdgeProcess(t *testing.T, bin, httpAddr, nodeAddr, db string) *exec.Cmd {
	t.Helper()
	var logs bytes.Buffer
	cmd := exec.Command(bin, "edge", "--listen", httpAddr, "--node-listen", nodeAddr, "--database", db, "--log-level", "warn")
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("edge process output:\n%s", logs.String())
		}
	})
	testenv.Eventually(t, "the edge process answers", func() bool {
		status, _ := call(t, context.Background(), http.MethodGet, "http://"+httpAddr+"/healthz", "")
		return status == http.StatusOK
	})
	return cmd
}

// TestRegression_RunsOfOneKeyHiddenFromAnother: with API keys, a run is
// seen, listed, streamed and cancelled only with the key that submitted it
// (another key gets 404, as for a run that does not exist). Before, any key
// could read any run's output.
func TestRegression_RunsOfOneKeyHiddenFromAnother(t *testing.T) {
	harness.Parallel(t)
	_, url := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOpenAI, Models: []string{"m"}})
	alice, aliceHash := auth.Generate()
	bob, bobHash := auth.Generate()
	cfg := process.DefaultEdgeFile()
	cfg.Keys = []auth.Key{{Name: "alice", Hash: aliceHash}, {Name: "bob", Hash: bobHash}}
	e := startEdgeWith(t, cfg, harness.Logger(t, "edge"))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	harness.Node(t, ctx, node.Config{NodeID: "gpu-1", Edge: e.NodeAddr, Providers: []node.ProviderConfig{
		{ID: "v", Type: "vllm", BaseURL: url + "/v1", Models: []string{"m"}, Capacity: 2}}})
	base := "http://" + e.HTTPAddr
	as := func(key, method, path, body string) (int, []byte) {
		req, err := http.NewRequest(method, base+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	status, b := as(alice, "POST", "/v1/runs", `{"model":"m","prompt":"secret plans","max_tokens":3}`)
	var r runJSON
	if status != http.StatusOK || json.Unmarshal(b, &r) != nil || r.State != "complete" {
		t.Fatalf("alice's run: %d %s", status, b)
	}
	for _, c := range []struct{ method, path string }{
		{"GET", "/v1/runs/" + r.ID}, {"GET", "/v1/runs/" + r.ID + "/events"}, {"DELETE", "/v1/runs/" + r.ID},
	} {
		if status, b := as(bob, c.method, c.path, ""); status != http.StatusNotFound || strings.Contains(string(b), r.Output) {
			t.Errorf("bob: %s %s: %d %s", c.method, c.path, status, b)
		}
		if status, _ := as(alice, c.method, c.path, ""); status != http.StatusOK {
			t.Errorf("alice: %s %s: %d", c.method, c.path, status)
		}
	}
	var page struct{ Data []runJSON }
	for key, want := range map[string]int{alice: 1, bob: 0} {
		_, b := as(key, "GET", "/v1/runs", "")
		if err := json.Unmarshal(b, &page); err != nil || len(page.Data) != want {
			t.Errorf("list: %d runs, want %d (%s)", len(page.Data), want, b)
		}
	}
}

// TestRegression_ZeroConfigKeepsNothingOnDisk: an edge started from
// edge.DefaultConfig (as tests and embedders do) keeps its records in
// memory; only `iop edge` defaults to iop.db. Before, every test edge
// shared cmd/iop/iop.db, and two test processes at once failed on its lock.
func TestRegression_ZeroConfigKeepsNothingOnDisk(t *testing.T) {
	// In a process of its own: it changes the working directory (t.Chdir).
	if testenv.RunInOwnProcess(t) {
		return
	}
	dir := t.TempDir()
	t.Chdir(dir)
	ctx, cancel := context.WithCancel(context.Background())
	cfg := process.DefaultEdgeFile()
	cfg.Listen, cfg.NodeListen = "127.0.0.1:0", "127.0.0.1:0"
	e, err := process.Start(ctx, process.Config{Mode: process.ModeEdge, Edge: cfg}, process.Deps{Logger: harness.Logger(t, "edge")})
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := e.Wait(); err != nil {
		t.Fatal(err)
	}
	if files, _ := os.ReadDir(dir); len(files) != 0 {
		t.Fatalf("the edge wrote %v", files)
	}
	if got := process.EdgeFileDefaults().Database; got != process.DefaultDatabase {
		t.Fatalf("iop edge's database default %q, want %q", got, process.DefaultDatabase)
	}
}
