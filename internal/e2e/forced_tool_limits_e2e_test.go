package e2e

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"iop/internal/e2e/harness"
	"iop/internal/sim"
)

// TestRegression_ForcedToolLimitsOnOllama: against the Ollama-protocol
// simulator behind an edge, a forced call whose answer the client's token
// limit cut was a 502 (Messages) or an error event (Messages, streaming)
// or a call with arguments that are not JSON (Chat); "required" beside a
// custom tool answered a nameless call; allowed tools of mode "required"
// with an empty list were refused as having no function tools.
func TestRegression_ForcedToolLimitsOnOllama(t *testing.T) {
	harness.Parallel(t)
	_, url := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOllama, Models: []string{"tools-n"}, Seed: 7})
	rig := startAgentRig(t, url, "tools-n", "", "")
	const tool = `{"name":"get_w","input_schema":{"type":"object","properties":{"city":{"type":"string"}}}}`

	status, data := rig.post(t, "/v1/messages", `{"model":"tools-n","max_tokens":2,"tools":[`+tool+`],"tool_choice":{"type":"any"},"messages":[{"role":"user","content":"weather?"}]}`)
	var m struct {
		StopReason string                  `json:"stop_reason"`
		Content    []struct{ Type string } `json:"content"`
	}
	if err := json.Unmarshal(data, &m); status != 200 || err != nil || m.StopReason != "max_tokens" {
		t.Fatalf("messages cut by max_tokens: %d %s; want 200 with stop_reason max_tokens", status, data)
	}
	status, data = rig.post(t, "/v1/messages", `{"model":"tools-n","stream":true,"max_tokens":2,"tools":[`+tool+`],"tool_choice":{"type":"any"},"messages":[{"role":"user","content":"weather?"}]}`)
	if status != 200 || strings.Contains(string(data), "event: error") || !strings.Contains(string(data), `"stop_reason":"max_tokens"`) {
		t.Fatalf("streamed messages cut by max_tokens: %d %s; want stop_reason max_tokens and no error event", status, data)
	}

	const fn = `{"type":"function","function":{"name":"get_w","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}`
	status, data = rig.post(t, "/v1/chat/completions", `{"model":"tools-n","max_tokens":2,"tools":[`+fn+`],"tool_choice":"required","messages":[{"role":"user","content":"weather?"}]}`)
	var c struct {
		Choices []struct {
			Message struct {
				ToolCalls []json.RawMessage `json:"tool_calls"`
			} `json:"message"`
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(data, &c); status != 200 || err != nil || len(c.Choices) != 1 || c.Choices[0].FinishReason != "length" || len(c.Choices[0].Message.ToolCalls) != 0 {
		t.Fatalf("chat cut by max_tokens: %d %s; want text with finish_reason length", status, data)
	}

	for _, tools := range []string{`{"type":"custom","custom":{"name":"c"}}`, fn + `,{"type":"custom","custom":{"name":"c"}}`} {
		status, data = rig.post(t, "/v1/chat/completions", fmt.Sprintf(`{"model":"tools-n","tools":[%s],"tool_choice":"required","messages":[{"role":"user","content":"hi"}]}`, tools))
		if status != 400 || !strings.Contains(string(data), "invalid_request_error") || !strings.Contains(string(data), "custom") {
			t.Fatalf("required with tools %s: %d %s; want 400 invalid_request_error naming the custom tool", tools, status, data)
		}
	}
	status, data = rig.post(t, "/v1/chat/completions", `{"model":"tools-n","tools":[`+fn+`],"tool_choice":{"type":"allowed_tools","allowed_tools":{"mode":"required","tools":[]}},"messages":[{"role":"user","content":"hi"}]}`)
	if status != 400 || !strings.Contains(string(data), "allowed_tools.tools") {
		t.Fatalf("empty allowed tools: %d %s; want 400 naming tool_choice.allowed_tools.tools", status, data)
	}
	waitIdle(t, rig.e)
}
