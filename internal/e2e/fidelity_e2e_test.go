package e2e

// End-to-end tests of protocol fidelity through a real edge and
// node over gRPC and `iop sim` providers: thinking on both execution paths
// and both client APIs, tool choice, the developer role and remote images.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"iop/internal/e2e/harness"
	"iop/internal/edge"
	"iop/internal/node"
	"iop/internal/sim"
	"iop/internal/sse"
)

// thinkingRig is an edge with one node driving two thinking simulators
// behind recording proxies: an Ollama one serving "qwen3:latest"
// (normalized path) and an OpenAI-compatible one serving "deepseek-r1"
// whose reasoning field is field (tunnel path); and a plain Ollama one
// serving "llama3:latest", a model that cannot think.
type thinkingRig struct {
	*ollamaRig
	plainProxy *recordingProxy
}

const (
	thinkOllamaModel = "qwen3:latest"
	thinkOpenAIModel = "deepseek-r1"
	plainOllamaModel = "llama3:latest"
)

func startThinkingRig(t *testing.T, field string) *thinkingRig {
	t.Helper()
	// ThinkLevels: the model takes Ollama's think levels, as gpt-oss does
	// (TestRegression_ReasoningEffortOnABooleanThinker has one that does not).
	_, ollamaURL := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOllama, Models: []string{thinkOllamaModel}, Seed: 5, Thinking: true, ThinkLevels: true})
	_, openaiURL := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOpenAI, Models: []string{thinkOpenAIModel}, Seed: 5, Thinking: true, ReasoningField: field})
	_, plainURL := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOllama, Models: []string{plainOllamaModel}, Seed: 5})
	rig := &thinkingRig{ollamaRig: &ollamaRig{
		ollamaProxy: startRecordingProxy(t, ollamaURL),
		openaiProx:  startRecordingProxy(t, openaiURL),
	}, plainProxy: startRecordingProxy(t, plainURL)}
	ctx, cancel := context.WithCancel(context.Background())
	rig.e = harness.Edge(t, ctx, harness.EdgeConfig(map[string]edge.ModelConfig{"mixed": {Targets: []string{thinkOllamaModel, thinkOpenAIModel}}}))
	t.Cleanup(cancel)
	caps := []string{"tools", "vision"}
	harness.Node(t, ctx, node.Config{
		NodeID: "gpu-1",
		Edge:   rig.e.NodeAddr,
		Providers: []node.ProviderConfig{
			{ID: "a-ollama", Type: node.TypeOllama, BaseURL: rig.ollamaProxy.URL, Models: []string{thinkOllamaModel}, Capacity: 2, Capabilities: caps},
			{ID: "b-vllm", Type: "vllm", BaseURL: rig.openaiProx.URL + "/v1", Models: []string{thinkOpenAIModel}, Capacity: 2, Capabilities: caps},
			{ID: "c-ollama", Type: node.TypeOllama, BaseURL: rig.plainProxy.URL, Models: []string{plainOllamaModel}, Capacity: 2, Capabilities: caps},
		},
	})
	rig.client = &http.Client{Transport: &http.Transport{}}
	t.Cleanup(rig.client.CloseIdleConnections)
	return rig
}

// count is how many requests p relayed.
func (p *recordingProxy) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.reqs)
}

// sentField is the JSON of field in the last body proxy relayed, "" if
// absent.
func sentField(t *testing.T, p *recordingProxy, field string) string {
	t.Helper()
	var body map[string]json.RawMessage
	if err := json.Unmarshal(p.last(t).Body, &body); err != nil {
		t.Fatal(err)
	}
	return string(body[field])
}

// openAIAnswer reads an OpenAI chat answer, streamed (SSE) or not, into
// the reasoning_content and content of choice 0 and the model; reasoning
// under the other name ("reasoning") is collected apart.
type openAIAnswer struct {
	model, reasoning, other, content string
	reasoningChunks                  int
}

