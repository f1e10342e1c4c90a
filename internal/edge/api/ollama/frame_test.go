package ollama

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"iop/internal/auth"
	"iop/internal/clock"
	"iop/internal/edge/api"
	"iop/internal/edge/api/apitest"
	"iop/internal/edge/api/request"
	"iop/internal/edge/contract"
	"iop/internal/ledger"
	"iop/internal/quota"
	"iop/internal/translate"
	"iop/internal/wire/nodev1"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// The frame's behaviours on the Ollama routes, moved with them from
// package api's tests.

// TestOptionalFeaturesOff: with the optional features left nil, /api/ps
// lists no model; /api/show is iop's own view; and a model only Known
// would know is unknown (404) where Known makes it unavailable (503).
func TestOptionalFeaturesOff(t *testing.T) {
	t.Parallel()
	env := newEnv(t, api.Config{}, okRun)
	if resp := env.get(t, "/api/ps"); resp.status != 200 || strings.TrimSpace(resp.body) != `{"models":[]}` {
		t.Errorf("/api/ps without Catalog: %d %s, want 200 and no model", resp.status, resp.body)
	}
	if status, _, body := env.ollamaPost(t, "/api/show", `{"model":"m"}`); status != 200 || !strings.Contains(body, `"capabilities"`) {
		t.Errorf("/api/show without Catalog and Shower: %d %s, want iop's own view", status, body)
	}
	load := `{"model":"gone"}`
	if status, _, body := env.ollamaPost(t, "/api/generate", load); status != http.StatusNotFound {
		t.Errorf("loading an unlisted model without Known: %d %s, want 404", status, body)
	}
	known := newEnv(t, api.Config{Known: func(model string) bool { return model == "gone" }}, okRun)
	if status, _, body := known.ollamaPost(t, "/api/generate", load); status != http.StatusServiceUnavailable {
		t.Errorf("loading a Known model no node serves: %d %s, want 503", status, body)
	}
}

// TestOllamaClientThinking: an Ollama client gets thinking as Ollama
// writes it, message.thinking (chat) or thinking (generate), streamed and
// whole, from an Ollama provider (run events) and from an OpenAI-compatible
// one (reasoning_content or reasoning in its SSE or JSON answer); with
// think false an OpenAI-compatible provider's reasoning is not shown.
func TestOllamaClientThinking(t *testing.T) {
	normalizedRun := func() *fakeRun {
		return scriptedRun(normalized, events(started(), thinkingDelta("So")), events(delta("Hi"), usageEvent(1, 2), complete("stop")))
	}
	sseRun := func(field string) func() *fakeRun {
		return func() *fakeRun {
			return scriptedRun(tunnel, tunnelHead(200, map[string]string{"Content-Type": "text/event-stream"}),
				tunnelData(`data: {"choices":[{"index":0,"delta":{"role":"assistant","content":null,"`+field+`":"So"}}]}`+"\n\n"),
				tunnelData(`data: {"choices":[{"index":0,"delta":{"content":"Hi"},"finish_reason":"stop"}]}`+"\n\ndata: [DONE]\n\n"), tunnelEnd())
		}
	}
	jsonRun := func() *fakeRun {
		return scriptedRun(tunnel, tunnelHead(200, map[string]string{"Content-Type": "application/json"}),
			tunnelData(`{"choices":[{"index":0,"message":{"role":"assistant","content":"Hi","reasoning_content":"So"},"finish_reason":"stop"}]}`), tunnelEnd())
	}
	const (
		chatStream = `{"model":"m"%s"role":"assistant","content":"","thinking":"So"},"done":false}` + "\n" +
			`{"model":"m"%s"role":"assistant","content":"Hi"},"done":false}` + "\n"
		chatWhole = `"message":{"role":"assistant","content":"Hi","thinking":"So"},"done":true`
		genStream = `"response":"","thinking":"So","done":false}` + "\n"
		genWhole  = `"response":"Hi","thinking":"So","done":true`
	)
	msgPrefix := `,"created_at":"","message":{`
	for _, c := range []struct {
		name, path, body string
		run              func() *fakeRun
		want             string // in the normalized body
	}{
		{"normalized chat stream", "/api/chat", `{"model":"m","messages":[{"role":"user","content":"q"}]}`, normalizedRun,
			strings.ReplaceAll(chatStream, "%s", msgPrefix)},
		{"normalized chat whole", "/api/chat", `{"model":"m","stream":false,"messages":[{"role":"user","content":"q"}]}`, normalizedRun, chatWhole},
		{"normalized generate stream", "/api/generate", `{"model":"m","prompt":"q"}`, normalizedRun, genStream},
		{"normalized generate whole", "/api/generate", `{"model":"m","prompt":"q","stream":false}`, normalizedRun, genWhole},
		{"tunnel reasoning_content chat stream", "/api/chat", `{"model":"m","messages":[{"role":"user","content":"q"}]}`, sseRun("reasoning_content"),
			strings.ReplaceAll(chatStream, "%s", msgPrefix)},
		{"tunnel reasoning chat whole", "/api/chat", `{"model":"m","stream":false,"messages":[{"role":"user","content":"q"}]}`, sseRun("reasoning"), chatWhole},
		{"tunnel reasoning generate stream", "/api/generate", `{"model":"m","prompt":"q"}`, sseRun("reasoning"), genStream},
		{"tunnel JSON answer", "/api/chat", `{"model":"m","stream":false,"messages":[{"role":"user","content":"q"}]}`, jsonRun, chatWhole},
	} {
		t.Run(c.name, func(t *testing.T) {
			env := newEnv(t, api.Config{}, runWith(c.run()))
			status, _, body := env.ollamaPost(t, c.path, c.body)
			if got := normalizeOllama(t, body); status != 200 || !strings.Contains(got, c.want) {
				t.Fatalf("%d\n%s\nwant it to hold\n%s", status, got, c.want)
			}
		})
	}
	t.Run("think false hides an OpenAI-compatible provider's reasoning", func(t *testing.T) {
		env := newEnv(t, api.Config{}, runWith(sseRun("reasoning_content")()))
		status, _, body := env.ollamaPost(t, "/api/chat", `{"model":"m","think":false,"stream":false,"messages":[{"role":"user","content":"q"}]}`)
		if status != 200 || strings.Contains(body, "thinking") || !strings.Contains(body, `"content":"Hi"`) {
			t.Fatalf("%d %s", status, body)
		}
		if req := env.gw.Requests()[0]; strings.Contains(string(req.Body), "reasoning_effort") {
			t.Fatalf("think false sent a reasoning_effort: %s", req.Body)
		}
	})
	t.Run("a think level reaches the canonical body as reasoning_effort", func(t *testing.T) {
		env := newEnv(t, api.Config{}, runWith(normalizedRun()))
		env.ollamaPost(t, "/api/chat", `{"model":"m","think":"high","messages":[{"role":"user","content":"q"}]}`)
		if req := env.gw.Requests()[0]; !strings.Contains(string(req.Body), `"reasoning_effort":"high"`) || strings.Contains(string(req.Body), "iop_ollama") ||
			string(req.OllamaFields) != `{"think":"high"}` {
			t.Fatalf("body %s, Ollama fields %s", req.Body, req.OllamaFields)
		}
	})
}

// The requests from Ollama clients carry nothing only OpenAI-compatible
// providers take (their think level needs a model that thinks, as any).
func TestOllamaRequestsNeedNoTunnelOnlySettings(t *testing.T) {
	env := newEnv(t, api.Config{}, runWith(scriptedRun(normalized, events(started(), delta("a"), complete("stop")))))
	env.ollamaPost(t, "/api/chat", `{"model":"m","think":"high","messages":[{"role":"user","content":"look","images":["iVBORw0KGgo="]}],
		"tools":[{"type":"function","function":{"name":"f"}}]}`)
	if req := env.gw.Requests()[0]; !slices.Equal(req.Needs, []string{"tools", "thinking", "vision"}) {
		t.Fatalf("needs %v", req.Needs)
	}
}

