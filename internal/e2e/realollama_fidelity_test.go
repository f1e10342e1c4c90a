package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"iop/internal/e2e/harness"
	"iop/internal/edge"
	"iop/internal/node"
	"iop/internal/ollamatest"
	"iop/internal/testenv"
)

// TestRealOllama_Logprobs ports the assertions of Ollama's own integration
// tests TestAPIGenerateLogprobs, TestAPIChatLogprobs and TestNumPredict
// (integration/ of github.com/ollama/ollama v0.17.4) and runs them against
// the real Ollama directly and through iop (edge and node over gRPC, the
// native provider): both must pass alike. A model only the OpenAI-
// compatible provider serves refuses logprobs (400) instead of dropping
// them.
func TestRealOllama_Logprobs(t *testing.T) {
	harness.ParallelOllama(t)
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
	harness.ParallelOllama(t)
	rig := startRealRig(t)
	// An embedding model on a provider of its own, with capability
	// embeddings.
	rig.s.CreateModel(t, "emb", ollamatest.Embedding)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	harness.Node(t, ctx, node.Config{NodeID: "gpu-emb", Edge: rig.e.NodeAddr, Providers: []node.ProviderConfig{
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

// modelFieldDifferences are the differences TestRealOllama_FieldByFieldModels
// allows between a real Ollama's /api/show, /api/ps and /api/tags and
// iop's in front of it: each is listed, with its reason, under
// "Differences that remain" in docs/apis.md, which must name it by the
// text here (the test checks).
var modelFieldDifferences = []string{
	// /api/show: the host's paths are removed.
	"`/api/show` `modelfile`: a `FROM` line's file path",
	"`/api/show` `details.parent_model`",
	// /api/ps: iop's own fields beside Ollama's.
	"`/api/ps` `node_id`, `provider_id`, `source`, `loaded_since`, `in_flight`",
}

// TestRealOllama_FieldByFieldModels extends TestRealOllama_FieldByField to
// the model routes: it asks a real Ollama and iop in front of it (an edge,
// and a node discovering that Ollama's models) for /api/show (short,
// verbose, an embedding model, an unknown model, none), /api/tags and,
// once a model of each kind is loaded, /api/ps, and compares every field.
// The answers are equal but for modelFieldDifferences, which the direct
// answer is adjusted by (the FROM path becomes the model's name, a
// parent_model path "") or which only iop's answer has.
func TestRealOllama_FieldByFieldModels(t *testing.T) {
	harness.ParallelOllama(t)
	doc, err := os.ReadFile("../../docs/apis.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range modelFieldDifferences {
		if !strings.Contains(string(doc), "- "+d) {
			t.Errorf("docs/apis.md does not list the difference %q", d)
		}
	}
	s := ollamatest.Start(t)
	s.CreateModel(t, "tiny", ollamatest.Plain)
	s.CreateModel(t, "emb", ollamatest.Embedding)
	ctx, cancel := context.WithCancel(context.Background())
	e := harness.Edge(t, ctx, harness.EdgeConfig(map[string]edge.ModelConfig{}))
	t.Cleanup(cancel)
	harness.Node(t, ctx, node.Config{NodeID: "gpu-1", Edge: e.NodeAddr, Providers: []node.ProviderConfig{
		{ID: "ollama", Type: node.TypeOllama, BaseURL: s.URL, Capacity: 2},
	}})
	transport := &http.Transport{}
	t.Cleanup(transport.CloseIdleConnections)
	client := &http.Client{Transport: transport}
	iop := "http://" + e.HTTPAddr
	testenv.Eventually(t, "iop lists the Ollama's models", func() bool {
		a := fetchJSONLines(t, client, http.MethodGet, iop+"/api/tags", "")
		return len(a.objs) == 1 && len(a.objs[0]["models"].([]any)) == 2
	})

	for _, body := range []string{`{"model":"tiny"}`, `{"model":"tiny:latest","verbose":true}`, `{"name":"emb"}`, `{"model":"nope"}`, `{}`} {
		direct := fetchJSONLines(t, client, http.MethodPost, s.URL+"/api/show", body)
		through := fetchJSONLines(t, client, http.MethodPost, iop+"/api/show", body)
		if direct.status != through.status || len(direct.objs) != 1 || len(through.objs) != 1 {
			t.Errorf("/api/show %s: %d %v directly, %d %v through iop", body, direct.status, direct.objs, through.status, through.objs)
			continue
		}
		if direct.status != http.StatusOK {
			continue // the error texts are compared below
		}
		d := direct.objs[0]
		if mf, ok := d["modelfile"].(string); ok {
			name := "tiny"
			if strings.Contains(body, "emb") {
				name = "emb"
			}
			d["modelfile"] = fromPath.ReplaceAllString(mf, "FROM "+name+":latest")
		}
		if det, ok := d["details"].(map[string]any); ok && strings.HasPrefix(fmt.Sprint(det["parent_model"]), "/") {
			det["parent_model"] = ""
		}
		if strings.Contains(fmt.Sprint(through.objs[0]), s.Addr) || strings.Contains(fmt.Sprint(through.objs[0]), "/blobs/") {
			t.Errorf("/api/show %s through iop shows a path of the Ollama host: %v", body, through.objs[0])
		}
		// Ollama writes PARAMETER lines in map order: one answer's order
		// is not the next one's, directly or not.
		for _, o := range []map[string]any{d, through.objs[0]} {
			for _, k := range []string{"modelfile", "parameters"} {
				if v, ok := o[k].(string); ok {
					lines := strings.Split(v, "\n")
					slices.Sort(lines)
					o[k] = strings.Join(lines, "\n")
				}
			}
		}
		diffObjects(t, "/api/show "+body, d, through.objs[0])
	}
	for _, body := range []string{`{"model":"nope"}`, `{}`} {
		direct := fetchJSONLines(t, client, http.MethodPost, s.URL+"/api/show", body)
		through := fetchJSONLines(t, client, http.MethodPost, iop+"/api/show", body)
		if !reflect.DeepEqual(direct, through) {
			t.Errorf("/api/show %s: %+v directly, %+v through iop", body, direct, through)
		}
	}

	direct := fetchJSONLines(t, client, http.MethodGet, s.URL+"/api/tags", "")
	through := fetchJSONLines(t, client, http.MethodGet, iop+"/api/tags", "")
	byName(direct.objs[0])
	byName(through.objs[0])
	diffObjects(t, "/api/tags", direct.objs[0], through.objs[0])

	// Load both models (through iop), then wait for the node's reading.
	for _, tc := range [][2]string{
		{"/api/generate", `{"model":"tiny","prompt":"hi","stream":false,"options":{"num_predict":2}}`},
		{"/api/embed", `{"model":"emb","input":"hi"}`},
	} {
		if status, data := postTo(t, client, iop+tc[0], tc[1]); status != http.StatusOK {
			t.Fatalf("%s: %d %s", tc[0], status, data)
		}
	}
	var last [2]map[string]any
	psEqual := func() bool {
		d := fetchJSONLines(t, client, http.MethodGet, s.URL+"/api/ps", "").objs[0]
		g := fetchJSONLines(t, client, http.MethodGet, iop+"/api/ps", "").objs[0]
		byName(d)
		byName(g)
		last = [2]map[string]any{d, g}
		models, _ := g["models"].([]any)
		for _, m := range models {
			m := m.(map[string]any)
			if m["node_id"] != "gpu-1" || m["provider_id"] != "ollama" || m["source"] != "reported" || m["loaded_since"] == nil {
				return false
			}
			for _, k := range []string{"node_id", "provider_id", "source", "loaded_since", "in_flight"} {
				delete(m, k)
			}
		}
		return len(d["models"].([]any)) == 2 && reflect.DeepEqual(d, g)
	}
	deadline := time.Now().Add(30 * time.Second)
	for !psEqual() {
		if time.Now().After(deadline) {
			diffObjects(t, "/api/ps", last[0], last[1])
			t.Fatalf("/api/ps through iop never matched the Ollama's")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// byName sorts a listing's "models" by name. Ollama lists the models
// modified (/api/tags) or expiring (/api/ps) in one second in its map's
// order, which changes from call to call.
func byName(listing map[string]any) {
	models, _ := listing["models"].([]any)
	slices.SortStableFunc(models, func(x, y any) int {
		return strings.Compare(fmt.Sprint(x.(map[string]any)["name"]), fmt.Sprint(y.(map[string]any)["name"]))
	})
}

// fromPath matches a modelfile's FROM line that names a file.
var fromPath = regexp.MustCompile(`(?m)^FROM /\S+$`)

// diffObjects reports every field in which got differs from want, by its
// JSON path.
func diffObjects(t *testing.T, what string, want, got any) {
	t.Helper()
	var walk func(path string, w, g any)
	walk = func(path string, w, g any) {
		switch wv := w.(type) {
		case map[string]any:
			gv, ok := g.(map[string]any)
			if !ok {
				t.Errorf("%s %s: %v directly, %v through iop", what, path, w, g)
				return
			}
			for k := range wv {
				walk(path+"."+k, wv[k], gv[k])
			}
			for k := range gv {
				if _, ok := wv[k]; !ok {
					t.Errorf("%s %s.%s: only through iop (%v)", what, path, k, gv[k])
				}
			}
		case []any:
			gv, ok := g.([]any)
			if !ok || len(gv) != len(wv) {
				t.Errorf("%s %s: %v directly, %v through iop", what, path, w, g)
				return
			}
			for i := range wv {
				walk(fmt.Sprintf("%s[%d]", path, i), wv[i], gv[i])
			}
		default:
			if !reflect.DeepEqual(w, g) {
				t.Errorf("%s %s: %v directly, %v through iop", what, path, w, g)
			}
		}
	}
	walk("", want, got)
}
