package anthropic

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"testing"

	"iop/internal/auth"
	"iop/internal/edge/api"
	"iop/internal/edge/api/apitest"
	"iop/internal/edge/api/request"
	"iop/internal/edge/contract"
	"iop/internal/sse"
	"iop/internal/wire/nodev1"
)

// The Messages API (/v1/messages, Anthropic API reference "Messages" and
// "Streaming Messages") through the handler and the fake gateway.

func toolPart(index int32, id, name, args string) *nodev1.RunEvent {
	return &nodev1.RunEvent{Type: nodev1.RunEvent_TYPE_DELTA,
		ToolCalls: []*nodev1.ToolCallDelta{{Index: index, Id: id, Name: name, Arguments: args}}}
}

// anthropicEvent is one event of a Messages stream.
type anthropicEvent struct {
	name string
	data map[string]any
}

// messagesEvents reads a Messages stream: each event's name and data,
// checking that every data is JSON whose type is the event's name.
func messagesEvents(t *testing.T, body string) []anthropicEvent {
	t.Helper()
	var out []anthropicEvent
	if err := sse.ReadAll(strings.NewReader(body), func(e sse.Event) error {
		var data map[string]any
		if err := json.Unmarshal(e.Data, &data); err != nil {
			return fmt.Errorf("event %s: %q is not JSON", e.Type, e.Data)
		}
		if data["type"] != e.Type {
			return fmt.Errorf("event %s: data of type %v", e.Type, data["type"])
		}
		out = append(out, anthropicEvent{e.Type, data})
		return nil
	}); err != nil {
		t.Fatalf("%v in %s", err, body)
	}
	return out
}

func eventNames(evs []anthropicEvent) []string {
	names := make([]string, len(evs))
	for i, e := range evs {
		names[i] = e.name
	}
	return names
}

// accumulate builds the message a client's stream helper builds from the
// events (the @anthropic-ai/sdk MessageStream's accumulation): the
// message_start message, blocks started, deltas appended, message_delta's
// stop reason and usage.
func accumulate(t *testing.T, evs []anthropicEvent) map[string]any {
	t.Helper()
	var msg map[string]any
	var blocks []map[string]any
	var inputs []string
	for _, e := range evs {
		switch e.name {
		case "message_start":
			msg = e.data["message"].(map[string]any)
		case "content_block_start":
			blocks = append(blocks, e.data["content_block"].(map[string]any))
			inputs = append(inputs, "")
		case "content_block_delta":
			i := int(e.data["index"].(float64))
			d := e.data["delta"].(map[string]any)
			switch d["type"] {
			case "text_delta":
				blocks[i]["text"] = blocks[i]["text"].(string) + d["text"].(string)
			case "thinking_delta":
				blocks[i]["thinking"] = blocks[i]["thinking"].(string) + d["thinking"].(string)
			case "signature_delta":
				blocks[i]["signature"] = d["signature"]
			case "input_json_delta":
				inputs[i] += d["partial_json"].(string)
			}
		case "content_block_stop":
			i := int(e.data["index"].(float64))
			if blocks[i]["type"] == "tool_use" && inputs[i] != "" {
				var in any
				if err := json.Unmarshal([]byte(inputs[i]), &in); err != nil {
					t.Fatalf("tool input %q: %v", inputs[i], err)
				}
				blocks[i]["input"] = in
			}
		case "message_delta":
			d := e.data["delta"].(map[string]any)
			msg["stop_reason"], msg["stop_sequence"] = d["stop_reason"], d["stop_sequence"]
			msg["usage"] = e.data["usage"]
		}
	}
	content := make([]any, len(blocks))
	for i, b := range blocks {
		content[i] = b
	}
	msg["content"] = content
	return msg
}

func anyJSON(t *testing.T, s string) any {
	t.Helper()
	var v any
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		t.Fatalf("%s: %v", s, err)
	}
	return v
}

const messagesBody = `{"model":"m","max_tokens":100,"messages":[{"role":"user","content":"hi"}]`