// TestThinkingOnlyStreamSendsAsItComes: a stream that is only thinking so
// far sends each piece to the client as it arrives, on both Ollama routes.
func TestThinkingOnlyStreamSendsAsItComes(t *testing.T) {
	for _, c := range []struct {
		path, body, want string
	}{
		{"/api/chat", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, `"thinking":"Hmm"`},
		{"/api/generate", `{"model":"m","prompt":"hi"}`, `"thinking":"Hmm"`},
	} {
		t.Run(c.path, func(t *testing.T) {
			run := liveRun(normalized, 4)
			env := newEnv(t, api.Config{}, runWith(run))
			var end sync.Once
			finish := func() { end.Do(func() { close(run.Up) }) }
			t.Cleanup(finish) // before env's cleanup, which waits for the handler
			run.Up <- events(started(), thinkingDelta("Hmm"))
			// The client reads on its own goroutine: the status line itself
			// waits for the first output.
			line := make(chan string, 8)
			go func() {
				defer close(line)
				resp, err := http.Post(env.srv.URL+c.path, "application/json", strings.NewReader(c.body))
				if err != nil {
					return
				}
				defer resp.Body.Close()
				sc := bufio.NewScanner(resp.Body)
				for sc.Scan() {
					line <- sc.Text()
				}
			}()
			deadline := time.After(10 * time.Second)
			for found := false; !found; {
				select {
				case l, ok := <-line:
					if !ok {
						t.Fatal("the answer ended without the thinking")
					}
					found = strings.Contains(l, c.want)
				case <-deadline:
					t.Fatalf("the thinking did not reach the client while the run went on")
				}
			}
			run.Up <- events(delta("ok"), complete("stop"))
			finish()
			for range line {
			}
		})
	}
}

// TestThinkingNeeds: an Ollama request that asks the model to think
// (think true or a level) needs a model that can (request.NeedThinking); one
// that does not ask, or asks for no thinking, needs nothing more.
func TestThinkingNeeds(t *testing.T) {
	user := `"messages":[{"role":"user","content":"hi"}]`
	for _, c := range []struct {
		path, body string
		want       []string
	}{
		{"/api/chat", `{"model":"m","think":true,` + user + `}`, []string{"thinking"}},
		{"/api/chat", `{"model":"m","think":"low",` + user + `}`, []string{"thinking"}},
		{"/api/chat", `{"model":"m","think":false,` + user + `}`, nil},
		{"/api/chat", `{"model":"m",` + user + `}`, nil},
		{"/api/generate", `{"model":"m","think":true,"prompt":"hi"}`, []string{"thinking"}},
		{"/api/generate", `{"model":"m","think":"high","prompt":"hi"}`, []string{"thinking"}},
		{"/api/generate", `{"model":"m","prompt":"hi"}`, nil},
	} {
		env := newEnv(t, api.Config{}, runWith(scriptedRun(normalized, events(started(), delta("a"), complete("stop")))))
		env.ollamaPost(t, c.path, c.body)
		if req := env.gw.Requests()[0]; !slices.Equal(req.Needs, c.want) {
			t.Errorf("%s %s: needs %v, want %v", c.path, c.body, req.Needs, c.want)
		}
	}
}

// TestOllamaRoutesDecodeBodyOnce: /api/chat, /api/generate and /api/embed
// decode the client's body once (in the translation) and do not parse
// the canonical body they generated.
func TestOllamaRoutesDecodeBodyOnce(t *testing.T) {
	for _, c := range []struct {
		path, body string
		run        *fakeRun
	}{
		{"/api/chat", `{"model":"m","stream":false,"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"f"}}]}`,
			scriptedRun(normalized, events(delta("hi"), complete("stop")))},
		{"/api/generate", `{"model":"m","stream":false,"prompt":"hi","system":"s"}`,
			scriptedRun(normalized, events(delta("hi"), complete("stop")))},
		{"/api/embed", `{"model":"m","input":["a","b"]}`,
			scriptedRun(normalized, events(&nodev1.RunEvent{Type: nodev1.RunEvent_TYPE_DELTA, Embeddings: []*nodev1.Embedding{{Values: []float32{1}}, {Values: []float32{2}}}}), events(complete("stop")))},
	} {
		t.Run(c.path, func(t *testing.T) {
			env := newEnv(t, api.Config{}, runWith(c.run))
			decodes, parses := translate.BodyDecodes(), request.BodyParses()
			resp, err := http.Post(env.srv.URL+c.path, "application/json", strings.NewReader(c.body))
			if err != nil {
				t.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d", resp.StatusCode)
			}
			if n := translate.BodyDecodes() - decodes; n != 1 {
				t.Errorf("the client's body was decoded %d times, want 1", n)
			}
			if n := request.BodyParses() - parses; n != 0 {
				t.Errorf("a generated body was parsed %d times, want 0", n)
			}
			if reqs := env.gw.Requests(); len(reqs) != 1 || reqs[0].EstimatedInputTokens == 0 {
				t.Errorf("dispatched %+v", reqs)
			}
		})
	}
}

// /api/tags (and /api/ps) list every name with its tag, as Ollama does
// (name and model "demo:latest", model.Name.DisplayShortest), so a
// client that looks a tagged name up in the list finds it; a name and the
// same name with ":latest" that are two models (an alias "x" and a served
// "x:latest") both keep their own names.
func TestRegression_TagsListNamesWithTheirTag(t *testing.T) {
	t.Parallel()
	env := newEnv(t, api.Config{}, failWith(contract.ErrUnknownModel))
	env.gw.Names = []string{"demo", "llama3:8b", "meta-llama/Llama-3.1-8B-Instruct", "x", "x:latest"}
	resp := env.get(t, "/api/tags")
	var tags struct {
		Models []struct{ Name, Model string } `json:"models"`
	}
	if err := json.Unmarshal([]byte(resp.body), &tags); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, m := range tags.Models {
		if m.Name != m.Model {
			t.Errorf("entry name %q model %q, want them equal", m.Name, m.Model)
		}
		got = append(got, m.Name)
	}
	want := []string{"demo:latest", "llama3:8b", "meta-llama/Llama-3.1-8B-Instruct:latest", "x", "x:latest"}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("/api/tags names %v, want %v", got, want)
	}
	// /v1/models keeps the names as they are.
	resp = env.get(t, "/v1/models")
	if !strings.Contains(resp.body, `"id":"demo"`) {
		t.Errorf("/v1/models: %s", resp.body)
	}
}

