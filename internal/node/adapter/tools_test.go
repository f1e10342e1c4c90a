package adapter

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"iop/internal/wire/nodev1"
)

// TestRegression_OllamaToolCallsDropped: tool calls from an Ollama provider
// used to be dropped (RunEvent had no field for them). Ollama sends whole
// calls without ids; they become tool-call deltas numbered in order of
// arrival, with a new "call_" id each (or Ollama's own), arguments as JSON
// text, and finish reason tool_calls.
func TestRegression_OllamaToolCallsDropped(t *testing.T) {
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		flushLines(w,
			`{"message":{"role":"assistant","content":"","tool_calls":[{"function":{"name":"get_weather","arguments":{"city":"Paris"}}}]},"done":false}`,
			`{"message":{"role":"assistant","content":"","tool_calls":[{"id":"call_ollama1","function":{"name":"get_time","arguments":{}}}]},"done":false}`,
			`{"message":{"role":"assistant","content":""},"done":true,"done_reason":"stop","prompt_eval_count":7,"eval_count":12}`)
	})
	o := newOllama(t, Config{BaseURL: up.URL})
	rec := &eventRec{}
	body := `{"model":"x","messages":[{"role":"user","content":"weather?"}],"tools":[{"type":"function","function":{"name":"get_weather"}}]}`
	if err := o.Normalize(context.Background(), Request{Op: nodev1.Operation_OPERATION_CHAT, ServedModel: "m", Body: []byte(body)}, rec); err != nil {
		t.Fatal(err)
	}
	var calls []*nodev1.ToolCallDelta
	for _, ev := range rec.events {
		calls = append(calls, ev.GetToolCalls()...)
	}
	if len(calls) != 2 {
		t.Fatalf("tool calls %v", calls)
	}
	if c := calls[0]; c.Index != 0 || !strings.HasPrefix(c.Id, "call_") || len(c.Id) != len("call_")+24 || c.Name != "get_weather" || c.Arguments != `{"city":"Paris"}` {
		t.Errorf("first call %v", c)
	}
	if c := calls[1]; c.Index != 1 || c.Id != "call_ollama1" || c.Name != "get_time" || c.Arguments != `{}` {
		t.Errorf("second call %v", c)
	}
	if fin := rec.last(nodev1.RunEvent_TYPE_COMPLETE); fin.GetFinishReason() != "tool_calls" {
		t.Errorf("finish %q, want tool_calls", fin.GetFinishReason())
	}
	if u := rec.last(nodev1.RunEvent_TYPE_USAGE); u.GetPromptTokens() != 7 || u.GetCompletionTokens() != 12 {
		t.Errorf("usage %v", u)
	}
	_, _, sent := up.request()
	var got struct {
		Tools []json.RawMessage `json:"tools"`
	}
	if json.Unmarshal(sent, &got) != nil || len(got.Tools) != 1 {
		t.Errorf("tools not forwarded: %s", sent)
	}
}

// A request that Ollama cannot answer as asked is refused naming the field,
// before the provider is called.
func TestOllamaRefusesFieldsItCannotHonour(t *testing.T) {
	for _, tc := range []struct {
		op    nodev1.Operation
		body  string
		field string
	}{
		{nodev1.Operation_OPERATION_CHAT, `{"n":2,"messages":[{"role":"user","content":"x"}]}`, "n"},
		{nodev1.Operation_OPERATION_COMPLETION, `{"prompt":"x","n":3}`, "n"},
		{nodev1.Operation_OPERATION_COMPLETION, `{"prompt":"x","echo":true}`, "echo"},
		{nodev1.Operation_OPERATION_COMPLETION, `{"prompt":"x","logprobs":2}`, "logprobs"},
		{nodev1.Operation_OPERATION_COMPLETION, `{"prompt":"x","best_of":2}`, "best_of"},
		{nodev1.Operation_OPERATION_EMBEDDINGS, `{"input":[[1,2,3]]}`, "input"},
	} {
		t.Run(tc.field+"/"+tc.op.String(), func(t *testing.T) {
			var hit atomic.Bool
			up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) { hit.Store(true) })
			err := newOllama(t, Config{BaseURL: up.URL}).Normalize(context.Background(),
				Request{Op: tc.op, ServedModel: "m", Body: []byte(tc.body)}, &eventRec{})
			e := asError(t, err)
			if e.Status != http.StatusBadRequest || !strings.HasPrefix(e.Message, tc.field+":") || hit.Load() {
				t.Errorf("got %+v (provider called: %v), want a 400 naming %s", e, hit.Load(), tc.field)
			}
		})
	}
	// What it can honour passes: n 1, echo false, logprobs null, suffix.
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		flushLines(w, `{"response":"ok","done":true,"done_reason":"stop"}`)
	})
	body := `{"prompt":"x","n":1,"echo":false,"logprobs":null,"best_of":1,"suffix":"end"}`
	if err := newOllama(t, Config{BaseURL: up.URL}).Normalize(context.Background(),
		Request{Op: nodev1.Operation_OPERATION_COMPLETION, ServedModel: "m", Body: []byte(body)}, &eventRec{}); err != nil {
		t.Fatal(err)
	}
	if _, _, sent := up.request(); !strings.Contains(string(sent), `"suffix":"end"`) {
		t.Errorf("suffix not forwarded: %s", sent)
	}
}

