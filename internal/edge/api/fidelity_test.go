package api

import (
	"bufio"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"iop/internal/edge/api/apitest"
	"iop/internal/sse"
	"iop/internal/wire/nodev1"
)

// Protocol fidelity: thinking on every path and client API,
// tool choice, roles and images, through the handler and the fake gateway.

func thinkingDelta(thinking string) *nodev1.RunEvent {
	return &nodev1.RunEvent{Type: nodev1.RunEvent_TYPE_DELTA, Thinking: thinking}
}

// sseEvents is the data of each event of an SSE body.
func sseEvents(t *testing.T, body string) []string {
	t.Helper()
	var out []string
	if err := sse.ReadAll(strings.NewReader(body), func(e sse.Event) error {
		out = append(out, string(e.Data))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

// chunkParts is the reasoning_content and content of each chunk's choice
// 0 delta (or message), and whether another reasoning field appears.
func chunkParts(t *testing.T, data string) (reasoning, content string) {
	t.Helper()
	var obj struct {
		Choices []struct {
			Delta   map[string]json.RawMessage `json:"delta"`
			Message map[string]json.RawMessage `json:"message"`
		} `json:"choices"`
	}
	if err := json.Unmarshal([]byte(data), &obj); err != nil {
		t.Fatalf("%s: %v", data, err)
	}
	for _, c := range obj.Choices {
		p := c.Delta
		if p == nil {
			p = c.Message
		}
		if _, ok := p["reasoning"]; ok {
			t.Fatalf("iop renders reasoning_content only, got reasoning: %s", data)
		}
		var r, s string
		_ = json.Unmarshal(p["reasoning_content"], &r)
		_ = json.Unmarshal(p["content"], &s)
		reasoning += r
		content += s
	}
	return reasoning, content
}

// TestRegression_ThinkingDropped: an Ollama provider's thinking (run
// events with Thinking and no text) used to be skipped; an OpenAI client
// now gets it as reasoning_content, streamed (before the text) and not.
func TestRegression_ThinkingDropped(t *testing.T) {
	msgs := func() *fakeRun {
		return scriptedRun(normalized,
			events(started(), thinkingDelta("Let me")),
			events(thinkingDelta(" think.")),
			events(delta("Hi"), usageEvent(2, 4), complete("stop")))
	}
	const body = `{"model":"m","stream":%v,"messages":[{"role":"user","content":"hi"}]}`
	env := newEnv(t, Config{}, runWith(msgs()))
	resp := env.post(t, "/v1/chat/completions", "application/json", strings.Replace(body, "%v", "true", 1))
	var reasoning, content []string
	for _, ev := range sseEvents(t, resp.body) {
		if ev == "[DONE]" {
			continue
		}
		r, c := chunkParts(t, ev)
		if r != "" {
			reasoning = append(reasoning, r)
		}
		if c != "" {
			content = append(content, c)
			if len(reasoning) != 2 {
				t.Fatalf("content before the reasoning was all sent: %s", resp.body)
			}
		}
	}
	if !slices.Equal(reasoning, []string{"Let me", " think."}) || !slices.Equal(content, []string{"Hi"}) {
		t.Fatalf("reasoning %q content %q in\n%s", reasoning, content, resp.body)
	}
	env = newEnv(t, Config{}, runWith(msgs()))
	resp = env.post(t, "/v1/chat/completions", "application/json", strings.Replace(body, "%v", "false", 1))
	if r, c := chunkParts(t, resp.body); r != "Let me think." || c != "Hi" {
		t.Fatalf("not streamed: reasoning %q content %q: %s", r, c, resp.body)
	}
}

// TestThinkingOnlyStreamSendsAsItComes: a stream that is only thinking so
// far sends each piece to the client as it arrives (package ollama's
// test has the Ollama routes).
func TestThinkingOnlyStreamSendsAsItComes(t *testing.T) {
	for _, c := range []struct {
		path, body, want string
	}{
		{"/v1/chat/completions", `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`, `"reasoning_content":"Hmm"`},
	} {
		t.Run(c.path, func(t *testing.T) {
			run := liveRun(normalized, 4)
			env := newEnv(t, Config{}, runWith(run))
			var end sync.Once
			finish := func() { end.Do(func() { close(run.up) }) }
			t.Cleanup(finish) // before env's cleanup, which waits for the handler
			run.up <- events(started(), thinkingDelta("Hmm"))
			// The client reads on its own goroutine: the status line itself
			// waits for the first output.
			line := make(chan string, 8)
			go func() {
				defer close(line)
				resp, err := http.Post(env.srv.URL+c.path, "application/json", strings.NewReader(c.body))
				if err != nil {
					return
				}
				defer resp.Body.Close()
				sc := bufio.NewScanner(resp.Body)
				for sc.Scan() {
					line <- sc.Text()
				}
			}()
			deadline := time.After(10 * time.Second)
			for found := false; !found; {
				select {
				case l, ok := <-line:
					if !ok {
						t.Fatal("the answer ended without the thinking")
					}
					found = strings.Contains(l, c.want)
				case <-deadline:
					t.Fatalf("the thinking did not reach the client while the run went on")
				}
			}
			run.up <- events(delta("ok"), complete("stop"))
			finish()
			for range line {
			}
		})
	}
}

// TestThinkingCountsForTimeToFirstToken: the first reasoning token is the
// first token (a reasoning model produces it first), on both paths.
func TestThinkingCountsForTimeToFirstToken(t *testing.T) {
	for name, run := range map[string]func() *fakeRun{
		"normalized": func() *fakeRun {
			return scriptedRun(normalized, events(started()), events(thinkingDelta("a")), events(thinkingDelta("b")), events(delta("c"), complete("stop")))
		},
		"tunnel": func() *fakeRun {
			return scriptedRun(tunnel, tunnelHead(200, map[string]string{"Content-Type": "text/event-stream"}),
				tunnelData(`data: {"choices":[{"index":0,"delta":{"reasoning_content":"a"}}]}`+"\n\n"),
				tunnelData(`data: {"choices":[{"index":0,"delta":{"reasoning_content":"b"}}]}`+"\n\n"),
				tunnelData(`data: {"choices":[{"index":0,"delta":{"content":"c"},"finish_reason":"stop"}]}`+"\n\ndata: [DONE]\n\n"), tunnelEnd())
		},
	} {
		t.Run(name, func(t *testing.T) {
			recs := &records{}
			env := newEnv(t, Config{Observer: recs, Now: apitest.Ticking()}, runWith(run()))
			env.post(t, "/v1/chat/completions", "application/json", `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`)
			env.waitHandlers()
			rec := recs.Only(t)
			// Three content events, the first of them reasoning; with a
			// clock ticking a second per reading, the first token comes
			// before the last by at least two readings.
			if rec.TimeToFirstToken <= 0 || rec.InterTokenLatency <= 0 || rec.TimeToFirstToken >= rec.Duration-2*time.Second {
				t.Fatalf("ttft %s inter-token %s duration %s: the reasoning did not count as the first tokens", rec.TimeToFirstToken, rec.InterTokenLatency, rec.Duration)
			}
		})
	}
}

// TestTunnelReasoningBytesUnchanged: on the tunnel path an OpenAI client
// gets the provider's reasoning bytes as sent, whichever field they use.
func TestTunnelReasoningBytesUnchanged(t *testing.T) {
	const stream = "data: {\"choices\":[{\"index\":0,\"delta\":{\"reasoning\":\"x\",\"reasoning_content\":\"x\"}}]}\r\n\r\n" +
		": keep-alive\n\ndata: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"y\"},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n"
	env := newEnv(t, Config{}, runWith(scriptedRun(tunnel, tunnelHead(200, map[string]string{"Content-Type": "text/event-stream"}),
		tunnelData(stream[:40]), tunnelData(stream[40:]), tunnelEnd())))
	resp := env.post(t, "/v1/chat/completions", "application/json", `{"model":"m","stream":true,"reasoning_effort":"high","messages":[{"role":"user","content":"hi"}]}`)
	if resp.status != 200 || resp.body != stream {
		t.Fatalf("%d %q, want the provider's bytes", resp.status, resp.body)
	}
	if req := env.gw.requests()[0]; !strings.Contains(string(req.Body), `"reasoning_effort":"high"`) {
		t.Fatalf("the request body changed: %s", req.Body)
	}
}

// TestRejectedNeedsSayWhy: a model whose providers cannot honour a
// request's tool choice or remote image answers 400 with the gateway's
// reason, not a silent drop.
func TestRejectedNeedsSayWhy(t *testing.T) {
	env := newEnv(t, Config{}, failWith(wrapRejected(`no provider for model "m" honours parallel_tool_calls false: only OpenAI-compatible providers do`)))
	resp := env.post(t, "/v1/chat/completions", "application/json",
		`{"model":"m","parallel_tool_calls":false,"tools":[{"type":"function","function":{"name":"f"}}],"messages":[{"role":"user","content":"hi"}]}`)
	msg, _, _, code := openAIError(t, resp.body)
	if resp.status != 400 || !strings.Contains(msg, `parallel_tool_calls false`) || str(code) != "unsupported_capability" {
		t.Fatalf("%d %s", resp.status, resp.body)
	}
	if req := env.gw.requests()[0]; !slices.Equal(req.Needs, []string{"tools", "tool_choice"}) {
		t.Fatalf("needs %v", req.Needs)
	}
}

func wrapRejected(msg string) error { return &rejected{msg} }

type rejected struct{ msg string }

func (e *rejected) Error() string { return ErrCandidatesRejected.Error() + ": " + e.msg }
func (e *rejected) Unwrap() error { return ErrCandidatesRejected }
