package e2e

// End-to-end tests of the edge's Ollama API: a real edge and node over
// loopback TCP and gRPC, `iop sim` backends of both wire protocols (behind
// recording reverse proxies, to see what each provider was sent), and raw
// HTTP requests whose NDJSON framing is checked byte by byte.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"iop/internal/e2e/harness"
	"iop/internal/edge"
	"iop/internal/node"
	"iop/internal/process"
	"iop/internal/sim"
	"iop/internal/testenv"
)

// recordingProxy is a reverse proxy in front of a model server that keeps
// every request body it relays, but the node's readings of what the server
// holds loaded (GET /api/ps, on its own schedule), which it relays
// unrecorded.
type recordingProxy struct {
	URL string

	mu   sync.Mutex // guards reqs
	reqs []recordedRequest
}

type recordedRequest struct {
	Path string
	Body []byte
}

func startRecordingProxy(t *testing.T, target string) *recordingProxy {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	transport := &http.Transport{}
	rp := httputil.NewSingleHostReverseProxy(u)
	rp.Transport = transport
	rp.FlushInterval = -1 // relay each write of a stream at once
	p := &recordingProxy{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if r.URL.Path != "/api/ps" {
			p.mu.Lock()
			p.reqs = append(p.reqs, recordedRequest{Path: r.URL.Path, Body: body})
			p.mu.Unlock()
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(func() {
		srv.Close()
		transport.CloseIdleConnections()
	})
	p.URL = srv.URL
	return p
}

// last returns the last request relayed.
func (p *recordingProxy) last(t *testing.T) recordedRequest {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.reqs) == 0 {
		t.Fatal("the provider saw no request")
	}
	return p.reqs[len(p.reqs)-1]
}

// ollamaRig is an edge with one node driving an Ollama sim (serving
// "llama3:latest") and an OpenAI sim (serving "qwen2:7b"), both seeded
// alike so that a prompt gets the same text (and a text the same
// embedding) from either; both providers have capability embeddings.
type ollamaRig struct {
	e                       *process.Process
	ollamaProxy, openaiProx *recordingProxy
	client                  *http.Client
}

const (
	rigOllamaModel = "llama3:latest"
	rigOpenAIModel = "qwen2:7b"
)

func startOllamaRig(t *testing.T, extra ...node.ProviderConfig) *ollamaRig {
	t.Helper()
	_, ollamaURL := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOllama, Models: []string{rigOllamaModel}, Seed: 11})
	_, openaiURL := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOpenAI, Models: []string{rigOpenAIModel}, Seed: 11})
	rig := &ollamaRig{
		ollamaProxy: startRecordingProxy(t, ollamaURL),
		openaiProx:  startRecordingProxy(t, openaiURL),
	}
	ctx, cancel := context.WithCancel(context.Background())
	rig.e = harness.Edge(t, ctx, harness.EdgeConfig(map[string]edge.ModelConfig{"both": {Targets: []string{rigOllamaModel, rigOpenAIModel}}}))
	t.Cleanup(cancel)
	harness.Node(t, ctx, node.Config{
		NodeID: "gpu-1",
		Edge:   rig.e.NodeAddr,
		Providers: append([]node.ProviderConfig{
			{ID: "ollama-1", Type: node.TypeOllama, BaseURL: rig.ollamaProxy.URL, Models: []string{rigOllamaModel}, Capacity: 2, Capabilities: []string{"tools", "vision", "embeddings"}},
			{ID: "vllm-1", Type: "vllm", BaseURL: rig.openaiProx.URL + "/v1", Models: []string{rigOpenAIModel}, Capacity: 2, Capabilities: []string{"tools", "embeddings"}},
		}, extra...),
	})
	transport := &http.Transport{}
	t.Cleanup(transport.CloseIdleConnections)
	rig.client = &http.Client{Transport: transport}
	return rig
}

// do sends a request to the edge and returns the answer with its whole body.
func (rig *ollamaRig) do(t *testing.T, method, path, body string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, "http://"+rig.e.HTTPAddr+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := rig.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: reading the body: %v", method, path, err)
	}
	return resp, data
}

