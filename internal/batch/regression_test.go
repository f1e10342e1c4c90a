package batch

import (
	"context"
	"encoding/json"
	"errors"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"iop/internal/testenv"
)

// outage answers every line as the edge does while no node serves the
// model: 503 provider_unavailable while down; a line whose id starts
// with "gone" first gets the 502 upstream_unavailable of a run whose node
// was fenced mid-run. Up, every line is 200.
type outage struct {
	mu    sync.Mutex
	down  bool
	calls map[string]int
	polls int // ready calls while down
	// dropAt, if set, takes the node down at that call: the outage
	// begins while the batch runs, after its start.
	dropAt, n int
}

func (o *outage) Execute(ctx context.Context, owner, path string, body []byte) (Response, error) {
	var b struct {
		ID string `json:"id"`
	}
	_ = json.Unmarshal(body, &b)
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.calls == nil {
		o.calls = map[string]int{}
	}
	o.calls[b.ID]++
	o.n++
	if o.n == o.dropAt {
		o.down = true
	}
	switch {
	case strings.HasPrefix(b.ID, "gone") && o.calls[b.ID] == 1:
		return Response{Status: 502, Body: []byte(`{"error":{"message":"The node serving this request failed: node gone","type":"upstream_error","param":null,"code":"upstream_unavailable"}}`)}, nil
	case o.down:
		return Response{Status: 503, Body: []byte(`{"error":{"message":"No provider for model \"tiny\" is available; retry later","type":"server_error","param":null,"code":"provider_unavailable"}}`)}, nil
	}
	return Response{Status: 200, RequestID: "req_" + b.ID, Body: []byte(`{"object":"chat.completion","id":"` + b.ID + `"}`)}, nil
}

func (o *outage) ready() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.down {
		o.polls++
	}
	return !o.down
}

func (o *outage) maxCallsLocked() int {
	n := 0
	for _, c := range o.calls {
		n = max(n, c)
	}
	return n
}

// TestRegression_BatchLineOfAFencedNodeRunsAgain: a line in flight when
// its node is fenced (SIGSTOP or kill -9 of the node, or a cut link) is
// answered 502 upstream_unavailable "node gone"; it produced nothing, so
// it runs again, as a line cut short by an edge restart does, instead of
// landing in the error file.
func TestRegression_BatchLineOfAFencedNodeRunsAgain(t *testing.T) {
	t.Parallel()
	store := openStore(t, filepath.Join(t.TempDir(), "iop.db"))
	defer store.Close()
	s := newService(t, store, t.TempDir(), Config{Concurrency: 1})
	defer s.Close()
	if err := s.Start(context.Background(), &outage{}); err != nil {
		t.Fatal(err)
	}
	b := create(t, s, input("ok-1", "gone-1", "ok-2"))
	done := waitStatus(t, s, KindOpenAI, b.ID, StatusCompleted)
	if errs := lines(t, s, done.ErrorFileID); done.Completed != 3 || len(errs) != 0 {
		t.Fatalf("after the node loss: %+v, error file %v", done, errs)
	}
}

