package runsapi

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"

	"iop/internal/edge/api"
	"iop/internal/edge/api/apitest"
	"iop/internal/edge/contract"
	"iop/internal/sse"
	"iop/internal/wire/nodev1"
)

// TestRegression_RunRecordsTunnelEventsWhole: a run on the
// tunnel path records the provider's OpenAI stream event by event, by the
// SSE rules (WHATWG HTML; package sse), whatever its valid framing: CRLF
// line ends, a comment line, an event whose data comes in two `data:`
// lines, no space after `data:`, a CR and its LF in two messages. Its
// record has the whole output, the finish reason and the usage, and
// GET /v1/runs/{id}/events replays exactly the events the provider sent
// (their data, in order). Recording the run by rendering it and then
// re-reading the log's lines as `data: <payload>` cut the two-line event
// to its first line.
func TestRegression_RunRecordsTunnelEventsWhole(t *testing.T) {
	stream := []string{
		": the provider's keep-alive comment\r\n\r\n",
		`data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":"Hel"}` + "\r\n" +
			`data: ,"finish_reason":null}]}` + "\r\n\r\n",
		`data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"lo"},"finish_reason":"stop"}]}` + "\r",
		"\n\r\n",
		`data:{"id":"c1","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}` + "\n\n",
		"data: [DONE]\r\n\r\n",
	}
	msgs := []*nodev1.RunUp{apitest.TunnelHead(200, map[string]string{"Content-Type": "text/event-stream"})}
	for _, s := range stream {
		msgs = append(msgs, apitest.TunnelData(s))
	}
	msgs = append(msgs, apitest.TunnelEnd())
	want := eventData(t, []byte(strings.Join(stream, "")))
	if len(want) != 4 {
		t.Fatalf("the provider's stream has %d events, want 4: %q", len(want), want)
	}

	env := newEnv(t, api.Config{}, apitest.RunWith(apitest.ScriptedRun(contract.PathTunnel, msgs...)))
	resp, err := http.Post(env.Srv.URL+"/v1/runs", "application/json", strings.NewReader(`{"model":"m","prompt":"x"}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST /v1/runs: %d %s", resp.StatusCode, body)
	}
	var rec struct {
		ID           string  `json:"id"`
		State        string  `json:"state"`
		Output       string  `json:"output"`
		FinishReason *string `json:"finish_reason"`
		Error        *string `json:"error"`
		Usage        struct {
			PromptTokens     int `json:"prompt_tokens"`
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(body, &rec); err != nil {
		t.Fatalf("record: %v: %s", err, body)
	}
	if rec.State != "complete" || rec.Output != "Hello" || rec.FinishReason == nil || *rec.FinishReason != "stop" ||
		rec.Error != nil || rec.Usage.PromptTokens != 3 || rec.Usage.CompletionTokens != 2 {
		t.Errorf("record: %s\nwant state complete, output \"Hello\", finish_reason stop, no error, usage 3/2", body)
	}

	resp, err = http.Get(env.Srv.URL + "/v1/runs/" + rec.ID + "/events")
	if err != nil {
		t.Fatal(err)
	}
	replay, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !sse.IsEventStream(resp.Header.Get("Content-Type")) {
		t.Fatalf("GET events: %d %q %s", resp.StatusCode, resp.Header.Get("Content-Type"), replay)
	}
	got := eventData(t, replay)
	if len(got) != len(want) {
		t.Fatalf("replayed %d events, want the provider's %d\nreplay:\n%s", len(got), len(want), replay)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("event %d: replayed data %q, want the provider's %q", i, got[i], want[i])
		}
	}
}

// TestRunEventsAreTheChatStream: a run's events (GET /v1/runs/{id}/events)
// are the events a client of POST /v1/chat/completions that streams with
// include_usage gets for the same run (the runs API's doc: a run is a chat
// completion, its events chat.completion.chunk objects ending [DONE], or
// one error event when it fails), on both execution paths, with
// reasoning, text and tool-call parts, and when the run fails after its
// first event. On the normalized path they are the same bytes.
func TestRunEventsAreTheChatStream(t *testing.T) {
	sseHead := map[string]string{"Content-Type": "text/event-stream"}
	thinking := &nodev1.RunEvent{Type: nodev1.RunEvent_TYPE_DELTA, Thinking: "hmm"}
	calls := &nodev1.RunEvent{Type: nodev1.RunEvent_TYPE_DELTA, ToolCalls: []*nodev1.ToolCallDelta{
		{Index: 0, Id: "call_1", Name: "f", Arguments: `{"a":`}, {Index: 0, Arguments: `1}`}}}
	const chunk = `data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}` + "\n\n"
	for _, tc := range []struct {
		name string
		path contract.Path
		msgs func() []*nodev1.RunUp
		same bool // the same bytes, not only the same events
	}{
		{"normalized", normalized, func() []*nodev1.RunUp {
			return []*nodev1.RunUp{apitest.Events(apitest.Started(), thinking, apitest.Delta("hi")), apitest.Events(calls, apitest.Delta(" there")),
				apitest.Events(apitest.Usage(4, 3), apitest.Complete("tool_calls"))}
		}, true},
		{"normalized without a finish reason", normalized, func() []*nodev1.RunUp {
			return []*nodev1.RunUp{apitest.Events(apitest.Started(), apitest.Delta("hi")), apitest.Events(apitest.Complete(""))}
		}, true},
		{"normalized failing after its first event", normalized, func() []*nodev1.RunUp {
			return []*nodev1.RunUp{apitest.Events(apitest.Started(), apitest.Delta("hi")), apitest.Events(apitest.ErrorEvent(500, "boom"))}
		}, true},
		{"tunnel", tunnel, func() []*nodev1.RunUp {
			return []*nodev1.RunUp{apitest.TunnelHead(200, sseHead), apitest.TunnelData(chunk), apitest.TunnelData(chunk + "data: [DONE]\n\n"), apitest.TunnelEnd()}
		}, false},
		{"tunnel failing after its status line", tunnel, func() []*nodev1.RunUp {
			return []*nodev1.RunUp{apitest.TunnelHead(200, sseHead), apitest.TunnelData(chunk), apitest.TunnelError(502, "reset")}
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := newEnv(t, api.Config{}, func(context.Context, contract.Request) (Run, error) {
				return apitest.ScriptedRun(tc.path, tc.msgs()...), nil
			})
			resp, err := http.Post(env.Srv.URL+"/v1/chat/completions", "application/json", strings.NewReader(
				`{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"x"}]}`))
			if err != nil {
				t.Fatal(err)
			}
			chat, _ := io.ReadAll(resp.Body)
			resp.Body.Close()

			resp, err = http.Post(env.Srv.URL+"/v1/runs", "application/json", strings.NewReader(`{"model":"m","prompt":"x"}`))
			if err != nil {
				t.Fatal(err)
			}
			var rec struct {
				ID string `json:"id"`
			}
			err = json.NewDecoder(resp.Body).Decode(&rec)
			resp.Body.Close()
			if err != nil || rec.ID == "" {
				t.Fatalf("POST /v1/runs: %d, %v", resp.StatusCode, err)
			}
			resp, err = http.Get(env.Srv.URL + "/v1/runs/" + rec.ID + "/events")
			if err != nil {
				t.Fatal(err)
			}
			replay, _ := io.ReadAll(resp.Body)
			resp.Body.Close()

			want, got := eventData(t, chat), eventData(t, replay)
			if len(want) < 2 || strings.Join(got, "\n\n") != strings.Join(want, "\n\n") {
				t.Errorf("the run's events differ from the chat stream's\nrun:\n%s\nchat:\n%s", replay, chat)
			}
			if tc.same && !bytes.Equal(replay, chat) {
				t.Errorf("the run's log is not the chat stream's bytes\nrun:\n%q\nchat:\n%q", replay, chat)
			}
		})
	}
}

// TestRegression_RunBrokenAnswerCountsForBreaker: a run whose provider's
// answer breaks the protocol (a tunnel message on a normalized run) is
// ended as the provider's failure (Run.Fail, for its circuit breaker), as
// a chat request's is. The runs API's own copy of the rendering only
// cancelled it.
func TestRegression_RunBrokenAnswerCountsForBreaker(t *testing.T) {
	t.Parallel()
	run := apitest.ScriptedRun(normalized, apitest.Events(apitest.Started(), apitest.Delta("hi")), apitest.TunnelData("x"))
	env := newEnv(t, api.Config{}, apitest.RunWith(run))
	if rec := submitRun(t, env); rec.State != "error" {
		t.Fatalf("record %+v, want state error", rec)
	}
	env.WaitHandlers()
	reasons := run.CancelReasons()
	if !slices.ContainsFunc(reasons, func(r string) bool { return strings.HasPrefix(r, "fail: ") }) {
		t.Errorf("cancel reasons %q: the run was not ended as the provider's failure", reasons)
	}
}

// TestRegression_RunFlowFromBodyUser: with flows named by the body's
// "user" (Config.Flow "user"), a run's flow is its body's user, as a chat
// request's is. The runs API's own dispatch read no flow from the body.
func TestRegression_RunFlowFromBodyUser(t *testing.T) {
	t.Parallel()
	env := newEnv(t, api.Config{Flow: api.FlowUser}, okRun)
	if rec := submitRun(t, env); rec.State != "complete" {
		t.Fatalf("record %+v", rec)
	}
	resp := env.Post(t, "/v1/runs", "application/json", `{"model":"m","prompt":"x","user":"u-42"}`)
	if resp.Status != 200 {
		t.Fatalf("POST /v1/runs: %d %s", resp.Status, resp.Body)
	}
	reqs := env.GW.Requests()
	if len(reqs) != 2 || reqs[1].Flow == reqs[0].Flow || !strings.Contains(reqs[1].Flow, "u-42") {
		t.Errorf("flows %q and %q, want the second named by its user u-42", reqs[0].Flow, reqs[1].Flow)
	}
}