// ollamaObject is one Ollama answer object, every field the edge writes.
type ollamaObject struct {
	Model     string `json:"model"`
	CreatedAt string `json:"created_at"`
	Message   *struct {
		Role      string            `json:"role"`
		Content   string            `json:"content"`
		ToolCalls []json.RawMessage `json:"tool_calls"`
	} `json:"message"`
	Response           *string `json:"response"`
	Done               bool    `json:"done"`
	DoneReason         string  `json:"done_reason"`
	TotalDuration      int64   `json:"total_duration"`
	LoadDuration       int64   `json:"load_duration"`
	PromptEvalCount    int     `json:"prompt_eval_count"`
	PromptEvalDuration int64   `json:"prompt_eval_duration"`
	EvalCount          int     `json:"eval_count"`
	EvalDuration       int64   `json:"eval_duration"`
	Context            []int64 `json:"context"` // a non-raw /api/generate answer's last object
	Error              string  `json:"error"`
}

func (o ollamaObject) text() string {
	if o.Message != nil {
		return o.Message.Content
	}
	if o.Response != nil {
		return *o.Response
	}
	return ""
}

// decodeObject decodes exactly one JSON object, rejecting unknown fields.
func decodeObject(t *testing.T, data []byte) ollamaObject {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var o ollamaObject
	if err := dec.Decode(&o); err != nil {
		t.Fatalf("not an Ollama answer object: %v: %q", err, data)
	}
	if dec.More() {
		t.Fatalf("more than one JSON value: %q", data)
	}
	return o
}

// ndjson splits an NDJSON body into its objects, checking the framing: the
// body ends with "\n", no line is empty, each line is one JSON object.
func ndjson(t *testing.T, body []byte) []ollamaObject {
	t.Helper()
	if len(body) == 0 || body[len(body)-1] != '\n' {
		t.Fatalf("NDJSON body does not end with a newline: %q", body)
	}
	var out []ollamaObject
	for _, line := range bytes.Split(body[:len(body)-1], []byte("\n")) {
		if len(line) == 0 || line[0] != '{' || bytes.ContainsAny(line, "\r") {
			t.Fatalf("bad NDJSON line %q in %q", line, body)
		}
		out = append(out, decodeObject(t, line))
	}
	return out
}

// checkFinal checks the final object of an answer.
func checkFinal(t *testing.T, o ollamaObject, model, doneReason string, evalCount int) {
	t.Helper()
	if !o.Done || o.DoneReason != doneReason || o.Model != model || o.Error != "" {
		t.Fatalf("final object %+v, want done %s for %s", o, doneReason, model)
	}
	if o.EvalCount != evalCount || o.PromptEvalCount <= 0 {
		t.Fatalf("counts: eval %d (want %d), prompt eval %d", o.EvalCount, evalCount, o.PromptEvalCount)
	}
	for name, d := range map[string]int64{"total": o.TotalDuration, "load": o.LoadDuration, "prompt eval": o.PromptEvalDuration, "eval": o.EvalDuration} {
		if d <= 0 {
			t.Fatalf("%s duration %d, want > 0 ns", name, d)
		}
	}
	if o.TotalDuration < o.LoadDuration || o.TotalDuration < o.EvalDuration {
		t.Fatalf("durations do not add up: %+v", o)
	}
	if _, err := time.Parse(time.RFC3339Nano, o.CreatedAt); err != nil {
		t.Fatalf("created_at %q: %v", o.CreatedAt, err)
	}
}