// TestMessagesNormalized: a normalized run's thinking, text and tool-call
// parts become a message's blocks, whole and streamed (the same message
// either way), with the run's usage and the stop reason of its finish.
func TestMessagesNormalized(t *testing.T) {
	script := func() *apitest.FakeRun {
		return apitest.ScriptedRun(apitest.Normalized,
			apitest.Events(apitest.Started(), thinkingDelta("hmm "), thinkingDelta("yes")),
			apitest.Events(apitest.Delta("Hel"), apitest.Delta("lo")),
			apitest.Events(toolPart(0, "", "get_weather", `{"city":"Paris"}`)),
			apitest.Events(apitest.Usage(12, 7), apitest.Complete("stop")))
	}
	want := anyJSON(t, `{"id":"msg_run1","type":"message","role":"assistant","model":"m","content":[
	  {"type":"thinking","thinking":"hmm yes","signature":"SIG"},{"type":"text","text":"Hello"},
	  {"type":"tool_use","id":"toolu_run1_0","name":"get_weather","input":{"city":"Paris"}}],
	  "stop_reason":"tool_use","stop_sequence":null,"usage":{"input_tokens":12,"output_tokens":7}}`).(map[string]any)
	thinking := `,"thinking":{"type":"enabled","budget_tokens":1024},"max_tokens":2000`
	for _, stream := range []bool{false, true} {
		env := newEnv(t, api.Config{}, runWith(script()))
		resp := env.post(t, messagesPath, "application/json", messagesBody+thinking+fmt.Sprintf(`,"stream":%v}`, stream))
		if resp.status != http.StatusOK {
			t.Fatalf("stream %v: status %d: %s", stream, resp.status, resp.body)
		}
		var got map[string]any
		if stream {
			if ct := resp.header.Get("Content-Type"); ct != "text/event-stream" {
				t.Errorf("Content-Type %q", ct)
			}
			evs := messagesEvents(t, resp.body)
			names := eventNames(evs)
			wantNames := []string{"message_start", "ping",
				"content_block_start", "content_block_delta", "content_block_delta", "content_block_delta", "content_block_stop",
				"content_block_start", "content_block_delta", "content_block_delta", "content_block_stop",
				"content_block_start", "content_block_delta", "content_block_stop",
				"message_delta", "message_stop"}
			if !reflect.DeepEqual(names, wantNames) {
				t.Errorf("events\n got %q\nwant %q", names, wantNames)
			}
			got = accumulate(t, evs)
		} else if err := json.Unmarshal([]byte(resp.body), &got); err != nil {
			t.Fatal(err)
		}
		blocks, _ := got["content"].([]any)
		if len(blocks) > 0 {
			sig, _ := blocks[0].(map[string]any)["signature"].(string)
			if sig == "" {
				t.Errorf("stream %v: no signature on the thinking block", stream)
			}
			blocks[0].(map[string]any)["signature"] = "SIG"
		}
		if !reflect.DeepEqual(got, want) {
			g, _ := json.Marshal(got)
			t.Errorf("stream %v: message\n got %s", stream, g)
		}
		reqs := env.GW.Requests()
		if len(reqs) != 1 || reqs[0].Operation != contract.OperationChat || !reqs[0].Stream {
			t.Fatalf("dispatched %+v", reqs)
		}
	}
}

// TestMessagesNoThinkingUnlessEnabled: reasoning a provider sends for a
// request that did not enable thinking (Anthropic's default) is not shown.
func TestMessagesNoThinkingUnlessEnabled(t *testing.T) {
	env := newEnv(t, api.Config{}, runWith(apitest.ScriptedRun(apitest.Normalized,
		apitest.Events(apitest.Started(), thinkingDelta("hmm"), apitest.Delta("ok"), apitest.Complete("length")))))
	resp := env.post(t, messagesPath, "", messagesBody+`}`)
	var got struct {
		Content    []map[string]any `json:"content"`
		StopReason string           `json:"stop_reason"`
	}
	if err := json.Unmarshal([]byte(resp.body), &got); err != nil || resp.status != 200 {
		t.Fatalf("%d %s", resp.status, resp.body)
	}
	if len(got.Content) != 1 || got.Content[0]["type"] != "text" || got.StopReason != "max_tokens" {
		t.Errorf("answer %s", resp.body)
	}
}

// openAIStreamBody is an OpenAI-compatible provider's SSE answer with
// reasoning, text and a tool call whose arguments come in pieces.
const openAIStreamBody = `data: {"choices":[{"index":0,"delta":{"role":"assistant","reasoning_content":"th"}}]}

data: {"choices":[{"index":0,"delta":{"reasoning_content":"ink"}}]}

data: {"choices":[{"index":0,"delta":{"content":"Hé"}}]}

data: {"choices":[{"index":0,"delta":{"content":"llo"}}]}

data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_9","type":"function","function":{"name":"get_weather","arguments":""}}]}}]}

data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"city\":"}}]}}]}

data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"\"Paris\"}"}}]}}]}

data: {"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}

data: {"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":4}}

data: [DONE]

`

