package e2e

// End-to-end tests of the Ollama API's fidelity to Ollama and of request
// and answer bodies in a content coding: a real edge and node over
// loopback TCP and gRPC, `iop sim` backends of both wire protocols.

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"iop/internal/e2e/harness"
	"iop/internal/node"
	"iop/internal/sim"
)

// logprobObject is an answer object with its logprobs (Ollama's
// api.Logprob).
type logprobObject struct {
	Done      bool   `json:"done"`
	EvalCount int    `json:"eval_count"`
	Error     string `json:"error"`
	Logprobs  []struct {
		Token       string  `json:"token"`
		Logprob     float64 `json:"logprob"`
		Bytes       []int   `json:"bytes"`
		TopLogprobs []struct {
			Token   string  `json:"token"`
			Logprob float64 `json:"logprob"`
			Bytes   []int   `json:"bytes"`
		} `json:"top_logprobs"`
	} `json:"logprobs"`
}

// checkLogprobs checks objs' logprobs as Ollama's own integration tests
// (TestAPIChatLogprobs, TestAPIGenerateLogprobs, TestNumPredict) do: one per
// generated token (eval_count), each with a token whose bytes are its
// bytes, a log probability ≤ 0, and with top > 0 at most top alternatives,
// most likely first; none for top 0.
func checkLogprobs(t *testing.T, objs []logprobObject, top int) {
	t.Helper()
	count, evals := 0, 0
	for _, o := range objs {
		if o.Error != "" {
			t.Fatalf("error line: %s", o.Error)
		}
		if o.Done {
			evals = o.EvalCount
		}
		for i, lp := range o.Logprobs {
			count++
			if lp.Logprob > 0 {
				t.Errorf("logprob[%d] %f > 0", i, lp.Logprob)
			}
			if !bytesMatch(lp.Token, lp.Bytes) {
				t.Errorf("logprob[%d]: bytes %v are not those of %q", i, lp.Bytes, lp.Token)
			}
			if top == 0 && len(lp.TopLogprobs) > 0 {
				t.Errorf("logprob[%d] has top_logprobs, none asked for", i)
			}
			if top > 0 && (len(lp.TopLogprobs) == 0 || len(lp.TopLogprobs) > top) {
				t.Errorf("logprob[%d] has %d top_logprobs, want 1..%d", i, len(lp.TopLogprobs), top)
			}
			for j := 1; j < len(lp.TopLogprobs); j++ {
				if lp.TopLogprobs[j-1].Logprob < lp.TopLogprobs[j].Logprob {
					t.Errorf("logprob[%d].top_logprobs not sorted", i)
				}
			}
			for j, alt := range lp.TopLogprobs {
				if !bytesMatch(alt.Token, alt.Bytes) {
					t.Errorf("logprob[%d].top[%d]: bytes %v are not those of %q", i, j, alt.Bytes, alt.Token)
				}
			}
		}
	}
	if count == 0 || count != evals {
		t.Errorf("%d logprobs for eval_count %d", count, evals)
	}
}

func bytesMatch(token string, ints []int) bool {
	if len(ints) != len(token) {
		return false
	}
	for i := range len(token) {
		if ints[i] != int(token[i]) {
			return false
		}
	}
	return true
}

// decodeLogprobObjects decodes an answer: NDJSON lines or one object.
func decodeLogprobObjects(t *testing.T, body []byte) []logprobObject {
	t.Helper()
	var out []logprobObject
	dec := json.NewDecoder(bytes.NewReader(body))
	for dec.More() {
		var o logprobObject
		if err := dec.Decode(&o); err != nil {
			t.Fatalf("not JSON: %v: %q", err, body)
		}
		out = append(out, o)
	}
	return out
}

