package responses

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"iop/internal/auth"
	"iop/internal/edge/contract"
	"iop/internal/responses"
	"iop/internal/sse"
	"iop/internal/testenv"
	"iop/internal/translate"
)

// saveHook is a ResponseStore whose Save runs hook first (an error from
// it fails the save); the rest is the SQLite store's.
type saveHook struct {
	*responses.SQLite
	hook func(rec responses.Record) error
}

func (s *saveHook) Save(ctx context.Context, rec responses.Record) error {
	if err := s.hook(rec); err != nil {
		return err
	}
	return s.SQLite.Save(ctx, rec)
}

// TestRegression_FailedSaveFailsTheRequest: a response whose save fails
// (here: a save that timed out waiting for the store's one
// connection) is not answered as a success "store": true that GET then
// does not know: not streamed, a 500 error answer; streamed, the stream
// ends with response.failed carrying the error, never response.completed.
func TestRegression_FailedSaveFailsTheRequest(t *testing.T) {
	var failAll atomic.Bool
	failAll.Store(true)
	store := &saveHook{SQLite: newResponseStore(t), hook: func(rec responses.Record) error {
		if failAll.Load() || rec.Status != "in_progress" {
			return context.DeadlineExceeded // what the store's timeout gave
		}
		return nil
	}}
	env := newEnv(t, envConfig{Responses: store}, okRun)
	resp := env.post(t, "/v1/responses", "application/json", `{"model":"m","input":"tiny"}`)
	if resp.status != http.StatusInternalServerError || !strings.Contains(resp.body, `"error":{`) || strings.Contains(resp.body, `"store":true`) {
		t.Errorf("not streamed: %d %s", resp.status, resp.body)
	}
	// Streamed, the save at response.created fails: an error answer.
	resp = env.post(t, "/v1/responses", "application/json", `{"model":"m","input":"tiny","stream":true}`)
	if resp.status != http.StatusInternalServerError || !strings.Contains(resp.body, `"error":{`) {
		t.Errorf("streamed, not stored at response.created: %d %s", resp.status, resp.body)
	}
	// Streamed, the final save fails: response.failed.
	failAll.Store(false)
	resp = env.post(t, "/v1/responses", "application/json", `{"model":"m","input":"tiny","stream":true}`)
	if resp.status != http.StatusOK {
		t.Fatalf("streamed: %d %s", resp.status, resp.body)
	}
	evs := responseEvents(t, resp.body)
	types := eventTypes(evs)
	if slices.Contains(types, "response.completed") || types[len(types)-1] != "response.failed" {
		t.Fatalf("streamed events %q", types)
	}
	final := finalResponse(t, evs)
	if final["status"] != "failed" || final["error"] == nil {
		t.Errorf("streamed final response %v", final)
	}
	id, _ := final["id"].(string)
	if got := env.get(t, "/v1/responses/"+id); strings.Contains(got.body, `"status":"completed"`) {
		t.Errorf("GET of the response whose final save failed: %d %s", got.status, got.body)
	}
}

// TestRegression_SlotHeldWhileSaving: a key limited to one request at a
// time (max_concurrent 1) has its slot until its response is stored; the
// a second request must not be admitted while the first is still saving.
func TestRegression_SlotHeldWhileSaving(t *testing.T) {
	f := newKeys(t, auth.Key{MaxConcurrent: 1})
	entered, proceed := make(chan struct{}), make(chan struct{})
	var once sync.Once
	store := &saveHook{SQLite: newResponseStore(t), hook: func(responses.Record) error {
		once.Do(func() {
			close(entered)
			<-proceed
		})
		return nil
	}}
	env := newEnv(t, envConfig{Keys: f.keys, AdminKeys: f.admin, Responses: store}, okRun)
	h := bearer(f.alice)
	h["Content-Type"] = "application/json"
	type result struct {
		status int
		body   string
		err    error
	}
	done := make(chan result, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, env.Srv.URL+"/v1/responses", strings.NewReader(`{"model":"m","input":"first"}`))
		for k, v := range h {
			req.Header.Set(k, v)
		}
		resp, err := env.Srv.Client().Do(req)
		if err != nil {
			done <- result{err: err}
			return
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		done <- result{status: resp.StatusCode, body: string(body)}
	}()
	<-entered
	if resp := env.send(t, http.MethodPost, "/v1/responses", `{"model":"m","input":"second"}`, h); resp.status != http.StatusTooManyRequests {
		t.Errorf("while the first is saving: %d %s", resp.status, resp.body)
	}
	close(proceed)
	r := <-done
	if r.err != nil || r.status != http.StatusOK {
		t.Fatalf("first: %d %s %v", r.status, r.body, r.err)
	}
	if resp := env.send(t, http.MethodPost, "/v1/responses", `{"model":"m","input":"third"}`, h); resp.status != http.StatusOK {
		t.Errorf("after the first was stored: %d %s", resp.status, resp.body)
	}
}