func TestOllamaAPIBothProviderProtocols(t *testing.T) {
	harness.Parallel(t)
	rig := startOllamaRig(t)
	providers := []struct {
		name, model string // the provider's protocol, the model name a client uses
		proxy       *recordingProxy
		chatPath    string // where a chat arrives at the provider
		rawPath     string // where a raw generate arrives
	}{
		{"ollama", "llama3", rig.ollamaProxy, "/api/chat", "/api/generate"},
		{"openai", rigOpenAIModel, rig.openaiProx, "/v1/chat/completions", "/v1/completions"},
	}
	texts := map[string]string{} // endpoint → answer text, the same from both providers
	for _, p := range providers {
		for _, endpoint := range []string{"chat", "generate", "generate-raw"} {
			var body string
			switch endpoint {
			case "chat":
				body = fmt.Sprintf(`{"model":%q,"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"say something"}],"options":{"num_predict":5}`, p.model)
			case "generate":
				body = fmt.Sprintf(`{"model":%q,"prompt":"say something","system":"be brief","options":{"num_predict":5}`, p.model)
			case "generate-raw":
				body = fmt.Sprintf(`{"model":%q,"prompt":"[INST] say something [/INST]","raw":true,"options":{"num_predict":5}`, p.model)
			}
			path := "/api/chat"
			if endpoint != "chat" {
				path = "/api/generate"
			}
			wantProviderPath := p.chatPath
			if endpoint == "generate-raw" {
				wantProviderPath = p.rawPath
			}
			var streamed string
			t.Run(p.name+"/"+endpoint+"/stream", func(t *testing.T) {
				resp, data := rig.do(t, http.MethodPost, path, body+`}`) // "stream" absent: Ollama streams
				if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/x-ndjson" {
					t.Fatalf("status %d, Content-Type %q: %s", resp.StatusCode, resp.Header.Get("Content-Type"), data)
				}
				lines := ndjson(t, data)
				if len(lines) != 6 {
					t.Fatalf("%d lines, want 5 tokens and the final object: %s", len(lines), data)
				}
				for _, l := range lines[:5] {
					if l.Done || l.text() == "" || l.Model != p.model || l.DoneReason != "" || l.TotalDuration != 0 || l.EvalCount != 0 {
						t.Fatalf("token line %+v", l)
					}
					if (endpoint == "chat") != (l.Message != nil) || (endpoint == "chat") == (l.Response != nil) {
						t.Fatalf("chat answers carry message, generate answers response: %+v", l)
					}
					if l.Message != nil && l.Message.Role != "assistant" {
						t.Fatalf("role %q", l.Message.Role)
					}
					streamed += l.text()
				}
				final := lines[5]
				checkFinal(t, final, p.model, "length", 5)
				if final.text() != "" {
					t.Fatalf("the final object of a stream repeats text %q", final.text())
				}
				if got := p.proxy.last(t).Path; got != wantProviderPath {
					t.Fatalf("the provider got %s, want %s", got, wantProviderPath)
				}
			})
			t.Run(p.name+"/"+endpoint+"/no-stream", func(t *testing.T) {
				resp, data := rig.do(t, http.MethodPost, path, body+`,"stream":false}`)
				if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/json; charset=utf-8" {
					t.Fatalf("status %d, Content-Type %q: %s", resp.StatusCode, resp.Header.Get("Content-Type"), data)
				}
				o := decodeObject(t, data)
				checkFinal(t, o, p.model, "length", 5)
				if o.text() != streamed || len(strings.Fields(o.text())) != 5 {
					t.Fatalf("one object %q, streamed %q", o.text(), streamed)
				}
				if prev, ok := texts[endpoint]; ok && prev != o.text() {
					t.Fatalf("the providers answered %q and %q to one prompt", prev, o.text())
				}
				texts[endpoint] = o.text()
			})
		}
	}
	waitIdle(t, rig.e)
}

