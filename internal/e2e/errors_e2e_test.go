package e2e

// End-to-end tests of provider errors as the provider said them (issue
// 15): an error object in a 200, an error event first in a stream, a
// plain-text or HTML error body, and the node's own translation errors,
// through a real edge and node over gRPC, on both execution paths and both
// client APIs.

import (
	"context"
	"database/sql"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"iop/internal/e2e/harness"
	"iop/internal/edge"
	"iop/internal/node"
	"iop/internal/process"
	"iop/internal/sim"
)

// fakeProvider is a model server that answers every generation request
// with its answer, counting them. Its answer may use the server's own URL
// ("{url}"), which iop must never show a client.
type fakeProvider struct {
	*httptest.Server
	hits atomic.Int32

	mu     sync.Mutex // guards answer
	answer func(w http.ResponseWriter, url string)
}

func startFakeProvider(t *testing.T, answer func(w http.ResponseWriter, url string)) *fakeProvider {
	t.Helper()
	p := &fakeProvider{answer: answer}
	p.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if r.URL.Path != "/api/ps" { // the node's residency readings are no request
			p.hits.Add(1)
		}
		p.mu.Lock()
		answer := p.answer
		p.mu.Unlock()
		answer(w, p.URL)
	}))
	t.Cleanup(p.Close)
	return p
}

// respond is an answer of status, content type and body; "{url}" in the
// body becomes the server's URL.
func respond(status int, ctype, body string) func(w http.ResponseWriter, url string) {
	return func(w http.ResponseWriter, url string) {
		if ctype != "" {
			w.Header().Set("Content-Type", ctype)
		}
		w.WriteHeader(status)
		io.WriteString(w, strings.ReplaceAll(body, "{url}", url))
	}
}

// errorsRig is an edge (usage ledger in a file) with one node driving an
// Ollama-protocol fake ("ollama-model", normalized path), an
// OpenAI-compatible fake ("openai-model", tunnel path), and behind the
// aliases "retry-ollama" and "retry-openai" each fake first, then a
// healthy simulator of the same protocol.
type errorsRig struct {
	e              *process.Process
	db             string
	ollama, openai *fakeProvider
	client         *http.Client
}

func startErrorsRig(t *testing.T, breakerFailures int) *errorsRig {
	t.Helper()
	rig := &errorsRig{
		db:     filepath.Join(t.TempDir(), "edge.db"),
		ollama: startFakeProvider(t, respond(200, "application/x-ndjson", "")),
		openai: startFakeProvider(t, respond(200, "application/json", "")),
	}
	_, goodOllama := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOllama, Models: []string{"good-ollama"}, Seed: 2})
	_, goodOpenAI := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOpenAI, Models: []string{"good-openai"}, Seed: 2})
	ctx, cancel := context.WithCancel(context.Background())
	cfg := process.DefaultEdgeFile()
	cfg.Listen, cfg.NodeListen, cfg.Database = "127.0.0.1:0", "127.0.0.1:0", rig.db
	cfg.CircuitBreaker.Failures = breakerFailures
	// The failing fakes must be tried first (they sort first and win
	// ties): no provider may win by holding its model, as the simulators
	// report theirs held (/api/ps) and the fakes report nothing.
	cfg.Residency.Mode = edge.ResidencyOff
	cfg.Models = map[string]edge.ModelConfig{
		"retry-ollama": {Targets: []string{"ollama-model", "good-ollama"}},
		"retry-openai": {Targets: []string{"openai-model", "good-openai"}},
	}
	e, err := process.Start(ctx, process.Config{Mode: process.ModeEdge, Edge: cfg}, process.Deps{Logger: harness.Logger(t, "edge")})
	if err != nil {
		t.Fatal(err)
	}
	rig.e = e
	harness.StopAtCleanup(t, cancel, e)
	caps := []string{"tools", "vision"}
	harness.Node(t, ctx, node.Config{
		NodeID: "gpu-1",
		Edge:   e.NodeAddr,
		Providers: []node.ProviderConfig{
			// The fakes sort first, so they win ties.
			{ID: "a-ollama", Type: node.TypeOllama, BaseURL: rig.ollama.URL, Models: []string{"ollama-model"}, Capacity: 4, Capabilities: caps},
			{ID: "b-openai", Type: "vllm", BaseURL: rig.openai.URL + "/v1", Models: []string{"openai-model"}, Capacity: 4, Capabilities: caps},
			{ID: "y-ollama", Type: node.TypeOllama, BaseURL: goodOllama, Models: []string{"good-ollama"}, Capacity: 4, Capabilities: caps},
			{ID: "z-openai", Type: "vllm", BaseURL: goodOpenAI + "/v1", Models: []string{"good-openai"}, Capacity: 4, Capabilities: caps},
		},
	})
	transport := &http.Transport{}
	t.Cleanup(transport.CloseIdleConnections)
	rig.client = &http.Client{Transport: transport}
	return rig
}