func readOpenAIAnswer(t *testing.T, data []byte, stream bool) openAIAnswer {
	t.Helper()
	var a openAIAnswer
	take := func(raw []byte) {
		var obj struct {
			Model   string `json:"model"`
			Choices []struct {
				Delta   map[string]json.RawMessage `json:"delta"`
				Message map[string]json.RawMessage `json:"message"`
			} `json:"choices"`
		}
		if err := json.Unmarshal(raw, &obj); err != nil {
			t.Fatalf("%s: %v", raw, err)
		}
		a.model = obj.Model
		for _, c := range obj.Choices {
			p := c.Delta
			if p == nil {
				p = c.Message
			}
			var r, o, s string
			_ = json.Unmarshal(p["reasoning_content"], &r)
			_ = json.Unmarshal(p["reasoning"], &o)
			_ = json.Unmarshal(p["content"], &s)
			if r != "" {
				a.reasoningChunks++
			}
			a.reasoning, a.other, a.content = a.reasoning+r, a.other+o, a.content+s
		}
	}
	if !stream {
		take(data)
		return a
	}
	if err := sse.ReadAll(bytes.NewReader(data), func(e sse.Event) error {
		if string(e.Data) != "[DONE]" {
			take(e.Data)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return a
}

// ollamaThinking joins the thinking and text of an Ollama answer's
// objects (message.thinking or thinking; message.content or response).
func ollamaThinking(t *testing.T, data []byte) (thinking, text string, thinkingLines int) {
	t.Helper()
	for _, line := range bytes.Split(bytes.TrimSpace(data), []byte("\n")) {
		var o struct {
			Message *struct {
				Content, Thinking string
			} `json:"message"`
			Response *string `json:"response"`
			Thinking string  `json:"thinking"`
			Error    string  `json:"error"`
		}
		if err := json.Unmarshal(line, &o); err != nil || o.Error != "" {
			t.Fatalf("%s: %v", line, err)
		}
		th, tx := o.Thinking, ""
		if o.Message != nil {
			th, tx = o.Message.Thinking, o.Message.Content
			if o.Thinking != "" {
				t.Fatalf("a chat answer's thinking is in its message: %s", line)
			}
		} else if o.Response != nil {
			tx = *o.Response
		}
		if th != "" {
			thinkingLines++
		}
		thinking, text = thinking+th, text+tx
	}
	return thinking, text, thinkingLines
}

// TestThinkingEndToEnd: reasoning crosses both APIs on both paths. An
// OpenAI client gets an Ollama provider's thinking as reasoning_content,
// and an OpenAI-compatible provider's reasoning as it sent it; an Ollama
// client gets either as message.thinking (or thinking); reasoning_effort
// reaches Ollama as think, think reaches OpenAI-compatible providers as
// reasoning_effort.
func TestThinkingEndToEnd(t *testing.T) {
	harness.Parallel(t)
	for _, field := range []string{sim.ReasoningContent, sim.ReasoningPlain} {
		rig := startThinkingRig(t, field)
		chat := func(model, extra string, stream bool) string {
			return fmt.Sprintf(`{"model":%q,"stream":%v,"max_tokens":3,"messages":[{"role":"user","content":"why is the sky blue?"}]%s}`, model, stream, extra)
		}
		for _, stream := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/openai client/normalized/stream=%v", field, stream), func(t *testing.T) {
				for extra, want := range map[string]struct {
					think  string
					tokens int
				}{
					``:                              {"", 8},
					`,"reasoning_effort":"high"`:    {`"high"`, 16},
					`,"reasoning_effort":"none"`:    {`false`, 0},
					`,"reasoning":{"effort":"low"}`: {`"low"`, 4},
				} {
					resp, data := rig.do(t, http.MethodPost, "/v1/chat/completions", chat(thinkOllamaModel, extra, stream))
					a := readOpenAIAnswer(t, data, stream)
					if resp.StatusCode != 200 || len(strings.Fields(a.reasoning)) != want.tokens || a.other != "" || len(strings.Fields(a.content)) != 3 {
						t.Fatalf("%s: %d reasoning_content %q (reasoning %q), content %q; want %d reasoning tokens: %s", extra, resp.StatusCode, a.reasoning, a.other, a.content, want.tokens, data)
					}
					if stream && a.reasoningChunks != want.tokens {
						t.Fatalf("%s: %d reasoning chunks, want one per token (%d)", extra, a.reasoningChunks, want.tokens)
					}
					if got := sentField(t, rig.ollamaProxy, "think"); got != want.think {
						t.Fatalf("%s: the Ollama provider got think %s, want %s", extra, got, want.think)
					}
				}
			})
			t.Run(fmt.Sprintf("%s/openai client/tunnel/stream=%v", field, stream), func(t *testing.T) {
				resp, data := rig.do(t, http.MethodPost, "/v1/chat/completions", chat(thinkOpenAIModel, `,"reasoning_effort":"low"`, stream))
				a := readOpenAIAnswer(t, data, stream)
				got := a.reasoning
				if field == sim.ReasoningPlain {
					got = a.other // the provider's own field, as it sent it
				}
				if resp.StatusCode != 200 || a.model != thinkOpenAIModel || len(strings.Fields(got)) != 4 || len(strings.Fields(a.content)) != 3 {
					t.Fatalf("%d %+v: %s", resp.StatusCode, a, data)
				}
				if got := sentField(t, rig.openaiProx, "reasoning_effort"); got != `"low"` {
					t.Fatalf("the provider got reasoning_effort %s", got)
				}
			})
		}
		for _, path := range []string{"/api/chat", "/api/generate"} {
			for _, target := range []struct {
				model string
				proxy *recordingProxy
			}{{thinkOllamaModel, rig.ollamaProxy}, {thinkOpenAIModel, rig.openaiProx}} {
				t.Run(fmt.Sprintf("%s/ollama client%s/%s", field, path, target.model), func(t *testing.T) {
					for think, want := range map[string]struct {
						tokens int
						sent   string // think (Ollama) or reasoning_effort (OpenAI) as the provider got it
					}{
						``:                {8, ""},
						`,"think":true`:   {8, ""},
						`,"think":"high"`: {16, `"high"`},
						`,"think":false`:  {0, ""},
					} {
						body := fmt.Sprintf(`{"model":%q,"options":{"num_predict":3}%s,"messages":[{"role":"user","content":"why?"}]}`, target.model, think)
						if path == "/api/generate" {
							body = fmt.Sprintf(`{"model":%q,"options":{"num_predict":3}%s,"prompt":"why?"}`, target.model, think)
						}
						for _, stream := range []string{"", `,"stream":false`} {
							resp, data := rig.do(t, http.MethodPost, path, strings.Replace(body, `"options"`, strings.TrimPrefix(stream+`,"options"`, ","), 1))
							thinking, text, lines := ollamaThinking(t, data)
							if resp.StatusCode != 200 || len(strings.Fields(thinking)) != want.tokens || len(strings.Fields(text)) != 3 {
								t.Fatalf("%s%s: %d thinking %q text %q: %s", think, stream, resp.StatusCode, thinking, text, data)
							}
							if stream == "" && lines != want.tokens {
								t.Fatalf("%s: %d thinking lines, want one per token (%d)", think, lines, want.tokens)
							}
						}
						sent := sentField(t, target.proxy, "think")
						wantSent := strings.TrimPrefix(strings.TrimPrefix(think, `,"think":`), ``)
						if target.proxy == rig.openaiProx {
							sent, wantSent = sentField(t, target.proxy, "reasoning_effort"), want.sent
							if sentField(t, target.proxy, "think") != "" || sentField(t, target.proxy, "iop_ollama") != "" {
								t.Fatalf("the OpenAI-compatible provider got Ollama fields: %s", target.proxy.last(t).Body)
							}
						}
						if sent != wantSent {
							t.Fatalf("%s: the provider got %s, want %s (%s)", think, sent, wantSent, target.proxy.last(t).Body)
						}
					}
				})
			}
		}
		waitIdle(t, rig.e)
	}
}