// TestRegression_OllamaLogprobsPassThrough: logprobs and top_logprobs on
// /api/chat and /api/generate, streamed or not, were dropped silently. An
// Ollama provider's logprobs now reach the client in Ollama's shape; a
// model only an OpenAI-compatible provider serves refuses them (400), and
// top_logprobs out of 0..20 is Ollama's 400.
func TestRegression_OllamaLogprobsPassThrough(t *testing.T) {
	harness.Parallel(t)
	rig := startOllamaRig(t)
	for _, path := range []string{"/api/chat", "/api/generate"} {
		for _, stream := range []bool{false, true} {
			for _, top := range []int{0, 3} {
				input := `"messages":[{"role":"user","content":"Say hello in one word"}]`
				if path == "/api/generate" {
					input = `"prompt":"Why is the sky blue?"`
				}
				body := `{"model":"` + rigOllamaModel + `",` + input + `,"logprobs":true,"top_logprobs":` + itoa(top) +
					`,"stream":` + boolText(stream) + `,"options":{"num_predict":10,"temperature":0,"seed":123}}`
				resp, data := rig.do(t, http.MethodPost, path, body)
				if resp.StatusCode != http.StatusOK {
					t.Fatalf("%s stream=%v: %d %s", path, stream, resp.StatusCode, data)
				}
				checkLogprobs(t, decodeLogprobObjects(t, data), top)
			}
		}
	}
	// Without logprobs, none (TestAPIGenerateLogprobs' "no_logprobs").
	resp, data := rig.do(t, http.MethodPost, "/api/generate", `{"model":"`+rigOllamaModel+`","prompt":"hi","stream":false}`)
	if resp.StatusCode != http.StatusOK || bytes.Contains(data, []byte("logprobs")) {
		t.Errorf("no logprobs asked: %d %s", resp.StatusCode, data)
	}
	for _, tc := range []struct{ body, want string }{
		{`{"model":"` + rigOpenAIModel + `","prompt":"hi","logprobs":true}`, "returns logprobs: only Ollama providers do"},
		{`{"model":"` + rigOllamaModel + `","prompt":"hi","top_logprobs":21}`, "top_logprobs must be between 0 and 20"},
		{`{"model":"` + rigOllamaModel + `","prompt":"hi","top_logprobs":-1}`, "top_logprobs must be between 0 and 20"},
	} {
		resp, data := rig.do(t, http.MethodPost, "/api/generate", tc.body)
		var e struct{ Error string }
		_ = json.Unmarshal(data, &e)
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(e.Error, tc.want) {
			t.Errorf("%s: %d %s, want 400 %q", tc.body, resp.StatusCode, data, tc.want)
		}
	}
}

// TestRegression_OllamaRawWithSystemRefused: raw true with a system (or a
// template) was accepted, the system dropped; Ollama refuses it with 400
// and this text. A raw request without them, and a raw load, still work.
func TestRegression_OllamaRawWithSystemRefused(t *testing.T) {
	harness.Parallel(t)
	rig := startOllamaRig(t)
	for _, model := range []string{rigOllamaModel, rigOpenAIModel} {
		for _, extra := range []string{`"system":"be brief"`, `"template":"{{ .Prompt }}"`} {
			resp, data := rig.do(t, http.MethodPost, "/api/generate", `{"model":"`+model+`","prompt":"hi","raw":true,"stream":false,`+extra+`}`)
			if resp.StatusCode != http.StatusBadRequest || strings.TrimSpace(string(data)) != `{"error":"raw mode does not support template, system, or context"}` {
				t.Errorf("%s %s: %d %s", model, extra, resp.StatusCode, data)
			}
		}
		if resp, data := rig.do(t, http.MethodPost, "/api/generate", `{"model":"`+model+`","prompt":"hi","raw":true,"stream":false}`); resp.StatusCode != http.StatusOK {
			t.Errorf("%s raw: %d %s", model, resp.StatusCode, data)
		}
	}
}

// TestRegression_OllamaModelManagementRefused: /api/copy and /api/delete
// (and create, push, blobs) answered 404, which clients read as "no such
// model". They are refused 403 saying why, in Ollama's error shape.
func TestRegression_OllamaModelManagementRefused(t *testing.T) {
	harness.Parallel(t)
	rig := startOllamaRig(t)
	for _, tc := range []struct{ method, path, body string }{
		{http.MethodPost, "/api/copy", `{"source":"` + rigOllamaModel + `","destination":"x"}`},
		{http.MethodDelete, "/api/delete", `{"model":"` + rigOllamaModel + `"}`},
		{http.MethodPost, "/api/create", `{"model":"x","from":"` + rigOllamaModel + `"}`},
		{http.MethodPost, "/api/push", `{"model":"` + rigOllamaModel + `"}`},
		{http.MethodPost, "/api/blobs/sha256:00", `x`},
	} {
		resp, data := rig.do(t, tc.method, tc.path, tc.body)
		var e struct{ Error string }
		if err := json.Unmarshal(data, &e); err != nil || resp.StatusCode != http.StatusForbidden || !strings.Contains(e.Error, "iop is a gateway") {
			t.Errorf("%s %s: %d %s", tc.method, tc.path, resp.StatusCode, data)
		}
	}
}