// POST /api/pull answers as Ollama does for a model it already has: the
// NDJSON progress stream ending {"status":"success"} (one object with
// stream false); for a model iop does not serve, Ollama's error for a
// model its registry does not have. Nothing is dispatched.
func TestOllamaPull(t *testing.T) {
	t.Parallel()
	env := newCatalogEnv(t) // qwen3:latest has a digest and a size
	lines := func(body string) []map[string]any {
		var out []map[string]any
		for _, l := range strings.Split(strings.TrimSpace(body), "\n") {
			var m map[string]any
			if err := json.Unmarshal([]byte(l), &m); err != nil {
				t.Fatalf("line %q: %v", l, err)
			}
			out = append(out, m)
		}
		return out
	}
	for _, body := range []string{`{"model":"qwen3"}`, `{"name":"qwen3:latest"}`, `{"model":"qwen3","stream":true}`} {
		status, ctype, out := env.ollamaPost(t, "/api/pull", body)
		got := lines(out)
		if status != 200 || ctype != "application/x-ndjson" || len(got) != 5 {
			t.Fatalf("%s: %d %s %s", body, status, ctype, out)
		}
		var statuses []string
		for _, l := range got {
			statuses = append(statuses, l["status"].(string))
		}
		want := "pulling manifest,pulling 500a1f067a9f,verifying sha256 digest,writing manifest,success"
		if strings.Join(statuses, ",") != want {
			t.Errorf("%s: statuses %v, want %s", body, statuses, want)
		}
		if got[1]["digest"] != "sha256:500a1f067a9f782620b40bee6f7b0c89e17ae61f686b92c24933e4ca4b2b8b41" ||
			got[1]["total"] != float64(5225376047) || got[1]["completed"] != float64(5225376047) {
			t.Errorf("%s: layer line %v", body, got[1])
		}
	}
	status, _, out := env.ollamaPost(t, "/api/pull", `{"model":"coder:latest","stream":false}`)
	if status != 200 || strings.TrimSpace(out) != `{"status":"success"}` {
		t.Errorf("stream false: %d %s", status, out)
	}

	status, ctype, out := env.ollamaPost(t, "/api/pull", `{"model":"nothing"}`)
	if got := lines(out); status != 200 || ctype != "application/x-ndjson" || len(got) != 2 ||
		got[0]["status"] != "pulling manifest" || got[1]["error"] != "pull model manifest: file does not exist" {
		t.Errorf("unknown model: %d %s %s", status, ctype, out)
	}
	status, _, out = env.ollamaPost(t, "/api/pull", `{"model":"qwen3:8b","stream":false}`)
	if status != http.StatusInternalServerError || strings.TrimSpace(out) != `{"error":"pull model manifest: file does not exist"}` {
		t.Errorf("unknown model, stream false: %d %s", status, out)
	}
	for body, want := range map[string]string{
		``:               "missing request body",
		`{"model":""}`:   "invalid model name",
		`["qwen3"]`:      "must be a JSON object",
		`{"model":"  "}`: "invalid model name",
	} {
		status, _, out := env.ollamaPost(t, "/api/pull", body)
		if status != 400 || !strings.Contains(out, want) {
			t.Errorf("%q: %d %s, want 400 saying %q", body, status, out, want)
		}
	}
	if n := len(env.gw.Requests()); n != 0 {
		t.Errorf("%d requests dispatched, want none", n)
	}
}

// TestRegression_OllamaRecordSaysTheClientsStream: an Ollama request's
// record (its log line) says the client's own "stream" flag (Ollama
// streams unless "stream": false), not the canonical body's, which always
// streams: a "stream": false request is logged stream=false.
func TestRegression_OllamaRecordSaysTheClientsStream(t *testing.T) {
	for body, want := range map[string]bool{
		`{"model":"m","stream":false,"messages":[{"role":"user","content":"hi"}]}`: false,
		`{"model":"m","messages":[{"role":"user","content":"hi"}]}`:                true,
		`{"model":"m","stream":false,"prompt":"hi"}`:                               false,
	} {
		recs := &records{}
		env := newEnv(t, api.Config{Observer: recs}, runWith(scriptedRun(normalized, events(started(), delta("a"), complete("stop")))))
		path := "/api/chat"
		if strings.Contains(body, "prompt") {
			path = "/api/generate"
		}
		env.ollamaPost(t, path, body)
		env.WaitHandlers()
		if rec := recs.Only(t); rec.Stream != want {
			t.Errorf("%s %s: record stream %v, want %v", path, body, rec.Stream, want)
		}
	}
}

// TestOllamaClientCannotSendIopOllama: an Ollama client's own "iop_ollama"
// member is not an Ollama field: it is not taken as fields (a client
// cannot put settings past the translation with it), and its body's
// fields go as OllamaFields, the canonical body never carrying the member.
func TestOllamaClientCannotSendIopOllama(t *testing.T) {
	t.Parallel()
	env := newEnv(t, api.Config{}, failWith(contract.ErrQueueFull))
	env.ollamaPost(t, "/api/chat", `{"model":"m","keep_alive":"5m","iop_ollama":{"options":{"num_ctx":1},"think":true},"messages":[{"role":"user","content":"hi"}]}`)
	reqs := env.gw.Requests()
	if len(reqs) != 1 {
		t.Fatalf("%d dispatches, want 1", len(reqs))
	}
	if string(reqs[0].OllamaFields) != `{"keep_alive":"5m"}` || strings.Contains(string(reqs[0].Body), "iop_ollama") {
		t.Errorf("body %s, Ollama fields %s; want only keep_alive as fields", reqs[0].Body, reqs[0].OllamaFields)
	}
}

// TestWrongOrMissingKeys: with keys configured, the Ollama routes need a
// key; a missing or wrong one is answered 401 with WWW-Authenticate:
// Bearer and Ollama's error shape, never echoing the key sent, and
// nothing is dispatched.
func TestWrongOrMissingKeys(t *testing.T) {
	f := newKeys(t, auth.Key{})
	env := newEnv(t, api.Config{Keys: f.keys, AdminKeys: f.admin}, okRun)
	const wrong = "iop-wrong-key-0123456789-do-not-echo"
	routes := []struct {
		method, path, body string
	}{
		{"POST", "/api/chat", `{"model":"m","messages":[{"role":"user","content":"x"}],"stream":false}`},
		{"POST", "/api/generate", `{"model":"m","prompt":"x","stream":false}`},
		{"GET", "/api/tags", ""},
		{"GET", "/api/ps", ""},
		{"GET", "/", ""},
	}
	for _, rt := range routes {
		for name, header := range map[string]map[string]string{
			"missing":         nil,
			"wrong bearer":    bearer(wrong),
			"wrong x-api-key": {"X-Api-Key": wrong},
			"empty bearer":    {"Authorization": "Bearer "},
			"basic":           {"Authorization": "Basic " + f.alice},
		} {
			resp := env.send(t, rt.method, rt.path, rt.body, header)
			if resp.status != http.StatusUnauthorized {
				t.Errorf("%s %s, %s key: status %d, want 401 (%s)", rt.method, rt.path, name, resp.status, resp.body)
				continue
			}
			if got := resp.header.Get("WWW-Authenticate"); !strings.HasPrefix(got, "Bearer") {
				t.Errorf("%s %s, %s key: WWW-Authenticate %q", rt.method, rt.path, name, got)
			}
			if strings.Contains(resp.body, wrong) || strings.Contains(resp.body, f.alice) {
				t.Errorf("%s %s: the key sent is echoed: %s", rt.method, rt.path, resp.body)
			}
			var body map[string]string
			if json.Unmarshal([]byte(resp.body), &body) != nil || body["error"] == "" || len(body) != 1 {
				t.Errorf("%s %s: Ollama error body %q", rt.method, rt.path, resp.body)
			}
		}
	}
	if n := len(env.gw.Requests()); n != 0 {
		t.Fatalf("%d requests were dispatched without a valid key", n)
	}
}