// TestRegression_ThinkOnAModelThatCannotThink: Ollama answers think true
// for a model without the capability 400 "... does not support thinking";
// through iop an Ollama client gets that answer, as it would from Ollama,
// and an OpenAI client's reasoning_effort reaches the model as think and
// gets it too.
func TestRegression_ThinkOnAModelThatCannotThink(t *testing.T) {
	harness.Parallel(t)
	rig := startThinkingRig(t, sim.ReasoningContent)
	resp, data := rig.do(t, http.MethodPost, "/api/chat", `{"model":"llama3","think":true,"messages":[{"role":"user","content":"hi"}]}`)
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(data), `does not support thinking`) {
		t.Fatalf("%d %s", resp.StatusCode, data)
	}
	resp, data = rig.do(t, http.MethodPost, "/api/chat", `{"model":"llama3","think":false,"stream":false,"messages":[{"role":"user","content":"hi"}],"options":{"num_predict":2}}`)
	if thinking, text, _ := ollamaThinking(t, data); resp.StatusCode != 200 || thinking != "" || text == "" {
		t.Fatalf("think false: %d %s", resp.StatusCode, data)
	}
	resp, data = rig.do(t, http.MethodPost, "/v1/chat/completions", `{"model":"llama3","reasoning_effort":"medium","messages":[{"role":"user","content":"hi"}]}`)
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(data), `does not support thinking`) {
		t.Fatalf("reasoning_effort: %d %s", resp.StatusCode, data)
	}
	waitIdle(t, rig.e)
}

