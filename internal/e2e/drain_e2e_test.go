package e2e

// Drain tests (a node drains): every component a real process
// built from this package — two `iop sim` (an OpenAI- and an Ollama-
// protocol one), `iop edge`, `iop node` — and a node signalled while its
// streams are under way, on both execution paths and both client APIs.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"iop/internal/e2e/harness"
	"iop/internal/process"
	"iop/internal/status"
	"iop/internal/testenv"
)

// getStatus GETs url and returns its status, or 0 when nothing answers.
func getStatus(url string) int {
	resp, err := http.Get(url)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// startSimProcess runs `iop sim` for model on a free port and returns its
// base URL once it answers.
func startSimProcess(t *testing.T, bin, protocol, model string, tokensPerSecond int) string {
	t.Helper()
	addr := testenv.ProcessAddr(t)
	harness.StartProgram(t, nil, "sim "+model, bin, "sim", "--protocol", protocol, "--listen", addr, "--model", model,
		"--tokens-per-second", fmt.Sprint(tokensPerSecond), "--default-max-tokens", "100000", "--log-level", "warn")
	url := "http://" + addr
	probe := url + "/v1/models"
	if protocol == "ollama" {
		probe = url + "/api/tags"
	}
	testenv.Eventually(t, "iop sim "+model+" answers", func() bool { return getStatus(probe) == http.StatusOK })
	return url
}

// startEdgeProc runs `iop edge` on free ports, logging JSON at info, and
// returns it with its HTTP base URL and node endpoint once it answers.
func startEdgeProc(t *testing.T, bin string) (p *harness.Command, base, nodeAddr string) {
	t.Helper()
	httpAddr, nodeAddr := testenv.ProcessAddr(t), testenv.ProcessAddr(t)
	p = harness.StartProgram(t, nil, "edge", bin, "edge", "--listen", httpAddr, "--node-listen", nodeAddr, "--database", ":memory:",
		"--log-format", "json", "--log-level", "info")
	base = "http://" + httpAddr
	testenv.Eventually(t, "the edge answers", func() bool { return getStatus(base+"/healthz") == http.StatusOK })
	return p, base, nodeAddr
}

// startNodeProc runs `iop node` with the providers oa (type sim, OpenAI
// protocol: tunnel path, model oa-m) and ol (Ollama protocol: normalized
// path, model ol-m), and waits until the edge has them in rotation.
func startNodeProc(t *testing.T, bin, base, nodeAddr, id, oaURL, olURL, drainTimeout string) *harness.Command {
	t.Helper()
	path := filepath.Join(t.TempDir(), id+".yaml")
	yaml := fmt.Sprintf(`node_id: %s
edge: %s
drain_timeout: %s
reconnect_min: 50ms
reconnect_max: 200ms
providers:
  - {id: oa, type: sim, protocol: openai, base_url: %q, models: [oa-m], capacity: 8}
  - {id: ol, type: sim, protocol: ollama, base_url: %q, models: [ol-m], capacity: 8}
`, id, nodeAddr, drainTimeout, oaURL+"/v1", olURL)
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	p := harness.StartProgram(t, nil, "node "+id, bin, "node", "--config", path, "--log-level", "info")
	testenv.Eventually(t, "node "+id+" in rotation", func() bool {
		v := fetchView(t, base)
		n := 0
		for _, pr := range v.Providers {
			if pr.NodeID == id && status.ProviderState(pr) == status.StatusAvailable {
				n++
			}
		}
		return n == 2
	})
	return p
}

// fetchView reads the edge's admin API as iop status does.
func fetchView(t *testing.T, base string) status.View {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	v, err := status.Fetch(ctx, http.DefaultClient, base)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// clientCase is one kind of client request: a client API and a model (and
// so an execution path: oa-m tunnel, ol-m normalized).
type clientCase struct{ api, model string }

var everyCase = []clientCase{{"openai", "oa-m"}, {"openai", "ol-m"}, {"ollama", "oa-m"}, {"ollama", "ol-m"}}

func (c clientCase) String() string { return c.api + " API, " + c.model }

// request is c's path and body: a chat of one prompt for maxTokens tokens.
func (c clientCase) request(stream bool, maxTokens int) (path, body string) {
	if c.api == "openai" {
		return "/v1/chat/completions", chatBody(c.model, stream, maxTokens)
	}
	return "/api/chat", fmt.Sprintf(`{"model":%q,"stream":%v,"messages":[{"role":"user","content":"hello there"}],"options":{"num_predict":%d}}`,
		c.model, stream, maxTokens)
}

// startStream posts c's streamed request to the edge at base on its own
// goroutine: first is closed at the first line of the answer, done gets
// the whole answer.
func startStream(base string, c clientCase, maxTokens int) (first <-chan struct{}, done <-chan streamResult) {
	firstc, donec := make(chan struct{}), make(chan streamResult, 1)
	path, body := c.request(true, maxTokens)
	go func() {
		signalled := false
		signal := func() {
			if !signalled {
				signalled = true
				close(firstc)
			}
		}
		defer signal()
		resp, err := http.Post(base+path, "application/json", strings.NewReader(body))
		if err != nil {
			donec <- streamResult{err: err}
			return
		}
		defer resp.Body.Close()
		var buf bytes.Buffer
		rd := bufio.NewReader(resp.Body)
		for {
			line, err := rd.ReadBytes('\n')
			buf.Write(line)
			if len(bytes.TrimSpace(line)) > 0 {
				signal()
			}
			if err != nil {
				if err == io.EOF {
					err = nil
				}
				donec <- streamResult{resp.StatusCode, buf.Bytes(), err}
				return
			}
		}
	}()
	return firstc, donec
}

// streamAnswer is what a client got: the text, whether the answer ended as a
// complete one (SSE "[DONE]"; NDJSON a last object with done true), and
// the error messages it carried (SSE error events; NDJSON error objects),
// in order, and whether an error was the last thing sent.
type streamAnswer struct {
	text      string
	complete  bool
	errors    []string
	errorLast bool
}

// readAnswer parses a streamed answer of c.
func readAnswer(t *testing.T, c clientCase, body []byte) streamAnswer {
	t.Helper()
	var a streamAnswer
	if c.api == "openai" {
		events := sseData(body)
		for i, ev := range events {
			if ev == "[DONE]" {
				a.complete = i == len(events)-1
				continue
			}
			var chunk struct {
				Choices []struct {
					Delta struct {
						Content string `json:"content"`
					} `json:"delta"`
				} `json:"choices"`
				Error *struct {
					Message string `json:"message"`
				} `json:"error"`
			}
			if err := json.Unmarshal([]byte(ev), &chunk); err != nil {
				t.Fatalf("%s: event %q: %v", c, ev, err)
			}
			for _, ch := range chunk.Choices {
				a.text += ch.Delta.Content
			}
			if chunk.Error != nil {
				a.errors = append(a.errors, chunk.Error.Message)
				a.errorLast = i == len(events)-1
			}
		}
		return a
	}
	objs := ndjson(t, body)
	for i, o := range objs {
		a.text += o.text()
		if o.Error != "" {
			a.errors = append(a.errors, o.Error)
			a.errorLast = i == len(objs)-1
		}
		a.complete = o.Done && i == len(objs)-1
	}
	return a
}

// referenceText is the whole answer to c's request for maxTokens tokens,
// asked without streaming (the simulators answer a prompt the same way
// every time).
func referenceText(t *testing.T, base string, c clientCase, maxTokens int) string {
	t.Helper()
	text, err := askReference(base, c, maxTokens)
	if err != nil {
		t.Fatal(err)
	}
	return text
}

// referenceTexts is referenceText of each of cases, asked at once (each
// answer takes as long as its simulator's pace).
func referenceTexts(t *testing.T, base string, cases []clientCase, maxTokens int) map[clientCase]string {
	t.Helper()
	texts := make([]string, len(cases))
	errs := make([]error, len(cases))
	var wg sync.WaitGroup
	for i, c := range cases {
		wg.Go(func() { texts[i], errs[i] = askReference(base, c, maxTokens) })
	}
	wg.Wait()
	out := make(map[clientCase]string, len(cases))
	for i, c := range cases {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		out[c] = texts[i]
	}
	return out
}

func askReference(base string, c clientCase, maxTokens int) (string, error) {
	path, body := c.request(false, maxTokens)
	resp, err := http.Post(base+path, "application/json", strings.NewReader(body))
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	var doc struct {
		Choices []struct {
			Message struct {
				Content string `json:"content"`
			} `json:"message"`
		} `json:"choices"`
		Message struct {
			Content string `json:"content"`
		} `json:"message"`
	}
	if resp.StatusCode != http.StatusOK || json.Unmarshal(data, &doc) != nil {
		return "", fmt.Errorf("%s reference: %d %s", c, resp.StatusCode, data)
	}
	if c.api == "openai" {
		if len(doc.Choices) != 1 {
			return "", fmt.Errorf("%s reference: %s", c, data)
		}
		return doc.Choices[0].Message.Content, nil
	}
	return doc.Message.Content, nil
}

// requestLines returns the edge's per-request log lines.
func requestLines(t *testing.T, edge *harness.Command) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, l := range harness.JSONLines(t, edge.Log.String()) {
		if l["msg"] == "request" {
			out = append(out, l)
		}
	}
	return out
}

// TestNodeProcessDrainsOnSIGTERM: `iop node` signalled (SIGTERM) while
// eight streams run on it, two of each client API and execution path,
// tells the edge it drains: the edge shows it draining (admin API and `iop
// status`) and takes its providers out of rotation, so a request with no
// other node to go to gets 503 provider_unavailable with Retry-After (it
// must not wait for a node that takes no more work), and once a second
// node is up, new requests go to that one. Every stream ends complete, its
// text whole (equal to the same request answered later), then the node
// exits with status 0 and leaves the edge.
func TestNodeProcessDrainsOnSIGTERM(t *testing.T) {
	harness.Parallel(t)
	bin := harness.IOP(t)
	oaURL := startSimProcess(t, bin, "openai", "oa-m", 20)
	olURL := startSimProcess(t, bin, "ollama", "ol-m", 20)
	edge, base, nodeAddr := startEdgeProc(t, bin)
	node1 := startNodeProc(t, bin, base, nodeAddr, "drain-1", oaURL, olURL, "2m")

	const tokens = 80 // 4 s at 20 tokens/s
	type stream struct {
		c    clientCase
		done <-chan streamResult
	}
	var streams []stream
	for range 2 {
		for _, c := range everyCase {
			first, done := startStream(base, c, tokens)
			<-first
			streams = append(streams, stream{c, done})
		}
	}

	node1.Signal(t, syscall.SIGTERM)
	testenv.Eventually(t, "drain-1 shown draining", func() bool {
		v := fetchView(t, base)
		draining := 0
		for _, n := range v.Nodes {
			if n.ID == "drain-1" && n.Draining {
				draining++
			}
		}
		for _, p := range v.Providers {
			if p.NodeID == "drain-1" && p.Status == status.StatusDraining && status.ProviderState(p) == "draining" {
				draining++
			}
		}
		return draining == 3
	})
	out, err := exec.Command(bin, "status", "--edge", base).CombinedOutput()
	if err != nil {
		t.Fatalf("iop status: %v\n%s", err, out)
	}
	for _, l := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(l, "LOADED") || strings.HasPrefix(l, "QUEUES") {
			break // the sections of nodes and providers are above
		}
		if strings.HasPrefix(l, "drain-1 ") && !strings.Contains(l, " draining ") {
			t.Errorf("iop status row %q: want it draining\n%s", l, out)
		}
	}

	// Nowhere else to go: refused at once as unavailable, with Retry-After.
	path, body := clientCase{"openai", "oa-m"}.request(false, 3)
	resp, err := http.Post(base+path, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	data, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if _, _, code := openAIError(t, resp.Header, data); resp.StatusCode != http.StatusServiceUnavailable || code != "provider_unavailable" || resp.Header.Get("Retry-After") == "" {
		t.Errorf("request while the only node drains: %d %s (Retry-After %q), want 503 provider_unavailable with Retry-After",
			resp.StatusCode, data, resp.Header.Get("Retry-After"))
	}

	// With a second node, new work goes there.
	startNodeProc(t, bin, base, nodeAddr, "drain-2", oaURL, olURL, "2m")
	for _, c := range everyCase {
		referenceText(t, base, c, 3)
	}
	testenv.Eventually(t, "the requests after the second node came to be logged", func() bool {
		n := 0
		for _, l := range requestLines(t, edge) {
			if l["node_id"] == "drain-2" && l["status"] == 200.0 {
				n++
			}
		}
		return n == len(everyCase)
	})

	results := make([]streamResult, len(streams))
	for i, s := range streams {
		select {
		case results[i] = <-s.done:
		case <-time.After(testenv.WaitDeadline):
			t.Fatalf("stream %d (%s) did not end", i, s.c)
		}
	}
	if err := node1.Wait(t, testenv.WaitDeadline); err != nil {
		t.Errorf("drained node exited with %v, want status 0", err)
	}
	want := referenceTexts(t, base, everyCase, tokens)
	for i, s := range streams {
		r := results[i]
		a := readAnswer(t, s.c, r.body)
		if want := want[s.c]; r.err != nil || r.status != http.StatusOK || !a.complete || len(a.errors) != 0 || a.text != want {
			t.Errorf("stream %d (%s): %d %v complete %v errors %q, text %d bytes (want %d)\n%s",
				i, s.c, r.status, r.err, a.complete, a.errors, len(a.text), len(want), r.body)
		}
	}
	// The edge logged each stream once, completed, on the drained node.
	completed := 0
	for _, l := range requestLines(t, edge) {
		if l["node_id"] == "drain-1" {
			if l["outcome"] != "completed" || l["status"] != 200.0 {
				t.Errorf("request on the drained node: %v", l)
			}
			completed++
		}
	}
	if completed != len(streams) {
		t.Errorf("%d requests logged on drain-1, want %d", completed, len(streams))
	}
	testenv.Eventually(t, "drain-1 gone from the edge", func() bool {
		return !slices.ContainsFunc(fetchView(t, base).Nodes, func(n status.Node) bool { return n.ID == "drain-1" })
	})
	if !strings.Contains(node1.Log.String(), "drained") {
		t.Errorf("the node did not log its drain:\n%s", node1.Log.String())
	}
}

// TestNodeProcessSecondSignalStopsAtOnce: a second signal during the drain
// (here with a drain timeout of ten minutes and streams that would last
// hours) makes `iop node` abort its runs and exit at once, status 0, and
// every client gets one clean error: the same message for all, sent once,
// as the last thing of the stream (an SSE error event without "[DONE]";
// an NDJSON error object without done), after the text it had got.
func TestNodeProcessSecondSignalStopsAtOnce(t *testing.T) {
	harness.Parallel(t)
	bin := harness.IOP(t)
	oaURL := startSimProcess(t, bin, "openai", "oa-m", 5)
	olURL := startSimProcess(t, bin, "ollama", "ol-m", 5)
	_, base, nodeAddr := startEdgeProc(t, bin)
	node1 := startNodeProc(t, bin, base, nodeAddr, "drain-1", oaURL, olURL, "10m")

	var dones []<-chan streamResult
	for _, c := range everyCase {
		first, done := startStream(base, c, 100_000)
		<-first
		dones = append(dones, done)
	}
	node1.Signal(t, syscall.SIGTERM)
	testenv.Eventually(t, "drain-1 draining", func() bool {
		return slices.ContainsFunc(fetchView(t, base).Nodes, func(n status.Node) bool { return n.ID == "drain-1" && n.Draining })
	})
	node1.Signal(t, syscall.SIGINT)
	if err := node1.Wait(t, testenv.WaitDeadline); err != nil {
		t.Errorf("node exited with %v after the second signal, want status 0", err)
	}

	var messages []string
	for i, c := range everyCase {
		var r streamResult
		select {
		case r = <-dones[i]:
		case <-time.After(testenv.WaitDeadline):
			t.Fatalf("%s: the stream did not end", c)
		}
		a := readAnswer(t, c, r.body)
		if r.err != nil || r.status != http.StatusOK || a.complete || len(a.errors) != 1 || !a.errorLast || a.text == "" {
			t.Errorf("%s: %d %v complete %v errors %q (last %v), text %q; want text, then one error, last\n%s",
				c, r.status, r.err, a.complete, a.errors, a.errorLast, a.text, r.body)
			continue
		}
		messages = append(messages, a.errors[0])
	}
	if len(messages) != len(everyCase) || len(slices.Compact(slices.Clone(messages))) != 1 {
		t.Errorf("the clients got different errors for one event: %q", messages)
	}
	testenv.Eventually(t, "drain-1 gone from the edge", func() bool {
		return !slices.ContainsFunc(fetchView(t, base).Nodes, func(n status.Node) bool { return n.ID == "drain-1" })
	})
}

// TestDevCtrlCDrains: on Ctrl-C (its context ending), `iop dev` lets the
// streams in flight on both execution paths finish (the edge drains its
// HTTP API while the in-process node still serves them), then its node
// drains as `iop node` does — it tells the edge and leaves — before the
// edge stops.
func TestDevCtrlCDrains(t *testing.T) {
	harness.Parallel(t)
	logs := &harness.Buffer{}
	logger := slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	d, err := process.Start(ctx, process.Config{Mode: process.ModeDev, Dev: process.DevConfig{Listen: "127.0.0.1:0", NodeListen: "127.0.0.1:0", ForceSim: true,
		SimCapacity: 4, SimTokensPerSecond: 20, SimMaxTokens: 100_000}}, process.Deps{Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	base := "http://" + d.HTTPAddr
	cases := []clientCase{{"openai", "sim-openai"}, {"openai", "sim-ollama"}, {"ollama", "sim-openai"}, {"ollama", "sim-ollama"}}
	var dones []<-chan streamResult
	for _, c := range cases {
		first, done := startStream(base, c, 40) // 2 s at 20 tokens/s
		<-first
		dones = append(dones, done)
	}
	cancel()
	stopped := make(chan error, 1)
	go func() { stopped <- d.Wait() }()
	for i, c := range cases {
		var r streamResult
		select {
		case r = <-dones[i]:
		case <-time.After(testenv.WaitDeadline):
			t.Fatalf("%s: the stream did not end", c)
		}
		if a := readAnswer(t, c, r.body); r.err != nil || r.status != http.StatusOK || !a.complete || len(a.errors) != 0 || a.text == "" {
			t.Errorf("%s: %d %v complete %v errors %q\n%s", c, r.status, r.err, a.complete, a.errors, r.body)
		}
	}
	select {
	case err := <-stopped:
		if err != nil {
			t.Fatalf("iop dev stopped with %v", err)
		}
	case <-time.After(testenv.WaitDeadline):
		t.Fatal("iop dev did not stop")
	}
	var msgs []string
	for _, l := range harness.JSONLines(t, logs.String()) {
		msgs = append(msgs, fmt.Sprint(l["msg"]))
	}
	for _, want := range []string{"node draining: its providers take no new requests", "drained: no run in flight; disconnecting"} {
		if !slices.Contains(msgs, want) {
			t.Errorf("iop dev did not log %q:\n%s", want, logs.String())
		}
	}
}

// TestRegression_EdgeSecondSIGINTWhenStartedIgnoringIt: `iop edge` started
// with SIGINT ignored (as `nohup` and `cmd &` in a script start it)
// drains at the first SIGINT and, at the second, ends its streams in flight
// with an error event and exits 0 at once, with a drain timeout of ten
// minutes. It left the second signal to the default disposition, which
// such a start leaves "ignored": the edge went on draining.
func TestRegression_EdgeSecondSIGINTWhenStartedIgnoringIt(t *testing.T) {
	harness.Parallel(t)
	bin := harness.IOP(t)
	oaURL := startSimProcess(t, bin, "openai", "oa-m", 5)
	olURL := startSimProcess(t, bin, "ollama", "ol-m", 5)
	httpAddr, nodeAddr := testenv.ProcessAddr(t), testenv.ProcessAddr(t)
	edgeProc := harness.StartProgram(t, nil, "edge", "sh", "-c", `trap "" INT; exec "$0" "$@"`, bin, "edge",
		"--listen", httpAddr, "--node-listen", nodeAddr, "--database", ":memory:", "--drain-timeout", "10m",
		"--log-format", "json", "--log-level", "info")
	base := "http://" + httpAddr
	testenv.Eventually(t, "the edge answers", func() bool { return getStatus(base+"/healthz") == http.StatusOK })
	startNodeProc(t, bin, base, nodeAddr, "n1", oaURL, olURL, "10m")

	c := clientCase{"openai", "oa-m"}
	first, done := startStream(base, c, 100_000)
	<-first
	edgeProc.Signal(t, syscall.SIGINT)
	edgeProc.WaitLog(t, "edge shutting down: draining requests in flight; a second signal stops it at once")
	edgeProc.Signal(t, syscall.SIGINT)
	if err := edgeProc.Wait(t, testenv.WaitDeadline); err != nil {
		t.Errorf("edge exited with %v after the second SIGINT, want status 0", err)
	}
	var r streamResult
	select {
	case r = <-done:
	case <-time.After(testenv.WaitDeadline):
		t.Fatal("the stream did not end")
	}
	if a := readAnswer(t, c, r.body); r.err != nil || a.complete || len(a.errors) != 1 || !a.errorLast {
		t.Errorf("the stream: %v, complete %v, errors %q (last %v); want one error event, last\n%s", r.err, a.complete, a.errors, a.errorLast, r.body)
	}
}