// TestModelsAllowedPerKey: a key limited to some models sees only them in
// /api/tags; the Ollama routes refuse another model 403 in Ollama's shape
// before dispatching it; the allowed model's :latest spelling passes.
func TestModelsAllowedPerKey(t *testing.T) {
	f := newKeys(t, auth.Key{Models: []string{"m"}})
	gw := &apitest.Gateway{Names: []string{"m", "alias", "secret-model"}, DispatchFunc: okRun}
	env := newEnvWithGateway(t, api.Config{Keys: f.keys}, gw, gw)
	var tags struct {
		Models []struct {
			Name string `json:"name"`
		} `json:"models"`
	}
	resp := env.send(t, "GET", "/api/tags", "", bearer(f.alice))
	if err := json.Unmarshal([]byte(resp.body), &tags); err != nil || len(tags.Models) != 1 || tags.Models[0].Name != "m:latest" {
		t.Errorf("alice's /api/tags: %s", resp.body)
	}
	for _, tc := range []struct{ path, body string }{
		{"/api/chat", `{"model":"secret-model","messages":[{"role":"user","content":"x"}]}`},
		{"/api/generate", `{"model":"secret-model","prompt":"x"}`},
	} {
		resp := env.send(t, "POST", tc.path, tc.body, bearer(f.alice))
		if resp.status != http.StatusForbidden {
			t.Errorf("%s: %d, want 403 (%s)", tc.path, resp.status, resp.body)
			continue
		}
		if !strings.Contains(resp.body, `"error":`) || strings.Contains(resp.body, `"code"`) {
			t.Errorf("%s: Ollama body %s", tc.path, resp.body)
		}
	}
	if n := len(gw.Requests()); n != 0 {
		t.Errorf("%d refused requests reached the gateway", n)
	}
	if resp := env.send(t, "POST", "/api/chat", `{"model":"m:latest","messages":[{"role":"user","content":"x"}],"stream":false}`, bearer(f.alice)); resp.status != 200 {
		t.Errorf("allowed model as m:latest: %d %s", resp.status, resp.body)
	}
}

// blockingRuns returns a dispatch func whose runs stay open until release
// is closed, and a channel that receives once per dispatch.
func blockingRuns(release <-chan struct{}) (func(context.Context, contract.Request) (Run, error), <-chan struct{}) {
	dispatched := make(chan struct{}, 64)
	return func(ctx context.Context, req contract.Request) (Run, error) {
		r := liveRun(normalized, 4)
		go func() {
			<-release
			r.Up <- events(started(), delta("x"), complete("stop"))
			close(r.Up)
		}()
		dispatched <- struct{}{}
		return r, nil
	}, dispatched
}

// TestKeyConcurrencyLimitRefusesBeforeDispatch: a key at its
// max_concurrent is refused 429 with Retry-After on /api/chat, before
// the gateway.
func TestKeyConcurrencyLimitRefusesBeforeDispatch(t *testing.T) {
	f := newKeys(t, auth.Key{MaxConcurrent: 2})
	release := make(chan struct{})
	dispatch, dispatched := blockingRuns(release)
	gw := &apitest.Gateway{Names: []string{"m"}, DispatchFunc: dispatch}
	env := newEnvWithGateway(t, api.Config{Keys: f.keys}, gw, gw)
	const chat = `{"model":"m","messages":[{"role":"user","content":"hello"}]}`
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if resp := env.send(t, "POST", "/api/chat", chat, bearer(f.alice)); resp.status != 200 {
				t.Errorf("request within the limit: %d", resp.status)
			}
		}()
	}
	<-dispatched
	<-dispatched
	resp := env.send(t, "POST", "/api/chat", chat, bearer(f.alice))
	if resp.status != http.StatusTooManyRequests || resp.header.Get("Retry-After") == "" {
		t.Errorf("/api/chat over max_concurrent: %d Retry-After %q (%s)", resp.status, resp.header.Get("Retry-After"), resp.body)
	}
	if n := len(gw.Requests()); n != 2 {
		t.Errorf("%d dispatches, want 2: the refused one must not reach the gateway", n)
	}
	close(release)
	wg.Wait()
}

// TestKeyRequestsPerMinute: an Ollama route over a key's
// requests_per_minute is 429 in Ollama's shape.
func TestKeyRequestsPerMinute(t *testing.T) {
	f := newKeys(t, auth.Key{RequestsPerMinute: 2})
	gw := &apitest.Gateway{Names: []string{"m"}, DispatchFunc: okRun}
	env := newEnvWithGateway(t, api.Config{Keys: f.keys}, gw, gw)
	for i := range 2 {
		if resp := env.send(t, "POST", "/api/generate", `{"model":"m","prompt":"x"}`, bearer(f.alice)); resp.status != 200 {
			t.Fatalf("request %d: %d", i, resp.status)
		}
	}
	resp := env.send(t, "POST", "/api/generate", `{"model":"m","prompt":"x"}`, bearer(f.alice))
	if resp.status != http.StatusTooManyRequests || !strings.HasPrefix(resp.body, `{"error":"`) {
		t.Errorf("Ollama route over the limit: %d %s", resp.status, resp.body)
	}
	if n := len(gw.Requests()); n != 2 {
		t.Errorf("%d dispatches, want 2", n)
	}
}

// recordingLedger keeps the ledger entries it is given.
type recordingLedger struct {
	mu      sync.Mutex
	entries []ledger.Entry
}

func (l *recordingLedger) Record(e ledger.Entry) {
	l.mu.Lock()
	l.entries = append(l.entries, e)
	l.mu.Unlock()
}

func (l *recordingLedger) Aggregate(context.Context, ledger.Query) ([]ledger.Group, error) {
	return nil, errors.New("unused")
}

func (l *recordingLedger) all() []ledger.Entry {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.entries)
}

// TestLedgerRecordsEveryFinishedRun: an Ollama request's run is recorded
// in the ledger under its key, with its dispatch, request id and tokens.
func TestLedgerRecordsEveryFinishedRun(t *testing.T) {
	f := newKeys(t, auth.Key{})
	led := &recordingLedger{}
	gw := &apitest.Gateway{Names: []string{"m"}, DispatchFunc: func(context.Context, contract.Request) (Run, error) {
		return scriptedRun(normalized, events(started(), delta("hi"), usageEvent(3, 4), complete("stop"))), nil
	}}
	env := newEnvWithGateway(t, api.Config{Keys: f.keys, Ledger: led}, gw, gw)
	env.send(t, "POST", "/api/chat", `{"model":"m","messages":[{"role":"user","content":"x"}],"stream":false}`, bearer(f.bob))
	env.WaitHandlers()
	got := led.all()
	if len(got) != 1 {
		t.Fatalf("ledger entries %+v, want 1", got)
	}
	e := got[0]
	if e.Key != "bob" || e.Outcome != "completed" || e.PromptTokens != 3 || e.CompletionTokens != 4 || e.Model != "m" || e.Time.IsZero() ||
		e.NodeID != "node1" || e.ProviderID != "prov1" || e.RunID != "run1" || !strings.HasPrefix(e.RequestID, "req_") ||
		e.SlotTime < 0 || e.SlotTime > e.Duration {
		t.Errorf("entry %+v", e)
	}
}

// TestUsageAttributionNeverInfluencesScheduling: two keys' identical
// Ollama requests dispatch identical requests but for their flows.
func TestUsageAttributionNeverInfluencesScheduling(t *testing.T) {
	f := newKeys(t, auth.Key{})
	gw := &apitest.Gateway{Names: []string{"m"}, DispatchFunc: okRun}
	env := newEnvWithGateway(t, api.Config{Keys: f.keys, Ledger: &recordingLedger{}}, gw, gw)
	for _, key := range []string{f.alice, f.bob} {
		env.send(t, "POST", "/api/chat", `{"model":"m","messages":[{"role":"user","content":"x"}]}`,
			map[string]string{"Authorization": "Bearer " + key, "X-Request-Id": "same"})
	}
	env.WaitHandlers()
	reqs := gw.Requests()
	if len(reqs) != 2 {
		t.Fatalf("%d requests dispatched, want 2", len(reqs))
	}
	a, b := reqs[0], reqs[1]
	if a.Flow != "alice" || b.Flow != "bob" || a.Weight != 1 || b.Weight != 1 || a.Priority != 0 || b.Priority != 0 {
		t.Errorf("flows %q (weight %d, priority %d) and %q (%d, %d), want alice and bob (1, standard)",
			a.Flow, a.Weight, a.Priority, b.Flow, b.Weight, b.Priority)
	}
	a.Flow, b.Flow = "", ""
	if !reflect.DeepEqual(a, b) {
		t.Errorf("alice's request %+v\ndiffers from bob's %+v", a, b)
	}
	for _, v := range a.Headers {
		if strings.Contains(v, f.alice) {
			t.Errorf("the key reached the dispatched request: %v", a.Headers)
		}
	}
}