func TestErrorWatch(t *testing.T) {
	const errEvent = `data: {"error":{"message":"boom","type":"server_error"}}`
	for _, tc := range []struct {
		name   string
		chunks []string
		want   string
	}{
		{"whole", []string{"data: {\"choices\":[]}\n\n" + errEvent + "\n\ndata: [DONE]\n\n"}, "boom"},
		{"no space after data", []string{`data:{"error":"plain"}` + "\n\n"}, "plain"},
		{"CRLF", []string{"data: {\"x\":1}\r\n\r\n" + errEvent + "\r\n\r\n"}, "boom"},
		{"lone CR", []string{"data: {\"x\":1}\r\r" + errEvent + "\r\r"}, "boom"},
		{"split everywhere", strings.Split(errEvent+"\n\n", ""), "boom"},
		{"split CR LF", []string{"data: {\"x\":1}\r", "\n\r", "\n" + errEvent + "\r", "\n\r", "\n"}, "boom"},
		{"last line without end", []string{errEvent}, ""},               // no blank line: not an event
		{"event without its blank line", []string{errEvent + "\n"}, ""}, // the stream may still end it
		{"error null", []string{`data: {"error":null,"choices":[]}` + "\n\n"}, ""},
		{"error in content", []string{`data: {"choices":[{"delta":{"content":"\"error\""}}]}` + "\n\n"}, ""},
		{"comment line", []string{`: {"error":"x"}` + "\n\n"}, ""},
		{"first error wins", []string{`data: {"error":"one"}` + "\n\n" + `data: {"error":"two"}` + "\n\n"}, "one"},
		{"two data lines are one event", []string{`data: {"error":` + "\n" + `data: "joined"}` + "\n\n"}, "joined"},
		{"an id and an event type", []string{"event: error\nid: 3\n" + errEvent + "\n\n"}, "boom"},
		{"too long", []string{"data: {\"error\":\"" + strings.Repeat("x", maxWatchedEvent) + "\"}\n\n"}, ""},
		{"after one too long", []string{"data: " + strings.Repeat("x", maxWatchedEvent) + "\n\n" + errEvent + "\n\n"}, "boom"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var w errorWatch
			for _, c := range tc.chunks {
				w.write([]byte(c))
			}
			if w.message != tc.want {
				t.Errorf("message %q, want %q", w.message, tc.want)
			}
		})
	}
}

// FuzzErrorWatch: however a body is cut into chunks, errorWatch finds the
// same error as when it gets the body whole.
func FuzzErrorWatch(f *testing.F) {
	f.Add([]byte("data: {\"x\":1}\r\n\r\ndata:{\"error\":\"e\"}\r\n"), uint8(3))
	f.Add([]byte("data: {\"error\":{\"message\":\"m\"}}\rdata: [DONE]\r"), uint8(1))
	f.Fuzz(func(t *testing.T, body []byte, step uint8) {
		var whole, split errorWatch
		whole.write(body)
		n := int(step%16) + 1
		for i := 0; i < len(body); i += n {
			split.write(body[i:min(i+n, len(body))])
		}
		if whole.message != split.message {
			t.Fatalf("whole %q, split by %d %q", whole.message, n, split.message)
		}
	})
}

