package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"iop/internal/e2e/harness"
	"iop/internal/edge"
	"iop/internal/node"
	"iop/internal/ollamatest"
	"iop/internal/process"
	"iop/internal/sim"
)

// agentRig is an edge whose node drives an Ollama-protocol server through
// a recording proxy twice: as a provider of type ollama (native API,
// normalized path) serving native, and, when v1 is set, as a provider of
// type openai on the server's /v1 (tunnel path) serving v1.
type agentRig struct {
	e           *process.Process
	native, v1  string
	nativeProxy *recordingProxy
	tunnelProxy *recordingProxy
	client      *http.Client
}

func startAgentRig(t *testing.T, nativeURL, native, tunnelURL, v1 string) *agentRig {
	t.Helper()
	rig := &agentRig{native: native, v1: v1, nativeProxy: startRecordingProxy(t, nativeURL)}
	providers := []node.ProviderConfig{{ID: "native", Type: node.TypeOllama, BaseURL: rig.nativeProxy.URL, Models: []string{native}, Capacity: 2, Capabilities: []string{"tools"}}}
	if tunnelURL != "" {
		rig.tunnelProxy = startRecordingProxy(t, tunnelURL)
		providers = append(providers, node.ProviderConfig{ID: "v1", Type: node.TypeOpenAI, BaseURL: rig.tunnelProxy.URL + "/v1", Models: []string{v1}, Capacity: 2, Capabilities: []string{"tools"}})
	}
	ctx, cancel := context.WithCancel(context.Background())
	rig.e = harness.Edge(t, ctx, harness.EdgeConfig(map[string]edge.ModelConfig{}))
	t.Cleanup(cancel)
	harness.Node(t, ctx, node.Config{NodeID: "gpu-1", Edge: rig.e.NodeAddr, Providers: providers})
	transport := &http.Transport{}
	t.Cleanup(transport.CloseIdleConnections)
	rig.client = &http.Client{Transport: transport}
	return rig
}

func (rig *agentRig) post(t *testing.T, path, body string) (int, []byte) {
	t.Helper()
	return postTo(t, rig.client, "http://"+rig.e.HTTPAddr+path, body)
}

// The tools of the forced-call checks: small enum parameters, so that even
// a model of random weights writes a whole call within a few tokens.
const (
	agentTools = `[{"type":"function","function":{"name":"get_weather","description":"the weather in a city","parameters":{"type":"object","properties":{"city":{"type":"string","enum":["Paris","Oslo"]}},"required":["city"]}}},` +
		`{"type":"function","function":{"name":"get_time","description":"the time in a zone","parameters":{"type":"object","properties":{"zone":{"type":"string","enum":["UTC","CET"]}},"required":["zone"]}}}]`
	agentMessagesTools = `[{"name":"get_weather","description":"the weather in a city","input_schema":{"type":"object","properties":{"city":{"type":"string","enum":["Paris","Oslo"]}},"required":["city"]}},` +
		`{"name":"get_time","description":"the time in a zone","input_schema":{"type":"object","properties":{"zone":{"type":"string","enum":["UTC","CET"]}},"required":["zone"]}}]`
	agentResponsesTools = `[{"type":"function","name":"get_weather","description":"the weather in a city","parameters":{"type":"object","properties":{"city":{"type":"string","enum":["Paris","Oslo"]}},"required":["city"]}},` +
		`{"type":"function","name":"get_time","description":"the time in a zone","parameters":{"type":"object","properties":{"zone":{"type":"string","enum":["UTC","CET"]}},"required":["zone"]}}]`
)

// wantArgs checks that args (JSON text) is an object whose one key is
// the called tool's parameter, with one of its enum values.
func wantArgs(t *testing.T, name, args string) {
	t.Helper()
	var m map[string]string
	if err := json.Unmarshal([]byte(args), &m); err != nil {
		t.Fatalf("%s: arguments %q are not an object of strings: %v", name, args, err)
	}
	ok := false
	switch name {
	case "get_weather":
		ok = m["city"] == "Paris" || m["city"] == "Oslo"
	case "get_time":
		ok = m["zone"] == "UTC" || m["zone"] == "CET"
	}
	if !ok || len(m) != 1 {
		t.Fatalf("%s: arguments %s do not follow its schema", name, args)
	}
}