// TestMessagesTunnelSplitWrites: the provider's SSE bytes split at every
// awkward boundary (inside "data:", inside a multi-byte character, between
// the two newlines of an event's end) give the same Messages stream as
// one write: thinking deltas, text deltas, the tool call as
// input_json_delta, the stop reason and usage.
// (The tool arguments come in two deltas and leave as two input_json_deltas:
// a tool call streams on the tunnel path too.)
func TestMessagesTunnelSplitWrites(t *testing.T) {
	want := anyJSON(t, `{"id":"msg_run1","type":"message","role":"assistant","model":"m","content":[
	  {"type":"thinking","thinking":"think","signature":"SIG"},{"type":"text","text":"Héllo"},
	  {"type":"tool_use","id":"toolu_9","name":"get_weather","input":{"city":"Paris"}}],
	  "stop_reason":"tool_use","stop_sequence":null,"usage":{"input_tokens":9,"output_tokens":4}}`)
	head := apitest.TunnelHead(200, map[string]string{"Content-Type": "text/event-stream"})
	for _, size := range []int{len(openAIStreamBody), 1, 2, 3, 5, 7, 64} {
		msgs := []*nodev1.RunUp{head}
		for i := 0; i < len(openAIStreamBody); i += size {
			msgs = append(msgs, apitest.TunnelData(openAIStreamBody[i:min(i+size, len(openAIStreamBody))]))
		}
		msgs = append(msgs, apitest.TunnelEnd())
		env := newEnv(t, api.Config{}, runWith(apitest.ScriptedRun(apitest.Tunnel, msgs...)))
		resp := env.post(t, messagesPath, "application/json", messagesBody+`,"max_tokens":2000,"stream":true,"thinking":{"type":"enabled","budget_tokens":1024}}`)
		if resp.status != 200 {
			t.Fatalf("size %d: %d %s", size, resp.status, resp.body)
		}
		evs := messagesEvents(t, resp.body)
		if eventNames(evs)[len(evs)-1] != "message_stop" {
			t.Fatalf("size %d: stream does not end with message_stop: %s", size, resp.body)
		}
		deltas := map[string]int{}
		for _, e := range evs {
			if e.name == "content_block_delta" {
				deltas[e.data["delta"].(map[string]any)["type"].(string)]++
			}
		}
		if deltas["thinking_delta"] != 2 || deltas["text_delta"] != 2 || deltas["input_json_delta"] != 2 || deltas["signature_delta"] != 1 {
			t.Errorf("size %d: deltas %v", size, deltas)
		}
		got := accumulate(t, evs)
		got["content"].([]any)[0].(map[string]any)["signature"] = "SIG"
		if !reflect.DeepEqual(got, want) {
			g, _ := json.Marshal(got)
			t.Errorf("size %d: message\n got %s", size, g)
		}
	}
}

// TestMessagesTunnelWhole: a provider's JSON answer (not SSE) becomes the
// same message.
func TestMessagesTunnelWhole(t *testing.T) {
	body := `{"choices":[{"index":0,"message":{"role":"assistant","content":"hi","tool_calls":[{"id":"call_1","type":"function","function":{"name":"f","arguments":"{\"a\":1}"}}]},"finish_reason":"tool_calls"}],"usage":{"prompt_tokens":3,"completion_tokens":2}}`
	env := newEnv(t, api.Config{}, runWith(apitest.ScriptedRun(apitest.Tunnel,
		apitest.TunnelHead(200, map[string]string{"Content-Type": "application/json"}), apitest.TunnelData(body), apitest.TunnelEnd())))
	resp := env.post(t, messagesPath, "application/json", messagesBody+`}`)
	want := anyJSON(t, `{"id":"msg_run1","type":"message","role":"assistant","model":"m","content":[{"type":"text","text":"hi"},
	  {"type":"tool_use","id":"toolu_1","name":"f","input":{"a":1}}],"stop_reason":"tool_use","stop_sequence":null,
	  "usage":{"input_tokens":3,"output_tokens":2}}`)
	if resp.status != 200 || !reflect.DeepEqual(anyJSON(t, resp.body), want) {
		t.Errorf("%d %s", resp.status, resp.body)
	}
}

// TestMessagesErrorMidStream: a run that fails after the stream began
// ends with `event: error` in Anthropic's shape and no message_stop, on
// both paths (the provider's error event inside its 200 stream, a node's
// failure event).
func TestMessagesErrorMidStream(t *testing.T) {
	for name, run := range map[string]func() *apitest.FakeRun{
		"normalized": func() *apitest.FakeRun {
			return apitest.ScriptedRun(apitest.Normalized, apitest.Events(apitest.Started(), apitest.Delta("par")), apitest.Events(apitest.ErrorEvent(502, "model crashed")))
		},
		"tunnel provider error": func() *apitest.FakeRun {
			return apitest.ScriptedRun(apitest.Tunnel, apitest.TunnelHead(200, map[string]string{"Content-Type": "text/event-stream"}),
				apitest.TunnelData(`data: {"choices":[{"index":0,"delta":{"content":"par"}}]}`+"\n\n"),
				apitest.TunnelData(`data: {"error":{"message":"model crashed"}}`+"\n\n"), apitest.TunnelEnd())
		},
		"tunnel cut": func() *apitest.FakeRun {
			return apitest.ScriptedRun(apitest.Tunnel, apitest.TunnelHead(200, map[string]string{"Content-Type": "text/event-stream"}),
				apitest.TunnelData(`data: {"choices":[{"index":0,"delta":{"content":"par"}}]}`+"\n\n"), apitest.TunnelError(502, "connection reset"))
		},
	} {
		env := newEnv(t, api.Config{}, runWith(run()))
		resp := env.post(t, messagesPath, "application/json", messagesBody+`,"stream":true}`)
		if resp.status != 200 {
			t.Fatalf("%s: status %d", name, resp.status)
		}
		evs := messagesEvents(t, resp.body)
		last := evs[len(evs)-1]
		if last.name != "error" || slices.Contains(eventNames(evs), "message_stop") {
			t.Errorf("%s: events %q", name, eventNames(evs))
			continue
		}
		e, _ := last.data["error"].(map[string]any)
		if e["type"] != "api_error" || e["message"] == "" {
			t.Errorf("%s: error event %v", name, last.data)
		}
	}
}

