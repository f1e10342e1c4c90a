package batch

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"iop/internal/testenv"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// executor answers each line by its custom_id's prefix: "ok" 200 at once,
// "err" 400 at once, "hold" only when ctx ends (as a request cut short),
// "busy" 503 until released. It counts the calls per custom_id.
type executor struct {
	mu    sync.Mutex
	calls map[string]int
	busy  bool
}

func (e *executor) Execute(ctx context.Context, owner, path string, body []byte) (Response, error) {
	var b struct {
		ID string `json:"id"`
	}
	_ = json.Unmarshal(body, &b)
	e.mu.Lock()
	if e.calls == nil {
		e.calls = map[string]int{}
	}
	e.calls[b.ID]++
	busy := e.busy
	e.mu.Unlock()
	switch {
	case strings.HasPrefix(b.ID, "hold"):
		<-ctx.Done()
		return Response{}, ctx.Err()
	case strings.HasPrefix(b.ID, "busy") && busy:
		return Response{Status: 503, Body: []byte(`{"error":{"message":"busy"}}`)}, nil
	case strings.HasPrefix(b.ID, "err"):
		return Response{Status: 400, RequestID: "req_" + b.ID, Body: []byte(`{"error":{"message":"bad"}}`)}, nil
	}
	return Response{Status: 200, RequestID: "req_" + b.ID, Body: []byte(`{"object":"chat.completion","id":"` + b.ID + `"}`)}, nil
}

func (e *executor) setBusy(v bool) {
	e.mu.Lock()
	e.busy = v
	e.mu.Unlock()
}

// input is a batch input file of one chat line per id (its body names
// the id, for the executor).
func input(ids ...string) string {
	var sb strings.Builder
	for _, id := range ids {
		fmt.Fprintf(&sb, `{"custom_id":%q,"method":"POST","url":"/v1/chat/completions","body":{"id":%q}}`+"\n", id, id)
	}
	return sb.String()
}

// expiringWindow is the completion window of the batches tests let
// expire: long enough for their immediate lines to finish first on a
// loaded machine (PostgreSQL's writes included), short enough to wait for.
const expiringWindow = 5 * time.Second