func (rig *errorsRig) set(p *fakeProvider, answer func(w http.ResponseWriter, url string)) {
	p.mu.Lock()
	p.answer = answer
	p.mu.Unlock()
}

func (rig *errorsRig) post(t *testing.T, path, body string) (int, []byte) {
	t.Helper()
	resp, err := rig.client.Post("http://"+rig.e.HTTPAddr+path, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s: reading the body: %v", path, err)
	}
	return resp.StatusCode, data
}

// errorOf is the message (and, for an OpenAI error, type, param and code)
// of an error answer of either client API: {"error":{...}} or
// {"error":"..."}.
type apiErrorBody struct{ message, typ, param, code string }

func errorOf(t *testing.T, data []byte) apiErrorBody {
	t.Helper()
	var openai struct {
		Error struct {
			Message string  `json:"message"`
			Type    string  `json:"type"`
			Param   *string `json:"param"`
			Code    *string `json:"code"`
		} `json:"error"`
	}
	if json.Unmarshal(data, &openai) == nil && openai.Error.Message != "" {
		e := apiErrorBody{message: openai.Error.Message, typ: openai.Error.Type}
		if openai.Error.Param != nil {
			e.param = *openai.Error.Param
		}
		if openai.Error.Code != nil {
			e.code = *openai.Error.Code
		}
		return e
	}
	var ollama struct {
		Error string `json:"error"`
	}
	if err := json.Unmarshal(data, &ollama); err != nil || ollama.Error == "" {
		t.Fatalf("not an error answer: %s", data)
	}
	return apiErrorBody{message: ollama.Error}
}