// TestRegression_ContinueAfterTheMiddleIsDeleted: three hops of a
// conversation, the middle one deleted; the last one still continues with
// the whole conversation, and the deleted one is not found.
func TestRegression_ContinueAfterTheMiddleIsDeleted(t *testing.T) {
	env := newEnv(t, envConfig{Responses: newResponseStore(t)}, okRun)
	first := createResponse(t, env, `{"model":"m","input":"one"}`, nil)
	second := createResponse(t, env, fmt.Sprintf(`{"model":"m","previous_response_id":%q,"input":"two"}`, first["id"]), nil)
	third := createResponse(t, env, fmt.Sprintf(`{"model":"m","previous_response_id":%q,"input":"three"}`, second["id"]), nil)
	if resp := env.send(t, http.MethodDelete, "/v1/responses/"+second["id"].(string), "", nil); resp.status != http.StatusOK {
		t.Fatalf("delete: %d %s", resp.status, resp.body)
	}
	if resp := env.get(t, "/v1/responses/"+second["id"].(string)); resp.status != http.StatusNotFound {
		t.Errorf("GET of the deleted one: %d", resp.status)
	}
	resp := env.post(t, "/v1/responses", "application/json", fmt.Sprintf(`{"model":"m","previous_response_id":%q,"input":"two"}`, second["id"]))
	if resp.status != http.StatusBadRequest || !strings.Contains(resp.body, `"param":"previous_response_id"`) {
		t.Errorf("continuing the deleted one: %d %s", resp.status, resp.body)
	}
	createResponse(t, env, fmt.Sprintf(`{"model":"m","previous_response_id":%q,"input":"four"}`, third["id"]), nil)
	reqs := env.GW.Requests()
	var got []string
	for _, m := range chatMessages(t, reqs[len(reqs)-1]) {
		got = append(got, fmt.Sprint(m["role"], ":", m["content"]))
	}
	want := []string{"user:one", "assistant:hi", "user:two", "assistant:hi", "user:three", "assistant:hi", "user:four"}
	if !slices.Equal(got, want) {
		t.Errorf("messages\n got %q\nwant %q", got, want)
	}
}

// TestRegression_PreviousStillInProgressIsRefused: previous_response_id
// naming a background response still queued or in progress was accepted
// and stored a history missing its answer; it is refused 400 naming
// previous_response_id, and nothing is dispatched for it.
func TestRegression_PreviousStillInProgressIsRefused(t *testing.T) {
	run := liveRun(normalized, 4)
	run.Up <- events(started(), delta("working"))
	m := newRunsManager(t)
	env := newEnv(t, envConfig{Responses: newResponseStore(t), Runs: m}, runWith(run))
	obj := createResponse(t, env, `{"model":"m","input":"long job","background":true}`, nil)
	id := obj["id"].(string)
	defer waitBackground(t, m, id)
	defer close(run.Up)
	// The background response is dispatched by the runs manager's own
	// goroutine: counted once it is (the count was read before it, 0, once
	// in a make test).
	testenv.Eventually(t, "the background response dispatched", func() bool { return len(env.GW.Requests()) == 1 })
	resp := env.post(t, "/v1/responses", "application/json", fmt.Sprintf(`{"model":"m","previous_response_id":%q,"input":"and then?"}`, id))
	if resp.status != http.StatusBadRequest || !strings.Contains(resp.body, `"param":"previous_response_id"`) ||
		!(strings.Contains(resp.body, "is still queued") || strings.Contains(resp.body, "is still in_progress")) {
		t.Errorf("continuing a running background response: %d %s", resp.status, resp.body)
	}
	if n := len(env.GW.Requests()); n != 1 {
		t.Errorf("%d dispatched, want the background one only", n)
	}
	run.Up <- events(usageEvent(1, 1), complete("stop"))
}

