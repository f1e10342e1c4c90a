package ollamatest_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/ollama/ollama/fs/ggml"

	"iop/internal/ollamatest"
)

// The build script's default version is the one Binary looks for.
func TestBuildScriptVersion(t *testing.T) {
	script, err := os.ReadFile(filepath.Join("..", "..", "test", "ollama", "build.sh"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`VERSION=\$\{OLLAMA_VERSION:-([^}]+)\}`).FindSubmatch(script)
	if m == nil || string(m[1]) != ollamatest.Version {
		t.Fatalf("test/ollama/build.sh builds %q by default, ollamatest.Version is %q", m, ollamatest.Version)
	}
}

// The GGUF is a llama model in ggml's dimension order, the same bytes on
// every write, and small.
func TestWriteGGUF(t *testing.T) {
	dir := t.TempDir()
	a, err := ollamatest.WriteGGUF(filepath.Join(dir, "a.gguf"), "tiny", ollamatest.Plain)
	if err != nil {
		t.Fatal(err)
	}
	b, err := ollamatest.WriteGGUF(filepath.Join(dir, "b.gguf"), "tiny", ollamatest.Plain)
	if err != nil {
		t.Fatal(err)
	}
	da, _ := os.ReadFile(a)
	db, _ := os.ReadFile(b)
	if !bytes.Equal(da, db) {
		t.Errorf("two writes of the same model differ")
	}
	if len(da) > 1<<20 {
		t.Errorf("model is %d bytes, want under 1 MiB", len(da))
	}

	f, err := os.Open(a)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	g, err := ggml.Decode(f, -1)
	if err != nil {
		t.Fatalf("decoding the GGUF with Ollama's reader: %v", err)
	}
	kv := g.KV()
	if kv.Architecture() != "llama" || kv.BlockCount() != 2 || kv.EmbeddingLength() != ollamatest.EmbeddingLength {
		t.Errorf("arch %q, %d blocks, %d dims", kv.Architecture(), kv.BlockCount(), kv.EmbeddingLength())
	}
	vocab := len(kv.Strings("tokenizer.ggml.tokens"))
	if vocab < 259 {
		t.Errorf("vocabulary of %d tokens; want the 3 special and 256 byte tokens at least", vocab)
	}
	shapes := map[string][]uint64{}
	for _, ts := range g.Tensors().Items() {
		shapes[ts.Name] = ts.Shape
	}
	for name, want := range map[string][]uint64{
		"token_embd.weight":      {ollamatest.EmbeddingLength, uint64(vocab)},
		"output.weight":          {ollamatest.EmbeddingLength, uint64(vocab)},
		"blk.1.ffn_down.weight":  {64, ollamatest.EmbeddingLength},
		"blk.0.attn_norm.weight": {ollamatest.EmbeddingLength},
	} {
		if !slices.Equal(shapes[name], want) {
			t.Errorf("%s shape %v, want %v", name, shapes[name], want)
		}
	}
	if _, ok := shapes["blk.2.attn_q.weight"]; ok || len(shapes) != 3+2*9 {
		t.Errorf("tensors %v: want 3 + 9 per layer for 2 layers", shapes)
	}
	if _, err := ollamatest.WriteGGUF(filepath.Join(dir, "e.gguf"), "tiny", ollamatest.Embedding); err != nil {
		t.Fatal(err)
	}
}

// One server for the tests below that need a running Ollama.
func startWithModels(t *testing.T) *ollamatest.Server {
	t.Helper()
	s := ollamatest.Start(t)
	for _, v := range ollamatest.Variants {
		s.CreateModel(t, "tiny-"+string(v), v)
	}
	return s
}

// Each variant has in /api/show the capabilities its constant documents.
func TestCreateModel_Capabilities(t *testing.T) {
	s := startWithModels(t)
	for _, v := range ollamatest.Variants {
		got := s.Capabilities(t, "tiny-"+string(v))
		if !slices.Equal(got, v.Capabilities()) {
			t.Errorf("%s: /api/show capabilities %v, want %v", v, got, v.Capabilities())
		}
	}
}

// post sends a JSON body and returns the status and body.
func post(t *testing.T, s *ollamatest.Server, path, body string) (int, []byte) {
	t.Helper()
	resp, err := s.Client.Post(s.URL+path, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b
}

type generated struct {
	Response   string `json:"response"`
	Thinking   string `json:"thinking"`
	Message    struct{ Content, Thinking string }
	Done       bool   `json:"done"`
	DoneReason string `json:"done_reason"`
	EvalCount  int    `json:"eval_count"`
	PromptEval int    `json:"prompt_eval_count"`
	Error      string `json:"error"`
}

// The model generates: exactly num_predict tokens (it never ends by itself),
// the model's default of 16 when the request sets none, streamed as NDJSON.
func TestModel_Generates(t *testing.T) {
	s := startWithModels(t)
	for _, tc := range []struct {
		body string
		want int
	}{
		{`{"model":"tiny-plain","prompt":"why is the sky blue","stream":false,"options":{"num_predict":5}}`, 5},
		{`{"model":"tiny-plain","prompt":"why is the sky blue","stream":false}`, ollamatest.DefaultNumPredict},
	} {
		status, body := post(t, s, "/api/generate", tc.body)
		var g generated
		if err := json.Unmarshal(body, &g); status != 200 || err != nil {
			t.Fatalf("%s: %d %s", tc.body, status, body)
		}
		if !g.Done || g.DoneReason != "length" || g.EvalCount != tc.want || g.PromptEval == 0 {
			t.Errorf("%s: %+v, want done, length, %d tokens, a prompt count", tc.body, g, tc.want)
		}
	}

	status, body := post(t, s, "/api/chat", `{"model":"tiny-tools","messages":[{"role":"user","content":"hi"}],"options":{"num_predict":7}}`)
	if status != 200 {
		t.Fatalf("stream: %d %s", status, body)
	}
	var lines []generated
	sc := bufio.NewScanner(bytes.NewReader(body))
	for sc.Scan() {
		var g generated
		if err := json.Unmarshal(sc.Bytes(), &g); err != nil {
			t.Fatalf("line %q: %v", sc.Bytes(), err)
		}
		lines = append(lines, g)
	}
	if len(lines) < 2 {
		t.Fatalf("streamed %d lines: %s", len(lines), body)
	}
	last := lines[len(lines)-1]
	if !last.Done || last.DoneReason != "length" || last.EvalCount != 7 {
		t.Errorf("last line %+v, want done, length, 7 tokens", last)
	}
}

// A thinking request to the thinking variant answers in the thinking field.
func TestModel_Thinks(t *testing.T) {
	s := startWithModels(t)
	status, body := post(t, s, "/api/chat", `{"model":"tiny-thinking","messages":[{"role":"user","content":"hi"}],"think":true,"stream":false,"options":{"num_predict":8}}`)
	var g generated
	if err := json.Unmarshal(body, &g); status != 200 || err != nil {
		t.Fatalf("%d %s", status, body)
	}
	if g.Message.Thinking == "" || g.Message.Content != "" {
		t.Errorf("message %+v: want thinking and no content", g.Message)
	}
	// A model without the capability refuses think.
	if status, body := post(t, s, "/api/chat", `{"model":"tiny-plain","messages":[{"role":"user","content":"hi"}],"think":true,"stream":false}`); status != http.StatusBadRequest {
		t.Errorf("think to a plain model: %d %s, want 400", status, body)
	}
}

// The embedding variant embeds and refuses chat.
func TestModel_Embeds(t *testing.T) {
	s := startWithModels(t)
	status, body := post(t, s, "/api/embed", `{"model":"tiny-embedding","input":["first input","second input here"]}`)
	var e struct {
		Embeddings [][]float32 `json:"embeddings"`
	}
	if err := json.Unmarshal(body, &e); status != 200 || err != nil {
		t.Fatalf("%d %s", status, body)
	}
	if len(e.Embeddings) != 2 || len(e.Embeddings[0]) != ollamatest.EmbeddingLength || slices.Equal(e.Embeddings[0], e.Embeddings[1]) {
		t.Errorf("embeddings %v: want two different vectors of %d", e.Embeddings, ollamatest.EmbeddingLength)
	}
	// Ollama embeds with a llama model that does not list "embedding" too.
	status, body = post(t, s, "/api/embed", `{"model":"tiny-plain","input":"x"}`)
	if err := json.Unmarshal(body, &e); status != 200 || err != nil || len(e.Embeddings) != 1 || len(e.Embeddings[0]) != ollamatest.EmbeddingLength {
		t.Errorf("embed with the plain model: %d %s, want one vector (as the Plain doc says)", status, body)
	}
	if status, body := post(t, s, "/api/chat", `{"model":"tiny-embedding","messages":[{"role":"user","content":"hi"}],"stream":false}`); status != http.StatusBadRequest {
		t.Errorf("chat with the embedding model: %d %s, want 400", status, body)
	}
}

// Stop makes the server unreachable; Restart brings it back on the same
// address with its models; DeleteModel removes one.
func TestServer_StopRestart(t *testing.T) {
	s := ollamatest.Start(t)
	s.CreateModel(t, "tiny", ollamatest.Plain)
	s.CreateModel(t, "gone", ollamatest.Plain)
	s.DeleteModel(t, "gone")
	url := s.URL
	s.Stop()
	if resp, err := http.Get(url + "/api/version"); err == nil {
		resp.Body.Close()
		t.Fatalf("stopped server answered %d", resp.StatusCode)
	}
	s.Stop() // idempotent
	s.Restart(t)
	if s.URL != url {
		t.Errorf("restarted on %s, was %s", s.URL, url)
	}
	resp, err := s.Client.Get(s.URL + "/api/tags")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var tags struct{ Models []struct{ Name string } }
	if err := json.NewDecoder(resp.Body).Decode(&tags); err != nil {
		t.Fatal(err)
	}
	if len(tags.Models) != 1 || tags.Models[0].Name != "tiny:latest" {
		t.Errorf("after restart /api/tags lists %+v, want only tiny:latest", tags.Models)
	}
	if !strings.Contains(s.Log(), "---- ollamatest: stopped ----") {
		t.Errorf("log has no stop mark")
	}
}
