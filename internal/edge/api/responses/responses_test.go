package responses

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"iop/internal/auth"
	"iop/internal/edge/api"
	"iop/internal/edge/api/apitest"
	"iop/internal/edge/api/request"
	"iop/internal/edge/contract"
	"iop/internal/responses"
	"iop/internal/runs"
	"iop/internal/sse"
	"iop/internal/wire/nodev1"
)

// respEvent is one decoded event of a Responses stream.
type respEvent struct {
	name string // the SSE "event" field
	obj  map[string]any
}

func (e respEvent) typ() string { s, _ := e.obj["type"].(string); return s }

// responseEvents decodes a Responses SSE body, checking that each event's
// SSE name is its "type" and that sequence numbers count from 0.
func responseEvents(t *testing.T, body string) []respEvent {
	t.Helper()
	var out []respEvent
	if err := sse.ReadAll(strings.NewReader(body), func(e sse.Event) error {
		var obj map[string]any
		if err := json.Unmarshal(e.Data, &obj); err != nil {
			return fmt.Errorf("event %q: %w", e.Data, err)
		}
		out = append(out, respEvent{name: e.Type, obj: obj})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for i, ev := range out {
		if ev.name != ev.typ() {
			t.Errorf("event %d: SSE event %q, type %q", i, ev.name, ev.typ())
		}
		if seq, _ := ev.obj["sequence_number"].(float64); int(seq) != i {
			t.Errorf("event %d (%s): sequence_number %v", i, ev.typ(), ev.obj["sequence_number"])
		}
	}
	return out
}

func eventTypes(evs []respEvent) []string {
	out := make([]string, len(evs))
	for i, ev := range evs {
		out[i] = ev.typ()
	}
	return out
}

// finalResponse is the "response" of the last event.
func finalResponse(t *testing.T, evs []respEvent) map[string]any {
	t.Helper()
	if len(evs) == 0 {
		t.Fatal("no events")
	}
	resp, ok := evs[len(evs)-1].obj["response"].(map[string]any)
	if !ok {
		t.Fatalf("last event %s has no response", evs[len(evs)-1].typ())
	}
	return resp
}

func toolDelta(index int32, id, name, args string) *nodev1.RunEvent {
	return &nodev1.RunEvent{Type: nodev1.RunEvent_TYPE_DELTA, ToolCalls: []*nodev1.ToolCallDelta{{Index: index, Id: id, Name: name, Arguments: args}}}
}

// newResponseStore is an in-memory response store.
func newResponseStore(t *testing.T) *responses.SQLite {
	t.Helper()
	s, err := responses.OpenSQLite(":memory:")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

const weatherTool = `{"type":"function","name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}`

// TestResponses_StreamNormalized: a normalized-path run's reasoning, text
// and tool-call parts become the Responses event sequence of the API
// reference: created, in_progress, a reasoning item with its summary
// events, a message with its output_text events, a function_call with its
// argument deltas, then completed with the whole response and its usage;
// sequence numbers count from 0 and each event's SSE name is its type.
func TestResponses_StreamNormalized(t *testing.T) {
	run := scriptedRun(normalized,
		events(started(), thinkingDelta("hmm"), thinkingDelta(" ok")),
		events(delta("Hel"), delta("lo")),
		events(toolDelta(0, "call_1", "get_weather", `{"ci`), toolDelta(0, "", "", `ty":"Paris"}`)),
		events(usageEvent(7, 5), complete("tool_calls")))
	env := newEnv(t, envConfig{}, runWith(run))
	resp := env.post(t, "/v1/responses", "application/json",
		`{"model":"m","input":"weather?","stream":true,"tools":[`+weatherTool+`]}`)
	if resp.status != http.StatusOK || !strings.HasPrefix(resp.header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("status %d %q: %s", resp.status, resp.header.Get("Content-Type"), resp.body)
	}
	evs := responseEvents(t, resp.body)
	want := []string{
		"response.created", "response.in_progress",
		"response.output_item.added", "response.reasoning_summary_part.added",
		"response.reasoning_summary_text.delta", "response.reasoning_summary_text.delta",
		"response.reasoning_summary_text.done", "response.reasoning_summary_part.done", "response.output_item.done",
		"response.output_item.added", "response.content_part.added",
		"response.output_text.delta", "response.output_text.delta",
		"response.output_text.done", "response.content_part.done", "response.output_item.done",
		"response.output_item.added", "response.function_call_arguments.delta", "response.function_call_arguments.delta",
		"response.function_call_arguments.done", "response.output_item.done",
		"response.completed",
	}
	if got := eventTypes(evs); !slices.Equal(got, want) {
		t.Fatalf("events\n got %q\nwant %q", got, want)
	}
	if s := evs[6].obj["text"]; s != "hmm ok" {
		t.Errorf("reasoning summary done text %v", s)
	}
	if s := evs[13].obj["text"]; s != "Hello" {
		t.Errorf("output_text.done text %v", s)
	}
	if s := evs[19].obj["arguments"]; s != `{"city":"Paris"}` {
		t.Errorf("arguments.done %v", s)
	}
	final := finalResponse(t, evs)
	if final["status"] != "completed" || final["object"] != "response" || final["model"] != "m" {
		t.Errorf("final response %v", final)
	}
	if id, _ := final["id"].(string); !strings.HasPrefix(id, "resp_") {
		t.Errorf("id %q", id)
	}
	out := final["output"].([]any)
	if len(out) != 3 {
		t.Fatalf("output %v", out)
	}
	call := out[2].(map[string]any)
	if call["type"] != "function_call" || call["call_id"] != "call_1" || call["name"] != "get_weather" || call["arguments"] != `{"city":"Paris"}` {
		t.Errorf("function call %v", call)
	}
	usage := final["usage"].(map[string]any)
	if usage["input_tokens"] != 7.0 || usage["output_tokens"] != 5.0 || usage["total_tokens"] != 12.0 {
		t.Errorf("usage %v", usage)
	}
	// The dispatched request is the canonical chat body with the tool in
	// the chat shape, and it needs tools.
	reqs := env.GW.Requests()
	if len(reqs) != 1 || !slices.Contains(reqs[0].Needs, request.NeedTools) {
		t.Fatalf("requests %+v", reqs)
	}
	var body struct {
		Stream bool `json:"stream"`
		Tools  []struct {
			Type     string `json:"type"`
			Function struct {
				Name string `json:"name"`
			} `json:"function"`
		} `json:"tools"`
		Messages []map[string]any `json:"messages"`
	}
	if err := json.Unmarshal(reqs[0].Body, &body); err != nil {
		t.Fatal(err)
	}
	if !body.Stream || len(body.Tools) != 1 || body.Tools[0].Function.Name != "get_weather" || body.Messages[0]["content"] != "weather?" {
		t.Errorf("canonical body %s", reqs[0].Body)
	}
}

// tunnelChatStream is an OpenAI-compatible provider's streamed chat answer
// with text, a tool call whose arguments come in pieces, usage and [DONE].
const tunnelChatStream = `data: {"choices":[{"index":0,"delta":{"role":"assistant","content":"Hi"}}]}

data: {"choices":[{"index":0,"delta":{"content":" there"}}]}

data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_9","type":"function","function":{"name":"get_weather","arguments":""}}]}}]}

data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"city\""}}]}}]}

data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":":\"Paris\"}"}}]}}]}

data: {"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}

data: {"choices":[],"usage":{"prompt_tokens":4,"completion_tokens":6}}

data: [DONE]

`

// splitTunnel is a tunnel run relaying body in chunks of n bytes.
func splitTunnel(body string, n int) *apitest.FakeRun {
	msgs := []*nodev1.RunUp{tunnelHead(200, map[string]string{"Content-Type": "text/event-stream"})}
	for i := 0; i < len(body); i += n {
		msgs = append(msgs, tunnelData(body[i:min(len(body), i+n)]))
	}
	msgs = append(msgs, tunnelEnd())
	return scriptedRun(tunnel, msgs...)
}

// TestResponses_TunnelSplitWrites: a tunnel provider's chat SSE, relayed
// in chunks of every awkward size (1 byte, inside a "data:" field, inside
// a multi-byte frame), renders the same Responses stream: the text, the
// function call with its arguments as streamed deltas, completed with the
// provider's usage.
func TestResponses_TunnelSplitWrites(t *testing.T) {
	var first []string
	for _, n := range []int{1, 2, 3, 5, 7, 11, 64, len(tunnelChatStream)} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			env := newEnv(t, envConfig{}, runWith(splitTunnel(tunnelChatStream, n)))
			resp := env.post(t, "/v1/responses", "application/json",
				`{"model":"m","input":"weather?","stream":true,"tools":[`+weatherTool+`]}`)
			if resp.status != http.StatusOK {
				t.Fatalf("status %d: %s", resp.status, resp.body)
			}
			evs := responseEvents(t, resp.body)
			types := eventTypes(evs)
			if first == nil {
				first = types
			} else if !slices.Equal(types, first) {
				t.Errorf("split %d: events\n got %q\nwant %q", n, types, first)
			}
			var args []string
			for _, ev := range evs {
				if ev.typ() == "response.function_call_arguments.delta" {
					args = append(args, ev.obj["delta"].(string))
				}
			}
			if len(args) != 2 || strings.Join(args, "") != `{"city":"Paris"}` {
				t.Errorf("argument deltas %q", args)
			}
			final := finalResponse(t, evs)
			if types[len(types)-1] != "response.completed" {
				t.Fatalf("last event %s", types[len(types)-1])
			}
			out := final["output"].([]any)
			msg, call := out[0].(map[string]any), out[1].(map[string]any)
			text := msg["content"].([]any)[0].(map[string]any)["text"]
			if text != "Hi there" || call["call_id"] != "call_9" || call["arguments"] != `{"city":"Paris"}` || call["status"] != "completed" {
				t.Errorf("output %v", out)
			}
			if u := final["usage"].(map[string]any); u["input_tokens"] != 4.0 || u["output_tokens"] != 6.0 {
				t.Errorf("usage %v", u)
			}
		})
	}
}