func TestOllamaTagsListWhatChatAccepts(t *testing.T) {
	harness.Parallel(t)
	rig := startOllamaRig(t)
	_, data := rig.do(t, http.MethodGet, "/api/tags", "")
	var tags struct {
		Models []struct {
			Name, Model, Digest string
			ModifiedAt          string `json:"modified_at"`
		} `json:"models"`
	}
	if err := json.Unmarshal(data, &tags); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, m := range tags.Models {
		names = append(names, m.Name)
		if m.Model != m.Name || len(m.Digest) != 64 || m.ModifiedAt == "" {
			t.Fatalf("entry %+v", m)
		}
	}
	// Names with their tag, as Ollama lists them.
	if want := []string{"both:latest", rigOllamaModel, rigOpenAIModel}; !slices.Equal(names, want) {
		t.Fatalf("tags %v, want %v", names, want)
	}
	chat := func(model string) (int, []byte) {
		resp, data := rig.do(t, http.MethodPost, "/api/chat",
			fmt.Sprintf(`{"model":%q,"stream":false,"messages":[{"role":"user","content":"hi"}],"options":{"num_predict":1}}`, model))
		return resp.StatusCode, data
	}
	// Every listed name is accepted, and so is its other spelling.
	for _, name := range append(names, "llama3", "both") {
		if status, data := chat(name); status != http.StatusOK {
			t.Fatalf("/api/chat with listed model %q: %d %s", name, status, data)
		}
	}
	// Nothing else is: not another tag, not a served name's prefix.
	for _, name := range []string{"nope", "llama3:8b", "qwen2", "qwen2:latest", "both:7b", "LLAMA3"} {
		status, data := chat(name)
		if status != http.StatusNotFound || decodeObject(t, data).Error != fmt.Sprintf("model '%s' not found", name) {
			t.Fatalf("/api/chat with unlisted model %q: %d %s", name, status, data)
		}
	}
	waitIdle(t, rig.e)
}

func TestOllamaOnlyFieldsReachOllamaProvidersUnchanged(t *testing.T) {
	harness.Parallel(t)
	rig := startOllamaRig(t)
	for _, keepAlive := range []string{`"24h"`, `300`, `-1`} {
		for _, p := range []struct {
			model string
			proxy *recordingProxy
		}{{"llama3", rig.ollamaProxy}, {rigOpenAIModel, rig.openaiProx}} {
			body := fmt.Sprintf(`{"model":%q,"stream":false,"keep_alive":%s,"think":false,"messages":[{"role":"user","content":"hi"}],
				"options":{"num_ctx":8192,"top_k":40,"temperature":0.5,"num_predict":2,"mirostat_tau":5.0}}`, p.model, keepAlive)
			if resp, data := rig.do(t, http.MethodPost, "/api/chat", body); resp.StatusCode != http.StatusOK {
				t.Fatalf("%d %s", resp.StatusCode, data)
			}
			var got map[string]json.RawMessage
			if err := json.Unmarshal(p.proxy.last(t).Body, &got); err != nil {
				t.Fatal(err)
			}
			var opts map[string]json.RawMessage
			if p.proxy == rig.ollamaProxy {
				_ = json.Unmarshal(got["options"], &opts)
				for field, want := range map[string]string{
					"keep_alive": keepAlive, "think": "false", "options.num_ctx": "8192", "options.top_k": "40",
					"options.mirostat_tau": "5.0", "options.temperature": "0.5", "options.num_predict": "2",
				} {
					v := got[field]
					if name, ok := strings.CutPrefix(field, "options."); ok {
						v = opts[name]
					}
					if string(v) != want {
						t.Fatalf("the Ollama provider got %s = %s, want %s (body %s)", field, v, want, p.proxy.last(t).Body)
					}
				}
				continue
			}
			for _, k := range []string{"iop_ollama", "keep_alive", "think", "options", "num_ctx"} {
				if _, ok := got[k]; ok {
					t.Fatalf("the OpenAI-compatible provider got %q: %s", k, p.proxy.last(t).Body)
				}
			}
			if string(got["temperature"]) != "0.5" || string(got["max_tokens"]) != "2" {
				t.Fatalf("the OpenAI-compatible provider got %s", p.proxy.last(t).Body)
			}
		}
	}
	waitIdle(t, rig.e)
}