// checkForcedToolChoice: on the normalized path, each API's forced tool
// choice is answered with that tool's call in the API's own shape; the
// Ollama provider got a format and no tools.
func checkForcedToolChoice(t *testing.T, rig *agentRig) {
	model := rig.native
	t.Run("chat named function", func(t *testing.T) {
		status, data := rig.post(t, "/v1/chat/completions", fmt.Sprintf(`{"model":%q,"max_tokens":200,"tools":%s,
			"tool_choice":{"type":"function","function":{"name":"get_time"}},"messages":[{"role":"user","content":"what time is it?"}]}`, model, agentTools))
		var a struct {
			Choices []struct {
				Message struct {
					ToolCalls []struct {
						Function struct{ Name, Arguments string } `json:"function"`
					} `json:"tool_calls"`
				} `json:"message"`
				FinishReason string `json:"finish_reason"`
			} `json:"choices"`
		}
		if err := json.Unmarshal(data, &a); status != 200 || err != nil || len(a.Choices) != 1 || a.Choices[0].FinishReason != "tool_calls" ||
			len(a.Choices[0].Message.ToolCalls) != 1 || a.Choices[0].Message.ToolCalls[0].Function.Name != "get_time" {
			t.Fatalf("%d %s", status, data)
		}
		wantArgs(t, "get_time", a.Choices[0].Message.ToolCalls[0].Function.Arguments)
		if sentField(t, rig.nativeProxy, "tools") != "" || !strings.Contains(sentField(t, rig.nativeProxy, "format"), `"zone"`) {
			t.Fatalf("the Ollama provider got %s", rig.nativeProxy.last(t).Body)
		}
	})
	t.Run("chat required", func(t *testing.T) {
		status, data := rig.post(t, "/v1/chat/completions", fmt.Sprintf(`{"model":%q,"max_tokens":200,"tools":%s,"tool_choice":"required",
			"messages":[{"role":"user","content":"weather or time?"}]}`, model, agentTools))
		var a struct {
			Choices []struct {
				Message struct {
					ToolCalls []struct {
						Function struct{ Name, Arguments string } `json:"function"`
					} `json:"tool_calls"`
				} `json:"message"`
				FinishReason string `json:"finish_reason"`
			} `json:"choices"`
		}
		if err := json.Unmarshal(data, &a); status != 200 || err != nil || len(a.Choices) != 1 || a.Choices[0].FinishReason != "tool_calls" ||
			len(a.Choices[0].Message.ToolCalls) != 1 {
			t.Fatalf("%d %s", status, data)
		}
		fn := a.Choices[0].Message.ToolCalls[0].Function
		wantArgs(t, fn.Name, fn.Arguments)
	})
	t.Run("responses named function", func(t *testing.T) {
		status, data := rig.post(t, "/v1/responses", fmt.Sprintf(`{"model":%q,"max_output_tokens":200,"tools":%s,
			"tool_choice":{"type":"function","name":"get_weather"},"input":"weather?"}`, model, agentResponsesTools))
		var r struct {
			Output []struct{ Type, Name, Arguments string } `json:"output"`
		}
		if err := json.Unmarshal(data, &r); status != 200 || err != nil || len(r.Output) == 0 {
			t.Fatalf("%d %s", status, data)
		}
		last := r.Output[len(r.Output)-1]
		if last.Type != "function_call" || last.Name != "get_weather" {
			t.Fatalf("output %s, want a get_weather function_call", data)
		}
		wantArgs(t, "get_weather", last.Arguments)
	})
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprintf("messages tool and any, stream=%v", stream), func(t *testing.T) {
			for choice, name := range map[string]string{`{"type":"tool","name":"get_time"}`: "get_time", `{"type":"any"}`: ""} {
				status, data := rig.post(t, "/v1/messages", fmt.Sprintf(`{"model":%q,"max_tokens":200,"stream":%v,"tools":%s,"tool_choice":%s,
					"messages":[{"role":"user","content":"time?"}]}`, model, stream, agentMessagesTools, choice))
				if status != 200 {
					t.Fatalf("%s: %d %s", choice, status, data)
				}
				gotName, input, stop := "", "", ""
				if !stream {
					var m struct {
						Content []struct {
							Type, Name string
							Input      json.RawMessage
						} `json:"content"`
						StopReason string `json:"stop_reason"`
					}
					if err := json.Unmarshal(data, &m); err != nil || len(m.Content) == 0 {
						t.Fatalf("%s: %s", choice, data)
					}
					c := m.Content[len(m.Content)-1]
					if c.Type == "tool_use" {
						gotName, input = c.Name, string(c.Input)
					}
					stop = m.StopReason
				} else {
					for _, line := range strings.Split(string(data), "\n") {
						payload, ok := strings.CutPrefix(line, "data: ")
						if !ok {
							continue
						}
						var ev struct {
							Type         string
							ContentBlock struct{ Type, Name string } `json:"content_block"`
							Delta        struct {
								Type        string
								PartialJSON string `json:"partial_json"`
								StopReason  string `json:"stop_reason"`
							}
						}
						if json.Unmarshal([]byte(payload), &ev) != nil {
							continue
						}
						switch {
						case ev.Type == "content_block_start" && ev.ContentBlock.Type == "tool_use":
							gotName = ev.ContentBlock.Name
						case ev.Delta.Type == "input_json_delta":
							input += ev.Delta.PartialJSON
						case ev.Type == "message_delta":
							stop = ev.Delta.StopReason
						}
					}
				}
				if stop != "tool_use" || gotName == "" || (name != "" && gotName != name) {
					t.Fatalf("%s: stop_reason %q, tool %q: %s", choice, stop, gotName, data)
				}
				wantArgs(t, gotName, input)
			}
		})
	}
	t.Run("tool_choice none stops tools", func(t *testing.T) {
		status, data := rig.post(t, "/v1/messages", fmt.Sprintf(`{"model":%q,"max_tokens":3,"tools":%s,"tool_choice":{"type":"none"},
			"messages":[{"role":"user","content":"use get_time"}]}`, model, agentMessagesTools))
		if status != 200 || strings.Contains(string(data), "tool_use") || sentField(t, rig.nativeProxy, "tools") != "" {
			t.Fatalf("%d %s; Ollama got %s", status, data, rig.nativeProxy.last(t).Body)
		}
	})
	if rig.tunnelProxy != nil {
		t.Run("tunnel path passes tool_choice through", func(t *testing.T) {
			status, data := rig.post(t, "/v1/chat/completions", fmt.Sprintf(`{"model":%q,"max_tokens":200,"tools":%s,"tool_choice":"required",
				"messages":[{"role":"user","content":"use get_time"}]}`, rig.v1, agentTools))
			if status != 200 || sentField(t, rig.tunnelProxy, "tool_choice") != `"required"` {
				t.Fatalf("%d %s; the provider got %s", status, data, rig.tunnelProxy.last(t).Body)
			}
		})
	}
}