// TestRegression_BrokenTunnelAnswerFailsTheRun: the translated routes
// (Ollama; Messages and Responses in their packages) stop reading a tunnel at the provider's
// error object inside its 200 stream, before the TunnelEnd whose
// provider_error would tell the edge's circuit breaker; they ended the run
// with Cancel, which counted as the provider's success and reset its
// failure count (ten broken Responses and Messages
// requests in a row, the circuit still closed). They end it with Fail now,
// streamed or not; a clean answer still ends with Cancel alone.
func TestRegression_BrokenTunnelAnswerFailsTheRun(t *testing.T) {
	const broken = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"he\"}}]}\n\n" +
		"data: {\"error\":{\"message\":\"generation failed\",\"type\":\"server_error\"}}\n\n"
	const clean = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"he\"}}]}\n\n" +
		"data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n"
	routes := []struct{ name, path, body string }{
		{"ollama chat", "/api/chat", `{"model":"m","messages":[{"role":"user","content":"hi"}]`},
	}
	for _, rt := range routes {
		for _, stream := range []bool{true, false} {
			for _, answer := range []string{broken, clean} {
				name := rt.name
				if stream {
					name += "/stream"
				}
				wantFail := answer == broken
				if wantFail {
					name += "/broken"
				}
				t.Run(name, func(t *testing.T) {
					run := scriptedRun(contract.PathTunnel,
						tunnelHead(200, map[string]string{"Content-Type": "text/event-stream"}),
						tunnelData(answer),
						&nodev1.RunUp{Msg: &nodev1.RunUp_TunnelEnd{TunnelEnd: &nodev1.TunnelEnd{}}})
					env := newEnv(t, api.Config{}, runWith(run))
					streamFlag := `,"stream":false}`
					if stream {
						streamFlag = `,"stream":true}`
					}
					env.post(t, rt.path, "application/json", rt.body+streamFlag)
					failed := false
					for _, r := range run.CancelReasons() {
						failed = failed || strings.HasPrefix(r, "fail: ")
					}
					if failed != wantFail {
						t.Errorf("run ended with Fail: %v, want %v (cancels %q)", failed, wantFail, run.CancelReasons())
					}
				})
			}
		}
	}
}

// writeWatch is the ResponseWriter a handler writes into: it notes, at
// each Write, how many requests of the watched key hold a request slot.
type writeWatch struct {
	http.ResponseWriter
	caller *auth.Caller

	mu       sync.Mutex
	inFlight []int // at each Write
}

func (w *writeWatch) Write(p []byte) (int, error) {
	w.mu.Lock()
	w.inFlight = append(w.inFlight, w.caller.InFlight())
	w.mu.Unlock()
	return w.ResponseWriter.Write(p)
}

func (w *writeWatch) Flush() { w.ResponseWriter.(http.Flusher).Flush() }

func (w *writeWatch) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *writeWatch) writes() []int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]int(nil), w.inFlight...)
}

// TestAnswerFinishedBeforeItsLastByte: on every route
// and execution path, streamed and not, and for an error answer before or
// after the status line, the key's request slot is given back before the
// write that ends the answer, and not before the run ended: writes of a
// stream's content before the run's terminal message still hold it.
func TestAnswerFinishedBeforeItsLastByte(t *testing.T) {
	sse := map[string]string{"Content-Type": "text/event-stream"}
	jsonHead := map[string]string{"Content-Type": "application/json"}
	const chunk = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\n"
	vectors := func() *nodev1.RunUp {
		return events(&nodev1.RunEvent{Type: nodev1.RunEvent_TYPE_DELTA, Embeddings: []*nodev1.Embedding{{Values: []float32{1, 0}}}})
	}
	// Streamed runs send content in one message and end in the next, so
	// the content's writes come before the terminal message.
	normStream := func() []*nodev1.RunUp {
		return []*nodev1.RunUp{events(started(), delta("hi")), events(delta(" there")), events(usageEvent(1, 2), complete("stop"))}
	}
	tunStream := func() []*nodev1.RunUp {
		return []*nodev1.RunUp{tunnelHead(200, sse), tunnelData(chunk), tunnelData(chunk + "data: [DONE]\n\n"), tunnelEnd()}
	}
	tunJSON := func(body string) []*nodev1.RunUp {
		return []*nodev1.RunUp{tunnelHead(200, jsonHead), tunnelData(body[:10]), tunnelData(body[10:]), tunnelEnd()}
	}
	const embeddingsJSON = `{"object":"list","data":[{"object":"embedding","index":0,"embedding":[1,0]}],"model":"m","usage":{"prompt_tokens":1,"total_tokens":1}}`
	ollamaChat, ollamaChatJSON := `{"model":"m","messages":[{"role":"user","content":"x"}]}`, `{"model":"m","stream":false,"messages":[{"role":"user","content":"x"}]}`
	generate, generateJSON := `{"model":"m","prompt":"x"}`, `{"model":"m","prompt":"x","stream":false}`
	for _, tc := range []struct {
		name, path, body string
		path_            contract.Path
		msgs             []*nodev1.RunUp
		dispatchErr      error
		streamed         bool // content is written before the terminal message
	}{
		{"ollama chat stream normalized", "/api/chat", ollamaChat, normalized, normStream(), nil, true},
		{"ollama chat stream tunnel", "/api/chat", ollamaChat, tunnel, tunStream(), nil, true},
		{"ollama chat normalized", "/api/chat", ollamaChatJSON, normalized, normStream(), nil, false},
		{"ollama chat tunnel", "/api/chat", ollamaChatJSON, tunnel, tunStream(), nil, false},
		{"ollama generate stream normalized", "/api/generate", generate, normalized, normStream(), nil, true},
		{"ollama generate tunnel", "/api/generate", generateJSON, tunnel, tunStream(), nil, false},
		{"ollama embed normalized", "/api/embed", `{"model":"m","input":"x"}`, normalized,
			[]*nodev1.RunUp{vectors(), events(usageEvent(1, 0), complete(""))}, nil, false},
		{"ollama embed tunnel", "/api/embed", `{"model":"m","input":"x"}`, tunnel, tunJSON(embeddingsJSON), nil, false},
		{"ollama embeddings tunnel", "/api/embeddings", `{"model":"m","prompt":"x"}`, tunnel, tunJSON(embeddingsJSON), nil, false},
		{"ollama refused before dispatch", "/api/chat", ollamaChat, normalized, nil, contract.ErrQueueTimeout, false},
		{"ollama stream failing after its status line", "/api/chat", ollamaChat, normalized,
			[]*nodev1.RunUp{events(started(), delta("hi")), events(errorEvent(500, "boom"))}, nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newKeys(t, auth.Key{MaxConcurrent: 1})
			alice := f.keys.Authenticate(f.alice)
			var run *fakeRun
			gw := &apitest.Gateway{Names: []string{"m"}, DispatchFunc: func(context.Context, contract.Request) (Run, error) {
				if tc.dispatchErr != nil {
					return nil, tc.dispatchErr
				}
				run = scriptedRun(tc.path_, tc.msgs...)
				return run, nil
			}}
			h := api.New(api.Config{Keys: f.keys, APIs: []api.API{Routes(Config{})}}, gw, nil)
			watch := &writeWatch{caller: alice}
			var handlers sync.WaitGroup
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				handlers.Add(1)
				defer handlers.Done()
				watch.ResponseWriter = w
				h.ServeHTTP(watch, r)
			}))
			defer srv.Close()
			req, _ := http.NewRequest(http.MethodPost, srv.URL+tc.path, strings.NewReader(tc.body))
			req.Header.Set("Authorization", "Bearer "+f.alice)
			resp, err := srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			handlers.Wait()
			writes := watch.writes()
			if len(writes) == 0 {
				t.Fatalf("nothing written: %d %s", resp.StatusCode, body)
			}
			if last := writes[len(writes)-1]; last != 0 {
				t.Errorf("the key held %d slot(s) at the write that ended the answer; writes saw %v\n%s", last, writes, body)
			}
			if tc.streamed && writes[0] != 1 {
				t.Errorf("the slot was free (%v) while the run still streamed its content\n%s", writes, body)
			}
			if alice.InFlight() != 0 {
				t.Errorf("the key holds %d slots after the request", alice.InFlight())
			}
		})
	}
}