// anthropicErrorOf decodes an Anthropic error body, failing unless it is
// exactly {"type":"error","error":{"type","message"}}.
func anthropicErrorOf(t *testing.T, body string) (typ, message string) {
	t.Helper()
	var shape struct {
		Type  string            `json:"type"`
		Error map[string]string `json:"error"`
	}
	if err := json.Unmarshal([]byte(body), &shape); err != nil || shape.Type != "error" || len(shape.Error) != 2 || shape.Error["message"] == "" {
		t.Fatalf("error body %q is not Anthropic's error shape", body)
	}
	return shape.Error["type"], shape.Error["message"]
}

// TestMessagesErrorStatuses: iop's refusals in Anthropic's statuses and
// error types (Anthropic API reference, "Errors"): a full queue and a
// queue timeout are 529 overloaded_error with Retry-After; no provider
// now 503 overloaded_error with Retry-After; an unknown model 404
// not_found_error; a capability no candidate has 400; a node failing
// before the first byte 502 api_error.
func TestMessagesErrorStatuses(t *testing.T) {
	for _, tc := range []struct {
		err        error
		status     int
		typ        string
		retryAfter bool
	}{
		{fmt.Errorf("%w: m", api.ErrQueueFull), 529, "overloaded_error", true},
		{fmt.Errorf("%w: m", api.ErrQueueTimeout), 529, "overloaded_error", true},
		{fmt.Errorf("%w: m", api.ErrNoProvider), 503, "overloaded_error", true},
		{fmt.Errorf("%w: m", api.ErrProviderUnavailable), 503, "overloaded_error", true},
		{fmt.Errorf("%w: m", api.ErrUnknownModel), 404, "not_found_error", false},
		{fmt.Errorf("%w: no candidate has vision", api.ErrCandidatesRejected), 400, "invalid_request_error", false},
		{fmt.Errorf("%w: x", api.ErrNodeGone), 502, "api_error", false},
		{api.ErrShuttingDown, 503, "api_error", true},
		{fmt.Errorf("boom"), 500, "api_error", false},
	} {
		env := newEnv(t, api.Config{}, apitest.FailWith(tc.err))
		resp := env.post(t, messagesPath, "application/json", messagesBody+`}`)
		typ, _ := anthropicErrorOf(t, resp.body)
		if resp.status != tc.status || typ != tc.typ || (resp.header.Get("Retry-After") != "") != tc.retryAfter {
			t.Errorf("%v: %d %s Retry-After %q, want %d %s (Retry-After %v)", tc.err, resp.status, typ,
				resp.header.Get("Retry-After"), tc.status, tc.typ, tc.retryAfter)
		}
	}
}

// TestMessagesBadInput: bad requests are answered in Anthropic's shape
// with its status, before anything is dispatched.
func TestMessagesBadInput(t *testing.T) {
	env := newEnv(t, api.Config{MaxBodyBytes: 4096}, okRun)
	for _, tc := range []struct {
		method, path, contentType, body string
		status                          int
		typ                             string
	}{
		{"POST", messagesPath, "application/json", `{"model":"m","messages":[{"role":"user","content":"x"}]}`, 400, "invalid_request_error"},
		{"POST", messagesPath, "application/json", `{"model":"m","max_tokens":0,"messages":[{"role":"user","content":"x"}]}`, 400, "invalid_request_error"},
		{"POST", messagesPath, "application/json", `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"x"}],"tools":[{"type":"web_search_20250305","name":"web_search"}]}`, 400, "invalid_request_error"},
		{"POST", messagesPath, "application/json", `{"model":`, 400, "invalid_request_error"},
		{"POST", messagesPath, "text/plain", messagesBody + `}`, 415, "invalid_request_error"},
		{"POST", messagesPath, "application/json", `{"model":"` + strings.Repeat("x", 5000) + `"}`, 413, "request_too_large"},
		{"GET", messagesPath, "", "", 405, "invalid_request_error"},
		{"POST", messagesPath + "/batches", "application/json", `{}`, 404, "not_found_error"},
		{"POST", countTokensPath, "application/json", `{"model":"m","messages":[]}`, 400, "invalid_request_error"},
		{"POST", countTokensPath, "application/json", `{"model":"nope","messages":[{"role":"user","content":"x"}]}`, 404, "not_found_error"},
	} {
		resp := env.send(t, tc.method, tc.path, tc.body, map[string]string{"Content-Type": tc.contentType})
		typ, msg := anthropicErrorOf(t, resp.body)
		if resp.status != tc.status || typ != tc.typ {
			t.Errorf("%s %s %.60s: %d %s %q, want %d %s", tc.method, tc.path, tc.body, resp.status, typ, msg, tc.status, tc.typ)
		}
	}
	if n := len(env.GW.Requests()); n != 0 {
		t.Errorf("%d requests dispatched", n)
	}
}