// outcomes reads the usage ledger's outcome of every request, by model.
func (rig *errorsRig) outcomes(t *testing.T) map[string][]string {
	t.Helper()
	rig.e.Ledger.Flush()
	db, err := sql.Open("sqlite", "file:"+rig.db+"?_pragma=busy_timeout(5000)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	rows, err := db.Query(`SELECT model, outcome FROM usage_ledger`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string][]string{}
	for rows.Next() {
		var model, outcome string
		if err := rows.Scan(&model, &outcome); err != nil {
			t.Fatal(err)
		}
		out[model] = append(out[model], outcome)
	}
	return out
}

// chatBodies are a chat request for model in both client APIs, streamed
// and not.
func chatBodies(model string) []struct{ path, body string } {
	return []struct{ path, body string }{
		{"/v1/chat/completions", `{"model":"` + model + `","messages":[{"role":"user","content":"hi"}]}`},
		{"/v1/chat/completions", `{"model":"` + model + `","stream":true,"messages":[{"role":"user","content":"hi"}]}`},
		{"/api/chat", `{"model":"` + model + `","stream":false,"messages":[{"role":"user","content":"hi"}]}`},
		{"/api/chat", `{"model":"` + model + `","messages":[{"role":"user","content":"hi"}]}`},
	}
}

// A provider's error object inside its 200 (a JSON body that is one, a
// stream whose first line or event is one) is an error on both paths and
// for both client APIs: 502 with the provider's message, its address
// scrubbed; recorded as upstream_error in the ledger. Before, it was taken
// for an answer (an empty one on the normalized path, the error object
// relayed with its 200 on the tunnel path).
func TestRegression_ErrorObjectInA200IsAnError(t *testing.T) {
	harness.Parallel(t)
	rig := startErrorsRig(t, -1) // no breaker: each request reaches its fake
	for _, c := range []struct {
		name   string
		p      *fakeProvider
		model  string
		answer func(w http.ResponseWriter, url string)
		want   string
	}{
		{"ollama error line", rig.ollama, "ollama-model",
			respond(200, "application/x-ndjson", `{"error":"llama runner process has terminated at {url}"}`+"\n"),
			"llama runner process has terminated at [provider]"},
		{"ollama JSON error object", rig.ollama, "ollama-model",
			respond(200, "application/json", `{"error":{"message":"model runner crashed ({url})"}}`),
			"model runner crashed ([provider])"},
		{"openai JSON error object", rig.openai, "openai-model",
			respond(200, "application/json", `{"error":{"message":"upstream quota exhausted at {url}","type":"server_error","code":"quota"}}`),
			"upstream quota exhausted at [provider]"},
		{"openai error string", rig.openai, "openai-model",
			respond(200, "application/json", `{"error":"no healthy upstream"}`),
			"no healthy upstream"},
		{"openai stream whose first event is an error", rig.openai, "openai-model",
			respond(200, "text/event-stream", "data: {\"error\":{\"message\":\"overloaded, retry at {url}\"}}\n\n"),
			"overloaded, retry at [provider]"},
	} {
		t.Run(c.name, func(t *testing.T) {
			rig.set(c.p, c.answer)
			for _, r := range chatBodies(c.model) {
				status, data := rig.post(t, r.path, r.body)
				e := errorOf(t, data)
				if status != http.StatusBadGateway || e.message != c.want || strings.Contains(string(data), rig.ollama.URL) || strings.Contains(string(data), rig.openai.URL) {
					t.Fatalf("%s %s: %d %s, want 502 %q", r.path, r.body, status, data, c.want)
				}
				if strings.HasPrefix(r.path, "/v1/") && (e.typ != "upstream_error" || e.code != "upstream_error") {
					t.Fatalf("%s: type %q code %q, want upstream_error", r.path, e.typ, e.code)
				}
			}
		})
	}
	waitIdle(t, rig.e)
	for model, outcomes := range rig.outcomes(t) {
		for _, o := range outcomes {
			if o != "upstream_error" {
				t.Errorf("model %s: ledger outcome %q, want upstream_error", model, o)
			}
		}
	}
}

// Nothing of such an answer reached the client, so the request goes to
// another provider of the model (max_retries 1) and is answered; the
// retry is counted with reason "status 502".
func TestErrorObjectInA200IsRetried(t *testing.T) {
	harness.Parallel(t)
	rig := startErrorsRig(t, -1)
	rig.set(rig.ollama, respond(200, "application/x-ndjson", `{"error":"runner crashed"}`+"\n"))
	rig.set(rig.openai, respond(200, "text/event-stream", "data: {\"error\":{\"message\":\"overloaded\"}}\n\n"))
	for _, alias := range []string{"retry-ollama", "retry-openai"} {
		for _, r := range chatBodies(alias) {
			if status, data := rig.post(t, r.path, r.body); status != http.StatusOK {
				t.Fatalf("%s %s: %d %s, want the healthy provider's answer", r.path, r.body, status, data)
			}
		}
	}
	if o, a := rig.ollama.hits.Load(), rig.openai.hits.Load(); o != 4 || a != 4 {
		t.Fatalf("the failing providers saw %d and %d requests, want 4 each (one per request)", o, a)
	}
	if got := rig.e.Service.Stats().Retries["status 502"]; got != 8 {
		t.Fatalf("%d retries for status 502, want 8", got)
	}
	waitIdle(t, rig.e)
}

// An error object counts as a provider failure for the circuit breaker: a
// provider that keeps answering one is taken out of rotation (3 failures
// in a row, the default), and its model is then 503.
func TestErrorObjectInA200OpensTheCircuit(t *testing.T) {
	harness.Parallel(t)
	rig := startErrorsRig(t, 3)
	rig.set(rig.ollama, respond(200, "application/x-ndjson", `{"error":"runner crashed"}`+"\n"))
	rig.set(rig.openai, respond(200, "application/json", `{"error":{"message":"quota"}}`))
	for _, model := range []string{"ollama-model", "openai-model"} {
		for range 3 {
			if status, data := rig.post(t, "/v1/chat/completions", chatBodies(model)[0].body); status != http.StatusBadGateway {
				t.Fatalf("%s: %d %s, want 502", model, status, data)
			}
		}
		if status, data := rig.post(t, "/v1/chat/completions", chatBodies(model)[0].body); status != http.StatusServiceUnavailable {
			t.Fatalf("%s after 3 error objects: %d %s, want 503 (circuit open)", model, status, data)
		}
	}
	for _, p := range rig.e.Service.Snapshot().Providers {
		want := edge.CircuitClosed
		if p.ProviderID == "a-ollama" || p.ProviderID == "b-openai" {
			want = edge.CircuitOpen
		}
		if p.Circuit != want {
			t.Errorf("provider %s: circuit %s, want %s", p.ProviderID, p.Circuit, want)
		}
	}
}

// A provider's error body that is not JSON (a proxy's plain text or HTML
// page) keeps its text, scrubbed and clipped, with the provider's status,
// on both paths and for both client APIs, instead of a generic "upstream
// returned HTTP 503".
func TestRegression_PlainTextErrorBodyKeepsItsText(t *testing.T) {
	harness.Parallel(t)
	rig := startErrorsRig(t, -1)
	for _, c := range []struct {
		name   string
		p      *fakeProvider
		model  string
		answer func(w http.ResponseWriter, url string)
		status int
		want   string
	}{
		{"ollama plain text", rig.ollama, "ollama-model",
			respond(503, "text/plain", "upstream connect error or disconnect/reset before headers ({url})\n"),
			503, "upstream connect error or disconnect/reset before headers ([provider])"},
		{"openai HTML page", rig.openai, "openai-model",
			respond(502, "text/html", "<html><head><title>502 Bad Gateway</title></head><body><center><h1>502 Bad Gateway</h1></center><hr><center>nginx/1.25.3</center></body></html>"),
			502, "502 Bad Gateway"},
		{"openai plain text", rig.openai, "openai-model",
			respond(500, "text/plain", strings.Repeat("x", 3000)),
			500, strings.Repeat("x", 1021) + "…"},
	} {
		t.Run(c.name, func(t *testing.T) {
			rig.set(c.p, c.answer)
			for _, r := range chatBodies(c.model) {
				status, data := rig.post(t, r.path, r.body)
				if e := errorOf(t, data); status != c.status || e.message != c.want || strings.Contains(string(data), "nginx") {
					t.Fatalf("%s %s: %d %s, want %d %q", r.path, r.body, status, data, c.status, c.want)
				}
			}
		})
	}
	waitIdle(t, rig.e)
}

// A request the node cannot turn into its provider's protocol (a data URL
// that is not base64 for Ollama, tool call arguments that are not JSON,
// echo on a completion) is the client's error, 400 invalid_request_error
// naming the field (OpenAI API) or a message starting with it (Ollama
// API), not the provider's "upstream_rejected"; the provider never sees
// it.
func TestRegression_NodeTranslationErrorNamesTheParam(t *testing.T) {
	harness.Parallel(t)
	rig := startErrorsRig(t, -1)
	rig.set(rig.ollama, respond(200, "application/x-ndjson", `{"message":{"role":"assistant","content":"hi"},"done":true}`+"\n"))
	for _, c := range []struct{ path, body, param string }{
		{"/v1/chat/completions",
			`{"model":"ollama-model","messages":[{"role":"user","content":[{"type":"text","text":"see"},{"type":"image_url","image_url":{"url":"data:image/png,notbase64"}}]}]}`,
			"messages[0].content[1].image_url"},
		{"/v1/chat/completions",
			`{"model":"ollama-model","messages":[{"role":"user","content":"hi"},{"role":"assistant","tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{not json"}}]},{"role":"tool","tool_call_id":"c1","content":"1"}]}`,
			"messages[1]"},
		{"/v1/completions", `{"model":"ollama-model","prompt":"hi","echo":true}`, "echo"},
		{"/api/chat", `{"model":"ollama-model","messages":[{"role":"user","content":"see","images":["data:image/png,notbase64"]}]}`,
			"messages[0].content[1].image_url"},
	} {
		status, data := rig.post(t, c.path, c.body)
		e := errorOf(t, data)
		if status != http.StatusBadRequest || !strings.HasPrefix(e.message, c.param+": ") {
			t.Fatalf("%s %s: %d %s, want 400 naming %s", c.path, c.body, status, data, c.param)
		}
		if strings.HasPrefix(c.path, "/v1/") && (e.typ != "invalid_request_error" || e.param != c.param || e.code != "invalid_request") {
			t.Fatalf("%s %s: %+v, want invalid_request_error param %s code invalid_request", c.path, c.body, e, c.param)
		}
	}
	if n := rig.ollama.hits.Load(); n != 0 {
		t.Fatalf("the provider saw %d requests, want none", n)
	}
	waitIdle(t, rig.e)
	for model, outcomes := range rig.outcomes(t) {
		for _, o := range outcomes {
			if o != "invalid_request" {
				t.Errorf("model %s: ledger outcome %q, want invalid_request", model, o)
			}
		}
	}
}