// TestRegression_ForcedToolChoiceOnOllama: a forced tool choice was
// refused ("required", Messages "any") or ignored (a named function) for
// a model only Ollama providers serve, so structured output through tools
// (LangChain's withStructuredOutput, the AI SDK's generateObject) failed.
// Against the Ollama-protocol simulator and, on the tunnel path, the
// OpenAI-protocol one; then the Anthropic SDK and the AI SDK's Anthropic
// provider (test/js/agents_anthropic.mjs).
func TestRegression_ForcedToolChoiceOnOllama(t *testing.T) {
	harness.Parallel(t)
	_, ollamaURL := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOllama, Models: []string{"tools-n"}, Seed: 7})
	_, openaiURL := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOpenAI, Models: []string{"tools-v1"}, Seed: 7})
	rig := startAgentRig(t, ollamaURL, "tools-n", openaiURL, "tools-v1")
	checkForcedToolChoice(t, rig)
	runJSTest(t, "agents_anthropic.mjs", "IOP_BASE_URL=http://"+rig.e.HTTPAddr, "IOP_TOOL_MODEL=tools-n")
	waitIdle(t, rig.e)
}

// TestRealOllama_ForcedToolChoice is TestRegression_ForcedToolChoiceOnOllama
// against a real Ollama (v0.17.4) serving a tiny tools model, natively and
// on its /v1 (whose tool_choice handling is Ollama's own: only the pass
// through is checked there).
func TestRealOllama_ForcedToolChoice(t *testing.T) {
	harness.ParallelOllama(t)
	s := ollamatest.Start(t)
	s.CreateModel(t, "tools-n", ollamatest.Tools)
	s.CreateModel(t, "tools-v1", ollamatest.Tools)
	rig := startAgentRig(t, s.URL, "tools-n", s.URL, "tools-v1")
	checkForcedToolChoice(t, rig)
	runJSTest(t, "agents_anthropic.mjs", "IOP_BASE_URL=http://"+rig.e.HTTPAddr, "IOP_TOOL_MODEL=tools-n")
	waitIdle(t, rig.e)
}