// TestResponses_ErrorMidStream: a run that fails after its stream began
// ends with response.failed (status "failed", the error), never with a
// clean-looking response.completed, on both paths; the failed response is
// stored as failed.
func TestResponses_ErrorMidStream(t *testing.T) {
	cases := map[string]*apitest.FakeRun{
		"normalized": scriptedRun(normalized, events(started(), delta("partial")), events(errorEvent(502, "the model server crashed"))),
		"tunnel error event": scriptedRun(tunnel, tunnelHead(200, map[string]string{"Content-Type": "text/event-stream"}),
			tunnelData(`data: {"choices":[{"index":0,"delta":{"content":"partial"}}]}`+"\n\n"),
			tunnelData(`data: {"error":{"message":"the model server crashed","type":"server_error"}}`+"\n\n"), tunnelEnd()),
		"tunnel truncated": scriptedRun(tunnel, tunnelHead(200, map[string]string{"Content-Type": "text/event-stream"}),
			tunnelData(`data: {"choices":[{"index":0,"delta":{"content":"partial"}}]}`+"\n\n"), tunnelEnd()),
		"tunnel lost": scriptedRun(tunnel, tunnelHead(200, map[string]string{"Content-Type": "text/event-stream"}),
			tunnelData(`data: {"choices":[{"index":0,"delta":{"content":"partial"}}]}`+"\n\n"), tunnelError(502, "the node lost the provider")),
	}
	for name, run := range cases {
		t.Run(name, func(t *testing.T) {
			store := newResponseStore(t)
			env := newEnv(t, envConfig{Responses: store}, runWith(run))
			resp := env.post(t, "/v1/responses", "application/json", `{"model":"m","input":"hi","stream":true}`)
			if resp.status != http.StatusOK {
				t.Fatalf("status %d: %s", resp.status, resp.body)
			}
			evs := responseEvents(t, resp.body)
			types := eventTypes(evs)
			if types[len(types)-1] != "response.failed" || slices.Contains(types, "response.completed") {
				t.Fatalf("events %q", types)
			}
			final := finalResponse(t, evs)
			errObj, _ := final["error"].(map[string]any)
			if final["status"] != "failed" || errObj == nil || errObj["message"] == "" {
				t.Fatalf("failed response %v", final)
			}
			got := env.get(t, "/v1/responses/"+final["id"].(string))
			if got.status != http.StatusOK || !strings.Contains(got.body, `"status":"failed"`) {
				t.Errorf("stored: %d %s", got.status, got.body)
			}
		})
	}
}