// openStream posts a streamed response and reads its events until
// response.created: the response's id and the open body.
func openStream(t *testing.T, env *testEnv, ctx context.Context, body string) (string, io.ReadCloser) {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, env.Srv.URL+"/v1/responses", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := env.Srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var id string
	var r sse.Reader
	buf := make([]byte, 4096)
	for id == "" {
		n, err := resp.Body.Read(buf)
		if n > 0 {
			_ = r.Feed(buf[:n], func(e sse.Event) error {
				if e.Type == "response.created" {
					var obj struct{ Response struct{ ID string } }
					_ = json.Unmarshal(e.Data, &obj)
					id = obj.Response.ID
				}
				return nil
			})
		}
		if err != nil && id == "" {
			resp.Body.Close()
			t.Fatalf("stream ended before response.created: %v", err)
		}
	}
	return id, resp.Body
}

// TestRegression_StreamedResponseIsStoredWhileItStreams: a streamed
// stored response's id arrives in response.created, and GET found
// nothing (404) until the stream ended; a DELETE meanwhile answered 404
// and the response appeared afterwards. Now GET answers it in_progress
// while it streams, and DELETE cancels its run and deletes it for good.
func TestRegression_StreamedResponseIsStoredWhileItStreams(t *testing.T) {
	run := liveRun(normalized, 4)
	run.Up <- events(started(), delta("first words"))
	env := newEnv(t, envConfig{Responses: newResponseStore(t)}, runWith(run))
	id, body := openStream(t, env, context.Background(), `{"model":"m","input":"hi","stream":true}`)
	defer body.Close()
	if resp := env.get(t, "/v1/responses/"+id); resp.status != http.StatusOK || !strings.Contains(resp.body, `"status":"in_progress"`) {
		t.Fatalf("GET while it streams: %d %s", resp.status, resp.body)
	}
	if resp := env.send(t, http.MethodDelete, "/v1/responses/"+id, "", nil); resp.status != http.StatusOK || !strings.Contains(resp.body, `"deleted":true`) {
		t.Fatalf("DELETE while it streams: %d %s", resp.status, resp.body)
	}
	if len(run.CancelReasons()) == 0 {
		t.Error("the run was not cancelled")
	}
	_, _ = io.Copy(io.Discard, body) // the stream ends
	env.WaitHandlers()
	if resp := env.get(t, "/v1/responses/"+id); resp.status != http.StatusNotFound {
		t.Errorf("GET after DELETE, once the stream ended: %d %s", resp.status, resp.body)
	}
}

// TestRegression_StreamedResponseItsClientLeftIsStoredCancelled: a
// client that leaves mid-stream left nothing stored; now the response is
// stored "cancelled" (README).
func TestRegression_StreamedResponseItsClientLeftIsStoredCancelled(t *testing.T) {
	run := liveRun(normalized, 4)
	run.Up <- events(started(), delta("first words"))
	env := newEnv(t, envConfig{Responses: newResponseStore(t)}, runWith(run))
	ctx, cancel := context.WithCancel(context.Background())
	id, body := openStream(t, env, ctx, `{"model":"m","input":"hi","stream":true}`)
	cancel()
	body.Close()
	env.WaitHandlers()
	resp := env.get(t, "/v1/responses/"+id)
	if resp.status != http.StatusOK || !strings.Contains(resp.body, `"status":"cancelled"`) {
		t.Errorf("GET after its client left: %d %s", resp.status, resp.body)
	}
}

// TestRegression_ResponsesRangesAndDuplicateTools: temperature outside
// [0, 2], top_p outside [0, 1] and two function tools of one name are
// refused 400 naming the field (OpenAI API reference), nothing
// dispatched; the bounds themselves are accepted.
func TestRegression_ResponsesRangesAndDuplicateTools(t *testing.T) {
	env := newEnv(t, envConfig{}, okRun)
	for body, param := range map[string]string{
		`{"model":"m","input":"x","temperature":2.5}`:                                 "temperature",
		`{"model":"m","input":"x","temperature":-0.1}`:                                "temperature",
		`{"model":"m","input":"x","top_p":1.5}`:                                       "top_p",
		`{"model":"m","input":"x","top_p":-1}`:                                        "top_p",
		`{"model":"m","input":"x","tools":[` + weatherTool + `,` + weatherTool + `]}`: "tools[1].name",
	} {
		resp := env.post(t, "/v1/responses", "application/json", body)
		if resp.status != http.StatusBadRequest || !strings.Contains(resp.body, `"param":"`+param+`"`) {
			t.Errorf("%s: %d %s, want 400 naming %s", body, resp.status, resp.body, param)
		}
	}
	if n := len(env.GW.Requests()); n != 0 {
		t.Errorf("%d dispatched", n)
	}
	for _, body := range []string{
		`{"model":"m","input":"x","temperature":0,"top_p":0}`,
		`{"model":"m","input":"x","temperature":2,"top_p":1}`,
	} {
		if resp := env.post(t, "/v1/responses", "application/json", body); resp.status != http.StatusOK {
			t.Errorf("%s: %d %s", body, resp.status, resp.body)
		}
	}
}

