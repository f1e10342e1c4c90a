package ollama

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"iop/internal/edge/api"
	"iop/internal/edge/contract"
	"iop/internal/translate"
)

// post sends body to path on env and returns status, Content-Type and body.
func (e *testEnv) ollamaPost(t *testing.T, path, body string) (int, string, string) {
	t.Helper()
	resp, err := http.Post(e.srv.URL+path, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading the body: %v", err)
	}
	return resp.StatusCode, resp.Header.Get("Content-Type"), string(data)
}

func TestOllamaRootProbe(t *testing.T) {
	env := newEnv(t, api.Config{}, failWith(contract.ErrUnknownModel))
	for _, method := range []string{"GET", "HEAD"} {
		req, _ := http.NewRequest(method, env.srv.URL+"/", nil)
		resp := env.do(t, req)
		if resp.status != 200 || (method == "GET" && resp.body != "Ollama is running") {
			t.Fatalf("%s /: %d %q", method, resp.status, resp.body)
		}
	}
	req, _ := http.NewRequest("POST", env.srv.URL+"/", nil)
	resp := env.do(t, req)
	if resp.status != 405 || resp.body != `{"error":"method not allowed"}`+"\n" {
		t.Fatalf("POST /: %d %q", resp.status, resp.body)
	}
}

func TestOllamaRendering(t *testing.T) {
	const chat = `{"model":"m","messages":[{"role":"user","content":"hi"}]}`
	for _, c := range []struct {
		name        string
		path, body  string
		run         *fakeRun
		status      int
		contentType string
		want        string // the body, with created_at and durations zeroed
	}{
		{
			name: "normalized stream fails after a delta",
			path: "/api/chat", body: chat,
			run:    scriptedRun(normalized, events(started(), delta("a")), events(errorEvent(500, "the model crashed"))),
			status: 200, contentType: "application/x-ndjson",
			want: `{"model":"m","created_at":"","message":{"role":"assistant","content":"a"},"done":false}` + "\n" + `{"error":"the model crashed"}` + "\n",
		},
		{
			name: "normalized failure before any text keeps its status",
			path: "/api/chat", body: chat,
			run:    scriptedRun(normalized, events(started(), errorEvent(429, "slow down"))),
			status: 429, contentType: "application/json; charset=utf-8",
			want: `{"error":"slow down"}` + "\n",
		},
		{
			name: "normalized generate without stream",
			path: "/api/generate", body: `{"model":"m","prompt":"hi","stream":false}`,
			run:    scriptedRun(normalized, events(started(), delta("a"), delta("b")), events(usageEvent(3, 2), complete("stop"))),
			status: 200, contentType: "application/json; charset=utf-8",
			want: `{"model":"m","created_at":"","response":"ab","done":true,"done_reason":"stop","context":` +
				contextJSON(translate.Turn{Role: "user", Content: "hi"}, translate.Turn{Role: "assistant", Content: "ab"}) +
				`,"total_duration":1,"load_duration":1,"prompt_eval_count":3,"prompt_eval_duration":1,"eval_count":2,"eval_duration":1}` + "\n",
		},
		{
			name: "tunnel error status",
			path: "/api/chat", body: chat,
			run: scriptedRun(tunnel, tunnelHead(401, map[string]string{"content-type": "application/json"}),
				tunnelData(`{"error":{"message":"bad key","type":"auth"}}`), tunnelEnd()),
			status: 401, contentType: "application/json; charset=utf-8",
			want: `{"error":"bad key"}` + "\n",
		},
		{
			name: "tunnel stream cut before its end",
			path: "/api/chat", body: chat,
			run: scriptedRun(tunnel, tunnelHead(200, map[string]string{"Content-Type": "text/event-stream"}),
				tunnelData(`data: {"choices":[{"index":0,"delta":{"content":"a"}}]}`+"\n\n"), tunnelEnd()),
			status: 200, contentType: "application/x-ndjson",
			want: `{"model":"m","created_at":"","message":{"role":"assistant","content":"a"},"done":false}` + "\n" +
				`{"error":"upstream ended the response without completing it"}` + "\n",
		},
		{
			name: "tunnel JSON answer",
			path: "/api/chat", body: `{"model":"m","stream":false,"messages":[{"role":"user","content":"hi"}]}`,
			run: scriptedRun(tunnel, tunnelHead(200, map[string]string{"Content-Type": "application/json"}),
				tunnelData(`{"choices":[{"index":0,"message":{"role":"assistant","content":"whole"},"finish_reason":"length"}],`),
				tunnelData(`"usage":{"prompt_tokens":2,"completion_tokens":1}}`), tunnelEnd()),
			status: 200, contentType: "application/json; charset=utf-8",
			want: `{"model":"m","created_at":"","message":{"role":"assistant","content":"whole"},"done":true,"done_reason":"length","total_duration":1,"load_duration":1,"prompt_eval_count":2,"prompt_eval_duration":1,"eval_count":1,"eval_duration":1}` + "\n",
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			env := newEnv(t, api.Config{}, runWith(c.run))
			status, ct, body := env.ollamaPost(t, c.path, c.body)
			if status != c.status || ct != c.contentType {
				t.Fatalf("%d %q %s, want %d %q", status, ct, body, c.status, c.contentType)
			}
			if got := normalizeOllama(t, body); got != c.want {
				t.Fatalf("body\n%s\nwant\n%s", got, c.want)
			}
		})
	}
}