// TestResponses_ErrorBeforeOutput: a run that fails before any output is
// answered with its own status and the OpenAI error body, streamed or not,
// and nothing is stored.
func TestResponses_ErrorBeforeOutput(t *testing.T) {
	for _, stream := range []bool{false, true} {
		run := scriptedRun(normalized, events(started(), errorEvent(503, "model server overloaded")))
		store := newResponseStore(t)
		env := newEnv(t, envConfig{Responses: store}, runWith(run))
		resp := env.post(t, "/v1/responses", "application/json", fmt.Sprintf(`{"model":"m","input":"hi","stream":%v}`, stream))
		if resp.status != http.StatusServiceUnavailable || !strings.Contains(resp.body, `"error":{`) {
			t.Errorf("stream %v: %d %s", stream, resp.status, resp.body)
		}
	}
}

// TestResponses_JSON: a non-streamed response is one response object: a
// message with its output_text (annotations present), status completed,
// usage; a length finish is status incomplete with incomplete_details
// max_output_tokens.
func TestResponses_JSON(t *testing.T) {
	for _, tc := range []struct {
		finish, status, reason string
	}{{"stop", "completed", ""}, {"length", "incomplete", "max_output_tokens"}} {
		run := scriptedRun(normalized, events(started(), delta("Hello")), events(usageEvent(3, 1), complete(tc.finish)))
		env := newEnv(t, envConfig{}, runWith(run))
		resp := env.post(t, "/v1/responses", "application/json",
			`{"model":"m","input":[{"role":"user","content":[{"type":"input_text","text":"hi"}]}],"max_output_tokens":16,"temperature":0.5,"metadata":{"a":"b"}}`)
		if resp.status != http.StatusOK {
			t.Fatalf("status %d: %s", resp.status, resp.body)
		}
		var obj struct {
			Object, Status string
			Output         []struct {
				Type, Role, Status string
				Content            []struct {
					Type, Text  string
					Annotations []any
				}
			}
			IncompleteDetails *struct{ Reason string } `json:"incomplete_details"`
			Usage             struct {
				InputTokens  int `json:"input_tokens"`
				OutputTokens int `json:"output_tokens"`
				TotalTokens  int `json:"total_tokens"`
			}
			MaxOutputTokens int               `json:"max_output_tokens"`
			Temperature     float64           `json:"temperature"`
			Metadata        map[string]string `json:"metadata"`
			ToolChoice      string            `json:"tool_choice"`
			ParallelTools   bool              `json:"parallel_tool_calls"`
		}
		if err := json.Unmarshal([]byte(resp.body), &obj); err != nil {
			t.Fatal(err)
		}
		if obj.Object != "response" || obj.Status != tc.status || len(obj.Output) != 1 || obj.Output[0].Role != "assistant" ||
			obj.Output[0].Content[0].Type != "output_text" || obj.Output[0].Content[0].Text != "Hello" || obj.Output[0].Content[0].Annotations == nil {
			t.Errorf("%s: %s", tc.finish, resp.body)
		}
		if (tc.reason == "") != (obj.IncompleteDetails == nil) || (obj.IncompleteDetails != nil && obj.IncompleteDetails.Reason != tc.reason) {
			t.Errorf("%s: incomplete_details %+v", tc.finish, obj.IncompleteDetails)
		}
		if obj.Usage.InputTokens != 3 || obj.Usage.OutputTokens != 1 || obj.Usage.TotalTokens != 4 {
			t.Errorf("usage %+v", obj.Usage)
		}
		if obj.MaxOutputTokens != 16 || obj.Temperature != 0.5 || obj.Metadata["a"] != "b" || obj.ToolChoice != "auto" || !obj.ParallelTools {
			t.Errorf("echo: %s", resp.body)
		}
	}
}