// TestRegression_BatchLinesWaitOutANodeOutage: while no node is connected
// (Config.Ready false, every line answered 503 provider_unavailable), a
// running batch's lines wait for a node as a starting batch's do, and do
// not spend their MaxAttempts: a node restart longer than the retry
// budget (about a minute by default) must not fail the lines it meets.
func TestRegression_BatchLinesWaitOutANodeOutage(t *testing.T) {
	t.Parallel()
	store := openStore(t, filepath.Join(t.TempDir(), "iop.db"))
	defer store.Close()
	o := &outage{dropAt: 2}
	s := newService(t, store, t.TempDir(), Config{Concurrency: 1, MaxAttempts: 3, Ready: o.ready})
	defer s.Close()
	if err := s.Start(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	b := create(t, s, input("ok-1", "ok-2", "ok-3", "ok-4"))
	// The outage outlasts the retry budget: a line was tried MaxAttempts
	// times, or the lines polled Ready for more than the budget's waits.
	testenv.Eventually(t, "the outage to outlast the retry budget", func() bool {
		o.mu.Lock()
		defer o.mu.Unlock()
		return o.polls >= 20 || o.maxCallsLocked() >= 3
	})
	o.mu.Lock()
	o.down = false
	o.mu.Unlock()
	done := waitStatus(t, s, KindOpenAI, b.ID, StatusCompleted)
	if errs := lines(t, s, done.ErrorFileID); done.Completed != 4 || len(errs) != 0 {
		t.Fatalf("after the outage: %+v, error file %v", done, errs)
	}
}

// TestRegression_BatchResponsesLineRefusesBackground: a /v1/responses
// line with "background": true is refused as a streaming line is (400 in
// the error file): run, its answer is a "queued" response with no
// output, counted completed, while the model's answer lands only in the
// response store, outside the batch's output file.
func TestRegression_BatchResponsesLineRefusesBackground(t *testing.T) {
	t.Parallel()
	store := openStore(t, filepath.Join(t.TempDir(), "iop.db"))
	defer store.Close()
	s := newService(t, store, t.TempDir(), Config{})
	defer s.Close()
	if err := s.Start(context.Background(), &executor{}); err != nil {
		t.Fatal(err)
	}
	in := `{"custom_id":"bg","method":"POST","url":"/v1/responses","body":{"id":"ok-bg","input":"hi","background":true}}` + "\n" +
		`{"custom_id":"fg","method":"POST","url":"/v1/responses","body":{"id":"ok-fg","input":"hi"}}` + "\n"
	f, err := s.UploadFile(context.Background(), "", "batch", "in.jsonl", strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.CreateBatch(context.Background(), "", CreateRequest{InputFileID: f.ID, Endpoint: "/v1/responses", CompletionWindow: "24h"})
	if err != nil {
		t.Fatal(err)
	}
	done := waitStatus(t, s, KindOpenAI, b.ID, StatusCompleted)
	errs := lines(t, s, done.ErrorFileID)
	if done.Completed != 1 || done.Failed != 1 || errs["bg"] == nil {
		t.Fatalf("background line: %+v, error file %v; want it refused (400)", done, errs)
	}
}

// TestRegression_MessageBatchCustomIDPattern: an Anthropic batch refuses
// a custom_id outside ^[a-zA-Z0-9_-]{1,64}$ (the reference's pattern;
// a space, a dot or a slash was accepted) and one used twice, naming the
// request; nothing is stored.
func TestRegression_MessageBatchCustomIDPattern(t *testing.T) {
	t.Parallel()
	store := openStore(t, ":memory:")
	defer store.Close()
	s := newService(t, store, t.TempDir(), Config{})
	defer s.Close()
	if err := s.Start(context.Background(), &executor{}); err != nil {
		t.Fatal(err)
	}
	req := func(ids ...string) []MessageRequest {
		var out []MessageRequest
		for _, id := range ids {
			out = append(out, MessageRequest{CustomID: id, Params: []byte(`{"id":"ok"}`)})
		}
		return out
	}
	for _, tc := range []struct {
		ids  []string
		want string
	}{
		{[]string{"ok-1", "has space"}, "requests.1.custom_id"},
		{[]string{"a.b"}, "requests.0.custom_id"},
		{[]string{"a/b"}, "requests.0.custom_id"},
		{[]string{""}, "requests.0.custom_id"},
		{[]string{strings.Repeat("x", 65)}, "requests.0.custom_id"},
		{[]string{"dup", "dup"}, "requests.1.custom_id"},
	} {
		_, err := s.CreateMessageBatch(context.Background(), "", req(tc.ids...))
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("custom_ids %q: %v, want ErrInvalid naming %s", tc.ids, err, tc.want)
		}
	}
	if list, _, _ := s.Batches(context.Background(), "", KindAnthropic, "", 10); len(list) != 0 {
		t.Fatalf("a refused batch was stored: %+v", list)
	}
	if _, err := s.CreateMessageBatch(context.Background(), "", req("Az09_-", strings.Repeat("y", 64))); err != nil {
		t.Fatalf("valid custom_ids: %v", err)
	}
}
