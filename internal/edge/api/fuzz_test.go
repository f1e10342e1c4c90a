package api

import (
	"encoding/json"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"iop/internal/wire/nodev1"
)

// frames joins protobuf messages into one fuzz input: each is a length
// byte and that many bytes.
func frames(t testing.TB, msgs ...*nodev1.RunUp) []byte {
	var out []byte
	for _, m := range msgs {
		b, err := proto.Marshal(m)
		if err != nil || len(b) > 255 {
			t.Fatalf("seed message %v: %d bytes, %v", m, len(b), err)
		}
		out = append(append(out, byte(len(b))), b...)
	}
	return out
}

// unframe is the inverse of frames: the RunUp messages of a fuzz input
// (bytes that are not one are skipped).
func unframe(b []byte) []*nodev1.RunUp {
	var out []*nodev1.RunUp
	for len(b) > 0 {
		n := min(int(b[0]), len(b)-1)
		var m nodev1.RunUp
		if proto.Unmarshal(b[1:1+n], &m) == nil {
			out = append(out, &m)
		}
		b = b[1+n:]
	}
	return out
}

// renderRoutes are the requests FuzzRenderRunUp renders a run for.
var renderRoutes = []struct {
	path, body string
	stream     bool // SSE lines
}{
	{"/v1/chat/completions", `{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"x"}]}`, true},
	{"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"x"}]}`, false},
	{"/v1/completions", `{"model":"m","stream":true,"prompt":"x"}`, true},
	{"/v1/completions", `{"model":"m","prompt":"x"}`, false},
	{"/v1/embeddings", `{"model":"m","input":["a","b"],"encoding_format":"base64"}`, false},
}

// FuzzRenderRunUp feeds arbitrary run messages, as a node would send them,
// to every route's renderer on both execution paths. It never panics
// (other than http.ErrAbortHandler, which cuts a response short on
// purpose), closes the run exactly once, and a normalized-path answer that
// was not cut short is well formed: JSON bodies, SSE events of JSON ending
// with [DONE] or an error event (package ollama's has the Ollama routes).
func FuzzRenderRunUp(f *testing.F) {
	tc := func(index int32, id, name, args string) *nodev1.ToolCallDelta {
		return &nodev1.ToolCallDelta{Index: index, Id: id, Name: name, Arguments: args}
	}
	ok := frames(f, events(started()), events(delta("hel"), delta("lo")), events(usageEvent(3, 2)), events(complete("stop")))
	calls := frames(f, events(&nodev1.RunEvent{Type: nodev1.RunEvent_TYPE_DELTA, ToolCalls: []*nodev1.ToolCallDelta{tc(0, "call_1", "f", `{"a"`)}}),
		events(&nodev1.RunEvent{Type: nodev1.RunEvent_TYPE_DELTA, ToolCalls: []*nodev1.ToolCallDelta{tc(0, "", "", `:1}`), tc(-3, "", "", "x")}}),
		events(complete("tool_calls")))
	vectors := frames(f, events(&nodev1.RunEvent{Type: nodev1.RunEvent_TYPE_DELTA, Embeddings: []*nodev1.Embedding{{Values: []float32{1, float32(math.NaN())}}, {Values: []float32{float32(math.Inf(1))}}}}),
		events(usageEvent(2, 0), complete("")))
	failed := frames(f, events(started(), delta("part")), events(errorEvent(500, "boom")), events(delta("after")))
	early := frames(f, events(errorEvent(429, "slow down")))
	thinking := frames(f, events(started(), &nodev1.RunEvent{Type: nodev1.RunEvent_TYPE_DELTA, Thinking: "hm"}),
		events(&nodev1.RunEvent{Type: nodev1.RunEvent_TYPE_DELTA, Thinking: "so", Text: "ok"}), events(complete("stop")))
	tunnelThinking := frames(f, tunnelHead(200, map[string]string{"Content-Type": "text/event-stream"}),
		tunnelData("data: {\"choices\":[{\"index\":0,\"delta\":{\"reasoning_content\":\"hm\",\"reasoning\":{}}}]}\n\n"), tunnelData("data: [DONE]\n\n"), tunnelEnd())
	tunnelOK := frames(f, tunnelHead(200, map[string]string{"Content-Type": "text/event-stream"}),
		tunnelData("data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\n"), tunnelData("data: [DONE]\n\n"), tunnelEnd())
	tunnelBad := frames(f, tunnelData("before head"), tunnelHead(0, map[string]string{"Content-Length": "-1", "Bad Header": "\r\n"}), tunnelError(504, "late"))
	for route := range renderRoutes {
		for _, seed := range [][]byte{ok, calls, vectors, failed, early, thinking, nil} {
			f.Add(uint8(route), false, seed)
		}
		f.Add(uint8(route), true, tunnelOK)
		f.Add(uint8(route), true, tunnelThinking)
		f.Add(uint8(route), true, tunnelBad)
	}
	f.Fuzz(func(t *testing.T, route uint8, tunnelPath bool, msgs []byte) {
		rt := renderRoutes[int(route)%len(renderRoutes)]
		path := normalized
		if tunnelPath {
			path = tunnel
		}
		run := scriptedRun(path, unframe(msgs)...)
		gw := &fakeGateway{models: []string{"m"}, dispatch: runWith(run)}
		h := New(withOpenAI(Config{Now: func() time.Time { return time.Unix(1700000000, 0) }}), gw, nil)
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodPost, rt.path, strings.NewReader(rt.body))
		aborted := serveRecovering(t, h, rec, req)
		if n, reasons := run.closeCalls(); n != 1 {
			t.Fatalf("Close called %d times (%q), want 1", n, reasons)
		}
		if aborted || tunnelPath {
			return // cut short on purpose, or the provider's own bytes
		}
		body := rec.Body.Bytes()
		switch {
		case rec.Code != http.StatusOK || !rt.stream:
			if !json.Valid(body) {
				t.Fatalf("%s: %d answer is not JSON: %q", rt.path, rec.Code, body)
			}
		default:
			checkSSE(t, body)
		}
	})
}

// serveRecovering serves req, reporting whether the handler aborted the
// response (http.ErrAbortHandler); any other panic fails the test.
func serveRecovering(t *testing.T, h http.Handler, w http.ResponseWriter, req *http.Request) (aborted bool) {
	t.Helper()
	defer func() {
		if v := recover(); v != nil {
			if v != http.ErrAbortHandler {
				t.Fatalf("panic: %v", v)
			}
			aborted = true
		}
	}()
	h.ServeHTTP(w, req)
	return false
}

// checkSSE checks a complete SSE answer: events of one data line each,
// JSON payloads, the last one [DONE] or an error object, nothing after it.
func checkSSE(t *testing.T, body []byte) {
	t.Helper()
	events := strings.Split(strings.TrimSuffix(string(body), "\n\n"), "\n\n")
	for i, ev := range events {
		data, ok := strings.CutPrefix(ev, "data: ")
		if !ok || strings.Contains(data, "\n") {
			t.Fatalf("event %d is not one data line: %q in %q", i, ev, body)
		}
		last := i == len(events)-1
		if data == "[DONE]" {
			if !last {
				t.Fatalf("[DONE] before the end: %q", body)
			}
			continue
		}
		var obj map[string]json.RawMessage
		if err := json.Unmarshal([]byte(data), &obj); err != nil {
			t.Fatalf("event %d is not a JSON object: %q", i, data)
		}
		if last && obj["error"] == nil {
			t.Fatalf("the stream ends with neither [DONE] nor an error: %q", body)
		}
	}
}