// holdAtRunEnd is a slog handler that, at the handler's debug line "run
// ended" (logged when the answer was rendered, before the request ends),
// waits for the request's context (the one the gateway was given) to end,
// up to a bound: it stands for the moment, between the answer's last byte
// and the end of the handler, in which a client that has its whole answer
// closes its connection (which ends the request's context).
type holdAtRunEnd struct {
	slog.Handler
	ctxs chan context.Context
}

func (h holdAtRunEnd) Enabled(context.Context, slog.Level) bool { return true }

func (h holdAtRunEnd) Handle(_ context.Context, r slog.Record) error {
	if r.Message == "run ended" {
		ctx := <-h.ctxs
		select {
		case <-ctx.Done():
		case <-time.After(10 * time.Second):
		}
	}
	return nil
}

func (h holdAtRunEnd) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h holdAtRunEnd) WithGroup(string) slog.Handler      { return h }

// TestRegression_ClientClosingAfterItsAnswerIsNotClientGone: under
// concurrency, 13-16% of successful streamed requests were recorded in the
// usage ledger as client_gone while their log line said completed. The
// ledger took the outcome from the first Run.Close, and
// the callback that closes the run when the request's context ends won
// whenever the client, having read the whole answer, closed its connection
// before the handler had closed the run: net/http then ends the context.
// The input that broke it: a streamed answer whose client closes its
// connection as soon as it has read the answer's end. Every record of the
// request must say completed: the log's (Observer), the ledger's, and the
// outcome the run is closed with (the run_ended event's).
func TestRegression_ClientClosingAfterItsAnswerIsNotClientGone(t *testing.T) {
	sse := map[string]string{"Content-Type": "text/event-stream"}
	const tunnelStream = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\ndata: [DONE]\n\n"
	for _, tc := range []struct {
		name, path, body, end string
		run                   func() *fakeRun
	}{
		{"normalized NDJSON", "/api/chat", `{"model":"m","messages":[{"role":"user","content":"x"}]}`, `"done":true`,
			func() *fakeRun {
				return scriptedRun(normalized, events(started(), delta("hi"), usageEvent(1, 1), complete("stop")))
			}},
		{"tunnel NDJSON", "/api/chat", `{"model":"m","messages":[{"role":"user","content":"x"}]}`, `"done":true`,
			func() *fakeRun {
				return scriptedRun(tunnel, tunnelHead(200, sse), tunnelData(tunnelStream), tunnelEnd())
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newKeys(t, auth.Key{})
			led, recs := &recordingLedger{}, &records{}
			run := tc.run()
			hold := holdAtRunEnd{ctxs: make(chan context.Context, 1)}
			env := newEnvLogging(t, api.Config{Keys: f.keys, Ledger: led, Observer: recs}, slog.New(hold),
				func(ctx context.Context, _ contract.Request) (Run, error) {
					hold.ctxs <- ctx
					return run, nil
				})
			env.gw.Names = []string{"m"}
			req, _ := http.NewRequest(http.MethodPost, env.srv.URL+tc.path, strings.NewReader(tc.body))
			req.Header.Set("Authorization", "Bearer "+f.alice)
			resp, err := env.srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			sc := bufio.NewScanner(resp.Body)
			for sc.Scan() && !strings.Contains(sc.Text(), tc.end) {
			}
			if !strings.Contains(sc.Text(), tc.end) {
				t.Fatalf("the answer ended without %s: %v", tc.end, sc.Err())
			}
			resp.Body.Close() // the whole answer is in: the client leaves at once
			env.WaitHandlers()
			rec := recs.Only(t)
			entries := led.all()
			if len(entries) != 1 {
				t.Fatalf("%d ledger entries, want 1: %+v", len(entries), entries)
			}
			n, outcomes := run.CloseCalls()
			if rec.Outcome != contract.OutcomeCompleted || entries[0].Outcome != string(contract.OutcomeCompleted) || n != 1 || outcomes[0] != contract.OutcomeCompleted {
				t.Errorf("outcomes: log %q, ledger %q, run closed %d times with %q; want completed everywhere",
					rec.Outcome, entries[0].Outcome, n, outcomes)
			}
			if entries[0].RequestID != rec.RequestID || entries[0].RunID != rec.RunID || entries[0].Key != "alice" {
				t.Errorf("ledger entry %+v is not the logged request %+v", entries[0], rec)
			}
		})
	}
}

// TestNoLeaderIs503WithRetryAfter: with no scheduler leader reachable,
// /api/chat is 503 with Retry-After, saying so.
func TestNoLeaderIs503WithRetryAfter(t *testing.T) {
	env := newEnv(t, api.Config{}, failWith(fmt.Errorf("%w: none elected within 5s", contract.ErrNoLeader)))
	resp := env.post(t, "/api/chat", "application/json", `{"model":"m","messages":[{"role":"user","content":"hello"}]}`)
	if resp.status != 503 || resp.header.Get("Retry-After") == "" {
		t.Errorf("%d Retry-After %q, want 503 with Retry-After", resp.status, resp.header.Get("Retry-After"))
	}
	if !strings.Contains(resp.body, "leader") {
		t.Errorf("body %s does not say no leader is reachable", resp.body)
	}
}

// TestProviderBusyIs503WithRetryAfter: a dispatch every provider refused
// as busy is 503 with Retry-After on /api/chat, saying so.
func TestProviderBusyIs503WithRetryAfter(t *testing.T) {
	busy := fmt.Errorf("%w: %w: node %q: provider at capacity on this node", contract.ErrProviderBusy, contract.ErrDispatchRefused, "n1")
	env := newEnv(t, api.Config{}, failWith(busy))
	resp := env.post(t, "/api/chat", "application/json", `{"model":"m","messages":[{"role":"user","content":"hello"}]}`)
	if resp.status != 503 || resp.header.Get("Retry-After") == "" {
		t.Errorf("%d Retry-After %q, want 503 with Retry-After", resp.status, resp.header.Get("Retry-After"))
	}
	if !strings.Contains(resp.body, "busy") {
		t.Errorf("body %s does not say the providers are busy", resp.body)
	}
}