// TestMessagesAuth: the keys Anthropic clients send (x-api-key, or
// Authorization: Bearer) are accepted; anthropic-version and
// anthropic-beta are accepted, not required; refusals are Anthropic's
// 401 authentication_error, 403 permission_error and 429
// rate_limit_error.
func TestMessagesAuth(t *testing.T) {
	f := newKeys(t, auth.Key{Models: []string{"m"}, MaxConcurrent: 1})
	block := make(chan struct{})
	dispatched := make(chan struct{}, 4)
	env := newEnv(t, api.Config{Keys: f.keys, AdminKeys: f.admin}, func(ctx context.Context, req contract.Request) (Run, error) {
		dispatched <- struct{}{}
		if strings.Contains(string(req.Body), "hold") {
			<-block
		}
		return apitest.ScriptedRun(apitest.Normalized, apitest.Events(apitest.Started(), apitest.Delta("ok"), apitest.Complete("stop"))), nil
	})
	post := func(header map[string]string, body string) rawResponse {
		header["Content-Type"] = "application/json"
		return env.send(t, "POST", messagesPath, body, header)
	}
	ok := messagesBody + `}`
	for _, h := range []map[string]string{
		{"x-api-key": f.alice, "anthropic-version": "2023-06-01"},
		{"Authorization": "Bearer " + f.alice, "anthropic-beta": "tools-2024-04-04"},
		{"x-api-key": f.bob},
	} {
		if resp := post(h, ok); resp.status != 200 {
			t.Errorf("%v: %d %s", h, resp.status, resp.body)
		}
	}
	for _, tc := range []struct {
		header map[string]string
		body   string
		status int
		typ    string
	}{
		{map[string]string{}, ok, 401, "authentication_error"},
		{map[string]string{"x-api-key": "wrong"}, ok, 401, "authentication_error"},
		{map[string]string{"x-api-key": f.adminKey}, ok, 403, "permission_error"},
		{map[string]string{"x-api-key": f.alice}, strings.Replace(ok, `"m"`, `"alias"`, 1), 403, "permission_error"},
	} {
		resp := post(tc.header, tc.body)
		if typ, _ := anthropicErrorOf(t, resp.body); resp.status != tc.status || typ != tc.typ {
			t.Errorf("%v: %d %s, want %d %s", tc.header, resp.status, typ, tc.status, tc.typ)
		}
	}
	// alice's one request slot is taken: her next request is 429.
	done := make(chan rawResponse)
	go func() {
		done <- post(map[string]string{"x-api-key": f.alice}, strings.Replace(ok, `"hi"`, `"hold"`, 1))
	}()
	for range 4 { // the three answered above, then the held one
		<-dispatched
	}
	resp := post(map[string]string{"x-api-key": f.alice}, ok)
	if typ, _ := anthropicErrorOf(t, resp.body); resp.status != 429 || typ != "rate_limit_error" || resp.header.Get("Retry-After") == "" {
		t.Errorf("over the limit: %d %s Retry-After %q", resp.status, typ, resp.header.Get("Retry-After"))
	}
	close(block)
	if r := <-done; r.status != 200 {
		t.Errorf("held request: %d %s", r.status, r.body)
	}
}