// TestToolChoiceEndToEnd: tool_choice and parallel_tool_calls through an
// OpenAI client, to an Ollama provider and to an OpenAI-compatible one.
// The simulators call the first of the request's tools the last user
// message names; a forced call reaches the Ollama one as a format (the
// simulator writes the first anyOf branch's value).
func TestToolChoiceEndToEnd(t *testing.T) {
	harness.Parallel(t)
	rig := startThinkingRig(t, sim.ReasoningContent)
	const tools = `"tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}},` +
		`{"type":"function","function":{"name":"get_time","parameters":{"type":"object","properties":{"zone":{"type":"string"}}}}}]`
	ask := func(model, choice string) string {
		return fmt.Sprintf(`{"model":%q,"reasoning_effort":"none","max_tokens":64,%s%s,"messages":[{"role":"user","content":"use get_weather or get_time"}]}`, model, tools, choice)
	}
	called := func(t *testing.T, data []byte) string {
		t.Helper()
		var a struct {
			Choices []struct {
				Message struct {
					ToolCalls []struct {
						Function struct{ Name string } `json:"function"`
					} `json:"tool_calls"`
				} `json:"message"`
				FinishReason string `json:"finish_reason"`
			} `json:"choices"`
		}
		if err := json.Unmarshal(data, &a); err != nil || len(a.Choices) == 0 {
			t.Fatalf("%s: %v", data, err)
		}
		var names []string
		for _, c := range a.Choices[0].Message.ToolCalls {
			names = append(names, c.Function.Name)
		}
		return strings.Join(names, ",")
	}
	for _, target := range []struct {
		model string
		proxy *recordingProxy
	}{{thinkOllamaModel, rig.ollamaProxy}, {thinkOpenAIModel, rig.openaiProx}} {
		t.Run(target.model+"/auto", func(t *testing.T) {
			resp, data := rig.do(t, http.MethodPost, "/v1/chat/completions", ask(target.model, ""))
			if resp.StatusCode != 200 || called(t, data) != "get_weather" {
				t.Fatalf("%d %s", resp.StatusCode, data)
			}
		})
		t.Run(target.model+"/tool_choice none calls no tool", func(t *testing.T) {
			resp, data := rig.do(t, http.MethodPost, "/v1/chat/completions", ask(target.model, `,"tool_choice":"none"`))
			if resp.StatusCode != 200 || called(t, data) != "" {
				t.Fatalf("tool_choice none called %q: %d %s", called(t, data), resp.StatusCode, data)
			}
			if target.proxy == rig.ollamaProxy && sentField(t, target.proxy, "tools") != "" {
				t.Fatalf("the Ollama provider got tools: %s", target.proxy.last(t).Body)
			}
		})
		t.Run(target.model+"/a named function is the one called", func(t *testing.T) {
			const named = `"tool_choice":{"type":"function","function":{"name":"get_time"}}`
			resp, data := rig.do(t, http.MethodPost, "/v1/chat/completions", ask(target.model, ","+named))
			if resp.StatusCode != 200 || called(t, data) != "get_time" {
				t.Fatalf("a named get_time called %q: %d %s", called(t, data), resp.StatusCode, data)
			}
			if target.proxy == rig.openaiProx {
				if !strings.Contains(string(target.proxy.last(t).Body), named) {
					t.Fatalf("the OpenAI-compatible provider did not get the request as sent: %s", target.proxy.last(t).Body)
				}
				return
			}
			if sentField(t, target.proxy, "tools") != "" || sentField(t, target.proxy, "format") != `{"type":"object","properties":{"zone":{"type":"string"}}}` {
				t.Fatalf("the Ollama provider got %s, want no tools and get_time's parameters as the format", target.proxy.last(t).Body)
			}
		})
		t.Run(target.model+"/required calls a tool", func(t *testing.T) {
			body := strings.Replace(ask(target.model, `,"tool_choice":"required"`), `"max_tokens":3`, `"max_tokens":60`, 1)
			resp, data := rig.do(t, http.MethodPost, "/v1/chat/completions", body)
			if resp.StatusCode != 200 || called(t, data) != "get_weather" || !strings.Contains(string(data), `"finish_reason":"tool_calls"`) {
				t.Fatalf("%d %s", resp.StatusCode, data)
			}
			if target.proxy == rig.openaiProx && !strings.Contains(string(target.proxy.last(t).Body), `"tool_choice":"required"`) {
				t.Fatalf("the provider got %s", target.proxy.last(t).Body)
			}
		})
		t.Run(target.model+"/parallel_tool_calls false", func(t *testing.T) {
			before := target.proxy.count()
			resp, data := rig.do(t, http.MethodPost, "/v1/chat/completions", ask(target.model, `,"parallel_tool_calls":false`))
			if target.proxy == rig.openaiProx {
				if resp.StatusCode != 200 || called(t, data) == "" || !strings.Contains(string(target.proxy.last(t).Body), `"parallel_tool_calls":false`) {
					t.Fatalf("%d %s: the provider got %s", resp.StatusCode, data, target.proxy.last(t).Body)
				}
				return
			}
			var e struct {
				Error struct{ Message, Code string } `json:"error"`
			}
			_ = json.Unmarshal(data, &e)
			if resp.StatusCode != 400 || e.Error.Code != "unsupported_capability" || !strings.Contains(e.Error.Message, `parallel_tool_calls false`) {
				t.Fatalf("%d %s, want 400 saying why", resp.StatusCode, data)
			}
			if target.proxy.count() != before {
				t.Fatal("the refused request reached the Ollama provider")
			}
		})
	}
	t.Run("a mixed alias sends parallel_tool_calls false to the OpenAI-compatible provider", func(t *testing.T) {
		resp, data := rig.do(t, http.MethodPost, "/v1/chat/completions", ask("mixed", `,"parallel_tool_calls":false`))
		var a struct{ Model string }
		if err := json.Unmarshal(data, &a); err != nil || resp.StatusCode != 200 || a.Model != thinkOpenAIModel {
			t.Fatalf("%d %s", resp.StatusCode, data)
		}
	})
	waitIdle(t, rig.e)
}