// TestShedIsAnswered429: a request the scheduler shed is 429 with
// Retry-After in Ollama's shape on /api/chat, recorded as shed.
func TestShedIsAnswered429(t *testing.T) {
	for _, reason := range []error{contract.ErrDisplaced, contract.ErrExpectedWait} {
		recs := &records{}
		env := newEnv(t, api.Config{Observer: recs}, failWith(fmt.Errorf("%w: %w: model m", contract.ErrShed, reason)))
		o := env.send(t, "POST", "/api/chat", `{"model":"m","messages":[{"role":"user","content":"x"}]}`, nil)
		var ob struct{ Error string }
		if o.status != http.StatusTooManyRequests || o.header.Get("Retry-After") == "" || json.Unmarshal([]byte(o.body), &ob) != nil || ob.Error == "" {
			t.Fatalf("%v: Ollama answer %d %q %s", reason, o.status, o.header.Get("Retry-After"), o.body)
		}
		env.WaitHandlers()
		want := map[error]string{contract.ErrDisplaced: "displaced", contract.ErrExpectedWait: "expected_wait"}[reason]
		for _, rec := range recs.All() {
			if rec.Admission != contract.AdmissionShed || rec.ShedReason != want || rec.Outcome != contract.OutcomeRefused {
				t.Fatalf("%v: record admission %q reason %q outcome %q", reason, rec.Admission, rec.ShedReason, rec.Outcome)
			}
		}
	}
}

// wholeAnswer is a tunnel head that carries the whole answer (End).
func wholeAnswer(status int32, headers map[string]string, body string) *nodev1.RunUp {
	m := tunnelHead(status, headers)
	m.GetTunnelHead().Data, m.GetTunnelHead().End = []byte(body), true
	return m
}

// tunnelJSON is an OpenAI-compatible provider's whole chat answer.
const tunnelJSON = `{"id":"chatcmpl-up","object":"chat.completion","created":1,"model":"served-model",` +
	`"choices":[{"index":0,"message":{"role":"assistant","content":"from upstream"},"finish_reason":"stop"}],` +
	`"usage":{"prompt_tokens":4,"completion_tokens":2,"total_tokens":6}}`

// TestTunnelWholeAnswerOnTranslatedRoutes: /api/chat reads a tunnel
// answer that came whole in its head as one that came in three messages.
func TestTunnelWholeAnswerOnTranslatedRoutes(t *testing.T) {
	for _, form := range []struct {
		name string
		msgs func() []*nodev1.RunUp
	}{
		{"one message", func() []*nodev1.RunUp {
			return []*nodev1.RunUp{wholeAnswer(200, map[string]string{"Content-Type": "application/json"}, tunnelJSON)}
		}},
		{"three messages", func() []*nodev1.RunUp {
			return []*nodev1.RunUp{tunnelHead(200, map[string]string{"Content-Type": "application/json"}), tunnelData(tunnelJSON), tunnelEnd()}
		}},
	} {
		t.Run(form.name+"/ollama", func(t *testing.T) {
			env := newEnv(t, api.Config{}, runWith(scriptedRun(tunnel, form.msgs()...)))
			resp := env.post(t, "/api/chat", "application/json", `{"model":"m","stream":false,"messages":[{"role":"user","content":"hi"}]}`)
			var got struct {
				Message struct{ Content string } `json:"message"`
				Done    bool                     `json:"done"`
			}
			if err := json.Unmarshal([]byte(resp.body), &got); err != nil || resp.status != 200 || got.Message.Content != "from upstream" || !got.Done {
				t.Errorf("/api/chat: %d %s", resp.status, resp.body)
			}
		})
	}
}