func TestOllamaErrorsAreOllamaShaped(t *testing.T) {
	harness.Parallel(t)
	rig := startOllamaRig(t)
	for _, c := range []struct {
		method, path, body string
		status             int
		want               string // in the error text
	}{
		{http.MethodPost, "/api/chat", `{"model":"nope","messages":[{"role":"user","content":"hi"}]}`, 404, `model 'nope' not found`},
		{http.MethodPost, "/api/generate", `{"model":"nope","prompt":"hi"}`, 404, `model 'nope' not found`},
		{http.MethodPost, "/api/chat", `{"model":"llama3","messages":[{"role":"user","content":"hi"}]`, 400, "not valid JSON"},
		{http.MethodPost, "/api/chat", `{"messages":[{"role":"user","content":"hi"}]}`, 400, "model"},
		{http.MethodPost, "/api/chat", `{"model":"llama3","messages":[{"role":"user","content":7}]}`, 400, "messages[0].content"},
		{http.MethodPost, "/api/chat", `{"model":"llama3","messages":[{"role":"user","content":"hi"}],"options":{"temperature":"hot"}}`, 400, "options.temperature"},
		{http.MethodPost, "/api/chat", `{"model":"llama3","messages":[{"role":"user","content":"hi","images":["%%%"]}]}`, 400, "messages[0].images[0]"},
		{http.MethodPost, "/api/chat", `{"model":"llama3","format":"yaml","messages":[{"role":"user","content":"hi"}]}`, 400, "format"},
		{http.MethodPost, "/api/generate", `{"model":"llama3","prompt":"hi","context":[1,2,3]}`, 400, "context"},
		{http.MethodPost, "/api/chat", `{"model":"qwen2:7b","messages":[{"role":"user","content":"hi","images":["iVBORw0KGgo="]}]}`, 400, "vision"},
		{http.MethodGet, "/api/chat", ``, 405, "method not allowed"},
		{http.MethodPost, "/api/nothing", `{}`, 404, "unknown url"},
		{http.MethodPost, "/api/show", `{"model":"nope"}`, 404, `model 'nope' not found`},
	} {
		resp, data := rig.do(t, c.method, c.path, c.body)
		if resp.StatusCode != c.status || !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
			t.Fatalf("%s %s %s: %d %q %s, want %d", c.method, c.path, c.body, resp.StatusCode, resp.Header.Get("Content-Type"), data, c.status)
		}
		var e map[string]any
		if err := json.Unmarshal(data, &e); err != nil || len(e) != 1 {
			t.Fatalf("not {\"error\":...}: %s", data)
		}
		if msg, _ := e["error"].(string); !strings.Contains(msg, c.want) {
			t.Fatalf("%s %s: error %q, want it to contain %q", c.method, c.path, msg, c.want)
		}
	}
	waitIdle(t, rig.e)
}

