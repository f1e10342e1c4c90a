package main

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

// A request for several choices (n, or best_of, above 1) can only be
// answered by an OpenAI-compatible provider (tunnel path). Through an alias
// of an Ollama and an OpenAI-compatible provider it reaches the latter,
// although the Ollama provider wins ties; to a model only Ollama serves it
// is answered 400 naming n at once, without reaching the provider.
func TestRegression_NAboveOneReachesOnlyOpenAICompatibleProviders(t *testing.T) {
	rig := startOllamaRig(t)
	requests := func() int {
		rig.ollamaProxy.mu.Lock()
		defer rig.ollamaProxy.mu.Unlock()
		return len(rig.ollamaProxy.reqs)
	}
	var answer struct {
		Model   string            `json:"model"`
		Choices []json.RawMessage `json:"choices"`
	}
	for _, c := range []struct {
		path, body string
		choices    int
	}{
		{"/v1/chat/completions", `{"model":"both","n":2,"max_tokens":3,"messages":[{"role":"user","content":"hi"}]}`, 2},
		{"/v1/completions", `{"model":"both","n":3,"max_tokens":3,"prompt":"hi"}`, 3},
	} {
		resp, data := rig.do(t, http.MethodPost, c.path, c.body)
		if err := json.Unmarshal(data, &answer); err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("%s %s: %d %s", c.path, c.body, resp.StatusCode, data)
		}
		if answer.Model != rigOpenAIModel || len(answer.Choices) != c.choices {
			t.Fatalf("%s: answered by %s with %d choices: %s", c.path, answer.Model, len(answer.Choices), data)
		}
	}
	// One choice still goes to the tie-break winner, the Ollama provider.
	if resp, data := rig.do(t, http.MethodPost, "/v1/chat/completions",
		`{"model":"both","n":1,"max_tokens":1,"messages":[{"role":"user","content":"hi"}]}`); resp.StatusCode != http.StatusOK || requests() != 1 {
		t.Fatalf("n 1: %d %s, the Ollama provider saw %d requests", resp.StatusCode, data, requests())
	}

	for _, c := range []struct{ path, body string }{
		{"/v1/chat/completions", `{"model":"llama3","n":2,"messages":[{"role":"user","content":"hi"}]}`},
		{"/v1/completions", `{"model":"llama3","n":2,"prompt":"hi"}`},
		{"/v1/completions", `{"model":"llama3:latest","best_of":2,"prompt":"hi"}`},
	} {
		resp, data := rig.do(t, http.MethodPost, c.path, c.body)
		var e struct {
			Error struct{ Message, Code string } `json:"error"`
		}
		if err := json.Unmarshal(data, &e); err != nil || resp.StatusCode != http.StatusBadRequest ||
			!strings.Contains(e.Error.Message, "n above 1") || e.Error.Code != "unsupported_capability" {
			t.Fatalf("%s %s: %d %s, want 400 naming n", c.path, c.body, resp.StatusCode, data)
		}
	}
	if got := requests(); got != 1 {
		t.Fatalf("the Ollama provider saw %d requests, want only the n 1 one", got)
	}
	waitIdle(t, rig.e)
}