// TestMessagesDispatchedRequest: what the edge admits a Messages request
// with: operation chat, the needs its translation found (tools, vision,
// remote images, thinking, tool_choice for "any"), the estimate
// count_tokens answers, the Ollama-only fields apart from the body.
func TestMessagesDispatchedRequest(t *testing.T) {
	env := newEnv(t, api.Config{}, okRun)
	body := `{"model":"m","max_tokens":2000,"top_k":5,"thinking":{"type":"enabled","budget_tokens":1024},
	 "tools":[{"name":"f","input_schema":{"type":"object"}}],"tool_choice":{"type":"any"},
	 "messages":[{"role":"user","content":[{"type":"text","text":"look"},{"type":"image","source":{"type":"url","url":"https://x/y.png"}}]}]}`
	if resp := env.post(t, messagesPath, "application/json", body); resp.status != 200 {
		t.Fatalf("%d %s", resp.status, resp.body)
	}
	reqs := env.GW.Requests()
	if len(reqs) != 1 {
		t.Fatalf("%d requests", len(reqs))
	}
	req := reqs[0]
	wantNeeds := []string{request.NeedTools, request.NeedVision, request.NeedRemoteImages, request.NeedThinking} // "any" is served everywhere
	if req.Model != "m" || req.Operation != contract.OperationChat || !reflect.DeepEqual(req.Needs, wantNeeds) {
		t.Errorf("request %+v", req)
	}
	if !reflect.DeepEqual(anyJSON(t, string(req.OllamaFields)), anyJSON(t, `{"think":true,"options":{"top_k":5}}`)) {
		t.Errorf("OllamaFields %s", req.OllamaFields)
	}
	if strings.Contains(string(req.Body), "top_k") || strings.Contains(string(req.Body), "thinking") {
		t.Errorf("body %s carries Anthropic-only fields", req.Body)
	}
	resp := env.post(t, countTokensPath, "application/json", body)
	var n struct {
		InputTokens int `json:"input_tokens"`
	}
	if err := json.Unmarshal([]byte(resp.body), &n); err != nil || resp.status != 200 || n.InputTokens != req.EstimatedInputTokens || n.InputTokens == 0 {
		t.Errorf("count_tokens %d %s, dispatched estimate %d", resp.status, resp.body, req.EstimatedInputTokens)
	}
}

// TestMessagesClientGoneCancelsRun: a streaming client that goes away
// mid-answer cancels its run (the node is told, the lease is released)
// and the run is closed once with outcome client_gone... as any route's.
func TestMessagesClientGoneCancelsRun(t *testing.T) {
	for _, path := range []contract.Path{apitest.Normalized, apitest.Tunnel} {
		run := apitest.LiveRun(path, 4)
		env := newEnv(t, api.Config{}, runWith(run))
		if path == apitest.Normalized {
			run.Up <- apitest.Events(apitest.Started(), apitest.Delta("first"))
		} else {
			run.Up <- apitest.TunnelHead(200, map[string]string{"Content-Type": "text/event-stream"})
			run.Up <- apitest.TunnelData(`data: {"choices":[{"index":0,"delta":{"content":"first"}}]}` + "\n\n")
		}
		ctx, cancel := context.WithCancel(context.Background())
		req, _ := http.NewRequestWithContext(ctx, "POST", env.Srv.URL+messagesPath, strings.NewReader(messagesBody+`,"stream":true}`))
		resp, err := env.Srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 4096)
		got := ""
		for !strings.Contains(got, "first") {
			n, err := resp.Body.Read(buf)
			if err != nil {
				t.Fatalf("%v: reading: %v (%q)", path, err, got)
			}
			got += string(buf[:n])
		}
		cancel()
		resp.Body.Close()
		env.WaitHandlers()
		if len(run.CancelReasons()) == 0 {
			t.Errorf("%v: the run was not cancelled", path)
		}
		if n, outcomes := run.CloseCalls(); n != 1 || outcomes[0] != contract.OutcomeClientGone {
			t.Errorf("%v: Close %d times, outcomes %v", path, n, outcomes)
		}
	}
}

// TestMessagesFailureBeforeOutput: a run that fails before any output is
// answered with its own status (the node could not translate the request
// for its provider: 400), not a 200 stream.
func TestMessagesFailureBeforeOutput(t *testing.T) {
	env := newEnv(t, api.Config{}, runWith(apitest.ScriptedRun(apitest.Normalized, apitest.Events(apitest.Started(),
		&nodev1.RunEvent{Type: nodev1.RunEvent_TYPE_ERROR, Status: 400, InvalidRequest: true, Param: "tool_choice", Error: "tool_choice: required cannot be honoured"}))))
	resp := env.post(t, messagesPath, "application/json", messagesBody+`,"stream":true}`)
	if typ, msg := anthropicErrorOf(t, resp.body); resp.status != 400 || typ != "invalid_request_error" || !strings.Contains(msg, "tool_choice") {
		t.Errorf("%d %s", resp.status, resp.body)
	}
}