func TestOllamaProbesVersionShowAndLoad(t *testing.T) {
	harness.Parallel(t)
	rig := startOllamaRig(t)
	for _, method := range []string{http.MethodGet, http.MethodHead} {
		resp, data := rig.do(t, method, "/", "")
		if want := map[string]string{"GET": "Ollama is running", "HEAD": ""}[method]; resp.StatusCode != 200 || string(data) != want {
			t.Fatalf("%s /: %d %q", method, resp.StatusCode, data)
		}
	}
	if _, data := rig.do(t, http.MethodGet, "/api/version", ""); string(data) != `{"version":"0.17.4"}`+"\n" {
		t.Fatalf("version %s", data)
	}

	// A name an Ollama provider serves (an alias: its first target) is
	// shown with that Ollama's own answer; one only an OpenAI-compatible
	// provider serves with iop's view.
	_, direct := postTo(t, rig.client, rig.ollamaProxy.URL+"/api/show", `{"model":"`+rigOllamaModel+`"}`)
	for _, body := range []string{`{"model":"both"}`, `{"name":"llama3"}`} { // an alias; the older field, the untagged name
		if _, data := rig.do(t, http.MethodPost, "/api/show", body); string(data) != string(direct) {
			t.Fatalf("show %s: %s, want the Ollama's %s", body, data, direct)
		}
	}
	_, data := rig.do(t, http.MethodPost, "/api/show", `{"model":"`+rigOpenAIModel+`"}`)
	var show struct {
		Capabilities []string       `json:"capabilities"`
		ModelInfo    map[string]any `json:"model_info"`
	}
	if err := json.Unmarshal(data, &show); err != nil || show.ModelInfo["iop.name"] != rigOpenAIModel || show.ModelInfo["iop.alias"] != false ||
		len(show.ModelInfo["iop.providers"].([]any)) != 1 {
		t.Fatalf("show %s", data)
	}
	rig.ollamaProxy.mu.Lock()
	rig.ollamaProxy.reqs = nil // the /api/show requests: what follows must send none
	rig.ollamaProxy.mu.Unlock()

	for _, c := range []struct{ path, body, reason string }{
		{"/api/chat", `{"model":"llama3","messages":[]}`, "load"},
		{"/api/generate", `{"model":"qwen2:7b"}`, "load"},
		{"/api/generate", `{"model":"qwen2:7b","keep_alive":0}`, "unload"},
		{"/api/chat", `{"model":"both","keep_alive":"0s"}`, "unload"},
	} {
		resp, data := rig.do(t, http.MethodPost, c.path, c.body)
		o := decodeObject(t, data)
		if resp.StatusCode != 200 || !o.Done || o.DoneReason != c.reason || o.text() != "" {
			t.Fatalf("%s %s: %d %s", c.path, c.body, resp.StatusCode, data)
		}
	}
	if resp, data := rig.do(t, http.MethodPost, "/api/chat", `{"model":"nope","messages":[]}`); resp.StatusCode != 404 {
		t.Fatalf("loading an unknown model: %d %s", resp.StatusCode, data)
	}
	rig.ollamaProxy.mu.Lock()
	defer rig.ollamaProxy.mu.Unlock()
	if len(rig.ollamaProxy.reqs) != 0 {
		t.Fatalf("a load request reached the provider: %+v", rig.ollamaProxy.reqs)
	}
}

// TestOllamaPSListsRunsInFlight: /api/ps counts a provider's runs in
// flight of the model it holds (in_flight), reported loaded by its server
// or not.
func TestOllamaPSListsRunsInFlight(t *testing.T) {
	harness.Parallel(t)
	_, hangURL := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOllama, Models: []string{"slow:1b"}, Faults: sim.Faults{Hang: true}})
	rig := startOllamaRig(t, node.ProviderConfig{ID: "slow-1", Type: node.TypeOllama, BaseURL: hangURL, Models: []string{"slow:1b"}, Capacity: 2})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+rig.e.HTTPAddr+"/api/chat",
			strings.NewReader(`{"model":"slow:1b","messages":[{"role":"user","content":"hi"}]}`))
		if resp, err := rig.client.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	type psModel struct {
		Name     string `json:"name"`
		InFlight int    `json:"in_flight"`
	}
	// slow-1's entries (the other providers hold their models too).
	ps := func() []psModel {
		_, data := rig.do(t, http.MethodGet, "/api/ps", "")
		var out struct {
			Models []struct {
				psModel
				ProviderID string `json:"provider_id"`
			}
		}
		if err := json.Unmarshal(data, &out); err != nil {
			t.Fatal(err)
		}
		var slow []psModel
		for _, m := range out.Models {
			if m.ProviderID == "slow-1" {
				slow = append(slow, m.psModel)
			}
		}
		return slow
	}
	testenv.Eventually(t, "/api/ps lists the run", func() bool { m := ps(); return len(m) == 1 && m[0] == psModel{"slow:1b", 1} })
	cancel()
	<-done
	testenv.Eventually(t, "/api/ps lists no run", func() bool { m := ps(); return len(m) == 0 || len(m) == 1 && m[0].InFlight == 0 })
	waitIdle(t, rig.e)
}