// TestRolesAndImagesEndToEnd: the developer role reaches Ollama providers
// as system, an OpenAI-compatible one as sent; a remote image URL is
// refused for an Ollama-only model with a message saying to send a data
// URL, and reaches an OpenAI-compatible provider (so a mixed alias sends it
// there).
func TestRolesAndImagesEndToEnd(t *testing.T) {
	harness.Parallel(t)
	rig := startThinkingRig(t, sim.ReasoningContent)
	dev := `{"model":%q,"max_tokens":2,"messages":[{"role":"developer","content":"be brief"},{"role":"user","content":"hi"}]}`
	if resp, data := rig.do(t, http.MethodPost, "/v1/chat/completions", fmt.Sprintf(dev, thinkOllamaModel)); resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, data)
	}
	if got := sentField(t, rig.ollamaProxy, "messages"); !strings.HasPrefix(got, `[{"role":"system","content":"be brief"}`) {
		t.Fatalf("the Ollama provider got messages %s", got)
	}
	if resp, data := rig.do(t, http.MethodPost, "/v1/chat/completions", fmt.Sprintf(dev, thinkOpenAIModel)); resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, data)
	}
	if got := sentField(t, rig.openaiProx, "messages"); !strings.Contains(got, `"role":"developer"`) {
		t.Fatalf("the OpenAI-compatible provider got messages %s", got)
	}

	img := `{"model":%q,"max_tokens":2,"messages":[{"role":"user","content":[{"type":"text","text":"what is it?"},{"type":"image_url","image_url":{"url":"https://example.com/cat.png"}}]}]}`
	resp, data := rig.do(t, http.MethodPost, "/v1/chat/completions", fmt.Sprintf(img, thinkOllamaModel))
	if resp.StatusCode != 400 || !strings.Contains(string(data), "base64 data URL") {
		t.Fatalf("a remote image for an Ollama provider: %d %s", resp.StatusCode, data)
	}
	resp, data = rig.do(t, http.MethodPost, "/v1/chat/completions", fmt.Sprintf(img, "mixed"))
	var a struct{ Model string }
	if err := json.Unmarshal(data, &a); err != nil || resp.StatusCode != 200 || a.Model != thinkOpenAIModel {
		t.Fatalf("a remote image through the mixed alias: %d %s", resp.StatusCode, data)
	}
	waitIdle(t, rig.e)
}

