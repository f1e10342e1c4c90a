package batch

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"iop/internal/batch"
	"iop/internal/testenv"
)

// quotaGate answers the first ok lines 200, then refuses every line as
// the key's quota does (429 quota_exceeded, Retry-After retry) until
// opened.
type quotaGate struct {
	mu    sync.Mutex
	ok    int
	open  bool
	retry time.Duration
}

func (g *quotaGate) Execute(ctx context.Context, _, _ string, _ []byte) (batch.Response, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.ok > 0 || g.open {
		g.ok--
		return batch.Response{Status: 200, Body: []byte(`{"object":"chat.completion"}`)}, nil
	}
	return batch.Response{Status: 429, RetryAfter: g.retry,
		Body: []byte(`{"error":{"message":"Quota tokens_per_day of key \"b\" exceeded: limit 100 tokens, used 100 tokens, this request asks 10 tokens; it resets at 2026-12-07T00:00:00Z","type":"rate_limit_error","param":null,"code":"quota_exceeded"}}`)}, nil
}

func (g *quotaGate) let() {
	g.mu.Lock()
	g.open = true
	g.mu.Unlock()
}

// progressList is GET /admin/v1/batches's answer.
func progressList(t *testing.T, s *batch.Service) []Progress {
	t.Helper()
	rec := httptest.NewRecorder()
	Routes(s, nil)[adminPath].Serve(rec, httptest.NewRequest(http.MethodGet, adminPath, nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("GET %s: %d %s", adminPath, rec.Code, rec.Body)
	}
	var out []Progress
	if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestRegression_BatchETAWhileTheQuotaRefusesItsLines: while the batch's
// key's quota refuses its lines, GET /admin/v1/batches (iop status, /ui)
// gave an ETA from the lines done so far as if the rest ran at that
// rate; it now gives none and says the batch waits for its quota, until
// when, and gives an ETA again once a line runs.
func TestRegression_BatchETAWhileTheQuotaRefusesItsLines(t *testing.T) {
	t.Parallel()
	store, err := batch.OpenSQLite(":memory:")
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	s, err := batch.New(batch.Config{Store: store, Dir: t.TempDir(), Concurrency: 1, RetryDelay: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	gate := &quotaGate{ok: 2, retry: 200 * time.Millisecond}
	if err := s.Start(context.Background(), gate); err != nil {
		t.Fatal(err)
	}
	var in strings.Builder
	for i := range 6 {
		fmt.Fprintf(&in, `{"custom_id":"l%d","method":"POST","url":"/v1/chat/completions","body":{"model":"m"}}`+"\n", i)
	}
	f, err := s.UploadFile(context.Background(), "", "batch", "in.jsonl", strings.NewReader(in.String()))
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.CreateBatch(context.Background(), "", batch.CreateRequest{InputFileID: f.ID, Endpoint: "/v1/chat/completions", CompletionWindow: "24h"})
	if err != nil {
		t.Fatal(err)
	}
	var p Progress
	testenv.Eventually(t, "the batch listed waiting for its quota", func() bool {
		list := progressList(t, s)
		if len(list) != 1 {
			return false
		}
		p = list[0]
		return p.Waiting != ""
	})
	if p.ID != b.ID || p.Waiting != batch.WaitingQuota || p.WaitingUntil <= 0 || p.ETASeconds != 0 || p.Done != 2 {
		t.Fatalf("while the quota refuses its lines: %+v; want 2 done, waiting quota with a time, no ETA", p)
	}
	seenWaiting := time.Now()
	let := time.Now()
	gate.let()
	testenv.Eventually(t, "the batch to complete", func() bool {
		got, err := s.Batch(context.Background(), "", batch.KindOpenAI, b.ID)
		if err != nil {
			t.Fatal(err)
		}
		return got.Status == batch.StatusCompleted
	})
	got, err := s.Batch(context.Background(), "", batch.KindOpenAI, b.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Completed != 6 || got.Waiting != "" {
		t.Fatalf("after the quota let its lines run: %d completed, waiting %q; want 6 and none", got.Completed, got.Waiting)
	}
	// The wait began before it was seen and ended after the gate opened.
	if min := let.Sub(seenWaiting); got.Waited <= 0 || got.Waited < min || !got.WaitingSince.IsZero() {
		t.Fatalf("after the wait: waited %v since %v; want at least %v, and no wait under way", got.Waited, got.WaitingSince, min)
	}
}

// TestRegression_BatchETAAfterAQuotaWait: a batch's rate counted the time
// its lines waited for its key's quota as running time, so after a wait
// its ETA was as long as the wait made it (a batch that waited out a day's
// quota and then ran 2 lines a second showed a rate of a few lines an
// hour). The rate now counts only the time its lines could run: the waits
// that ended (Waited) and the one under way (WaitingSince).
func TestRegression_BatchETAAfterAQuotaWait(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	b := batch.Batch{ID: "b", Status: batch.StatusInProgress, Total: 100, Completed: 40, InProgressAt: t0,
		Waited: 10 * time.Hour}
	p := progressOf(b, t0.Add(10*time.Hour+20*time.Second))
	if p.LinesPerSecond != 2 || p.ETASeconds != 30 {
		t.Fatalf("after a 10 h wait, 40 lines in 20 s of running: %+v; want 2 lines/s, ETA 30 s", p)
	}
	b.Waiting, b.WaitingSince, b.WaitingUntil = batch.WaitingQuota, t0.Add(10*time.Hour+20*time.Second), t0.Add(20*time.Hour)
	p = progressOf(b, t0.Add(15*time.Hour))
	if p.LinesPerSecond != 2 || p.ETASeconds != 0 || p.Waiting != batch.WaitingQuota {
		t.Fatalf("in a second wait: %+v; want the running rate (2 lines/s) and no ETA", p)
	}
}

// TestProgressETA checks progressOf's rate and ETA, and that a waiting
// batch has none.
func TestProgressETA(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	b := batch.Batch{ID: "b", Status: batch.StatusInProgress, Total: 100, Completed: 20, Failed: 5, InProgressAt: t0, Leased: true, Runner: "e/x"}
	p := progressOf(b, t0.Add(50*time.Second))
	if p.LinesPerSecond != 0.5 || p.ETASeconds != 150 || p.Waiting != "" || p.Runner != "e/x" {
		t.Fatalf("running: %+v; want 0.5 lines/s, ETA 150 s", p)
	}
	b.Waiting, b.WaitingUntil = batch.WaitingQuota, t0.Add(time.Hour)
	p = progressOf(b, t0.Add(50*time.Second))
	if p.ETASeconds != 0 || p.Waiting != "quota" || p.WaitingUntil != t0.Add(time.Hour).Unix() {
		t.Fatalf("waiting: %+v; want no ETA, waiting quota until %d", p, t0.Add(time.Hour).Unix())
	}
	b.Status = batch.StatusCancelling
	if p = progressOf(b, t0.Add(50*time.Second)); p.Waiting != "" {
		t.Fatalf("cancelling: %+v; want no waiting", p)
	}
}