// startRawProvider starts an OpenAI-compatible server that answers every
// request with status 200, Content-Type text/event-stream and the given
// writes, each flushed on its own (a stand-in for a provider whose stream
// framing iop sim does not produce). It returns its /v1 base URL.
func startRawProvider(t *testing.T, writes ...string) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		for _, s := range writes {
			if _, err := io.WriteString(w, s); err != nil {
				return
			}
			http.NewResponseController(w).Flush()
		}
	}))
	t.Cleanup(srv.Close)
	return srv.URL + "/v1"
}

func TestOllamaClientOverFragmentedOpenAIStream(t *testing.T) {
	harness.Parallel(t)
	// "héllo wörld": é and ö split between writes; lines split; CRLF and
	// bare CR line ends; "data:" without a space; two events in one write;
	// a comment; a usage chunk with "choices": [].
	raw := startRawProvider(t,
		`data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}`+"\r\n\r\n"+`data:{"choices":[{"index":0,"delta":{"content":"h`+"\xc3",
		"\xa9llo"+`"}}]}`+"\r",
		"\r\n: keep-alive\n\n"+`data: {"choices":[{"index":0,"delta":{"content":" w`+"\xc3\xb6",
		`rld"},"finish_reason":null}]}`+"\n\n"+`data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`+"\n\nda",
		`ta: {"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":3,"total_tokens":10}}`+"\r\r",
		"data: [DONE]\n\n")
	rig := startOllamaRig(t, node.ProviderConfig{ID: "raw-1", Type: "openai", BaseURL: raw, Models: []string{"raw:1b"}, Capacity: 1})
	resp, data := rig.do(t, http.MethodPost, "/api/chat", `{"model":"raw:1b","messages":[{"role":"user","content":"hi"}]}`)
	if resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, data)
	}
	lines := ndjson(t, data)
	var text strings.Builder
	for _, l := range lines[:len(lines)-1] {
		text.WriteString(l.text())
	}
	final := lines[len(lines)-1]
	if text.String() != "héllo wörld" || final.EvalCount != 3 || final.PromptEvalCount != 7 || final.DoneReason != "stop" || !final.Done {
		t.Fatalf("text %q, final %+v", text.String(), final)
	}
	resp, data = rig.do(t, http.MethodPost, "/api/generate", `{"model":"raw:1b","prompt":"hi","stream":false}`)
	if o := decodeObject(t, data); resp.StatusCode != 200 || o.text() != "héllo wörld" || o.EvalCount != 3 {
		t.Fatalf("%d %s", resp.StatusCode, data)
	}
	waitIdle(t, rig.e)
}

func TestRegression_OllamaErrorInside200StreamFailsTheRun(t *testing.T) {
	harness.Parallel(t)
	// A provider that starts a 200 stream and then reports an error in it
	// must not look like a clean answer to an Ollama client.
	raw := startRawProvider(t,
		`data: {"choices":[{"index":0,"delta":{"content":"partial"}}]}`+"\n\n",
		`data: {"error":{"message":"the model crashed","type":"server_error"}}`+"\n\n",
		"data: [DONE]\n\n")
	rig := startOllamaRig(t, node.ProviderConfig{ID: "raw-1", Type: "openai", BaseURL: raw, Models: []string{"raw:1b"}, Capacity: 1})
	resp, data := rig.do(t, http.MethodPost, "/api/chat", `{"model":"raw:1b","messages":[{"role":"user","content":"hi"}]}`)
	lines := ndjson(t, data)
	if resp.StatusCode != 200 || len(lines) != 2 || lines[0].text() != "partial" {
		t.Fatalf("%d %s", resp.StatusCode, data)
	}
	if last := lines[1]; last.Done || last.Error != "the model crashed" {
		t.Fatalf("the stream ended with %s, want an error line and no done object", data)
	}
	resp, data = rig.do(t, http.MethodPost, "/api/chat", `{"model":"raw:1b","stream":false,"messages":[{"role":"user","content":"hi"}]}`)
	if o := decodeObject(t, data); resp.StatusCode != http.StatusBadGateway || o.Error != "the model crashed" || o.Done {
		t.Fatalf("%d %s", resp.StatusCode, data)
	}
	waitIdle(t, rig.e)
}