// TestThinkingHistoryEndToEnd: an earlier answer's thinking in a request's
// history reaches an Ollama provider as message.thinking, from an Ollama
// client (message.thinking) and from an OpenAI client (reasoning_content
// or reasoning); an OpenAI-compatible provider gets none from an Ollama
// client.
func TestThinkingHistoryEndToEnd(t *testing.T) {
	harness.Parallel(t)
	rig := startThinkingRig(t, sim.ReasoningContent)
	history := func(t *testing.T, p *recordingProxy) string {
		t.Helper()
		var msgs []map[string]json.RawMessage
		if err := json.Unmarshal([]byte(sentField(t, p, "messages")), &msgs); err != nil || len(msgs) != 3 {
			t.Fatalf("messages %s: %v", sentField(t, p, "messages"), err)
		}
		for _, k := range []string{"thinking", "reasoning_content", "reasoning"} {
			if v, ok := msgs[1][k]; ok {
				return k + "=" + string(v)
			}
		}
		return ""
	}
	const ollamaChat = `{"model":%q,"stream":false,"think":false,"options":{"num_predict":2},"messages":[{"role":"user","content":"q"},
		{"role":"assistant","content":"a","thinking":"because"},{"role":"user","content":"and?"}]}`
	if resp, data := rig.do(t, http.MethodPost, "/api/chat", fmt.Sprintf(ollamaChat, thinkOllamaModel)); resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, data)
	}
	if got := history(t, rig.ollamaProxy); got != `thinking="because"` {
		t.Fatalf("the Ollama provider got %s", got)
	}
	if resp, data := rig.do(t, http.MethodPost, "/api/chat", fmt.Sprintf(ollamaChat, thinkOpenAIModel)); resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, data)
	}
	if got := history(t, rig.openaiProx); got != "" {
		t.Fatalf("the OpenAI-compatible provider got %s", got)
	}
	for _, field := range []string{"reasoning_content", "reasoning"} {
		body := fmt.Sprintf(`{"model":%q,"reasoning_effort":"none","max_tokens":2,"messages":[{"role":"user","content":"q"},
			{"role":"assistant","content":"a",%q:"because"},{"role":"user","content":"and?"}]}`, thinkOllamaModel, field)
		if resp, data := rig.do(t, http.MethodPost, "/v1/chat/completions", body); resp.StatusCode != 200 {
			t.Fatalf("%d %s", resp.StatusCode, data)
		}
		if got := history(t, rig.ollamaProxy); got != `thinking="because"` {
			t.Fatalf("%s: the Ollama provider got %s", field, got)
		}
	}
	waitIdle(t, rig.e)
}
