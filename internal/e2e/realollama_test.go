package e2e

// End-to-end tests against a real Ollama (internal/ollamatest: the server
// `make test` builds, with tiny random-weight models created by the test):
// `iop dev --ollama URL` discovering it and serving the official JavaScript
// clients, and an edge with a node whose providers drive it on both
// execution paths (type ollama on the native API, type openai on Ollama's
// own /v1): a model Ollama does not have, tools reaching Ollama, a client
// that goes away mid-stream.

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"iop/internal/e2e/harness"
	"iop/internal/edge"
	"iop/internal/node"
	"iop/internal/ollamatest"
	"iop/internal/process"
	"iop/internal/testenv"
)

// ollamaTags is the model names an Ollama-style /api/tags lists, in order.
func ollamaTags(t *testing.T, c *http.Client, base string) []string {
	t.Helper()
	resp, err := c.Get(base + "/api/tags")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var tags struct{ Models []struct{ Name string } }
	if err := json.NewDecoder(resp.Body).Decode(&tags); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s/api/tags: %d %v", base, resp.StatusCode, err)
	}
	var names []string
	for _, m := range tags.Models {
		names = append(names, m.Name)
	}
	return names
}

// TestRealOllama_Dev runs `iop dev --ollama URL` as a child process on a
// real Ollama with four models: it discovers them (/v1/models and
// /api/tags list each, and the alias demo), serves chat through demo and by
// name, and the official `openai` and `ollama` JavaScript clients pass
// their checks against it (test/js/real_openai.mjs, real_ollama.mjs).
func TestRealOllama_Dev(t *testing.T) {
	harness.ParallelOllama(t)
	s := ollamatest.Start(t)
	// Ollama lists the newest model first: every other model is created a
	// second before tiny (modified_at has one-second steps), so tiny heads
	// the list. iop dev's demo alias is every model, the least loaded that
	// can take a request first, so the clients' checks name models, not
	// demo: demo may be the thinking model (its answer is all thinking) or
	// tiny-abort, whose slot the first script's abort check may leave taken
	// (ollama/ollama#17131), and a request and its repeat may go to two
	// models.
	s.CreateModel(t, "tiny-embed", ollamatest.Embedding)
	s.CreateModel(t, "tiny-think", ollamatest.Thinking)
	s.CreateModel(t, "tiny-abort", ollamatest.Plain) // only for the clients' abort checks (ollama/ollama#17131)
	s.CreateModel(t, "tiny-tools", ollamatest.Tools)
	created := time.Now().Unix()
	testenv.Eventually(t, "the next second", func() bool { return time.Now().Unix() > created })
	s.CreateModel(t, "tiny", ollamatest.Plain)
	all := []string{"tiny:latest", "tiny-tools:latest", "tiny-abort:latest", "tiny-think:latest", "tiny-embed:latest"}
	c := &http.Client{Transport: &http.Transport{}}
	defer c.CloseIdleConnections()
	if tags := ollamaTags(t, c, s.URL); len(tags) != len(all) || tags[0] != "tiny:latest" {
		t.Fatalf("Ollama lists %v: want %d models, tiny first", tags, len(all))
	}

	bin := harness.IOP(t)
	addr := testenv.ProcessAddr(t)
	logs := &harness.Buffer{}
	cmd := exec.Command(bin, "dev", "--listen", addr, "--node-listen", "127.0.0.1:0", "--ollama", s.URL, "--database", ":memory:", "--log-level", "warn")
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("iop dev output:\n%s", logs.String())
		}
	})
	testenv.Eventually(t, "iop dev's banner", func() bool { return strings.Contains(logs.String(), "iop dev is ready") })
	if out := logs.String(); !strings.Contains(out, "local Ollama at "+s.URL+" (5 models, behind alias \"demo\")") {
		t.Fatalf("banner does not name the Ollama and its models:\n%s", out)
	}
	base := "http://" + addr

	// What it serves: every Ollama model and the alias.
	status, body := postTo(t, c, base+"/v1/chat/completions", `{"model":"demo","max_tokens":3,"messages":[{"role":"user","content":"hi"}]}`)
	var answer struct {
		Choices []struct {
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
		Usage struct {
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}
	if status != http.StatusOK || json.Unmarshal(body, &answer) != nil || len(answer.Choices) != 1 ||
		answer.Choices[0].FinishReason != "length" || answer.Usage.CompletionTokens != 3 {
		t.Fatalf("chat via demo: %d %s", status, body)
	}
	resp, err := c.Get(base + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	var list struct{ Data []struct{ ID string } }
	err = json.NewDecoder(resp.Body).Decode(&list)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, m := range list.Data {
		ids = append(ids, m.ID)
	}
	for _, want := range append([]string{"demo"}, all...) {
		if !slices.Contains(ids, want) {
			t.Errorf("/v1/models lists %v, not %s", ids, want)
		}
	}
	if tags := ollamaTags(t, c, base); len(tags) < len(all) {
		t.Errorf("iop's /api/tags lists %v, want at least %v", tags, all)
	}

	chat, _ := json.Marshal([]string{"tiny:latest", "tiny-tools:latest"})
	allJSON, _ := json.Marshal(all)
	// Each script ends with a client going away mid-stream on tiny-abort:
	// Ollama must end that request too.
	abortEnded := func(t *testing.T, mark int) {
		t.Helper()
		if t.Skipped() {
			return // the script did not run (its packages are missing)
		}
		runner := "runner.name=registry.ollama.ai/library/tiny-abort:latest "
		testenv.Eventually(t, "Ollama to log that tiny-abort's runner went idle", func() bool {
			for _, line := range strings.Split(s.LogSince(mark), "\n") {
				if strings.Contains(line, runner) && strings.Contains(line, `msg="runner with non-zero duration has gone idle`) {
					return true
				}
			}
			return false
		})
	}
	t.Run("openai client", func(t *testing.T) {
		mark := len(s.Log())
		defer abortEnded(t, mark)
		runJSTest(t, "real_openai.mjs",
			"IOP_BASE_URL="+base+"/v1",
			"IOP_CHAT_MODELS="+string(chat),
			"IOP_ABORT_MODEL=tiny-abort:latest",
			"IOP_EMBED_MODEL=tiny-embed:latest",
			"IOP_ALL_MODELS="+string(allJSON),
			"IOP_DEFAULT_TOKENS=16")
	})
	t.Run("ollama client", func(t *testing.T) {
		mark := len(s.Log())
		defer abortEnded(t, mark)
		runJSTest(t, "real_ollama.mjs",
			"IOP_OLLAMA_HOST="+base,
			"IOP_CHAT_MODELS="+string(chat),
			"IOP_ABORT_MODEL=tiny-abort:latest",
			"IOP_EMBED_MODEL=tiny-embed:latest",
			"IOP_THINK_MODEL=tiny-think:latest",
			"IOP_ALL_MODELS="+string(allJSON))
	})
}

// realRig is an edge and a node whose two providers drive one real Ollama:
// "native" (type ollama, normalized path) and "v1" (type openai on
// Ollama's /v1, tunnel path), each behind a recording proxy, both with
// capability tools configured.
type realRig struct {
	s              *ollamatest.Server
	e              *process.Process
	native, tunnel *recordingProxy
	client         *http.Client
}

// Served names of the rig. Each provider has models of its own, so a
// request names its path: Ollama has every model but the ghosts.
var (
	rigNativeModels = []string{"tiny", "tools-n", "cancel-n", "ghost-n"}
	rigTunnelModels = []string{"tiny-v1", "tools-v1", "cancel-v1", "ghost-v1"}
)

func startRealRig(t *testing.T) *realRig {
	t.Helper()
	rig := &realRig{s: ollamatest.Start(t)}
	for _, m := range [][2]string{{"tiny", "plain"}, {"tiny-v1", "plain"}, {"tools-n", "tools"}, {"tools-v1", "tools"},
		{"cancel-n", "plain"}, {"cancel-v1", "plain"}} {
		rig.s.CreateModel(t, m[0], ollamatest.Variant(m[1]))
	}
	rig.native = startRecordingProxy(t, rig.s.URL)
	rig.tunnel = startRecordingProxy(t, rig.s.URL)
	ctx, cancel := context.WithCancel(context.Background())
	rig.e = harness.Edge(t, ctx, harness.EdgeConfig(map[string]edge.ModelConfig{}))
	t.Cleanup(cancel)
	harness.Node(t, ctx, node.Config{
		NodeID: "gpu-1",
		Edge:   rig.e.NodeAddr,
		Providers: []node.ProviderConfig{
			{ID: "native", Type: node.TypeOllama, BaseURL: rig.native.URL, Models: rigNativeModels, Capacity: 2, Capabilities: []string{"tools"}},
			{ID: "v1", Type: node.TypeOpenAI, BaseURL: rig.tunnel.URL + "/v1", Models: rigTunnelModels, Capacity: 2, Capabilities: []string{"tools"}},
		},
	})
	transport := &http.Transport{}
	t.Cleanup(transport.CloseIdleConnections)
	rig.client = &http.Client{Transport: transport}
	return rig
}

func (rig *realRig) post(t *testing.T, path, body string) (int, []byte) {
	t.Helper()
	return postTo(t, rig.client, "http://"+rig.e.HTTPAddr+path, body)
}

// TestRealOllama_UnknownModel: the node advertises a model Ollama does not
// have. The client gets 404 (the provider's own status, relayed: DESIGN's
// "unknown model 404"), with an error body that names the model and not
// Ollama's address, before any byte of an answer, on every endpoint and
// both paths; and, being a 4xx, it leaves the provider in rotation however
// often it happens (the circuit breaker opens after 3 failures in a row).
func TestRealOllama_UnknownModel(t *testing.T) {
	harness.ParallelOllama(t)
	rig := startRealRig(t)
	for _, tc := range []struct{ path, model, body string }{
		{"/v1/chat/completions", "ghost-n", `"messages":[{"role":"user","content":"hi"}]`},
		{"/v1/chat/completions", "ghost-n", `"stream":true,"messages":[{"role":"user","content":"hi"}]`},
		{"/v1/completions", "ghost-n", `"prompt":"hi"`},
		{"/api/chat", "ghost-n", `"messages":[{"role":"user","content":"hi"}]`},
		{"/api/generate", "ghost-n", `"prompt":"hi","stream":false`},
		{"/v1/chat/completions", "ghost-v1", `"messages":[{"role":"user","content":"hi"}]`},
		{"/v1/chat/completions", "ghost-v1", `"stream":true,"messages":[{"role":"user","content":"hi"}]`},
		{"/v1/completions", "ghost-v1", `"prompt":"hi","stream":true`},
		{"/api/chat", "ghost-v1", `"messages":[{"role":"user","content":"hi"}]`},
	} {
		status, body := rig.post(t, tc.path, `{"model":"`+tc.model+`",`+tc.body+`}`)
		var e struct {
			Error json.RawMessage `json:"error"`
		}
		if status != http.StatusNotFound || json.Unmarshal(body, &e) != nil || len(e.Error) == 0 {
			t.Errorf("%s %s %s: %d %s, want 404 with an error body", tc.path, tc.model, tc.body, status, body)
			continue
		}
		if !strings.Contains(string(e.Error), tc.model) || strings.Contains(string(body), rig.s.Addr) ||
			strings.Contains(string(body), strings.TrimPrefix(rig.native.URL, "http://")) {
			t.Errorf("%s %s: error %s: want the model named, no provider address", tc.path, tc.model, e.Error)
		}
	}
	// Both providers still take requests.
	for _, model := range []string{"tiny", "tiny-v1"} {
		if status, body := rig.post(t, "/v1/chat/completions", `{"model":"`+model+`","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`); status != http.StatusOK {
			t.Errorf("%s after the 404s: %d %s", model, status, body)
		}
	}
	waitIdle(t, rig.e)
}

// TestRealOllama_ToolsReachOllama: with capability tools configured, a
// chat request with tools is admitted, reaches Ollama with its tools (the
// proxy sees them), and Ollama, which checks the model's tools capability
// itself, answers it; a model whose template has no tools is refused by
// Ollama with 400, and the client gets that 400.
func TestRealOllama_ToolsReachOllama(t *testing.T) {
	harness.ParallelOllama(t)
	rig := startRealRig(t)
	tools := `"tools":[{"type":"function","function":{"name":"get_weather","description":"the weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}]`
	for _, tc := range []struct {
		model string
		proxy *recordingProxy
		path  string
	}{
		{"tools-n", rig.native, "/api/chat"},
		{"tools-v1", rig.tunnel, "/v1/chat/completions"},
	} {
		for _, stream := range []string{"false", "true"} {
			status, body := rig.post(t, "/v1/chat/completions", `{"model":"`+tc.model+`","max_tokens":3,"stream":`+stream+`,`+tools+`,"messages":[{"role":"user","content":"weather in Paris?"}]}`)
			if status != http.StatusOK {
				t.Errorf("%s stream %s: %d %s", tc.model, stream, status, body)
				continue
			}
			if stream == "true" && !strings.HasSuffix(string(body), "data: [DONE]\n\n") {
				t.Errorf("%s stream: %q does not end with [DONE]", tc.model, body)
			}
			got := tc.proxy.last(t)
			var sent struct {
				Model string `json:"model"`
				Tools []struct {
					Function struct{ Name string } `json:"function"`
				} `json:"tools"`
			}
			if got.Path != tc.path || json.Unmarshal(got.Body, &sent) != nil || len(sent.Tools) != 1 || sent.Tools[0].Function.Name != "get_weather" {
				t.Errorf("%s: Ollama got %s %s, want the tool", tc.model, got.Path, got.Body)
			}
		}
	}
	for _, model := range []string{"tiny", "tiny-v1"} {
		status, body := rig.post(t, "/v1/chat/completions", `{"model":"`+model+`",`+tools+`,"messages":[{"role":"user","content":"hi"}]}`)
		if status != http.StatusBadRequest || !strings.Contains(string(body), "does not support tools") {
			t.Errorf("tools to %s (no tools in its template): %d %s, want Ollama's 400", model, status, body)
		}
	}
	waitIdle(t, rig.e)
}

// TestRealOllama_ClientGoesAway: a client reads the first chunks of a long
// streamed answer and disconnects, on both paths and both APIs. The edge
// releases the slot (nothing in flight), and Ollama ends the request (its
// scheduler logs the model's runner going idle). No request follows on the
// same model (ollama/ollama#17131, see TestRealOllama_CancelMidStream in
// internal/node/adapter).
func TestRealOllama_ClientGoesAway(t *testing.T) {
	harness.ParallelOllama(t)
	rig := startRealRig(t)
	for _, tc := range []struct{ name, path, model, body string }{
		{"normalized", "/v1/chat/completions", "cancel-n", `"stream":true,"max_tokens":1000000,"messages":[{"role":"user","content":"hi"}]`},
		{"tunnel", "/v1/chat/completions", "cancel-v1", `"stream":true,"max_tokens":1000000,"messages":[{"role":"user","content":"hi"}]`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mark := len(rig.s.Log())
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+rig.e.HTTPAddr+tc.path, strings.NewReader(`{"model":"`+tc.model+`",`+tc.body+`}`))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Content-Type", "application/json")
			resp, err := rig.client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				b, _ := io.ReadAll(resp.Body)
				t.Fatalf("%d %s", resp.StatusCode, b)
			}
			sc := bufio.NewScanner(resp.Body)
			for events := 0; events < 3 && sc.Scan(); {
				if strings.HasPrefix(sc.Text(), "data: {") {
					events++
				}
			}
			if err := sc.Err(); err != nil {
				t.Fatalf("reading the stream: %v", err)
			}
			cancel()
			waitIdle(t, rig.e)
			runner := "runner.name=registry.ollama.ai/library/" + tc.model + ":latest "
			testenv.Eventually(t, "Ollama to log that the model's runner went idle", func() bool {
				for _, line := range strings.Split(rig.s.LogSince(mark), "\n") {
					if strings.Contains(line, runner) && strings.Contains(line, `msg="runner with non-zero duration has gone idle`) {
						return true
					}
				}
				return false
			})
		})
	}
}