// TestMessagesRecords: a Messages request is recorded as every API
// request is (one RequestRecord: its API, where it went, its status,
// outcome and tokens), on both paths, and so is a refusal (529, queue
// full, outcome refused).
func TestMessagesRecords(t *testing.T) {
	const tunnelSSE = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"},\"finish_reason\":\"stop\"}]}\n\n" +
		"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":1}}\n\ndata: [DONE]\n\n"
	for _, tc := range []struct {
		path contract.Path
		run  func() *apitest.FakeRun
	}{
		{apitest.Normalized, func() *apitest.FakeRun {
			return apitest.ScriptedRun(apitest.Normalized, apitest.Events(apitest.Started(), apitest.Delta("hi")), apitest.Events(apitest.Usage(5, 1), apitest.Complete("stop")))
		}},
		{apitest.Tunnel, func() *apitest.FakeRun {
			return apitest.ScriptedRun(apitest.Tunnel, apitest.TunnelHead(200, map[string]string{"Content-Type": "text/event-stream"}), apitest.TunnelData(tunnelSSE), apitest.TunnelEnd())
		}},
	} {
		recs := &records{}
		env := newEnv(t, api.Config{Observer: recs, Now: apitest.Ticking()}, runWith(tc.run()))
		if resp := env.post(t, messagesPath, "application/json", messagesBody+`,"stream":true}`); resp.status != 200 {
			t.Fatalf("%v: %d", tc.path, resp.status)
		}
		env.WaitHandlers()
		rec := recs.Only(t)
		if rec.API != "anthropic.messages" || rec.Model != "m" || !rec.Stream || rec.RunID != "run1" || rec.Status != 200 ||
			rec.Outcome != contract.OutcomeCompleted || rec.InputTokens != 5 || rec.OutputTokens != 1 || !rec.TokensKnown || rec.TimeToFirstToken <= 0 {
			t.Errorf("%v: record %+v", tc.path, rec)
		}
	}
	recs := &records{}
	env := newEnv(t, api.Config{Observer: recs}, apitest.FailWith(fmt.Errorf("%w: m", api.ErrQueueFull)))
	env.post(t, messagesPath, "application/json", messagesBody+`}`)
	env.WaitHandlers()
	if rec := recs.Only(t); rec.API != "anthropic.messages" || rec.Status != 529 || rec.Outcome != contract.OutcomeRefused || rec.ErrorCode != "queue_full" {
		t.Errorf("refusal record %+v", rec)
	}
}

// TestMessagesLateToolPart: a normalized run whose tool call gets a part
// after another block began cannot be streamed as Anthropic's blocks: the
// stream ends with an error event (502's api_error, the upstream broke the
// answer; not a 500 of iop's), not a wrong answer.
func TestMessagesLateToolPart(t *testing.T) {
	env := newEnv(t, api.Config{}, runWith(apitest.ScriptedRun(apitest.Normalized,
		apitest.Events(apitest.Started(), toolPart(0, "", "f", `{"a":1}`), toolPart(1, "", "g", `{}`)),
		apitest.Events(toolPart(0, "", "", `{}`), apitest.Complete("tool_calls")))))
	resp := env.post(t, messagesPath, "application/json", messagesBody+`,"stream":true}`)
	evs := messagesEvents(t, resp.body)
	last := evs[len(evs)-1]
	e, _ := last.data["error"].(map[string]any)
	msg, _ := e["message"].(string)
	if last.name != "error" || e["type"] != "api_error" || !strings.Contains(msg, "a tool call's part came after another block") {
		t.Errorf("events %q, last %v", eventNames(evs), last.data)
	}
}

// TestRegression_MessagesToolChoiceAnyInItsOwnWords: a Messages request
// with tool_choice "any" for a model only Ollama providers serve was
// refused in the chat API's words (tool_choice "required" or
// parallel_tool_calls false), which the client never sent.
func TestRegression_MessagesToolChoiceAnyInItsOwnWords(t *testing.T) {
	refusal := fmt.Errorf(`%w: no provider for model "m" honours tool_choice "required" or parallel_tool_calls false: only OpenAI-compatible providers do`, api.ErrCandidatesRejected)
	env := newEnv(t, api.Config{}, apitest.FailWith(refusal))
	resp := env.post(t, messagesPath, "application/json", messagesBody+`,"tools":[{"name":"f","input_schema":{"type":"object"}}],"tool_choice":{"type":"any"}}`)
	typ, msg := anthropicErrorOf(t, resp.body)
	if resp.status != 400 || typ != "invalid_request_error" || !strings.Contains(msg, `tool_choice "any"`) || strings.Contains(msg, "required") {
		t.Errorf("%d %s %q", resp.status, typ, msg)
	}
}

