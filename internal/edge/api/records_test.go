package api

import (
	"bufio"
	"context"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"iop/internal/auth"
	"iop/internal/edge/api/observe"
	"iop/internal/edge/contract"
)

// holdAtRunEnd is a slog handler that, at the handler's debug line "run
// ended" (logged when the answer was rendered, before the request ends),
// waits for the request's context (the one the gateway was given) to end,
// up to a bound: it stands for the moment, between the answer's last byte
// and the end of the handler, in which a client that has its whole answer
// closes its connection (which ends the request's context).
type holdAtRunEnd struct {
	slog.Handler
	ctxs chan context.Context
}

func (h holdAtRunEnd) Enabled(context.Context, slog.Level) bool { return true }

func (h holdAtRunEnd) Handle(_ context.Context, r slog.Record) error {
	if r.Message == "run ended" {
		ctx := <-h.ctxs
		select {
		case <-ctx.Done():
		case <-time.After(10 * time.Second):
		}
	}
	return nil
}

func (h holdAtRunEnd) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h holdAtRunEnd) WithGroup(string) slog.Handler      { return h }

// TestRegression_ClientClosingAfterItsAnswerIsNotClientGone: under
// concurrency, 13-16% of successful streamed requests were recorded in the
// usage ledger as client_gone while their log line said completed (issue
// 13, item 6). The ledger took the outcome from the first Run.Close, and
// the callback that closes the run when the request's context ends won
// whenever the client, having read the whole answer, closed its connection
// before the handler had closed the run: net/http then ends the context.
// The input that broke it: a streamed answer whose client closes its
// connection as soon as it has read the answer's end. Every record of the
// request must say completed: the log's (Observer), the ledger's, and the
// outcome the run is closed with (the run_ended event's).
func TestRegression_ClientClosingAfterItsAnswerIsNotClientGone(t *testing.T) {
	sse := map[string]string{"Content-Type": "text/event-stream"}
	const tunnelStream = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\ndata: [DONE]\n\n"
	for _, tc := range []struct {
		name, path, body, end string
		run                   func() *fakeRun
	}{
		{"normalized SSE", "/v1/chat/completions", `{"model":"m","stream":true,"messages":[{"role":"user","content":"x"}]}`, "data: [DONE]",
			func() *fakeRun {
				return scriptedRun(normalized, events(started(), delta("hi"), usageEvent(1, 1), complete("stop")))
			}},
		{"tunnel SSE", "/v1/chat/completions", `{"model":"m","stream":true,"messages":[{"role":"user","content":"x"}]}`, "data: [DONE]",
			func() *fakeRun {
				return scriptedRun(tunnel, tunnelHead(200, sse), tunnelData(tunnelStream), tunnelEnd())
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newKeys(t, auth.Key{})
			led, recs := &recordingLedger{}, &records{}
			run := tc.run()
			hold := holdAtRunEnd{ctxs: make(chan context.Context, 1)}
			env := newEnvLogging(t, Config{Keys: f.keys, Ledger: led, Observer: recs}, slog.New(hold),
				func(ctx context.Context, _ contract.Request) (Run, error) {
					hold.ctxs <- ctx
					return run, nil
				})
			env.gw.models = []string{"m"}
			req, _ := http.NewRequest(http.MethodPost, env.srv.URL+tc.path, strings.NewReader(tc.body))
			req.Header.Set("Authorization", "Bearer "+f.alice)
			resp, err := env.srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			sc := bufio.NewScanner(resp.Body)
			for sc.Scan() && !strings.Contains(sc.Text(), tc.end) {
			}
			if !strings.Contains(sc.Text(), tc.end) {
				t.Fatalf("the answer ended without %s: %v", tc.end, sc.Err())
			}
			resp.Body.Close() // the whole answer is in: the client leaves at once
			env.waitHandlers()
			rec := recs.Only(t)
			entries := led.all()
			if len(entries) != 1 {
				t.Fatalf("%d ledger entries, want 1: %+v", len(entries), entries)
			}
			n, outcomes := run.closeCalls()
			if rec.Outcome != contract.OutcomeCompleted || entries[0].Outcome != string(contract.OutcomeCompleted) || n != 1 || outcomes[0] != contract.OutcomeCompleted {
				t.Errorf("outcomes: log %q, ledger %q, run closed %d times with %q; want completed everywhere",
					rec.Outcome, entries[0].Outcome, n, outcomes)
			}
			if entries[0].RequestID != rec.RequestID || entries[0].RunID != rec.RunID || entries[0].Key != "alice" {
				t.Errorf("ledger entry %+v is not the logged request %+v", entries[0], rec)
			}
		})
	}
}