// zipBomb is a generate body of 40 MiB (over the edge's default 32 MiB
// limit) in about 40 KB of gzip, made once per test binary.
var zipBomb = sync.OnceValue(func() []byte {
	var b bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&b, gzip.BestSpeed)
	io.WriteString(zw, `{"model":"`+rigOllamaModel+`","prompt":"`)
	zeros := bytes.Repeat([]byte("0"), 1<<20)
	for range 40 {
		zw.Write(zeros)
	}
	io.WriteString(zw, `"}`)
	zw.Close()
	return b.Bytes()
})

func gzipped(t *testing.T, s string) []byte {
	t.Helper()
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	if _, err := io.WriteString(zw, s); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// TestRegression_GzipRequestBody: a body sent with Content-Encoding gzip
// was read as JSON text (400). It is decoded on every route; the size
// limit counts the decoded bytes (a 40 MiB body of zeros in 40 KB of gzip
// is 413), and a coding the edge does not decode is 415 naming it.
func TestRegression_GzipRequestBody(t *testing.T) {
	harness.Parallel(t)
	rig := startOllamaRig(t)
	send := func(path, encoding string, body []byte) (int, string) {
		req, err := http.NewRequest(http.MethodPost, "http://"+rig.e.HTTPAddr+path, bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Content-Encoding", encoding)
		resp, err := rig.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		data, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(data)
	}
	for _, tc := range []struct{ path, body string }{
		{"/api/chat", `{"model":"` + rigOllamaModel + `","messages":[{"role":"user","content":"hi"}],"stream":false}`},
		{"/api/chat", `{"model":"` + rigOpenAIModel + `","messages":[{"role":"user","content":"hi"}],"stream":false}`},
		{"/api/embed", `{"model":"` + rigOllamaModel + `","input":"hi"}`},
		{"/v1/chat/completions", `{"model":"` + rigOpenAIModel + `","messages":[{"role":"user","content":"hi"}]}`},
		{"/v1/chat/completions", `{"model":"` + rigOllamaModel + `","messages":[{"role":"user","content":"hi"}]}`},
	} {
		if st, data := send(tc.path, "gzip", gzipped(t, tc.body)); st != http.StatusOK {
			t.Errorf("%s gzip: %d %s", tc.path, st, data)
		}
	}
	bomb := zipBomb()
	if st, data := send("/api/generate", "gzip", bomb); st != http.StatusRequestEntityTooLarge {
		t.Errorf("zip bomb (%d bytes): %d %s", len(bomb), st, data)
	}
	if st, data := send("/api/chat", "br", []byte("x")); st != http.StatusUnsupportedMediaType || !strings.Contains(data, `\"br\"`) {
		t.Errorf("br: %d %s", st, data)
	}
	if st, data := send("/v1/chat/completions", "gzip", []byte("not gzip")); st != http.StatusBadRequest {
		t.Errorf("corrupt gzip: %d %s", st, data)
	}
}

// gzipProxy is a model server that compresses every answer although
// asked for identity: a reverse proxy in front of target that gzips the
// body (flushed per read, so streams stay streams) and records the
// Accept-Encoding it was sent.
type gzipProxy struct {
	URL string

	mu      sync.Mutex // guards accepts
	accepts []string
}

func startGzipProxy(t *testing.T, target string) *gzipProxy {
	t.Helper()
	p := &gzipProxy{}
	client := &http.Client{Transport: &http.Transport{DisableCompression: true}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost { // a provider call, not a health probe
			p.mu.Lock()
			p.accepts = append(p.accepts, r.Header.Get("Accept-Encoding"))
			p.mu.Unlock()
		}
		req, err := http.NewRequestWithContext(r.Context(), r.Method, target+r.URL.RequestURI(), r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		req.Header = r.Header.Clone()
		resp, err := client.Do(req)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		for k, vs := range resp.Header {
			w.Header()[k] = vs
		}
		w.Header().Del("Content-Length")
		w.Header().Set("Content-Encoding", "gzip")
		w.WriteHeader(resp.StatusCode)
		zw := gzip.NewWriter(w)
		buf := make([]byte, 32<<10)
		for {
			n, err := resp.Body.Read(buf)
			if n > 0 {
				zw.Write(buf[:n])
				zw.Flush()
				http.NewResponseController(w).Flush()
			}
			if err != nil {
				break
			}
		}
		zw.Close()
	}))
	t.Cleanup(srv.Close)
	p.URL = srv.URL
	return p
}

// TestRegression_ProviderGzipsUnasked: the node sent no Accept-Encoding,
// and a provider that compressed its answer corrupted the stream (the edge
// looked for [DONE] in gzip bytes and opened the provider's breaker). The
// node asks for identity and decodes what comes compressed anyway, on
// both paths: the text, the usage and the end of every answer arrive, and
// the provider stays in rotation.
func TestRegression_ProviderGzipsUnasked(t *testing.T) {
	harness.Parallel(t)
	const olModel, oaModel = "gz-ollama:latest", "gz-openai"
	_, olURL := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOllama, Models: []string{olModel}, Seed: 11})
	_, oaURL := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOpenAI, Models: []string{oaModel}, Seed: 11})
	olProxy, oaProxy := startGzipProxy(t, olURL), startGzipProxy(t, oaURL)
	rig := startOllamaRig(t,
		node.ProviderConfig{ID: "gz-ollama", Type: node.TypeOllama, BaseURL: olProxy.URL, Models: []string{olModel}, Capacity: 2},
		node.ProviderConfig{ID: "gz-openai", Type: "vllm", BaseURL: oaProxy.URL + "/v1", Models: []string{oaModel}, Capacity: 2},
	)
	for range 8 { // more than a breaker's threshold of failures
		for _, model := range []string{olModel, oaModel} {
			resp, data := rig.do(t, http.MethodPost, "/api/chat", `{"model":"`+model+`","messages":[{"role":"user","content":"hi"}]}`)
			objs := ndjson(t, data)
			last := objs[len(objs)-1]
			if resp.StatusCode != http.StatusOK || !last.Done || last.EvalCount == 0 || last.PromptEvalCount == 0 {
				t.Fatalf("/api/chat %s: %d %s", model, resp.StatusCode, data)
			}
			resp, data = rig.do(t, http.MethodPost, "/v1/chat/completions",
				`{"model":"`+model+`","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}`)
			if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Encoding") != "" ||
				!bytes.HasSuffix(data, []byte("data: [DONE]\n\n")) || !bytes.Contains(data, []byte(`"completion_tokens"`)) {
				t.Fatalf("/v1/chat/completions %s: %d %v %q", model, resp.StatusCode, resp.Header, data)
			}
		}
	}
	for _, p := range []*gzipProxy{olProxy, oaProxy} {
		p.mu.Lock()
		for _, a := range p.accepts {
			if a != "identity" {
				t.Errorf("provider asked with Accept-Encoding %q, want identity", a)
			}
		}
		p.mu.Unlock()
	}
}