// TestRegression_MessagesToolArgumentsNotAnObject: a provider whose tool
// call's arguments are not a JSON object ("{broken", "[1,2]") was
// answered 200 with "input":{} (the arguments silently replaced) when not
// streamed, and streamed as input_json_delta "{broken" then message_stop,
// which the SDK's JSON parse throws on. Now both are the provider's
// broken answer, on both paths: 502 api_error before the stream began,
// and after it the input_json_delta as it came, then `event: error`
// (api_error) with neither the block's content_block_stop nor a
// message_stop.
func TestRegression_MessagesToolArgumentsNotAnObject(t *testing.T) {
	for _, args := range []string{`{broken`, `[1,2]`} {
		quoted, _ := json.Marshal(args)
		sseBody := `data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"f","arguments":""}}]}}]}` + "\n\n" +
			`data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":` + string(quoted) + `}}]}}]}` + "\n\n" +
			`data: {"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}` + "\n\ndata: [DONE]\n\n"
		jsonBody := `{"choices":[{"index":0,"message":{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"f","arguments":` +
			string(quoted) + `}}]},"finish_reason":"tool_calls"}]}`
		runs := map[string]func() *apitest.FakeRun{
			"normalized": func() *apitest.FakeRun {
				return apitest.ScriptedRun(apitest.Normalized, apitest.Events(apitest.Started(), toolPart(0, "call_1", "f", args)), apitest.Events(apitest.Complete("tool_calls")))
			},
			"tunnel SSE": func() *apitest.FakeRun {
				return apitest.ScriptedRun(apitest.Tunnel, apitest.TunnelHead(200, map[string]string{"Content-Type": "text/event-stream"}), apitest.TunnelData(sseBody), apitest.TunnelEnd())
			},
			"tunnel JSON": func() *apitest.FakeRun {
				return apitest.ScriptedRun(apitest.Tunnel, apitest.TunnelHead(200, map[string]string{"Content-Type": "application/json"}), apitest.TunnelData(jsonBody), apitest.TunnelEnd())
			},
		}
		for name, run := range runs {
			for _, stream := range []bool{false, true} {
				env := newEnv(t, api.Config{}, runWith(run()))
				resp := env.post(t, messagesPath, "application/json", messagesBody+fmt.Sprintf(`,"stream":%v}`, stream))
				what := fmt.Sprintf("%s %q stream %v", name, args, stream)
				if !stream {
					typ, msg := anthropicErrorOf(t, resp.body)
					if resp.status != http.StatusBadGateway || typ != "api_error" || !strings.Contains(msg, args) {
						t.Errorf("%s: %d %s", what, resp.status, resp.body)
					}
					continue
				}
				evs := messagesEvents(t, resp.body)
				names := eventNames(evs)
				want := []string{"message_start", "ping", "content_block_start", "content_block_delta", "error"}
				if resp.status != 200 || !reflect.DeepEqual(names, want) {
					t.Errorf("%s: %d events %q, want %q", what, resp.status, names, want)
					continue
				}
				if d := evs[3].data["delta"].(map[string]any); d["type"] != "input_json_delta" || d["partial_json"] != args {
					t.Errorf("%s: delta %v", what, d)
				}
				if e, _ := evs[4].data["error"].(map[string]any); e["type"] != "api_error" || !strings.Contains(e["message"].(string), args) {
					t.Errorf("%s: error %v", what, evs[4].data)
				}
			}
		}
	}
}

// TestRegression_MessagesValidatedAsTheReference: bodies Anthropic's
// reference refuses, which the edge dispatched (a text/plain image, a
// temperature of 1.5, a top_p of 7, max_tokens cut to 2147483647, a
// file:// image) or refused naming another field (bad base64 padding:
// the node named "messages[0].content[0].image_url"; content []: "messages
// must not be empty"), are refused 400 invalid_request_error naming the
// field, on either route (create and count_tokens), with nothing
// dispatched.
func TestRegression_MessagesValidatedAsTheReference(t *testing.T) {
	env := newEnv(t, api.Config{}, okRun)
	image := func(src string) string {
		return `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":[{"type":"image","source":` + src + `}]}]}`
	}
	const msgs = `"messages":[{"role":"user","content":"x"}]`
	for _, tc := range []struct{ body, field string }{
		{image(`{"type":"base64","media_type":"text/plain","data":"aGk="}`), "messages[0].content[0].source.media_type"},
		{image(`{"type":"base64","media_type":"image/png","data":"aGVsbG8"}`), "messages[0].content[0].source.data"},
		{image(`{"type":"url","url":"file:///etc/passwd"}`), "messages[0].content[0].source.url"},
		{`{"model":"m","max_tokens":5,` + msgs + `,"temperature":1.5}`, "temperature"},
		{`{"model":"m","max_tokens":5,` + msgs + `,"top_p":7}`, "top_p"},
		{`{"model":"m","max_tokens":99999999999,` + msgs + `}`, "max_tokens"},
		{`{"model":"m","max_tokens":5,"messages":[{"role":"user","content":[]}]}`, "messages[0].content"},
	} {
		for _, path := range []string{messagesPath, countTokensPath} {
			resp := env.post(t, path, "application/json", tc.body)
			typ, msg := anthropicErrorOf(t, resp.body)
			if resp.status != 400 || typ != "invalid_request_error" || !strings.HasPrefix(msg, tc.field+": ") {
				t.Errorf("%s %s: %d %s %q, want 400 naming %s", path, tc.body, resp.status, typ, msg, tc.field)
			}
		}
	}
	if n := len(env.GW.Requests()); n != 0 {
		t.Errorf("%d requests dispatched", n)
	}
}