// TestRealOllama_RepeatLimit: a greedy answer of the test model loops, and
// Ollama's repeat limit (30 equal tokens in a row) ends its stream without
// a done line (native API) or data: [DONE] (/v1). On both paths the client
// gets the text that came, then an error event and no clean end (DESIGN: a
// stream that fails after its headers ends with an error event).
func TestRealOllama_RepeatLimit(t *testing.T) {
	harness.ParallelOllama(t)
	rig := startRealRig(t)
	greedy := `"temperature":0,"seed":7,"max_tokens":1000,"messages":[{"role":"system","content":"you are terse"},{"role":"user","content":"why is the sky blue"}]`
	for _, model := range []string{"tiny", "tiny-v1"} {
		status, body := rig.post(t, "/v1/chat/completions", `{"model":"`+model+`","stream":true,`+greedy+`}`)
		events := strings.Split(strings.TrimSuffix(string(body), "\n\n"), "\n\n")
		last := events[len(events)-1]
		if status != http.StatusOK || len(events) < 3 || !strings.HasPrefix(last, `data: {"error":`) || slices.Contains(events, "data: [DONE]") {
			t.Errorf("%s SSE: %d, %d events, last %q: want chunks then an error event, no [DONE]", model, status, len(events), last)
		}
	}
	status, body := rig.post(t, "/api/chat", `{"model":"tiny","options":{"temperature":0,"seed":7,"num_predict":1000},"messages":[{"role":"system","content":"you are terse"},{"role":"user","content":"why is the sky blue"}]}`)
	lines := strings.Split(strings.TrimSpace(string(body)), "\n")
	if status != http.StatusOK || len(lines) < 3 || !strings.HasPrefix(lines[len(lines)-1], `{"error":`) || strings.Contains(string(body), `"done":true`) {
		t.Errorf("/api/chat NDJSON: %d, %d lines, last %q: want parts then an error line, no done", status, len(lines), lines[len(lines)-1])
	}
	waitIdle(t, rig.e)
}