// TestKeyRefusalsAreRecordedOnce: a request refused by one of its key's
// limits (max_concurrent, requests_per_minute, a model it may not use) is
// a finished request like any other: one record (the log line's, the
// metrics'), one ledger entry, outcome refused with the error code, under
// the route's operation, on the OpenAI and Ollama APIs (package runsapi
// checks the runs API's).
func TestKeyRefusalsAreRecordedOnce(t *testing.T) {
	limited, limitedHash := auth.Generate()
	f := newKeys(t, auth.Key{MaxConcurrent: 1, Models: []string{"m"}})
	rpm, err := auth.NewKeyring("keys", []auth.Key{{Name: "rpm", Hash: limitedHash, RequestsPerMinute: 1}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	held := liveRun(normalized, 1)
	dispatched := make(chan struct{}, 1)
	gw := &fakeGateway{models: []string{"m", "other"}, dispatch: func(context.Context, contract.Request) (Run, error) {
		dispatched <- struct{}{}
		return held, nil
	}}
	led, recs := &recordingLedger{}, &records{}
	cfg := Config{Keys: f.keys, Ledger: led, Observer: recs}
	env := newEnvWithGateway(t, cfg, gw, gw)
	cfgRPM := Config{Keys: rpm, Ledger: led, Observer: recs}
	gwRPM := &fakeGateway{models: []string{"m"}, dispatch: okRun}
	envRPM := newEnvWithGateway(t, cfgRPM, gwRPM, gwRPM)

	// alice holds her one slot with a stream that has not ended.
	stream := make(chan rawResponse, 1)
	go func() {
		stream <- env.send(t, "POST", "/v1/chat/completions", `{"model":"m","stream":true,"messages":[{"role":"user","content":"x"}]}`, bearer(f.alice))
	}()
	<-dispatched
	type want struct {
		api, code string
		status    int
	}
	var wants []want
	for _, r := range []struct{ api, path, body string }{
		{"chat.completions", "/v1/chat/completions", simpleChat},
	} {
		if resp := env.send(t, "POST", r.path, r.body, bearer(f.alice)); resp.status != 429 {
			t.Fatalf("%s over max_concurrent: %d %s", r.path, resp.status, resp.body)
		}
		wants = append(wants, want{r.api, "concurrency_limit_exceeded", 429})
	}
	held.up <- events(started(), delta("hi"), complete("stop"))
	if resp := <-stream; resp.status != 200 {
		t.Fatalf("alice's stream: %d", resp.status)
	}
	wants = append(wants, want{"chat.completions", "", 200})
	// A model alice may not use, once her slot is free.
	for _, r := range []struct{ api, path, body string }{
		{"chat.completions", "/v1/chat/completions", `{"model":"other","messages":[{"role":"user","content":"x"}]}`},
	} {
		if resp := env.send(t, "POST", r.path, r.body, bearer(f.alice)); resp.status != 403 {
			t.Fatalf("%s for a model not allowed: %d %s", r.path, resp.status, resp.body)
		}
		wants = append(wants, want{r.api, "model_not_allowed", 403})
	}
	// One request a minute: the second is refused.
	for i, code := range []string{"", "rate_limit_exceeded"} {
		resp := envRPM.send(t, "POST", "/v1/completions", `{"model":"m","prompt":"x"}`, bearer(limited))
		if code == "" && resp.status != 200 || code != "" && resp.status != 429 {
			t.Fatalf("rpm request %d: %d %s", i, resp.status, resp.body)
		}
		wants = append(wants, want{"completions", code, resp.status})
	}
	env.waitHandlers()
	envRPM.waitHandlers()

	got := recs.All()
	entries := led.all()
	if len(got) != len(wants) || len(entries) != len(wants) {
		t.Fatalf("%d records and %d ledger entries for %d requests:\n%+v\n%+v", len(got), len(entries), len(wants), got, entries)
	}
	// Records are made as each handler ends, maybe after the client read
	// the answer and sent the next request: compare them as sets.
	count := map[want]int{}
	for _, w := range wants {
		count[w]++
	}
	byID := map[string]observe.RequestRecord{}
	for _, rec := range got {
		w := want{rec.API, rec.ErrorCode, rec.Status}
		outcome := contract.OutcomeRefused
		if w.code == "" {
			outcome = contract.OutcomeCompleted
		}
		if count[w] == 0 || rec.Outcome != outcome || rec.Key == "" {
			t.Errorf("record %+v: not one of the requests sent, or outcome %q", rec, outcome)
		}
		count[w]--
		byID[rec.RequestID] = rec
	}
	for _, e := range entries {
		rec, ok := byID[e.RequestID]
		if !ok || e.Outcome != string(rec.Outcome) || e.ErrorCode != rec.ErrorCode || e.Key != rec.Key {
			t.Errorf("ledger entry %+v disagrees with its record %+v", e, rec)
		}
		delete(byID, e.RequestID)
	}
}