// TestRegression_ReasoningTokensPassedOn: a provider reporting
// usage.completion_tokens_details.reasoning_tokens has it in the
// response's usage.output_tokens_details.reasoning_tokens (it was always
// 0), streamed or not; one reporting none has 0.
func TestRegression_ReasoningTokensPassedOn(t *testing.T) {
	withDetails := `data: {"choices":[{"index":0,"delta":{"content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":4,"completion_tokens":9,"completion_tokens_details":{"reasoning_tokens":6}}}` + "\n\ndata: [DONE]\n\n"
	without := `data: {"choices":[{"index":0,"delta":{"content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":4,"completion_tokens":9}}` + "\n\ndata: [DONE]\n\n"
	for _, tc := range []struct {
		body string
		want float64
	}{{withDetails, 6}, {without, 0}} {
		for _, stream := range []bool{false, true} {
			env := newEnv(t, envConfig{}, func(context.Context, contract.Request) (Run, error) { return splitTunnel(tc.body, 16), nil })
			resp := env.post(t, "/v1/responses", "application/json", fmt.Sprintf(`{"model":"m","input":"x","stream":%v}`, stream))
			var obj map[string]any
			if stream {
				obj = finalResponse(t, responseEvents(t, resp.body))
			} else if err := json.Unmarshal([]byte(resp.body), &obj); err != nil {
				t.Fatalf("%d %s", resp.status, resp.body)
			}
			usage, _ := obj["usage"].(map[string]any)
			details, _ := usage["output_tokens_details"].(map[string]any)
			if usage["output_tokens"] != 9.0 || details["reasoning_tokens"] != tc.want {
				t.Errorf("stream %v: usage %v, want reasoning_tokens %v", stream, usage, tc.want)
			}
		}
	}
}

// TestRegression_ResponsesErrorsInTheClientsWords: a function_call input
// item with arguments that are not JSON, and an input_image whose data:
// URL is not valid base64, were refused naming the chat translation's
// fields (messages[0], messages[0].content[0].image_url); they are
// refused 400 naming the client's (input[0].arguments,
// input[0].content[0].image_url), nothing dispatched.
func TestRegression_ResponsesErrorsInTheClientsWords(t *testing.T) {
	env := newEnv(t, envConfig{}, okRun)
	for body, param := range map[string]string{
		`{"model":"m","input":[{"type":"function_call","call_id":"c1","name":"get_weather","arguments":"{not json"},
			{"type":"function_call_output","call_id":"c1","output":"21C"}]}`: "input[0].arguments",
		`{"model":"m","input":[{"role":"user","content":[{"type":"input_image","image_url":"data:image/png;base64,!!!"}]}]}`:                             "input[0].content[0].image_url",
		`{"model":"m","input":[{"role":"user","content":[{"type":"input_text","text":"see"},{"type":"input_image","image_url":"data:image/png,raw"}]}]}`: "input[0].content[1].image_url",
	} {
		resp := env.post(t, "/v1/responses", "application/json", body)
		if resp.status != http.StatusBadRequest || !strings.Contains(resp.body, `"param":"`+param+`"`) {
			t.Errorf("%s: %d %s, want 400 naming %s", body, resp.status, resp.body, param)
		}
	}
	if n := len(env.GW.Requests()); n != 0 {
		t.Errorf("%d dispatched", n)
	}
}