// TestResponses_BadInput: bodies every provider would refuse, built-in
// tools and unserved features are answered 400 invalid_request_error
// naming the param, before anything is dispatched; unknown ids are 404.
func TestResponses_BadInput(t *testing.T) {
	env := newEnv(t, envConfig{Responses: newResponseStore(t)}, okRun)
	for _, tc := range []struct{ body, param, text string }{
		{`[]`, "", ""},
		{`{"input":"hi"}`, "model", ""},
		{`{"model":"m"}`, "input", ""},
		{`{"model":"m","input":42}`, "input", ""},
		{`{"model":"m","input":[{"type":"message","role":"robot","content":"x"}]}`, "input[0].role", ""},
		{`{"model":"m","input":[{"role":"user","content":[{"type":"input_file","file_id":"f"}]}]}`, "input[0].content[0].type", "input_file"},
		{`{"model":"m","input":[{"role":"user","content":[{"type":"input_image","file_id":"f"}]}]}`, "input[0].content[0].file_id", ""},
		{`{"model":"m","input":[{"type":"function_call","name":"f"}]}`, "input[0].call_id", ""},
		{`{"model":"m","input":[{"type":"web_search_call","id":"ws"}]}`, "input[0].type", "web_search_call"},
		{`{"model":"m","input":"hi","tools":[{"type":"web_search"}]}`, "tools[0].type", "web_search"},
		{`{"model":"m","input":"hi","tools":[{"type":"file_search","vector_store_ids":["v"]}]}`, "tools[0].type", "file_search"},
		{`{"model":"m","input":"hi","tools":[{"type":"computer_use_preview"}]}`, "tools[0].type", "computer_use_preview"},
		{`{"model":"m","input":"hi","tools":[{"type":"code_interpreter"}]}`, "tools[0].type", "code_interpreter"},
		{`{"model":"m","input":"hi","tools":[{"type":"image_generation"}]}`, "tools[0].type", "image_generation"},
		{`{"model":"m","input":"hi","tools":[{"type":"mcp","server_label":"x"}]}`, "tools[0].type", "mcp"},
		{`{"model":"m","input":"hi","tools":[{"type":"function"}]}`, "tools[0].name", ""},
		{`{"model":"m","input":"hi","tools":[` + weatherTool + `],"tool_choice":{"type":"function","name":"other"}}`, "tool_choice.name", ""},
		{`{"model":"m","input":"hi","tool_choice":{"type":"web_search_preview"}}`, "tool_choice.type", "web_search_preview"},
		{`{"model":"m","input":"hi","text":{"format":{"type":"json_schema","schema":{}}}}`, "text.format.name", ""},
		{`{"model":"m","input":"hi","text":{"format":{"type":"yaml"}}}`, "text.format.type", ""},
		{`{"model":"m","input":"hi","reasoning":{"effort":"extreme"}}`, "reasoning.effort", ""},
		{`{"model":"m","input":"hi","max_output_tokens":0}`, "max_output_tokens", ""},
		{`{"model":"m","input":"hi","temperature":"hot"}`, "temperature", ""},
		{`{"model":"m","input":"hi","conversation":"conv_1"}`, "conversation", ""},
		{`{"model":"m","input":"hi","background":true,"store":false}`, "background", ""},
		{`{"model":"m","input":"hi","previous_response_id":"resp_nope"}`, "previous_response_id", "not found"},
		{`{"model":"m","input":[{"type":"item_reference","id":"msg_nope"}]}`, "input[0].id", "not found"},
	} {
		resp := env.post(t, "/v1/responses", "application/json", tc.body)
		var e errorBody
		_ = json.Unmarshal([]byte(resp.body), &e)
		if resp.status != http.StatusBadRequest || e.Error == nil || e.Error.Type != "invalid_request_error" {
			t.Errorf("%s: %d %s", tc.body, resp.status, resp.body)
			continue
		}
		if got := deref(e.Error.Param); got != tc.param {
			t.Errorf("%s: param %q, want %q", tc.body, got, tc.param)
		}
		if !strings.Contains(e.Error.Message, tc.text) {
			t.Errorf("%s: message %q lacks %q", tc.body, e.Error.Message, tc.text)
		}
	}
	if n := len(env.GW.Requests()); n != 0 {
		t.Errorf("%d requests dispatched", n)
	}
	for _, path := range []string{"/v1/responses/resp_nope", "/v1/responses/resp_nope/input_items"} {
		if resp := env.get(t, path); resp.status != http.StatusNotFound || !strings.Contains(resp.body, "resp_nope") {
			t.Errorf("GET %s: %d %s", path, resp.status, resp.body)
		}
	}
	if resp := env.send(t, http.MethodDelete, "/v1/responses/resp_nope", "", nil); resp.status != http.StatusNotFound {
		t.Errorf("DELETE: %d %s", resp.status, resp.body)
	}
	if resp := env.post(t, "/v1/responses", "text/plain", `{"model":"m","input":"hi"}`); resp.status != http.StatusUnsupportedMediaType {
		t.Errorf("text/plain: %d", resp.status)
	}
}

// TestResponses_Admission: a full queue is 429 with Retry-After and no
// live provider 503, in OpenAI's error shape, and nothing is stored.
func TestResponses_Admission(t *testing.T) {
	for _, tc := range []struct {
		err    error
		status int
	}{{api.ErrQueueFull, http.StatusTooManyRequests}, {api.ErrProviderUnavailable, http.StatusServiceUnavailable}, {api.ErrUnknownModel, http.StatusNotFound}} {
		store := newResponseStore(t)
		env := newEnv(t, envConfig{Responses: store}, failWith(tc.err))
		for _, stream := range []string{"false", "true"} {
			resp := env.post(t, "/v1/responses", "application/json", `{"model":"m","input":"hi","stream":`+stream+`}`)
			if resp.status != tc.status || !strings.Contains(resp.body, `"error":{`) {
				t.Errorf("%v: %d %s", tc.err, resp.status, resp.body)
			}
			if tc.status != http.StatusNotFound && resp.header.Get("Retry-After") == "" {
				t.Errorf("%v: no Retry-After", tc.err)
			}
		}
	}
}