// TestRealOllama_Responses: OpenAI's Responses API through iop to a real
// Ollama on both execution paths (the rig's native and /v1 providers): the
// official `openai` client's responses.create and responses.stream answer
// (test/js/real_responses.mjs), previous_response_id continues a
// conversation begun on one path on the other, text.format json_schema
// gets JSON of the schema, and a thinking model (on a second node) answers
// reasoning.effort with a reasoning item and its reasoning_tokens.
func TestRealOllama_Responses(t *testing.T) {
	harness.ParallelOllama(t)
	rig := startRealRig(t)
	rig.s.CreateModel(t, "think-r", ollamatest.Thinking)
	rig.s.CreateModel(t, "think-r-v1", ollamatest.Thinking)
	harness.Node(t, t.Context(), node.Config{
		NodeID: "gpu-2",
		Edge:   rig.e.NodeAddr,
		Providers: []node.ProviderConfig{
			{ID: "native-think", Type: node.TypeOllama, BaseURL: rig.s.URL, Models: []string{"think-r"}, Capacity: 2},
			{ID: "v1-think", Type: node.TypeOpenAI, BaseURL: rig.s.URL + "/v1", Models: []string{"think-r-v1"}, Capacity: 2},
		},
	})
	models, _ := json.Marshal([]map[string]string{{"path": "normalized", "model": "tiny"}, {"path": "tunnel", "model": "tiny-v1"}})
	thinkers, _ := json.Marshal([]map[string]string{{"path": "normalized", "model": "think-r"}, {"path": "tunnel", "model": "think-r-v1"}})
	runJSTest(t, "real_responses.mjs", "IOP_BASE_URL=http://"+rig.e.HTTPAddr+"/v1", "IOP_MODELS="+string(models), "IOP_THINK_MODELS="+string(thinkers))
}
