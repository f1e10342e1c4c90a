package api

import (
	"net/http"
	"strings"
	"testing"
)

// TestOptionalFeaturesOff: every optional feature of Config left nil
// answers as documented: its routes, and those of packages not
// registered in Config.Routes, are 404 unknown_url; /api/ps lists no
// model; /api/show is iop's own view; and a model only Known would know
// is unknown (404) where Known makes it unavailable (503).
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
	known := newEnv(t, Config{Known: func(model string) bool { return model == "gone" }}, okRun)
	if status, _, body := known.ollamaPost(t, "/api/generate", load); status != http.StatusServiceUnavailable {
		t.Errorf("loading a Known model no node serves: %d %s, want 503", status, body)
	}
}
