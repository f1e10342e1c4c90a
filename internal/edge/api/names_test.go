package api

import (
	"encoding/json"
	"testing"
)

// GET /v1/models/{id} applies Ollama's ":latest" rule, as chat and
// /api/show do: "qwen3" finds the served "qwen3:latest" and
// "coder:latest" the alias "coder"; another tag, or an unknown name, is
// 404.
func TestRegression_GetModelAppliesTheLatestRule(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Config{}, okRun)
	env.gw.models = []string{"coder", "embed:latest", "legacy", "qwen3:latest"}
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
