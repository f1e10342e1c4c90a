package api

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

// GET /v1/models/{id} applies Ollama's ":latest" rule, as chat and
// /api/show do: "qwen3" finds the served "qwen3:latest" and
// "coder:latest" the alias "coder"; another tag, or an unknown name, is
// 404.
func TestRegression_GetModelAppliesTheLatestRule(t *testing.T) {
	t.Parallel()
	env := newCatalogEnv(t) // models coder, embed:latest, legacy, qwen3:latest
	for id, want := range map[string]int{
		"qwen3:latest": 200, "qwen3": 200, "coder": 200, "coder:latest": 200, "embed": 200,
		"qwen3:8b": 404, "coder:v2": 404, "nothing": 404, "nothing:latest": 404,
	} {
		resp := env.get(t, "/v1/models/"+id)
		if resp.status != want {
			t.Errorf("GET /v1/models/%s: %d %s, want %d", id, resp.status, resp.body, want)
			continue
		}
		var m struct{ ID, Object string }
		if want == 200 && (json.Unmarshal([]byte(resp.body), &m) != nil || m.ID != id || m.Object != "model") {
			t.Errorf("GET /v1/models/%s: %s, want the model object of id %s", id, resp.body, id)
		}
	}
}

// /api/tags (and /api/ps) list every name with its tag, as Ollama does
// (name and model "demo:latest", model.Name.DisplayShortest), so a
// client that looks a tagged name up in the list finds it; a name and the
// same name with ":latest" that are two models (an alias "x" and a served
// "x:latest") both keep their own names.
func TestRegression_TagsListNamesWithTheirTag(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Config{}, failWith(ErrUnknownModel))
	env.gw.models = []string{"demo", "llama3:8b", "meta-llama/Llama-3.1-8B-Instruct", "x", "x:latest"}
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
	if n := len(env.gw.requests()); n != 0 {
		t.Errorf("%d requests dispatched, want none", n)
	}
}