// TestRegression_StoredCallWithBrokenArgumentsContinuesOnOllama: a
// provider's function call whose arguments are not JSON, stored, could
// not be continued on an Ollama provider (400 "messages[1]: tool call
// arguments are not JSON"); its arguments now reach the chat body as a
// JSON string, which the Ollama translation takes.
func TestRegression_StoredCallWithBrokenArgumentsContinuesOnOllama(t *testing.T) {
	n := 0
	env := newEnv(t, envConfig{Responses: newResponseStore(t)}, func(context.Context, contract.Request) (Run, error) {
		if n++; n == 1 {
			return scriptedRun(normalized, events(started(), toolDelta(0, "call_a", "get_weather", `{"city": Paris`)),
				events(usageEvent(3, 2), complete("tool_calls"))), nil
		}
		return okRun(context.Background(), contract.Request{})
	})
	first := createResponse(t, env, `{"model":"m","input":"weather?","tools":[`+weatherTool+`]}`, nil)
	createResponse(t, env, fmt.Sprintf(`{"model":"m","previous_response_id":%q,"tools":[`+weatherTool+`],
		"input":[{"type":"function_call_output","call_id":"call_a","output":"21C"}]}`, first["id"]), nil)
	body := env.GW.Requests()[1].Body
	if _, err := translate.ToOllamaChat(body, "served", nil); err != nil {
		t.Fatalf("the continued conversation on an Ollama provider: %v\n%s", err, body)
	}
	msgs := chatMessages(t, env.GW.Requests()[1])
	calls, _ := msgs[1]["tool_calls"].([]any)
	if len(calls) != 1 {
		t.Fatalf("messages %v", msgs)
	}
	args := calls[0].(map[string]any)["function"].(map[string]any)["arguments"].(string)
	var s string
	if err := json.Unmarshal([]byte(args), &s); err != nil || s != `{"city": Paris` {
		t.Errorf("arguments %q, want the provider's as a JSON string", args)
	}
}

// TestRegression_BackgroundResponseInTheRunsAPI: a background response's
// run showed dispatch null, zero usage, started_at null, output "" and
// finish_reason null even after it completed, and its events nothing
// while in progress and an empty 200 without [DONE] once finished. Now
// it is recorded as a POST /v1/runs run is: its events while it runs,
// then its dispatch, usage, output and finish reason, and events ending
// with [DONE].
func TestRegression_BackgroundResponseInTheRunsAPI(t *testing.T) {
	run := liveRun(normalized, 4)
	run.Up <- events(started(), delta("Hel"))
	m := newRunsManager(t)
	env := newEnv(t, envConfig{Responses: newResponseStore(t), Runs: m}, runWith(run))
	id := createResponse(t, env, `{"model":"m","input":"hi","background":true}`, nil)["id"].(string)

	// While it runs, its events stream has its first delta.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, env.Srv.URL+"/v1/runs/"+id+"/events", nil)
	resp, err := env.Srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var seen strings.Builder
	buf := make([]byte, 4096)
	for !strings.Contains(seen.String(), `"content":"Hel"`) {
		n, err := resp.Body.Read(buf)
		seen.Write(buf[:n])
		if err != nil {
			t.Fatalf("events while it runs: %v %q", err, seen.String())
		}
	}
	run.Up <- events(delta("lo"), usageEvent(7, 2), complete("stop"))
	close(run.Up)
	waitBackground(t, m, id)
	rest, _ := io.ReadAll(resp.Body)
	if all := seen.String() + string(rest); !strings.Contains(all, `"content":"lo"`) || !strings.HasSuffix(all, "data: [DONE]\n\n") {
		t.Errorf("live events %q", all)
	}

	got := env.get(t, "/v1/runs/"+id)
	var rec struct {
		State        string `json:"state"`
		StartedAt    *int64 `json:"started_at"`
		Output       string `json:"output"`
		FinishReason string `json:"finish_reason"`
		Dispatch     *struct {
			NodeID     string `json:"node_id"`
			ProviderID string `json:"provider_id"`
		} `json:"dispatch"`
		Usage struct {
			PromptTokens     int `json:"prompt_tokens"`
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}
	if err := json.Unmarshal([]byte(got.body), &rec); err != nil {
		t.Fatalf("%d %s", got.status, got.body)
	}
	if rec.State != "complete" || rec.StartedAt == nil || rec.Output != "Hello" || rec.FinishReason != "stop" ||
		rec.Dispatch == nil || rec.Dispatch.NodeID != "node1" || rec.Dispatch.ProviderID != "prov1" ||
		rec.Usage.PromptTokens != 7 || rec.Usage.CompletionTokens != 2 {
		t.Errorf("run record %s", got.body)
	}
	// Replayed once it ended.
	if ev := env.get(t, "/v1/runs/"+id+"/events"); !strings.Contains(ev.body, `"content":"Hel"`) || !strings.HasSuffix(ev.body, "data: [DONE]\n\n") {
		t.Errorf("events once it ended: %d %q", ev.status, ev.body)
	}
}
