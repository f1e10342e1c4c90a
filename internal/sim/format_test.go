package sim

import (
	"encoding/json"
	"net/http"
	"testing"
)

// A request for structured output is answered as a model constrained to
// it answers: OpenAI's response_format json_schema and Ollama's format
// schema with a value of the schema, json_object and "json" with a JSON
// object; a plain request with text.
func TestStructuredOutput(t *testing.T) {
	schema := map[string]any{"type": "object", "properties": map[string]any{
		"city": map[string]any{"type": "string"}, "days": map[string]any{"type": "integer"},
		"tags": map[string]any{"type": "array", "items": map[string]any{"enum": []string{"sunny", "rainy"}}},
		"ok":   map[string]any{"type": []string{"boolean", "null"}},
	}, "required": []string{"city", "days"}}
	_, openaiURL, _ := startSim(t, Config{Protocol: ProtocolOpenAI, Seed: 4})
	_, ollamaURL, _ := startSim(t, Config{Protocol: ProtocolOllama, Seed: 4})
	msgs := []map[string]string{{"role": "user", "content": "the weather, as JSON"}}
	text := func(resp *http.Response, ollama bool) string {
		t.Helper()
		var out struct {
			Choices []struct {
				Message struct{ Content string } `json:"message"`
			} `json:"choices"`
			Message struct{ Content string } `json:"message"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != 200 {
			t.Fatalf("status %d: %v", resp.StatusCode, err)
		}
		if ollama {
			return out.Message.Content
		}
		return out.Choices[0].Message.Content
	}
	type weather struct {
		City *string  `json:"city"`
		Days *int     `json:"days"`
		Tags []string `json:"tags"`
		OK   *bool    `json:"ok"`
	}
	for name, got := range map[string]string{
		"openai json_schema": text(mustPost(t, newClient(t), openaiURL+"/v1/chat/completions", map[string]any{"model": DefaultModel, "messages": msgs,
			"response_format": map[string]any{"type": "json_schema", "json_schema": map[string]any{"name": "weather", "schema": schema}}}), false),
		"ollama format schema": text(mustPost(t, newClient(t), ollamaURL+"/api/chat", map[string]any{"model": DefaultModel, "messages": msgs,
			"stream": false, "format": schema}), true),
	} {
		var w weather
		if err := json.Unmarshal([]byte(got), &w); err != nil || w.City == nil || *w.City == "" || w.Days == nil || *w.Days != 42 ||
			len(w.Tags) != 1 || w.Tags[0] != "sunny" || w.OK == nil || !*w.OK {
			t.Errorf("%s: %q, want a value of the schema", name, got)
		}
	}
	for name, got := range map[string]string{
		"openai json_object": text(mustPost(t, newClient(t), openaiURL+"/v1/chat/completions", map[string]any{"model": DefaultModel, "messages": msgs,
			"response_format": map[string]any{"type": "json_object"}}), false),
		"ollama format json": text(mustPost(t, newClient(t), ollamaURL+"/api/chat", map[string]any{"model": DefaultModel, "messages": msgs,
			"stream": false, "format": "json"}), true),
	} {
		var obj map[string]string
		if err := json.Unmarshal([]byte(got), &obj); err != nil || obj["answer"] == "" {
			t.Errorf("%s: %q, want a JSON object", name, got)
		}
	}
	if got := text(mustPost(t, newClient(t), openaiURL+"/v1/chat/completions", map[string]any{"model": DefaultModel, "messages": msgs}), false); json.Valid([]byte(got)) {
		t.Errorf("plain request answered JSON %q", got)
	}
}
