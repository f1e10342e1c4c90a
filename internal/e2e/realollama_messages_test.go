package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"

	"iop/internal/e2e/harness"
	"iop/internal/edge"
	"iop/internal/node"
	"iop/internal/ollamatest"
)

// TestRealOllama_Messages: the official `@anthropic-ai/sdk` client
// (test/js/real_anthropic.mjs) against an edge whose node drives a real
// Ollama on both paths: a provider of type ollama (native API, normalized
// path) and one of type openai on Ollama's own /v1 (tunnel path), each
// with capability tools and a plain, a tools and a thinking model of its
// own: messages.create
// and messages.stream, a tool round trip's turns reaching Ollama, and
// thinking.
func TestRealOllama_Messages(t *testing.T) {
	harness.ParallelOllama(t)
	s := ollamatest.Start(t)
	native := []string{"tiny", "tools-n", "think-n"}
	v1 := []string{"tiny-v1", "tools-v1", "think-v1"}
	for i, variant := range []ollamatest.Variant{ollamatest.Plain, ollamatest.Tools, ollamatest.Thinking} {
		s.CreateModel(t, native[i], variant)
		s.CreateModel(t, v1[i], variant)
	}
	nativeProxy, v1Proxy := startRecordingProxy(t, s.URL), startRecordingProxy(t, s.URL)
	ctx, cancel := context.WithCancel(context.Background())
	e := harness.Edge(t, ctx, harness.EdgeConfig(map[string]edge.ModelConfig{}))
	t.Cleanup(cancel)
	harness.Node(t, ctx, node.Config{
		NodeID: "gpu-1",
		Edge:   e.NodeAddr,
		Providers: []node.ProviderConfig{
			{ID: "native", Type: node.TypeOllama, BaseURL: nativeProxy.URL, Models: native, Capacity: 2, Capabilities: []string{"tools"}},
			{ID: "v1", Type: node.TypeOpenAI, BaseURL: v1Proxy.URL + "/v1", Models: v1, Capacity: 2, Capabilities: []string{"tools"}},
		},
	})
	pair := func(i int) string {
		b, _ := json.Marshal([]string{native[i], v1[i]})
		return string(b)
	}
	runJSTest(t, "real_anthropic.mjs",
		"IOP_BASE_URL=http://"+e.HTTPAddr,
		"IOP_CHAT_MODELS="+pair(0),
		"IOP_TOOL_MODELS="+pair(1),
		"IOP_THINK_MODELS="+pair(2))

	// The tool round trip's turns reach Ollama as its own API has them: the
	// assistant's call, the tool's answer naming the function.
	c := &http.Client{Transport: &http.Transport{}}
	defer c.CloseIdleConnections()
	status, body := postTo(t, c, "http://"+e.HTTPAddr+"/v1/messages", `{"model":"tools-n","max_tokens":2,
	 "tools":[{"name":"get_weather","input_schema":{"type":"object"}}],
	 "messages":[{"role":"user","content":"weather?"},
	  {"role":"assistant","content":[{"type":"tool_use","id":"toolu_1","name":"get_weather","input":{"city":"Paris"}}]},
	  {"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":"sunny"}]}]}`)
	if status != http.StatusOK {
		t.Fatalf("tool round trip: %d %s", status, body)
	}
	var sent []struct {
		Role      string `json:"role"`
		Content   string `json:"content"`
		ToolName  string `json:"tool_name"`
		ToolCalls []struct {
			Function struct {
				Name      string          `json:"name"`
				Arguments json.RawMessage `json:"arguments"`
			} `json:"function"`
		} `json:"tool_calls"`
	}
	if err := json.Unmarshal([]byte(sentField(t, nativeProxy, "messages")), &sent); err != nil || len(sent) != 3 ||
		len(sent[1].ToolCalls) != 1 || sent[1].ToolCalls[0].Function.Name != "get_weather" ||
		string(sent[1].ToolCalls[0].Function.Arguments) != `{"city":"Paris"}` ||
		sent[2].Role != "tool" || sent[2].ToolName != "get_weather" || sent[2].Content != "sunny" {
		t.Errorf("Ollama got messages %s (%v)", sentField(t, nativeProxy, "messages"), err)
	}
	if think := sentField(t, nativeProxy, "think"); think != "false" {
		t.Errorf("Ollama got think %s, want false (thinking not enabled)", think)
	}
	if v1Proxy.count() == 0 {
		t.Error("the tunnel provider saw no request")
	}
	waitIdle(t, e)
}