// TestRegression_TunnelErrorEventCountedAsSuccess: an error event inside a
// 200 SSE stream used to end the run as a clean success. It is relayed
// byte for byte, and the call reports ErrProviderReported with its message
// (redacted).
func TestRegression_TunnelErrorEventCountedAsSuccess(t *testing.T) {
	var body string
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, body)
	})
	body = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\n" +
		fmt.Sprintf("data:{\"error\":{\"message\":\"engine at %s died\",\"type\":\"server_error\"}}\r\n\r\n", up.URL) +
		"data: [DONE]\n\n"
	o := newOpenAI(t, Config{BaseURL: up.URL})
	rec := &tunnelRec{}
	err := o.Tunnel(context.Background(), Request{Op: nodev1.Operation_OPERATION_CHAT, ServedModel: "m", Body: []byte(`{"stream":true}`)}, rec)
	if !errors.Is(err, ErrProviderReported) {
		t.Fatalf("err %v, want ErrProviderReported", err)
	}
	if e := asError(t, err); e.Message != "engine at [provider] died" || e.Status != http.StatusBadGateway {
		t.Errorf("error %+v", e)
	}
	if rec.body() != body {
		t.Errorf("relayed %q, want the provider's bytes %q", rec.body(), body)
	}

	// The same body as JSON (not SSE) is not watched.
	up2 := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"x":"data: {\"error\":\"no\"}"}`+"\n")
	})
	if err := newOpenAI(t, Config{BaseURL: up2.URL}).Tunnel(context.Background(),
		Request{Op: nodev1.Operation_OPERATION_CHAT, ServedModel: "m", Body: []byte(`{}`)}, &tunnelRec{}); err != nil {
		t.Fatalf("JSON body: %v", err)
	}
}

// The tunnel posts each operation to its OpenAI path.
func TestOpenAITunnelPaths(t *testing.T) {
	for op, path := range map[nodev1.Operation]string{
		nodev1.Operation_OPERATION_CHAT:       "/v1/chat/completions",
		nodev1.Operation_OPERATION_COMPLETION: "/v1/completions",
		nodev1.Operation_OPERATION_EMBEDDINGS: "/v1/embeddings",
	} {
		up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) { w.Write([]byte(`{}`)) })
		if err := newOpenAI(t, Config{BaseURL: up.URL + "/v1"}).Tunnel(context.Background(),
			Request{Op: op, ServedModel: "m", Body: []byte(`{}`)}, &tunnelRec{}); err != nil {
			t.Fatal(err)
		}
		if got, _, _ := up.request(); got != path {
			t.Errorf("%v posted to %s, want %s", op, got, path)
		}
	}
}

// TestRegression_ForcedCallCutByTokenLimit: a forced call of one tool
// whose answer the client's max_tokens cut mid-arguments came back as a
// tool call with arguments that are not JSON (`{"c":"bl`), which the
// Messages API turned into a 502 "malformed answer". An answer cut before
// the call is whole is the text as it came with finish_reason "length";
// a whole call cut only in its trailing whitespace stays the call.
func TestRegression_ForcedCallCutByTokenLimit(t *testing.T) {
	const one = `{"model":"x","max_tokens":2,"messages":[{"role":"user","content":"weather?"}],
		"tools":[{"type":"function","function":{"name":"get_w","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}],
		"tool_choice":"required"}`
	for _, tc := range []struct {
		name, body string
		parts      []string
		wantCall   string // the call's arguments; "" for text
		wantFinish string
	}{
		{"cut arguments", one, []string{`{\"c`, `\":\"bl`}, "", "length"},
		{"whole call at the limit", one, []string{`{\"city\":\"Paris\"}`, `\n`}, `{"city":"Paris"}`, "tool_calls"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var lines []string
			for _, p := range tc.parts {
				lines = append(lines, `{"model":"m","message":{"role":"assistant","content":"`+p+`"},"done":false}`)
			}
			lines = append(lines, `{"model":"m","message":{"role":"assistant","content":""},"done":true,"done_reason":"length","prompt_eval_count":3,"eval_count":2}`)
			up := newUpstream(t, ollamaLines(lines...))
			o := newOllama(t, Config{BaseURL: up.URL})
			rec := &eventRec{}
			if err := o.Normalize(context.Background(), chatReq(tc.body), rec); err != nil {
				t.Fatalf("Normalize: %v; want no error", err)
			}
			var calls []*nodev1.ToolCallDelta
			for _, e := range rec.events {
				calls = append(calls, e.ToolCalls...)
			}
			if tc.wantCall == "" {
				if len(calls) != 0 || rec.text() != `{"c":"bl` {
					t.Fatalf("calls %v text %q; want no call and the text as it came", calls, rec.text())
				}
			} else if len(calls) != 1 || calls[0].Name != "get_w" || strings.TrimSpace(calls[0].Arguments) != tc.wantCall {
				t.Fatalf("calls %v; want one get_w call with %s", calls, tc.wantCall)
			}
			if c := rec.last(tComplete); c == nil || c.FinishReason != tc.wantFinish {
				t.Fatalf("complete %v; want finish_reason %q", c, tc.wantFinish)
			}
		})
	}
}