// TestKeyRefusalsAreRecordedOnce: a request refused by one of its key's
// limits (max_concurrent, requests_per_minute, a model it may not use) is
// a finished request like any other: one record (the log line's, the
// metrics'), one ledger entry, outcome refused with the error code, under
// the route's operation, on the OpenAI, Ollama and runs APIs.
func TestKeyRefusalsAreRecordedOnce(t *testing.T) {
	limited, limitedHash := auth.Generate()
	f := newKeys(t, auth.Key{MaxConcurrent: 1, Models: []string{"m"}})
	rpm, err := auth.NewKeyring("keys", []auth.Key{{Name: "rpm", Hash: limitedHash, RequestsPerMinute: 1}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	held := liveRun(normalized, 1)
	dispatched := make(chan struct{}, 1)
	gw := &apitest.Gateway{Names: []string{"m", "other"}, DispatchFunc: func(context.Context, contract.Request) (Run, error) {
		dispatched <- struct{}{}
		return held, nil
	}}
	led, recs := &recordingLedger{}, &records{}
	cfg := api.Config{Keys: f.keys, Ledger: led, Observer: recs}
	env := newEnvWithGateway(t, cfg, gw, gw)
	cfgRPM := api.Config{Keys: rpm, Ledger: led, Observer: recs}
	gwRPM := &apitest.Gateway{Names: []string{"m"}, DispatchFunc: okRun}
	envRPM := newEnvWithGateway(t, cfgRPM, gwRPM, gwRPM)

	// alice holds her one slot with a stream that has not ended.
	stream := make(chan rawResponse, 1)
	go func() {
		stream <- env.send(t, "POST", "/api/chat", `{"model":"m","messages":[{"role":"user","content":"x"}]}`, bearer(f.alice))
	}()
	<-dispatched
	type want struct {
		api, code string
		status    int
	}
	var wants []want
	for _, r := range []struct{ api, path, body string }{
		{"ollama.chat", "/api/chat", `{"model":"m","messages":[{"role":"user","content":"x"}]}`},
		{"ollama.embed", "/api/embeddings", `{"model":"m","prompt":"x"}`},
	} {
		if resp := env.send(t, "POST", r.path, r.body, bearer(f.alice)); resp.status != 429 {
			t.Fatalf("%s over max_concurrent: %d %s", r.path, resp.status, resp.body)
		}
		wants = append(wants, want{r.api, "concurrency_limit_exceeded", 429})
	}
	held.Up <- events(started(), delta("hi"), complete("stop"))
	if resp := <-stream; resp.status != 200 {
		t.Fatalf("alice's stream: %d", resp.status)
	}
	wants = append(wants, want{"ollama.chat", "", 200})
	// A model alice may not use, once her slot is free.
	for _, r := range []struct{ api, path, body string }{
		{"ollama.chat", "/api/chat", `{"model":"other","messages":[{"role":"user","content":"x"}]}`},
	} {
		if resp := env.send(t, "POST", r.path, r.body, bearer(f.alice)); resp.status != 403 {
			t.Fatalf("%s for a model not allowed: %d %s", r.path, resp.status, resp.body)
		}
		wants = append(wants, want{r.api, "model_not_allowed", 403})
	}
	// One request a minute: the second is refused.
	for i, code := range []string{"", "rate_limit_exceeded"} {
		resp := envRPM.send(t, "POST", "/api/generate", `{"model":"m","prompt":"x"}`, bearer(limited))
		if code == "" && resp.status != 200 || code != "" && resp.status != 429 {
			t.Fatalf("rpm request %d: %d %s", i, resp.status, resp.body)
		}
		wants = append(wants, want{"ollama.generate", code, resp.status})
	}
	env.WaitHandlers()
	envRPM.WaitHandlers()

	got := recs.All()
	entries := led.all()
	if len(got) != len(wants) || len(entries) != len(wants) {
		t.Fatalf("%d records and %d ledger entries for %d requests:\n%+v\n%+v", len(got), len(entries), len(wants), got, entries)
	}
	// Records are made as each handler ends, maybe after the client read
	// the answer and sent the next request: compare them as sets.
	count := map[want]int{}
	for _, w := range wants {
		count[w]++
	}
	byID := map[string]api.RequestRecord{}
	for _, rec := range got {
		w := want{rec.API, rec.ErrorCode, rec.Status}
		outcome := contract.OutcomeRefused
		if w.code == "" {
			outcome = contract.OutcomeCompleted
		}
		if count[w] == 0 || rec.Outcome != outcome || rec.Key == "" {
			t.Errorf("record %+v: not one of the requests sent, or outcome %q", rec, outcome)
		}
		count[w]--
		byID[rec.RequestID] = rec
	}
	for _, e := range entries {
		rec, ok := byID[e.RequestID]
		if !ok || e.Outcome != string(rec.Outcome) || e.ErrorCode != rec.ErrorCode || e.Key != rec.Key {
			t.Errorf("ledger entry %+v disagrees with its record %+v", e, rec)
		}
		delete(byID, e.RequestID)
	}
}

// TestRegression_OllamaLoadIsCompleted: an Ollama "load" (a generate
// request with nothing to generate, answered 200 without a run) was
// recorded invalid_request; it is completed, in the log and the ledger.
func TestRegression_OllamaLoadIsCompleted(t *testing.T) {
	led, recs := &recordingLedger{}, &records{}
	env := newEnv(t, api.Config{Ledger: led, Observer: recs}, okRun)
	if resp := env.post(t, "/api/generate", "application/json", `{"model":"m"}`); resp.status != 200 || !strings.Contains(resp.body, `"done_reason":"load"`) {
		t.Fatalf("load: %d %s", resp.status, resp.body)
	}
	env.WaitHandlers()
	if rec, entries := recs.Only(t), led.all(); rec.Outcome != contract.OutcomeCompleted || len(entries) != 1 || entries[0].Outcome != string(contract.OutcomeCompleted) {
		t.Fatalf("record %+v, ledger %+v; want completed", rec, entries)
	}
}

// newQuotaEnv serves alice (with lim as her quota) and bob (none) over a
// quota ledger on a fake clock.
func newQuotaEnv(t *testing.T, lim quota.Limits) (*testEnv, keyFixture, *clock.Fake) {
	t.Helper()
	f := newKeys(t, auth.Key{Quota: lim})
	clk := clock.NewFake(time.Unix(1700000000, 0))
	l := quota.New(quota.Config{Clock: clk})
	keys, teams := auth.QuotaScopes([]auth.Key{{Name: "alice", Quota: lim}, {Name: "bob"}}, nil)
	l.Configure(keys, teams, nil)
	gw := &apitest.Gateway{Names: []string{"m"}, DispatchFunc: okRun}
	env := newEnvWithGateway(t, api.Config{Keys: f.keys, Quota: l, Now: clk.Now}, gw, gw)
	return env, f, clk
}

// TestQuotaRefusesBeforeDispatch: an Ollama request reserves its body's
// bytes plus its options.num_predict; once the window cannot hold it, it
// is refused 429 in Ollama's shape with the Retry-After of the seconds
// until the settled tokens leave the window, and never dispatched.
func TestQuotaRefusesBeforeDispatch(t *testing.T) {
	t.Parallel()
	body := `{"model":"m","prompt":"x","stream":false,"options":{"num_predict":500}}`
	ask := int64(len(body) + 500)
	env, f, clk := newQuotaEnv(t, quota.Limits{TokensPerMinute: ask + 3})
	if resp := env.send(t, "POST", "/api/generate", body, bearer(f.alice)); resp.status != 200 {
		t.Fatalf("first request: %d %s", resp.status, resp.body)
	}
	clk.Advance(10 * time.Second)
	if resp := env.send(t, "POST", "/api/generate", body, bearer(f.alice)); resp.status != 429 ||
		!strings.HasPrefix(resp.body, `{"error":"Quota tokens_per_minute`) || resp.header.Get("Retry-After") != "51" {
		t.Errorf("Ollama route: %d %s", resp.status, resp.body)
	}
	if n := len(env.gw.Requests()); n != 1 {
		t.Fatalf("%d dispatches, want 1", n)
	}
}

// TestQuotaClampsOrRefusesAnUncappedRequest: an Ollama request with no
// cap on its answer is clamped (X-Iop-Max-Tokens-Clamped).
func TestQuotaClampsOrRefusesAnUncappedRequest(t *testing.T) {
	t.Parallel()
	env, f, _ := newQuotaEnv(t, quota.Limits{TokensPerMinute: 1000})
	resp := env.send(t, "POST", "/api/generate", `{"model":"m","prompt":"x","stream":false}`, bearer(f.alice))
	if resp.status != 200 || resp.header.Get("X-Iop-Max-Tokens-Clamped") == "" {
		t.Fatalf("Ollama: %d %s", resp.status, resp.body)
	}
}

// TestRegression_RequestIDOnEveryAnswer: an Ollama route's answer carries
// the request's id in X-Request-Id, on both execution paths; the id is
// the one of the request's log line, ledger entry and record; a
// provider's own X-Request-Id and a client's are not it.
func TestRegression_RequestIDOnEveryAnswer(t *testing.T) {
	t.Parallel()
	sse := "data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\ndata: [DONE]\n\n"
	scripts := map[string]func(context.Context, contract.Request) (Run, error){
		"normalized": okRun,
		"tunnel": func(context.Context, contract.Request) (Run, error) {
			return scriptedRun(tunnel, tunnelHead(200, map[string]string{"content-type": "text/event-stream", "x-request-id": "provider-id"}),
				tunnelData(sse), tunnelEnd()), nil
		},
	}
	idForm := regexp.MustCompile(`^req_[0-9a-f]{32}$`)
	for path, dispatch := range scripts {
		t.Run(path, func(t *testing.T) {
			t.Parallel()
			recs, led := &records{}, &recordingLedger{}
			mu := &syncBuffer{}
			env := newEnvLogging(t, api.Config{Observer: recs, Ledger: led}, slog.New(slog.NewJSONHandler(mu, nil)), func(ctx context.Context, req contract.Request) (Run, error) {
				if req.Model == "nope" {
					return nil, contract.ErrUnknownModel
				}
				return dispatch(ctx, req)
			})
			cases := []struct {
				method, path, body string
				header             map[string]string
				want               string // the header
				status             int
				recorded           bool
			}{
				{"POST", "/api/chat", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, nil, "X-Request-Id", 200, true},
			}
			seen := map[string]bool{}
			for _, c := range cases {
				resp := env.send(t, c.method, c.path, c.body, c.header)
				if resp.status != c.status {
					t.Errorf("%s %s: %d %s, want %d", c.method, c.path, resp.status, resp.body, c.status)
				}
				id := resp.header.Get(c.want)
				other := map[string]string{"X-Request-Id": "Request-Id", "Request-Id": "X-Request-Id"}[c.want]
				if !idForm.MatchString(id) || resp.header.Get(other) != "" || seen[id] {
					t.Errorf("%s %s: %s %q, %s %q: want a new req_<32 hex> in %s only", c.method, c.path, c.want, id, other, resp.header.Get(other), c.want)
				}
				seen[id] = true
				if !c.recorded {
					continue
				}
				env.WaitHandlers()
				all := recs.All()
				rec := all[len(all)-1]
				entries := led.all()
				if rec.RequestID != id || entries[len(entries)-1].RequestID != id {
					t.Errorf("%s %s: header id %s, record %s, ledger %s", c.method, c.path, id, rec.RequestID, entries[len(entries)-1].RequestID)
				}
				if !strings.Contains(mu.String(), `"request_id":"`+id+`"`) {
					t.Errorf("%s %s: no log line with request_id %s:\n%s", c.method, c.path, id, mu.String())
				}
				if c.header["X-Request-Id"] != "" && rec.ClientRequestID != c.header["X-Request-Id"] {
					t.Errorf("client request id %q, want %q", rec.ClientRequestID, c.header["X-Request-Id"])
				}
			}
		})
	}
}

// syncBuffer is a bytes.Buffer safe for concurrent use.
type syncBuffer struct {
	mu  sync.Mutex // guards buf
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