func newService(t *testing.T, store Store, dir string, cfg Config) *Service {
	t.Helper()
	cfg.Store, cfg.Dir = store, dir
	if cfg.Contents == nil {
		cfg.Contents = contentsOf(store)
	}
	if cfg.RetryDelay == 0 {
		cfg.RetryDelay = 10 * time.Millisecond
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// contentsOf is the PostgreSQL store under st, which keeps the file
// bytes itself; nil for SQLite (a directory keeps them).
func contentsOf(st Store) Contents {
	for {
		switch s := st.(type) {
		case *SQL:
			if s.dialect == "postgres" {
				return s
			}
			return nil
		case nopClose:
			st = s.Store
		case *frozenStore:
			st = s.Store
		default:
			return nil
		}
	}
}

func openStore(t *testing.T, path string) *SQL {
	t.Helper()
	st, err := OpenSQLite(path)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// waitStatus waits until batch id is one of want and returns it.
func waitStatus(t *testing.T, s *Service, kind, id string, want ...string) Batch {
	t.Helper()
	var b Batch
	testenv.Eventually(t, "batch "+id+" to be "+strings.Join(want, " or "), func() bool {
		var err error
		if b, err = s.Batch(context.Background(), "", kind, id); err != nil {
			t.Fatal(err)
		}
		for _, w := range want {
			if b.Status == w {
				return true
			}
		}
		return false
	})
	return b
}

// lines reads file id's JSON lines by custom_id; a custom_id twice fails.
func lines(t *testing.T, s *Service, id string) map[string]map[string]any {
	t.Helper()
	out := map[string]map[string]any{}
	if id == "" {
		return out
	}
	_, rc, err := s.Content(context.Background(), "", id)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	b, _ := io.ReadAll(rc)
	for l := range strings.SplitSeq(strings.TrimSpace(string(b)), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("line %q: %v", l, err)
		}
		cid := m["custom_id"].(string)
		if _, dup := out[cid]; dup {
			t.Fatalf("custom_id %s twice", cid)
		}
		out[cid] = m
	}
	return out
}

func create(t *testing.T, s *Service, content string) Batch {
	t.Helper()
	f, err := s.UploadFile(context.Background(), "", "batch", "in.jsonl", strings.NewReader(content))
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.CreateBatch(context.Background(), "", CreateRequest{InputFileID: f.ID, Endpoint: "/v1/chat/completions", CompletionWindow: "24h"})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// testExpiresWithPartialResults: a batch past its completion window
// ends expired; the lines that finished keep their results and the rest
// are in the error file as batch_expired.
func testExpiresWithPartialResults(t *testing.T, db database) {
	s := newService(t, db.open(t), db.dir, Config{CompletionWindow: expiringWindow, Concurrency: 8})
	defer s.store.Close()
	defer s.Close()
	if err := s.Start(context.Background(), &executor{}); err != nil {
		t.Fatal(err)
	}
	b := waitStatus(t, s, KindOpenAI, create(t, s, input("ok-1", "ok-2", "err-1", "hold-1", "hold-2")).ID, StatusExpired)
	if b.Total != 5 || b.Completed != 2 || b.Failed != 1 || b.ExpiredAt.IsZero() {
		t.Fatalf("expired batch: %+v", b)
	}
	if out := lines(t, s, b.OutputFileID); len(out) != 2 || out["ok-1"] == nil || out["ok-2"] == nil {
		t.Fatalf("output: %v", out)
	}
	errs := lines(t, s, b.ErrorFileID)
	if len(errs) != 3 || errs["err-1"]["response"].(map[string]any)["status_code"] != float64(400) {
		t.Fatalf("errors: %v", errs)
	}
	for _, id := range []string{"hold-1", "hold-2"} {
		if e, _ := errs[id]["error"].(map[string]any); e["code"] != "batch_expired" || errs[id]["response"] != nil {
			t.Fatalf("%s: %v", id, errs[id])
		}
	}
}

// testMessageBatchExpiredAndCanceledResults: an Anthropic batch's
// unrun requests end expired (window over) or canceled (cancel).
func testMessageBatchExpiredAndCanceledResults(t *testing.T, db database) {
	s := newService(t, db.open(t), db.dir, Config{CompletionWindow: expiringWindow, Concurrency: 8})
	defer s.store.Close()
	defer s.Close()
	if err := s.Start(context.Background(), &executor{}); err != nil {
		t.Fatal(err)
	}
	reqs := func(ids ...string) []MessageRequest {
		var out []MessageRequest
		for _, id := range ids {
			out = append(out, MessageRequest{CustomID: id, Params: []byte(`{"id":"` + id + `"}`)})
		}
		return out
	}
	expiring, err := s.CreateMessageBatch(context.Background(), "", reqs("ok-1", "hold-1"))
	if err != nil {
		t.Fatal(err)
	}
	b := waitStatus(t, s, KindAnthropic, expiring.ID, StatusExpired)
	res := lines(t, s, b.ResultsFileID)
	if b.ExpiredCount != 1 || res["hold-1"]["result"].(map[string]any)["type"] != "expired" ||
		res["ok-1"]["result"].(map[string]any)["type"] != "succeeded" {
		t.Fatalf("expired: %+v %v", b, res)
	}
	cancelled, err := s.CreateMessageBatch(context.Background(), "", reqs("hold-2", "hold-3"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Cancel(context.Background(), "", KindAnthropic, cancelled.ID); err != nil {
		t.Fatal(err)
	}
	b = waitStatus(t, s, KindAnthropic, cancelled.ID, StatusCancelled)
	if res := lines(t, s, b.ResultsFileID); b.Canceled != 2 || len(res) != 2 || res["hold-2"]["result"].(map[string]any)["type"] != "canceled" {
		t.Fatalf("cancelled: %+v %v", b, res)
	}
}

// testResumesAfterClose: a service closed mid-batch leaves it
// in_progress; a new service on the same database runs the lines without
// a result and every custom_id has exactly one result line.
func testResumesAfterClose(t *testing.T, db database) {
	dir := db.dir
	store := db.open(t)
	first := newService(t, store, dir, Config{Concurrency: 2, MaxAttempts: 1 << 20})
	exec := &executor{busy: true}
	if err := first.Start(context.Background(), exec); err != nil {
		t.Fatal(err)
	}
	b := create(t, first, input("ok-1", "ok-2", "busy-1", "ok-3", "busy-2", "ok-4"))
	testenv.Eventually(t, "the ok lines before the busy ones done", func() bool {
		got, _ := first.Batch(context.Background(), "", KindOpenAI, b.ID)
		return got.Completed >= 2
	})
	first.Close()
	store.Close()
	store = db.open(t)
	defer store.Close()
	if got, _ := store.GetBatch(context.Background(), "", b.ID); got.Status != StatusInProgress {
		t.Fatalf("after close: %+v", got)
	}
	second := newService(t, store, dir, Config{Concurrency: 2})
	defer second.Close()
	exec.setBusy(false)
	if err := second.Start(context.Background(), exec); err != nil {
		t.Fatal(err)
	}
	done := waitStatus(t, second, KindOpenAI, b.ID, StatusCompleted)
	if out := lines(t, second, done.OutputFileID); done.Completed != 6 || len(out) != 6 {
		t.Fatalf("resumed: %+v %v", done, out)
	}
}

// testFinishLineRecordsOnce: a line's result is recorded once; a second
// (a late answer of a line re-run after a restart) changes nothing.
func testFinishLineRecordsOnce(t *testing.T, db database) {
	st := db.open(t)
	defer st.Close()
	ctx := context.Background()
	if err := st.CreateBatch(ctx, Batch{ID: "b", Kind: KindOpenAI, Status: StatusInProgress}); err != nil {
		t.Fatal(err)
	}
	if err := st.AddLines(ctx, "b", []Line{{No: 1, CustomID: "a", Body: []byte(`{}`)}}); err != nil {
		t.Fatal(err)
	}
	claimed, ok, err := st.Claim(ctx, "b", "r", time.Minute)
	if err != nil || !ok {
		t.Fatalf("claim: %v %v", ok, err)
	}
	for i, want := range []bool{true, false} {
		ok, err := st.FinishLine(ctx, "b", claimed.Epoch, 1, LineDone, []byte(fmt.Sprintf(`{"n":%d}`, i)))
		if err != nil || ok != want {
			t.Fatalf("finish %d: %v %v", i, ok, err)
		}
	}
	b, _ := st.GetBatch(ctx, "", "b")
	var got Line
	_ = st.Results(ctx, "b", func(l Line) error { got = l; return nil })
	if b.Completed != 1 || b.Total != 1 || string(got.Result) != `{"n":0}` {
		t.Fatalf("batch %+v line %+v", b, got)
	}
}

// TestUploadOverTheLimit: an upload over MaxFileBytes is ErrTooLarge and
// leaves nothing behind.
func TestUploadOverTheLimit(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s := newService(t, openStore(t, ":memory:"), dir, Config{MaxFileBytes: 10})
	defer s.store.Close()
	if _, err := s.UploadFile(context.Background(), "", "batch", "f", strings.NewReader(strings.Repeat("x", 11))); err == nil || !strings.Contains(err.Error(), ErrTooLarge.Error()) {
		t.Fatalf("upload: %v", err)
	}
	if f, err := s.UploadFile(context.Background(), "", "batch", "f", strings.NewReader(strings.Repeat("x", 10))); err != nil || f.Bytes != 10 {
		t.Fatalf("upload at the limit: %+v %v", f, err)
	}
	if files, _ := filepath.Glob(filepath.Join(dir, "*")); len(files) != 1 {
		t.Fatalf("files left: %v", files)
	}
}

// FuzzParseInput: any input file either fails validation with errors
// that name lines in the file, or yields lines with unique custom_ids
// and object bodies.
func FuzzParseInput(f *testing.F) {
	f.Add([]byte(input("a", "b")))
	f.Add([]byte("{not json\n\n" + input("a", "a")))
	f.Add([]byte(`{"custom_id":"x","method":"GET","url":"/v1/chat/completions","body":{}}`))
	f.Add([]byte(""))
	f.Fuzz(func(t *testing.T, data []byte) {
		var got []Line
		errs, err := parseInput(bytes.NewReader(data), "/v1/chat/completions", func(l []Line) error {
			got = append(got, l...)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		n := bytes.Count(data, []byte("\n")) + 1
		for _, e := range errs {
			if e.Line != nil && (*e.Line < 1 || *e.Line > n) {
				t.Fatalf("error names line %d of %d", *e.Line, n)
			}
		}
		if len(errs) == 0 && len(got) == 0 {
			t.Fatal("no error and no line")
		}
		seen := map[string]bool{}
		for _, l := range got {
			if seen[l.CustomID] || l.CustomID == "" || len(l.Body) == 0 || l.Body[0] != '{' {
				t.Fatalf("line %+v", l)
			}
			seen[l.CustomID] = true
		}
	})
}