// checkEffortOnABooleanThinker: a reasoning effort for a thinking model
// that takes no think level is answered with reasoning: the first request
// costs one refused level, later ones send think true at once; an Ollama
// client's own level still gets Ollama's 400.
func checkEffortOnABooleanThinker(t *testing.T, rig *agentRig) {
	model := rig.native
	for i, body := range []string{
		fmt.Sprintf(`{"model":%q,"max_tokens":4,"reasoning_effort":"low","messages":[{"role":"user","content":"why?"}]}`, model),
		fmt.Sprintf(`{"model":%q,"max_output_tokens":4,"reasoning":{"effort":"high"},"input":"why?"}`, model),
		fmt.Sprintf(`{"model":%q,"max_tokens":4,"reasoning_effort":"medium","messages":[{"role":"user","content":"why?"}]}`, model),
	} {
		path := "/v1/chat/completions"
		if strings.Contains(body, `"input"`) {
			path = "/v1/responses"
		}
		before := rig.nativeProxy.count()
		status, data := rig.post(t, path, body)
		if status != 200 || !strings.Contains(string(data), "reason") {
			t.Fatalf("%s: %d %s", body, status, data)
		}
		sent, want := rig.nativeProxy.count()-before, 1
		if i == 0 {
			want = 2 // the level, refused; then true
		}
		if sent != want || sentField(t, rig.nativeProxy, "think") != "true" {
			t.Fatalf("%s: the provider got %d requests, the last with think %s; want %d, true", body, sent, sentField(t, rig.nativeProxy, "think"), want)
		}
	}
	status, data := rig.post(t, "/api/chat", fmt.Sprintf(`{"model":%q,"think":"low","messages":[{"role":"user","content":"hi"}]}`, model))
	if status != http.StatusBadRequest || !strings.Contains(string(data), `think value \"low\" is not supported for this model`) {
		t.Fatalf("an Ollama client's own level: %d %s", status, data)
	}
}

// TestRegression_ReasoningEffortOnABooleanThinker: a reasoning effort
// reached Ollama as a think level, which Ollama refuses (400 "think value
// \"low\" is not supported for this model") for every thinking model but
// gpt-oss. Against the simulator, which refuses levels as Ollama does.
func TestRegression_ReasoningEffortOnABooleanThinker(t *testing.T) {
	harness.Parallel(t)
	_, url := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOllama, Models: []string{"think-n"}, Seed: 7, Thinking: true})
	rig := startAgentRig(t, url, "think-n", "", "")
	checkEffortOnABooleanThinker(t, rig)
	waitIdle(t, rig.e)
}

// TestRealOllama_ReasoningEffort is
// TestRegression_ReasoningEffortOnABooleanThinker against a real Ollama
// (v0.17.4) serving a tiny thinking model (not gpt-oss).
func TestRealOllama_ReasoningEffort(t *testing.T) {
	harness.ParallelOllama(t)
	s := ollamatest.Start(t)
	s.CreateModel(t, "think-n", ollamatest.Thinking)
	rig := startAgentRig(t, s.URL, "think-n", "", "")
	checkEffortOnABooleanThinker(t, rig)
	waitIdle(t, rig.e)
}
