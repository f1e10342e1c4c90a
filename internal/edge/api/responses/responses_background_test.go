package responses

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"iop/internal/sse"
)

// seqEvents decodes a Responses SSE body: each event's type and
// sequence_number, checking they count up by one from first.
func seqEvents(t *testing.T, body string, first int) []respEvent {
	t.Helper()
	var out []respEvent
	if err := sse.ReadAll(strings.NewReader(body), func(e sse.Event) error {
		var obj map[string]any
		if err := json.Unmarshal(e.Data, &obj); err != nil {
			return err
		}
		out = append(out, respEvent{name: e.Type, obj: obj})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for i, ev := range out {
		if seq, _ := ev.obj["sequence_number"].(float64); int(seq) != first+i || ev.name != ev.typ() {
			t.Errorf("event %d (%s, SSE %s): sequence_number %v, want %d", i, ev.typ(), ev.name, ev.obj["sequence_number"], first+i)
		}
	}
	return out
}

// background and stream true streamed the response (it was 400): the
// events of a background response, created queued, then in progress,
// its items, completed; stored as it goes; GET ?stream=true resumes the
// stream after any sequence number, and replays the same events.
func TestRegression_BackgroundStreamAndResume(t *testing.T) {
	t.Parallel()
	m := newRunsManager(t)
	env := newEnv(t, envConfig{Responses: newResponseStore(t), Runs: m}, okRun)
	resp := env.post(t, "/v1/responses", "application/json", `{"model":"m","input":"hi","background":true,"stream":true}`)
	if resp.status != http.StatusOK || !strings.HasPrefix(resp.header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("create: %d %s %s", resp.status, resp.header.Get("Content-Type"), resp.body)
	}
	evs := seqEvents(t, resp.body, 0)
	want := []string{"response.created", "response.queued", "response.in_progress",
		"response.output_item.added", "response.content_part.added", "response.output_text.delta",
		"response.output_text.done", "response.content_part.done", "response.output_item.done", "response.completed"}
	if got := eventTypes(evs); !slices.Equal(got, want) {
		t.Fatalf("events\n got %q\nwant %q", got, want)
	}
	created := evs[0].obj["response"].(map[string]any)
	if created["status"] != "queued" || created["background"] != true {
		t.Errorf("response.created: %v", created)
	}
	id := created["id"].(string)
	final := evs[len(evs)-1].obj["response"].(map[string]any)
	if final["status"] != "completed" || final["id"] != id {
		t.Errorf("response.completed: %v", final)
	}
	waitBackground(t, m, id)
	if got := env.get(t, "/v1/responses/"+id); !strings.Contains(got.body, `"status":"completed"`) || !strings.Contains(got.body, `"text":"hi"`) {
		t.Errorf("stored: %s", got.body)
	}
	for _, after := range []int{-1, 0, 4, len(evs) - 2, len(evs) - 1} {
		q := "?stream=true"
		if after >= 0 {
			q += "&starting_after=" + strconv.Itoa(after)
		}
		got := env.get(t, "/v1/responses/"+id+q)
		if got.status != http.StatusOK {
			t.Fatalf("GET %s: %d %s", q, got.status, got.body)
		}
		resumed := seqEvents(t, got.body, after+1)
		if !slices.Equal(eventTypes(resumed), want[after+1:]) {
			t.Errorf("GET %s: %q", q, eventTypes(resumed))
		}
	}
	if got := env.get(t, "/v1/responses/"+id+"?stream=true&starting_after=-1"); got.status != http.StatusBadRequest || !strings.Contains(got.body, `"starting_after"`) {
		t.Errorf("starting_after=-1: %d %s", got.status, got.body)
	}
	if got := env.get(t, "/v1/responses/resp_nope?stream=true"); got.status != http.StatusNotFound {
		t.Errorf("unknown id: %d %s", got.status, got.body)
	}
}

// A client of a background stream that goes away leaves the response
// running; another request resumes its stream live, from where the first
// one stopped, to its end; a cancel ends a followed stream with an error
// event response_cancelled.
func TestRegression_BackgroundStreamResumesLive(t *testing.T) {
	t.Parallel()
	m := newRunsManager(t)
	run := liveRun(normalized, 8)
	run.Up <- events(started(), delta("first "))
	env := newEnv(t, envConfig{Responses: newResponseStore(t), Runs: m}, runWith(run))
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, env.Srv.URL+"/v1/responses",
		strings.NewReader(`{"model":"m","input":"long","background":true,"stream":true}`))
	res, err := env.Srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	// Read up to the first text delta, then leave.
	var id string
	last := -1
	rd := bufio.NewReader(res.Body)
	for {
		line, err := rd.ReadString('\n')
		if err != nil {
			t.Fatalf("reading the stream: %v", err)
		}
		data, ok := strings.CutPrefix(strings.TrimSpace(line), "data: ")
		if !ok {
			continue
		}
		var ev map[string]any
		if err := json.Unmarshal([]byte(data), &ev); err != nil {
			t.Fatal(err)
		}
		last = int(ev["sequence_number"].(float64))
		if r, ok := ev["response"].(map[string]any); ok && id == "" {
			id = r["id"].(string)
		}
		if ev["type"] == "response.output_text.delta" {
			break
		}
	}
	cancel()
	res.Body.Close()
	// The response runs on: a resumed stream starts (its head comes
	// before the response has more), then it has more output and ends.
	res, err = env.Srv.Client().Get(env.Srv.URL + "/v1/responses/" + id + "?stream=true&starting_after=" + strconv.Itoa(last))
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	run.Up <- events(delta("second"), usageEvent(3, 2), complete("stop"))
	var b strings.Builder
	if _, err := bufio.NewReader(res.Body).WriteTo(&b); err != nil {
		t.Fatal(err)
	}
	got := rawResponse{status: res.StatusCode, body: b.String()}
	evs := seqEvents(t, got.body, last+1)
	if got.status != 200 || len(evs) == 0 || evs[len(evs)-1].typ() != "response.completed" {
		t.Fatalf("resumed: %d %s", got.status, got.body)
	}
	text := evs[len(evs)-1].obj["response"].(map[string]any)["output"].([]any)[0].(map[string]any)["content"].([]any)[0].(map[string]any)["text"]
	if text != "first second" {
		t.Errorf("final text %v", text)
	}
	waitBackground(t, m, id)
}

// A cancelled background response ends the stream that follows it with
// an error event (code response_cancelled), and is stored cancelled.
func TestRegression_BackgroundStreamCancelled(t *testing.T) {
	t.Parallel()
	m := newRunsManager(t)
	run := liveRun(normalized, 8)
	run.Up <- events(started(), delta("partial"))
	env := newEnv(t, envConfig{Responses: newResponseStore(t), Runs: m}, runWith(run))
	obj := createResponse(t, env, `{"model":"m","input":"long job","background":true}`, nil)
	id := obj["id"].(string)
	eventually(t, "the response in progress", func() bool {
		return strings.Contains(env.get(t, "/v1/responses/"+id).body, `"status":"in_progress"`)
	})
	done := make(chan rawResponse, 1)
	go func() {
		res, err := env.Srv.Client().Get(env.Srv.URL + "/v1/responses/" + id + "?stream=true")
		if err != nil {
			done <- rawResponse{}
			return
		}
		defer res.Body.Close()
		var b strings.Builder
		_, _ = bufio.NewReader(res.Body).WriteTo(&b)
		done <- rawResponse{status: res.StatusCode, body: b.String()}
	}()
	if resp := env.post(t, "/v1/responses/"+id+"/cancel", "", ""); !strings.Contains(resp.body, `"status":"cancelled"`) {
		t.Fatalf("cancel: %d %s", resp.status, resp.body)
	}
	var got rawResponse
	select {
	case got = <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the stream did not end")
	}
	evs := seqEvents(t, got.body, 0)
	if len(evs) == 0 || evs[len(evs)-1].typ() != "error" || evs[len(evs)-1].obj["code"] != "response_cancelled" {
		t.Fatalf("stream: %s", got.body)
	}
}
