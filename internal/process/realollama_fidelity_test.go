package process

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"reflect"
	"strings"
	"testing"

	"iop/internal/node"
	"iop/internal/ollamatest"
)

// TestRealOllama_Logprobs ports the assertions of Ollama's own integration
// tests TestAPIGenerateLogprobs, TestAPIChatLogprobs and TestNumPredict
// (integration/ of github.com/ollama/ollama v0.17.4) and runs them against
// the real Ollama directly and through iop (edge and node over gRPC, the
// native provider): both must pass alike. A model only the OpenAI-
// compatible provider serves refuses logprobs (400) instead of dropping
// them.
func TestRealOllama_Logprobs(t *testing.T) {
	rig := startRealRig(t)
	targets := map[string]string{"direct": rig.s.URL, "iop": "http://" + rig.e.HTTPAddr}
	opts := func(n int) string { return `"options":{"temperature":0,"seed":123,"num_predict":` + itoa(n) + `}` }
	cases := []struct {
		name, path, body string
		top              int
	}{
		// TestAPIGenerateLogprobs
		{"generate/no_logprobs", "/api/generate", `"prompt":"Why is the sky blue?","stream":false,` + opts(10), -1},
		{"generate/logprobs_only", "/api/generate", `"prompt":"Why is the sky blue?","stream":false,"logprobs":true,` + opts(10), 0},
		{"generate/logprobs_with_top_5", "/api/generate", `"prompt":"Why is the sky blue?","stream":false,"logprobs":true,"top_logprobs":5,` + opts(10), 5},
		// TestAPIChatLogprobs
		{"chat/top_3", "/api/chat", `"messages":[{"role":"user","content":"Say hello in one word"}],"stream":false,"logprobs":true,"top_logprobs":3,` + opts(5), 3},
		// TestNumPredict: streamed, one logprob per token, num_predict of them.
		{"num_predict", "/api/generate", `"prompt":"Write a long story.","stream":true,"logprobs":true,` + opts(10), 0},
		{"chat/streamed", "/api/chat", `"messages":[{"role":"user","content":"Say hello in one word"}],"logprobs":true,"top_logprobs":2,` + opts(5), 2},
	}
	for _, tc := range cases {
		for where, base := range targets {
			t.Run(tc.name+"/"+where, func(t *testing.T) {
				status, data := postTo(t, rig.client, base+tc.path, `{"model":"tiny",`+tc.body+`}`)
				if status != http.StatusOK {
					t.Fatalf("%d %s", status, data)
				}
				objs := decodeLogprobObjects(t, data)
				if tc.top < 0 {
					for _, o := range objs {
						if len(o.Logprobs) > 0 {
							t.Fatalf("logprobs not asked for: %s", data)
						}
					}
					return
				}
				checkLogprobs(t, objs, tc.top)
				if tc.name == "num_predict" {
					n := 0
					for _, o := range objs {
						n += len(o.Logprobs)
					}
					if n != 10 {
						t.Errorf("%d logprobs, want 10 (num_predict)", n)
					}
				}
			})
		}
	}
	status, data := rig.post(t, "/api/generate", `{"model":"tiny-v1","prompt":"hi","logprobs":true}`)
	if status != http.StatusBadRequest || !strings.Contains(string(data), "logprobs") {
		t.Errorf("logprobs on the tunnel path: %d %s, want 400", status, data)
	}
}

// TestRealOllama_FieldByField sends the same requests to the real Ollama
// and through iop (the native provider) and compares every field of the
// answers, but durations and created_at (and /api/generate's context,
// iop's own encoding: see the README's "The Ollama API compared with
// Ollama"). Deterministic answers (temperature 0, a seed) must match
// exactly.
func TestRealOllama_FieldByField(t *testing.T) {
	rig := startRealRig(t)
	// An embedding model on a provider of its own, with capability
	// embeddings.
	rig.s.CreateModel(t, "emb", ollamatest.Embedding)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	startNode(t, ctx, node.Config{NodeID: "gpu-emb", Edge: rig.e.NodeAddr, Providers: []node.ProviderConfig{
		{ID: "emb", Type: node.TypeOllama, BaseURL: rig.s.URL, Models: []string{"emb"}, Capacity: 1, Capabilities: []string{"embeddings"}},
	}})
	ignored := []string{"created_at", "total_duration", "load_duration", "prompt_eval_duration", "eval_duration", "context"}
	opts := `"options":{"temperature":0,"seed":7,"num_predict":8}`
	for _, tc := range []struct{ method, path, body string }{
		{http.MethodGet, "/api/version", ""},
		{http.MethodPost, "/api/chat", `{"model":"tiny","messages":[{"role":"user","content":"hello there"}],"stream":false,` + opts + `}`},
		{http.MethodPost, "/api/chat", `{"model":"tiny","messages":[{"role":"user","content":"hello there"}],` + opts + `}`},
		{http.MethodPost, "/api/generate", `{"model":"tiny","prompt":"why is the sky blue","stream":false,` + opts + `}`},
		{http.MethodPost, "/api/generate", `{"model":"tiny","prompt":"why is the sky blue","raw":true,` + opts + `}`},
		{http.MethodPost, "/api/generate", `{"model":"tiny","prompt":"why","stream":false,"logprobs":true,"top_logprobs":2,` + opts + `}`},
		{http.MethodPost, "/api/chat", `{"model":"tiny","messages":[{"role":"user","content":"hi"}],"logprobs":true,` + opts + `}`},
		{http.MethodPost, "/api/generate", `{"model":"tiny","prompt":"hi","raw":true,"system":"x"}`},
		{http.MethodPost, "/api/embed", `{"model":"emb","input":["first input","second input here"]}`},
		{http.MethodPost, "/api/embeddings", `{"model":"emb","prompt":"first input"}`},
		{http.MethodPost, "/api/chat", `{"model":"nope","messages":[{"role":"user","content":"hi"}]}`},
	} {
		direct := fetchJSONLines(t, rig.client, tc.method, rig.s.URL+tc.path, tc.body)
		through := fetchJSONLines(t, rig.client, tc.method, "http://"+rig.e.HTTPAddr+tc.path, tc.body)
		if direct.status != through.status {
			t.Errorf("%s %s: status %d directly, %d through iop", tc.path, tc.body, direct.status, through.status)
		}
		if len(direct.objs) != len(through.objs) {
			t.Errorf("%s %s: %d objects directly, %d through iop", tc.path, tc.body, len(direct.objs), len(through.objs))
			continue
		}
		for i := range direct.objs {
			for _, k := range ignored {
				delete(direct.objs[i], k)
				delete(through.objs[i], k)
			}
			if !reflect.DeepEqual(direct.objs[i], through.objs[i]) {
				d, _ := json.Marshal(direct.objs[i])
				g, _ := json.Marshal(through.objs[i])
				t.Errorf("%s %s: object %d differs:\n direct %s\n iop    %s", tc.path, tc.body, i, d, g)
			}
		}
	}
}

// ollamaAnswer is an answer's status and its JSON objects (one, or an NDJSON
// stream's lines).
type ollamaAnswer struct {
	status int
	objs   []map[string]any
}

func fetchJSONLines(t *testing.T, c *http.Client, method, url, body string) ollamaAnswer {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	out := ollamaAnswer{status: resp.StatusCode}
	dec := json.NewDecoder(bytes.NewReader(data))
	for dec.More() {
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			t.Fatalf("%s %s: not JSON: %v: %q", method, url, err, data)
		}
		out.objs = append(out.objs, m)
	}
	return out
}