func itoa(n int) string {
	b, _ := json.Marshal(n)
	return string(b)
}

func boolText(b bool) string {
	if b {
		return "true"
	}
	return "false"
}

// TestRegression_OllamaLegacyEmbeddingsRaw: the older /api/embeddings
// answered normalized vectors, where Ollama answers the model's raw one
// (every component differed by one factor). Through an Ollama provider it
// is now the provider's own /api/embeddings answer, and /api/embed stays
// normalized.
func TestRegression_OllamaLegacyEmbeddingsRaw(t *testing.T) {
	harness.Parallel(t)
	rig := startOllamaRig(t)
	body := `{"model":"` + rigOllamaModel + `","prompt":"why is the sky blue"}`
	resp, err := rig.client.Post(rig.ollamaProxy.URL+"/api/embeddings", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	direct, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	_, through := rig.do(t, http.MethodPost, "/api/embeddings", body)
	if !bytes.Equal(bytes.TrimSpace(direct), bytes.TrimSpace(through)) {
		t.Errorf("/api/embeddings through iop %s, directly %s", through, direct)
	}
	if sent := rig.ollamaProxy.last(t); bytes.Contains(sent.Body, []byte("iop_")) {
		t.Errorf("the provider got %s", sent.Body)
	}
	_, data := rig.do(t, http.MethodPost, "/api/embed", `{"model":"`+rigOllamaModel+`","input":"why is the sky blue"}`)
	var e struct{ Embeddings [][]float64 }
	if err := json.Unmarshal(data, &e); err != nil || len(e.Embeddings) != 1 {
		t.Fatalf("/api/embed: %s", data)
	}
	norm := 0.0
	for _, v := range e.Embeddings[0] {
		norm += v * v
	}
	if norm < 0.999 || norm > 1.001 {
		t.Errorf("/api/embed vector of squared norm %f, want 1", norm)
	}
}

// startBigAnswerServer is a model server of both protocols whose answers
// are large: an Ollama /api/generate stream whose final line carries a
// "context" of contextIDs token ids (over 1 MiB), and an OpenAI
// /v1/embeddings answer of one vector of dims components (over 16 MiB).
func startBigAnswerServer(t *testing.T, contextIDs, dims int) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		switch r.URL.Path {
		case "/api/generate", "/api/chat":
			w.Header().Set("Content-Type", "application/x-ndjson")
			io.WriteString(w, `{"model":"big:latest","response":"hello","done":false}`+"\n")
			var b strings.Builder
			b.WriteString(`{"model":"big:latest","response":"","done":true,"done_reason":"stop","prompt_eval_count":3,"eval_count":1,"context":[`)
			for i := range contextIDs {
				if i > 0 {
					b.WriteByte(',')
				}
				b.WriteString("151643")
			}
			b.WriteString("]}\n")
			io.WriteString(w, b.String())
		case "/v1/embeddings":
			w.Header().Set("Content-Type", "application/json")
			var b strings.Builder
			b.WriteString(`{"object":"list","model":"bigemb","usage":{"prompt_tokens":1,"total_tokens":1},"data":[{"object":"embedding","index":0,"embedding":[`)
			for i := range dims {
				if i > 0 {
					b.WriteByte(',')
				}
				b.WriteString("0.12345678901234567") // 20 bytes a component
			}
			b.WriteString("]}]}")
			io.WriteString(w, b.String())
		default:
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"models":[],"object":"list","data":[]}`)
		}
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// TestRegression_BigAnswersWithinTheAnswerLimit: an Ollama stream line
// over 1 MiB (a final /api/generate line with every token id of a long
// conversation) failed the whole answer with 502, and an /api/embed
// answer over 16 MiB was 502 where /v1/embeddings relayed the same
// vectors. Both limits are now the documented answer limit (256 MiB by
// default, the same on the node and the edge).
func TestRegression_BigAnswersWithinTheAnswerLimit(t *testing.T) {
	harness.ParallelLong(t)
	const dims = 900_000 // about 18 MB of JSON
	url := startBigAnswerServer(t, 400_000, dims)
	rig := startOllamaRig(t,
		node.ProviderConfig{ID: "big-ollama", Type: node.TypeOllama, BaseURL: url, Models: []string{"big:latest"}, Capacity: 1},
		node.ProviderConfig{ID: "big-openai", Type: "vllm", BaseURL: url + "/v1", Models: []string{"bigemb"}, Capacity: 1, Capabilities: []string{"embeddings"}},
	)
	for _, stream := range []bool{true, false} {
		resp, data := rig.do(t, http.MethodPost, "/api/generate", `{"model":"big:latest","prompt":"hi","raw":true,"stream":`+boolText(stream)+`}`)
		objs := decodeLogprobObjects(t, data)
		if resp.StatusCode != http.StatusOK || len(objs) == 0 || !objs[len(objs)-1].Done || objs[len(objs)-1].Error != "" {
			t.Errorf("/api/generate stream=%v: %d %.300s", stream, resp.StatusCode, data)
		}
	}
	resp, data := rig.do(t, http.MethodPost, "/api/embed", `{"model":"bigemb","input":"hi"}`)
	var e struct{ Embeddings [][]float32 }
	if err := json.Unmarshal(data, &e); err != nil || resp.StatusCode != http.StatusOK || len(e.Embeddings) != 1 || len(e.Embeddings[0]) != dims {
		t.Errorf("/api/embed (%d bytes): %d %.300s", len(data), resp.StatusCode, data)
	}
}
