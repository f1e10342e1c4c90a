package api

import (
	"net/http"
	"testing"
)

// TestOptionalFeaturesOff: every optional feature of Config left nil
// answers as documented: its routes, and those of packages not
// registered in Config.Routes, are 404 unknown_url (package ollama's
// test covers its Config and Known).
func TestOptionalFeaturesOff(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Config{}, okRun)
	for _, path := range []string{
		"/admin/v1/nodes", "/admin/v1/events", "/ui", "/admin/v1/usage", // Routes (package admin)
		"/metrics",                   // Metrics
		"/v1/runs", "/v1/runs/run_x", // package runsapi
	} {
		resp := env.get(t, path)
		if resp.status != http.StatusNotFound {
			t.Errorf("GET %s without its feature: %d %s, want 404", path, resp.status, resp.body)
			continue
		}
		if _, _, _, code := openAIError(t, resp.body); str(code) != "unknown_url" {
			t.Errorf("GET %s without its feature: code %s, want unknown_url", path, str(code))
		}
	}
	if resp := env.get(t, "/v1/responses/resp_x"); resp.status != http.StatusNotFound {
		t.Errorf("a stored response without Responses: %d %s, want 404", resp.status, resp.body)
	}
}