// createResponse posts body and returns the response object.
func createResponse(t *testing.T, env *testEnv, body string, header map[string]string) map[string]any {
	t.Helper()
	if header == nil {
		header = map[string]string{}
	}
	header["Content-Type"] = "application/json"
	resp := env.send(t, http.MethodPost, "/v1/responses", body, header)
	if resp.status != http.StatusOK {
		t.Fatalf("create %s: %d %s", body, resp.status, resp.body)
	}
	var obj map[string]any
	if err := json.Unmarshal([]byte(resp.body), &obj); err != nil {
		t.Fatal(err)
	}
	return obj
}

// chatMessages is the messages of a dispatched canonical chat body.
func chatMessages(t *testing.T, req contract.Request) []map[string]any {
	t.Helper()
	var body struct {
		Messages []map[string]any `json:"messages"`
	}
	if err := json.Unmarshal(req.Body, &body); err != nil {
		t.Fatal(err)
	}
	return body.Messages
}

// TestResponses_PreviousResponseAcrossPaths: previous_response_id continues
// a conversation whose first turn ran on a normalized-path provider on a
// tunnel-path one: the second dispatch carries the first input, the first
// answer (its text and its function call) and the new input, in order;
// instructions are not carried over.
func TestResponses_PreviousResponseAcrossPaths(t *testing.T) {
	n := 0
	dispatch := func(context.Context, contract.Request) (Run, error) {
		n++
		if n == 1 {
			return scriptedRun(normalized, events(started(), delta("Let me check."),
				toolDelta(0, "call_a", "get_weather", `{"city":"Paris"}`)), events(usageEvent(3, 2), complete("tool_calls"))), nil
		}
		return splitTunnel(`data: {"choices":[{"index":0,"delta":{"content":"Sunny."},"finish_reason":"stop"}]}`+"\n\ndata: [DONE]\n\n", 9), nil
	}
	env := newEnv(t, envConfig{Responses: newResponseStore(t)}, dispatch)
	first := createResponse(t, env, `{"model":"m","instructions":"be brief","input":"weather in Paris?","tools":[`+weatherTool+`]}`, nil)
	second := createResponse(t, env, fmt.Sprintf(`{"model":"m","previous_response_id":%q,"tools":[`+weatherTool+`],
		"input":[{"type":"function_call_output","call_id":"call_a","output":"21C"}]}`, first["id"]), nil)
	if second["previous_response_id"] != first["id"] || second["status"] != "completed" {
		t.Fatalf("second %v", second)
	}
	reqs := env.GW.Requests()
	msgs := chatMessages(t, reqs[1])
	if len(msgs) != 3 {
		t.Fatalf("messages %v", msgs)
	}
	calls, _ := msgs[1]["tool_calls"].([]any)
	if msgs[0]["role"] != "user" || msgs[0]["content"] != "weather in Paris?" ||
		msgs[1]["role"] != "assistant" || msgs[1]["content"] != "Let me check." || len(calls) != 1 ||
		msgs[2]["role"] != "tool" || msgs[2]["tool_call_id"] != "call_a" || msgs[2]["content"] != "21C" {
		t.Errorf("messages %v", msgs)
	}
	if first := chatMessages(t, reqs[0]); first[0]["role"] != "system" || first[0]["content"] != "be brief" {
		t.Errorf("first turn's messages %v", first)
	}
	// The second's estimate counts the whole conversation.
	if reqs[1].EstimatedInputTokens <= reqs[0].EstimatedInputTokens-3 {
		t.Errorf("estimates %d then %d", reqs[0].EstimatedInputTokens, reqs[1].EstimatedInputTokens)
	}
	// A third turn on top of the second sees all of it.
	createResponse(t, env, fmt.Sprintf(`{"model":"m","previous_response_id":%q,"input":"thanks"}`, second["id"]), nil)
	if msgs := chatMessages(t, env.GW.Requests()[2]); len(msgs) != 5 || msgs[3]["content"] != "Sunny." || msgs[4]["content"] != "thanks" {
		t.Errorf("third turn's messages %v", msgs)
	}
}

// TestResponses_OwnerIsolation: a response belongs to the key that made
// it: another key's GET, input_items, DELETE and previous_response_id see
// no such response (404, 400 for previous_response_id), as OpenAI answers
// an id it does not know; its owner still can.
func TestResponses_OwnerIsolation(t *testing.T) {
	f := newKeys(t, auth.Key{})
	env := newEnv(t, envConfig{Keys: f.keys, AdminKeys: f.admin, Responses: newResponseStore(t)}, okRun)
	obj := createResponse(t, env, `{"model":"m","input":"secret plans"}`, bearer(f.alice))
	id := obj["id"].(string)
	for _, path := range []string{"/v1/responses/" + id, "/v1/responses/" + id + "/input_items"} {
		if resp := env.send(t, http.MethodGet, path, "", bearer(f.bob)); resp.status != http.StatusNotFound || strings.Contains(resp.body, "secret") {
			t.Errorf("bob GET %s: %d %s", path, resp.status, resp.body)
		}
		if resp := env.send(t, http.MethodGet, path, "", bearer(f.alice)); resp.status != http.StatusOK {
			t.Errorf("alice GET %s: %d %s", path, resp.status, resp.body)
		}
	}
	h := bearer(f.bob)
	h["Content-Type"] = "application/json"
	if resp := env.send(t, http.MethodPost, "/v1/responses", fmt.Sprintf(`{"model":"m","input":"more","previous_response_id":%q}`, id), h); resp.status != http.StatusBadRequest {
		t.Errorf("bob continues: %d %s", resp.status, resp.body)
	}
	if resp := env.send(t, http.MethodDelete, "/v1/responses/"+id, "", bearer(f.bob)); resp.status != http.StatusNotFound {
		t.Errorf("bob DELETE: %d %s", resp.status, resp.body)
	}
	resp := env.send(t, http.MethodDelete, "/v1/responses/"+id, "", bearer(f.alice))
	if resp.status != http.StatusOK || resp.body != fmt.Sprintf(`{"deleted":true,"id":%q,"object":"response"}`+"\n", id) {
		t.Errorf("alice DELETE: %d %s", resp.status, resp.body)
	}
	if resp := env.send(t, http.MethodGet, "/v1/responses/"+id, "", bearer(f.alice)); resp.status != http.StatusNotFound {
		t.Errorf("GET after DELETE: %d", resp.status)
	}
}