// normalizeOllama zeroes the clock-dependent fields of each line: the fake
// clock stands still, so every duration is the 1 ns floor already, and
// created_at becomes "".
func normalizeOllama(t *testing.T, body string) string {
	t.Helper()
	var out strings.Builder
	for _, line := range strings.SplitAfter(body, "\n") {
		if line == "" {
			continue
		}
		var m map[string]json.RawMessage
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("line %q: %v", line, err)
		}
		if _, ok := m["created_at"]; ok {
			line = strings.Replace(line, string(m["created_at"]), `""`, 1)
		}
		out.WriteString(line)
	}
	return out.String()
}

func TestOllamaDispatchesCanonicalRequests(t *testing.T) {
	run := scriptedRun(normalized, events(started(), complete("stop")))
	env := newEnv(t, api.Config{}, runWith(run))
	req, _ := http.NewRequest("POST", env.srv.URL+"/api/generate", strings.NewReader(`{"model":"m","prompt":"p","raw":true,"stream":false}`))
	req.Header.Set("Accept", "application/json")
	req.Header.Set("X-Request-Id", "r-1")
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded") // curl's default: accepted, as Ollama does
	if resp := env.do(t, req); resp.status != 200 {
		t.Fatalf("%d %s", resp.status, resp.body)
	}
	got := env.gw.Requests()[0]
	if got.Operation != contract.OperationCompletion || got.Model != "m" || !got.Stream ||
		len(got.Headers) != 1 || got.Headers["X-Request-Id"] != "r-1" || !strings.Contains(string(got.Body), `"prompt":"p"`) {
		t.Fatalf("dispatched %+v %s", got, got.Body)
	}
}

func TestOllamaLoadAnswersForTaggedNames(t *testing.T) {
	env := newEnv(t, api.Config{}, failWith(contract.ErrUnknownModel))
	for body, want := range map[string]int{
		`{"model":"m:latest","messages":[]}`: 200,
		`{"model":"m","messages":[]}`:        200,
		`{"model":"m:7b","messages":[]}`:     404,
		`{"model":"alias:latest"}`:           200,
	} {
		if status, _, data := env.ollamaPost(t, "/api/chat", body); status != want {
			t.Fatalf("%s: %d %s, want %d", body, status, data, want)
		}
	}
	if n := len(env.gw.Requests()); n != 0 {
		t.Fatalf("%d load requests were dispatched", n)
	}
}

// contextJSON is the JSON of the "context" iop gives for a conversation.
func contextJSON(turns ...translate.Turn) string {
	b, _ := json.Marshal(translate.EncodeContext(turns))
	return string(b)
}

// TestRegression_OllamaClientGetsTheProvidersRetryAfter: a tunnel-path
// provider's 429 kept its Retry-After for an OpenAI client (the head is
// relayed) but lost it on /api/chat. An Ollama client
// gets the provider's Retry-After too, when it is one (seconds or an HTTP
// date); anything else is not passed on.
func TestRegression_OllamaClientGetsTheProvidersRetryAfter(t *testing.T) {
	chat := `{"model":"m","messages":[{"role":"user","content":"hi"}]}`
	for value, want := range map[string]string{"7": "7", "Wed, 21 Oct 2026 07:28:00 GMT": "Wed, 21 Oct 2026 07:28:00 GMT", "soon\r\nX-Evil: 1": ""} {
		run := scriptedRun(tunnel, tunnelHead(429, map[string]string{"Content-Type": "application/json", "Retry-After": value}),
			tunnelData(`{"error":{"message":"slow down","type":"rate_limit"}}`), tunnelEnd())
		env := newEnv(t, api.Config{}, runWith(run))
		resp := env.post(t, "/api/chat", "", chat)
		if resp.status != http.StatusTooManyRequests || resp.header.Get("Retry-After") != want || resp.header.Get("X-Evil") != "" {
			t.Errorf("provider Retry-After %q: %d Retry-After %q %s, want 429 with %q", value, resp.status, resp.header.Get("Retry-After"), resp.body, want)
		}
	}
}