func TestOllamaClientGetsToolCallsFromOpenAIProvider(t *testing.T) {
	harness.Parallel(t)
	// Tool-call deltas split over chunks (index, id, partial arguments)
	// become one Ollama tool call with an arguments object.
	raw := startRawProvider(t,
		`data: {"choices":[{"index":0,"delta":{"role":"assistant","tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"get_weather","arguments":""}}]}}]}`+"\n\n",
		`data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"city\":"}}]}}]}`+"\n\n",
		`data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"\"Paris\"}"}}]}}]}`+"\n\n",
		`data: {"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}`+"\n\ndata: [DONE]\n\n")
	rig := startOllamaRig(t, node.ProviderConfig{ID: "raw-1", Type: "openai", BaseURL: raw, Models: []string{"raw:1b"}, Capacity: 1, Capabilities: []string{"tools"}})
	req := `{"model":"raw:1b","messages":[{"role":"user","content":"weather?"}],"tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}}]`
	want := `[{"function":{"name":"get_weather","arguments":{"city":"Paris"}}}]`
	resp, data := rig.do(t, http.MethodPost, "/api/chat", req+`}`)
	lines := ndjson(t, data)
	if resp.StatusCode != 200 || len(lines) != 2 || lines[0].Message == nil || lines[0].Done || !lines[1].Done || lines[1].DoneReason != "stop" {
		t.Fatalf("%d %s", resp.StatusCode, data)
	}
	if got, _ := json.Marshal(lines[0].Message.ToolCalls); string(got) != want {
		t.Fatalf("tool calls %s, want %s", got, want)
	}
	resp, data = rig.do(t, http.MethodPost, "/api/chat", req+`,"stream":false}`)
	o := decodeObject(t, data)
	if got, _ := json.Marshal(o.Message.ToolCalls); resp.StatusCode != 200 || string(got) != want {
		t.Fatalf("%d %s", resp.StatusCode, data)
	}
	waitIdle(t, rig.e)
}

// TestRegression_LoadOfAModelWhoseNodeIsGoneIsUnavailable: Ollama's load
// request (/api/generate or /api/chat with nothing to generate) for a model
// whose only node had just gone answered 404 "try pulling it first", while
// a request that generates answered 503. It answers
// 503 with Retry-After too; a model never served is still 404.
func TestRegression_LoadOfAModelWhoseNodeIsGoneIsUnavailable(t *testing.T) {
	harness.Parallel(t)
	_, url := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOllama, Models: []string{"m"}})
	e := startEdgeWith(t, process.DefaultEdgeFile(), harness.Logger(t, "edge"))
	nodeCtx, stopNode := context.WithCancel(context.Background())
	harness.Node(t, nodeCtx, node.Config{NodeID: "n1", Edge: e.NodeAddr, Providers: []node.ProviderConfig{
		{ID: "o", Type: node.TypeOllama, BaseURL: url, Models: []string{"m"}}}})
	post := func(path, body string) (int, string, string) {
		resp, err := http.Post("http://"+e.HTTPAddr+path, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header.Get("Retry-After"), string(b)
	}
	if st, _, body := post("/api/generate", `{"model":"m"}`); st != http.StatusOK || !strings.Contains(body, `"done_reason":"load"`) {
		t.Fatalf("load while served: %d %s", st, body)
	}
	stopNode()
	testenv.Eventually(t, "the node is gone", func() bool { return len(e.Service.Snapshot().Nodes) == 0 })
	for _, path := range []string{"/api/generate", "/api/chat"} {
		st, retry, body := post(path, `{"model":"m"}`)
		if st != http.StatusServiceUnavailable || retry == "" {
			t.Errorf("%s load of m, its node gone: %d Retry-After %q %s, want 503 with Retry-After", path, st, retry, body)
		}
	}
	if st, _, body := post("/api/generate", `{"model":"never"}`); st != http.StatusNotFound || !strings.Contains(body, "model 'never' not found") {
		t.Errorf("load of a model never served: %d %s, want 404", st, body)
	}
}