// TestResponses_StoreFalse: store false keeps nothing: GET is 404 and
// previous_response_id naming it 400.
func TestResponses_StoreFalse(t *testing.T) {
	env := newEnv(t, envConfig{Responses: newResponseStore(t)}, okRun)
	obj := createResponse(t, env, `{"model":"m","input":"hi","store":false}`, nil)
	if obj["store"] != false {
		t.Errorf("store %v", obj["store"])
	}
	if resp := env.get(t, "/v1/responses/"+obj["id"].(string)); resp.status != http.StatusNotFound {
		t.Errorf("GET: %d %s", resp.status, resp.body)
	}
	resp := env.post(t, "/v1/responses", "application/json", fmt.Sprintf(`{"model":"m","input":"hi","previous_response_id":%q}`, obj["id"]))
	if resp.status != http.StatusBadRequest || !strings.Contains(resp.body, `"param":"previous_response_id"`) {
		t.Errorf("continue: %d %s", resp.status, resp.body)
	}
}

// TestResponses_InputItemsPaging: GET input_items lists the response's
// input items, newest first by default, limit/after/before as the API
// reference says, with first_id, last_id and has_more.
func TestResponses_InputItemsPaging(t *testing.T) {
	env := newEnv(t, envConfig{Responses: newResponseStore(t)}, okRun)
	var input []string
	for i := range 5 {
		input = append(input, fmt.Sprintf(`{"id":"msg_%d","role":"user","content":"turn %d"}`, i, i))
	}
	obj := createResponse(t, env, `{"model":"m","input":[`+strings.Join(input, ",")+`]}`, nil)
	base := "/v1/responses/" + obj["id"].(string) + "/input_items"
	type list struct {
		Object  string
		Data    []struct{ ID, Type string }
		FirstID *string `json:"first_id"`
		LastID  *string `json:"last_id"`
		HasMore bool    `json:"has_more"`
	}
	page := func(query string) ([]string, list) {
		t.Helper()
		resp := env.get(t, base+query)
		if resp.status != http.StatusOK {
			t.Fatalf("%s: %d %s", query, resp.status, resp.body)
		}
		var l list
		if err := json.Unmarshal([]byte(resp.body), &l); err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, d := range l.Data {
			ids = append(ids, d.ID)
		}
		return ids, l
	}
	for _, tc := range []struct {
		query string
		ids   []string
		more  bool
	}{
		{"", []string{"msg_4", "msg_3", "msg_2", "msg_1", "msg_0"}, false},
		{"?order=asc", []string{"msg_0", "msg_1", "msg_2", "msg_3", "msg_4"}, false},
		{"?limit=2", []string{"msg_4", "msg_3"}, true},
		{"?limit=2&after=msg_3", []string{"msg_2", "msg_1"}, true},
		{"?limit=2&after=msg_1", []string{"msg_0"}, false},
		{"?order=asc&after=msg_1&limit=10", []string{"msg_2", "msg_3", "msg_4"}, false},
		{"?order=asc&before=msg_2", []string{"msg_0", "msg_1"}, false},
		{"?after=msg_0", nil, false},
	} {
		ids, l := page(tc.query)
		if !slices.Equal(ids, tc.ids) || l.HasMore != tc.more || l.Object != "list" {
			t.Errorf("%s: %v more %v, want %v more %v", tc.query, ids, l.HasMore, tc.ids, tc.more)
		}
		if len(ids) > 0 && (l.FirstID == nil || *l.FirstID != ids[0] || *l.LastID != ids[len(ids)-1]) {
			t.Errorf("%s: first %v last %v", tc.query, l.FirstID, l.LastID)
		}
		if len(ids) == 0 && (l.FirstID != nil || l.LastID != nil) {
			t.Errorf("%s: empty page with first %v last %v", tc.query, l.FirstID, l.LastID)
		}
	}
	for _, q := range []string{"?limit=0", "?limit=101", "?order=up", "?after=msg_x"} {
		if resp := env.get(t, base+q); resp.status != http.StatusBadRequest {
			t.Errorf("%s: %d %s", q, resp.status, resp.body)
		}
	}
}

// TestResponses_ItemReference: an item_reference input item is the key's
// stored item of that id (here the earlier answer's message), sent to the
// provider as it was.
func TestResponses_ItemReference(t *testing.T) {
	env := newEnv(t, envConfig{Responses: newResponseStore(t)}, okRun)
	first := createResponse(t, env, `{"model":"m","input":"hi"}`, nil)
	msgID := first["output"].([]any)[0].(map[string]any)["id"].(string)
	createResponse(t, env, fmt.Sprintf(`{"model":"m","input":[{"role":"user","content":"hi"},{"type":"item_reference","id":%q},{"role":"user","content":"again"}]}`, msgID), nil)
	msgs := chatMessages(t, env.GW.Requests()[1])
	if len(msgs) != 3 || msgs[1]["role"] != "assistant" || msgs[1]["content"] != "hi" {
		t.Errorf("messages %v", msgs)
	}
}

// TestResponses_BackgroundCancel: a background response answers at once
// with status queued; GET shows it in progress while its run goes on;
// POST cancel ends it (its run cancelled, closed once) and answers status
// cancelled, which GET then shows too. A response that is not a background
// one cannot be cancelled (400).
func TestResponses_BackgroundCancel(t *testing.T) {
	run := liveRun(normalized, 4)
	run.Up <- events(started(), delta("thinking about it"))
	env := newEnv(t, envConfig{Responses: newResponseStore(t), Runs: newRunsManager(t)}, runWith(run))
	obj := createResponse(t, env, `{"model":"m","input":"long job","background":true}`, nil)
	if obj["status"] != "queued" || obj["background"] != true {
		t.Fatalf("create: %v", obj)
	}
	id := obj["id"].(string)
	eventually(t, "the response in progress", func() bool {
		return strings.Contains(env.get(t, "/v1/responses/"+id).body, `"status":"in_progress"`)
	})
	resp := env.post(t, "/v1/responses/"+id+"/cancel", "", "")
	if resp.status != http.StatusOK || !strings.Contains(resp.body, `"status":"cancelled"`) {
		t.Fatalf("cancel: %d %s", resp.status, resp.body)
	}
	if resp := env.get(t, "/v1/responses/"+id); !strings.Contains(resp.body, `"status":"cancelled"`) {
		t.Errorf("GET after cancel: %s", resp.body)
	}
	if len(run.CancelReasons()) == 0 {
		t.Error("the run was not cancelled")
	}
}

// waitBackground waits until the background response id's run has ended
// (its dispatched run closed).
func waitBackground(t *testing.T, m *runs.Manager, id string) {
	t.Helper()
	run := m.Live(id)
	if run == nil {
		return // ended, and its log expired
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := run.Wait(ctx); err != nil {
		t.Fatalf("background response %s: %v", id, err)
	}
}

// TestResponses_BackgroundCompletes: a background response's final
// object, once its run ended, is what GET answers: completed, its output
// and usage.
func TestResponses_BackgroundCompletes(t *testing.T) {
	m := newRunsManager(t)
	env := newEnv(t, envConfig{Responses: newResponseStore(t), Runs: m}, okRun)
	obj := createResponse(t, env, `{"model":"m","input":"hi","background":true}`, nil)
	id := obj["id"].(string)
	waitBackground(t, m, id) // its final object is stored before its run ends
	if resp := env.get(t, "/v1/responses/"+id); !strings.Contains(resp.body, `"status":"completed"`) ||
		!strings.Contains(resp.body, `"text":"hi"`) || !strings.Contains(resp.body, `"output_tokens":1`) {
		t.Fatalf("final: %s", resp.body)
	}
	if resp := env.post(t, "/v1/responses/"+id+"/cancel", "", ""); resp.status != http.StatusOK || !strings.Contains(resp.body, `"status":"completed"`) {
		t.Errorf("cancel of a finished response: %d %s", resp.status, resp.body)
	}
	plain := createResponse(t, env, `{"model":"m","input":"hi"}`, nil)
	if resp := env.post(t, "/v1/responses/"+plain["id"].(string)+"/cancel", "", ""); resp.status != http.StatusBadRequest {
		t.Errorf("cancel of a foreground response: %d %s", resp.status, resp.body)
	}
}

// TestResponses_KeyLimits: POST /v1/responses takes one of its key's
// request slots like every route that runs a model: over
// requests_per_minute it is refused 429 with Retry-After before anything
// is dispatched; a background response holds its slot until its run
// ends.
func TestResponses_KeyLimits(t *testing.T) {
	f := newKeys(t, auth.Key{RequestsPerMinute: 1})
	env := newEnv(t, envConfig{Keys: f.keys, AdminKeys: f.admin, Responses: newResponseStore(t)}, okRun)
	createResponse(t, env, `{"model":"m","input":"hi"}`, bearer(f.alice))
	h := bearer(f.alice)
	h["Content-Type"] = "application/json"
	resp := env.send(t, http.MethodPost, "/v1/responses", `{"model":"m","input":"hi"}`, h)
	if resp.status != http.StatusTooManyRequests || resp.header.Get("Retry-After") == "" {
		t.Errorf("second request: %d %s", resp.status, resp.body)
	}
	if n := len(env.GW.Requests()); n != 1 {
		t.Errorf("%d dispatched, want 1", n)
	}

	g := newKeys(t, auth.Key{MaxConcurrent: 1})
	run := liveRun(normalized, 4)
	m := newRunsManager(t)
	env = newEnv(t, envConfig{Keys: g.keys, AdminKeys: g.admin, Responses: newResponseStore(t), Runs: m}, runWith(run))
	obj := createResponse(t, env, `{"model":"m","input":"long","background":true}`, bearer(g.alice))
	defer waitBackground(t, m, obj["id"].(string))
	h = bearer(g.alice)
	h["Content-Type"] = "application/json"
	if resp := env.send(t, http.MethodPost, "/v1/responses", `{"model":"m","input":"hi"}`, h); resp.status != http.StatusTooManyRequests {
		t.Errorf("while the background response runs: %d %s", resp.status, resp.body)
	}
	run.Up <- events(started(), delta("done"), usageEvent(1, 1), complete("stop"))
	close(run.Up)
	waitBackground(t, m, obj["id"].(string))
	if body := env.send(t, http.MethodGet, "/v1/responses/"+obj["id"].(string), "", bearer(g.alice)).body; !strings.Contains(body, `"status":"completed"`) {
		t.Fatalf("the background response did not complete: %s", body)
	}
}

// TestResponses_ClientGoesAway: a client that leaves a streamed response
// mid-stream cancels its run, which is closed once with the outcome
// client_gone, on both paths; the response is stored "cancelled", not as
// if it had finished.
func TestResponses_ClientGoesAway(t *testing.T) {
	for _, path := range []string{"normalized", "tunnel"} {
		t.Run(path, func(t *testing.T) {
			run := liveRun(normalized, 4)
			first := events(started(), delta("first words"))
			if path == "tunnel" {
				run = liveRun(tunnel, 4)
				run.Up <- tunnelHead(200, map[string]string{"Content-Type": "text/event-stream"})
				first = tunnelData(`data: {"choices":[{"index":0,"delta":{"content":"first words"}}]}` + "\n\n")
			}
			run.Up <- first
			store := newResponseStore(t)
			env := newEnv(t, envConfig{Responses: store}, runWith(run))
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, env.Srv.URL+"/v1/responses",
				strings.NewReader(`{"model":"m","input":"hi","stream":true}`))
			resp, err := env.Srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var id string
			var r sse.Reader
			seen := map[string]bool{}
			buf := make([]byte, 4096)
			for id == "" || !seen["response.output_text.delta"] {
				n, err := resp.Body.Read(buf)
				if n > 0 {
					_ = r.Feed(buf[:n], func(e sse.Event) error {
						if e.Type == "response.created" {
							var obj struct{ Response struct{ ID string } }
							_ = json.Unmarshal(e.Data, &obj)
							id = obj.Response.ID
						}
						seen[e.Type] = true
						return nil
					})
				}
				if err != nil {
					t.Fatalf("stream ended before its first delta: %v", err)
				}
			}
			cancel()
			select {
			case <-run.Closed():
			case <-time.After(30 * time.Second):
				t.Fatal("the run was not closed after the client left")
			}
			env.WaitHandlers()
			if n, reasons := run.CloseCalls(); n != 1 || reasons[0] != contract.OutcomeClientGone {
				t.Errorf("Close called %d times with %q, want once with %q", n, reasons, contract.OutcomeClientGone)
			}
			if rec, err := store.Get(context.Background(), "", id); err != nil || rec.Status != "cancelled" {
				t.Errorf("a response its client left: %q %v, want it stored cancelled", rec.Status, err)
			}
		})
	}
}

// TestResponses_NoReasoningWhenNone: reasoning.effort "none" shows no
// reasoning item even when the provider reasons all the same; without it
// the provider's reasoning is a reasoning item with its summary.
func TestResponses_NoReasoningWhenNone(t *testing.T) {
	for _, tc := range []struct {
		effort string
		items  int
	}{{`"none"`, 1}, {`"low"`, 2}} {
		run := scriptedRun(normalized, events(started(), thinkingDelta("pondering"), delta("answer")), events(complete("stop")))
		env := newEnv(t, envConfig{}, runWith(run))
		obj := createResponse(t, env, `{"model":"m","input":"hi","reasoning":{"effort":`+tc.effort+`}}`, nil)
		out := obj["output"].([]any)
		if len(out) != tc.items || out[len(out)-1].(map[string]any)["type"] != "message" {
			t.Errorf("effort %s: output %v", tc.effort, out)
		}
		if tc.items == 2 && out[0].(map[string]any)["summary"].([]any)[0].(map[string]any)["text"] != "pondering" {
			t.Errorf("reasoning item %v", out[0])
		}
	}
}

// TestResponses_OrphanedBackground: a background response an earlier edge
// process left in progress (its run is gone) reads as failed, saying the
// edge restarted, not in progress for ever.
func TestResponses_OrphanedBackground(t *testing.T) {
	store := newResponseStore(t)
	if err := store.Save(context.Background(), responses.Record{ID: "resp_old", Status: "in_progress", CreatedAt: time.Unix(1, 0),
		Response: json.RawMessage(`{"id":"resp_old","object":"response","status":"in_progress","background":true,"error":null}`)}); err != nil {
		t.Fatal(err)
	}
	env := newEnv(t, envConfig{Responses: store, Runs: newRunsManager(t)}, okRun)
	for range 2 {
		resp := env.get(t, "/v1/responses/resp_old")
		if resp.status != http.StatusOK || !strings.Contains(resp.body, `"status":"failed"`) || !strings.Contains(resp.body, errResponseOrphaned) {
			t.Errorf("GET: %d %s", resp.status, resp.body)
		}
	}
	if rec, _ := store.Get(context.Background(), "", "resp_old"); rec.Status != "failed" {
		t.Errorf("stored status %q", rec.Status)
	}
}

// TestRegression_RetrieveWithStreamIsRefused: GET /v1/responses/{id}?stream=true
// (the openai client's responses.retrieve(id, {stream: true}), which resumes
// a response's event stream) was answered with the JSON object, and the
// client read it as a stream without events. iop keeps the events of a
// background response only: for another, 400 naming stream; stream=false
// is a plain retrieve.
func TestRegression_RetrieveWithStreamIsRefused(t *testing.T) {
	env := newEnv(t, envConfig{Responses: newResponseStore(t)}, okRun)
	id := createResponse(t, env, `{"model":"m","input":"hi"}`, nil)["id"].(string)
	for _, q := range []string{"?stream=true", "?stream=true&starting_after=3", "?stream=1"} {
		resp := env.get(t, "/v1/responses/"+id+q)
		if resp.status != http.StatusBadRequest || !strings.Contains(resp.body, `"param":"stream"`) {
			t.Errorf("GET %s: %d %s", q, resp.status, resp.body)
		}
	}
	if resp := env.get(t, "/v1/responses/"+id+"?stream=false"); resp.status != http.StatusOK || !strings.Contains(resp.body, id) {
		t.Errorf("GET ?stream=false: %d %s", resp.status, resp.body)
	}
}
