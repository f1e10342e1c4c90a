package runsapi

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"iop/internal/auth"
	"iop/internal/edge/api"
	"iop/internal/edge/api/apitest"
	"iop/internal/edge/contract"
	"iop/internal/ledger"
	"iop/internal/quota"
	"iop/internal/wire/nodev1"
)

// The frame's behaviours on the runs API's routes: keys, the models a
// key may use, the key's request slot, refusals recorded once, quota,
// and one reading of a tunnel stream for the run, the metrics and the
// ledger.

// TestRunsKeys: with keys configured, the runs API needs one; a missing
// or wrong key is 401 with WWW-Authenticate: Bearer in OpenAI's shape,
// never echoing the key sent; nothing is dispatched.
func TestRunsKeys(t *testing.T) {
	t.Parallel()
	k := apitest.NewKeys(t, auth.Key{})
	env := newEnv(t, api.Config{Keys: k.Keys, AdminKeys: k.Admin}, okRun)
	const wrong = "iop-wrong-key-0123456789-do-not-echo"
	for _, rt := range []struct{ method, path, body string }{
		{"POST", "/v1/runs", `{"model":"m","prompt":"x"}`},
		{"GET", "/v1/runs", ""},
		{"GET", "/v1/runs/run_x", ""},
	} {
		for name, header := range map[string]map[string]string{
			"missing":      nil,
			"wrong bearer": bearer(wrong),
			"admin key":    bearer(k.AdminKey),
		} {
			resp := env.send(t, rt.method, rt.path, rt.body, header)
			want := http.StatusUnauthorized
			if name == "admin key" {
				want = http.StatusForbidden
			}
			if resp.Status != want {
				t.Errorf("%s %s, %s: status %d, want %d (%s)", rt.method, rt.path, name, resp.Status, want, resp.Body)
				continue
			}
			if got := resp.Header.Get("WWW-Authenticate"); want == 401 && !strings.HasPrefix(got, "Bearer") {
				t.Errorf("%s %s, %s: WWW-Authenticate %q", rt.method, rt.path, name, got)
			}
			if strings.Contains(resp.Body, wrong) || strings.Contains(resp.Body, k.AdminKey) {
				t.Errorf("%s %s: the key sent is echoed: %s", rt.method, rt.path, resp.Body)
			}
			openAIError(t, resp.Body)
		}
	}
	if n := len(env.GW.Requests()); n != 0 {
		t.Errorf("%d refused requests reached the gateway", n)
	}
}

// TestRunsModelNotAllowed: a run of a model the key may not use is 403
// model_not_allowed naming the model, background or not, before
// anything is dispatched; an allowed one runs.
func TestRunsModelNotAllowed(t *testing.T) {
	t.Parallel()
	k := apitest.NewKeys(t, auth.Key{Models: []string{"m"}})
	env := newEnv(t, api.Config{Keys: k.Keys}, okRun)
	env.GW.Names = []string{"m", "alias", "secret-model"}
	for _, body := range []string{`{"model":"secret-model","prompt":"x","background":true}`, `{"model":"secret-model","prompt":"x"}`} {
		resp := env.send(t, "POST", "/v1/runs", body, bearer(k.Alice))
		if resp.Status != http.StatusForbidden {
			t.Errorf("%s: %d, want 403 (%s)", body, resp.Status, resp.Body)
			continue
		}
		if code, param := openAIError(t, resp.Body); code != "model_not_allowed" || param != "model" {
			t.Errorf("%s: code %s param %s", body, code, param)
		}
	}
	if n := len(env.GW.Requests()); n != 0 {
		t.Errorf("%d refused requests reached the gateway", n)
	}
	if resp := env.send(t, "POST", "/v1/runs", `{"model":"m","prompt":"x"}`, bearer(k.Alice)); resp.Status != 200 || !strings.Contains(resp.Body, `"state":"complete"`) {
		t.Errorf("allowed model: %d %s", resp.Status, resp.Body)
	}
}

// writeWatch is a ResponseWriter that notes the key's slots in use at
// each write.
type writeWatch struct {
	http.ResponseWriter
	caller *auth.Caller

	mu       sync.Mutex // guards inFlight
	inFlight []int      // at each Write
}

func (w *writeWatch) Write(p []byte) (int, error) {
	w.mu.Lock()
	w.inFlight = append(w.inFlight, w.caller.InFlight())
	w.mu.Unlock()
	return w.ResponseWriter.Write(p)
}

func (w *writeWatch) Flush() { w.ResponseWriter.(http.Flusher).Flush() }

func (w *writeWatch) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *writeWatch) writes() []int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]int(nil), w.inFlight...)
}

// TestRunAnswerFinishedBeforeItsLastByte: a synchronous run holds its
// key's request slot until it ended and gives it back before the write
// of its record, on both execution paths.
func TestRunAnswerFinishedBeforeItsLastByte(t *testing.T) {
	t.Parallel()
	const chunk = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\n"
	for _, tc := range []struct {
		name string
		path contract.Path
		msgs func() []*nodev1.RunUp
	}{
		{"normalized", normalized, func() []*nodev1.RunUp {
			return []*nodev1.RunUp{apitest.Events(apitest.Started(), apitest.Delta("hi")), apitest.Events(apitest.Delta(" there")),
				apitest.Events(apitest.Usage(1, 2), apitest.Complete("stop"))}
		}},
		{"tunnel", tunnel, func() []*nodev1.RunUp {
			return []*nodev1.RunUp{apitest.TunnelHead(200, map[string]string{"Content-Type": "text/event-stream"}),
				apitest.TunnelData(chunk), apitest.TunnelData(chunk + "data: [DONE]\n\n"), apitest.TunnelEnd()}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			k := apitest.NewKeys(t, auth.Key{MaxConcurrent: 1})
			alice := k.Keys.Authenticate(k.Alice)
			gw := &apitest.Gateway{Names: []string{"m"}, DispatchFunc: func(context.Context, contract.Request) (Run, error) {
				return apitest.ScriptedRun(tc.path, tc.msgs()...), nil
			}}
			h := newHandler(t, api.Config{Keys: k.Keys}, nil, gw)
			watch := &writeWatch{caller: alice}
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				watch.ResponseWriter = w
				h.ServeHTTP(watch, r)
			}))
			defer srv.Close()
			req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/runs", strings.NewReader(`{"model":"m","prompt":"x"}`))
			req.Header.Set("Authorization", "Bearer "+k.Alice)
			req.Header.Set("Content-Type", "application/json")
			resp, err := srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			srv.Close() // waits for the handler
			writes := watch.writes()
			if len(writes) == 0 || resp.StatusCode != 200 {
				t.Fatalf("nothing written: %d", resp.StatusCode)
			}
			if last := writes[len(writes)-1]; last != 0 {
				t.Errorf("the key held %d slot(s) at the write that ended the answer; writes saw %v", last, writes)
			}
			if alice.InFlight() != 0 {
				t.Errorf("the key holds %d slots after the request", alice.InFlight())
			}
		})
	}
}

// TestRunRefusalsAreRecordedOnce: a run refused by its key's limits
// (max_concurrent, a model it may not use) is one record and one ledger
// entry, outcome refused with the error code, under operation "runs".
func TestRunRefusalsAreRecordedOnce(t *testing.T) {
	t.Parallel()
	k := apitest.NewKeys(t, auth.Key{MaxConcurrent: 1, Models: []string{"m"}})
	held := apitest.LiveRun(normalized, 1)
	dispatched := make(chan struct{}, 1)
	led, recs := &apitest.Ledger{}, &records{}
	env := newEnv(t, api.Config{Keys: k.Keys, Ledger: led, Observer: recs}, func(context.Context, contract.Request) (Run, error) {
		dispatched <- struct{}{}
		return held, nil
	})
	env.GW.Names = []string{"m", "other"}
	stream := make(chan apitest.Response, 1)
	go func() { stream <- env.send(t, "POST", "/v1/runs", `{"model":"m","prompt":"x"}`, bearer(k.Alice)) }()
	<-dispatched
	if resp := env.send(t, "POST", "/v1/runs", `{"model":"m","prompt":"x"}`, bearer(k.Alice)); resp.Status != 429 {
		t.Fatalf("over max_concurrent: %d %s", resp.Status, resp.Body)
	}
	held.Up <- apitest.Events(apitest.Started(), apitest.Delta("hi"), apitest.Complete("stop"))
	if resp := <-stream; resp.Status != 200 {
		t.Fatalf("alice's run: %d %s", resp.Status, resp.Body)
	}
	if resp := env.send(t, "POST", "/v1/runs", `{"model":"other","prompt":"x"}`, bearer(k.Alice)); resp.Status != 403 {
		t.Fatalf("a model not allowed: %d %s", resp.Status, resp.Body)
	}
	env.WaitHandlers()
	all, entries := waitRecorded(t, recs, led, 3)
	want := map[string]int{"concurrency_limit_exceeded": 1, "model_not_allowed": 1, "": 1}
	byID := map[string]ledger.Entry{}
	for _, e := range entries {
		byID[e.RequestID] = e
	}
	for _, rec := range all {
		outcome := contract.OutcomeRefused
		if rec.ErrorCode == "" {
			outcome = contract.OutcomeCompleted
		}
		if rec.API != "runs" || rec.Outcome != outcome || want[rec.ErrorCode] != 1 {
			t.Errorf("record %+v: want operation runs, one of %v, outcome %s", rec, want, outcome)
		}
		want[rec.ErrorCode]--
		if e, ok := byID[rec.RequestID]; !ok || e.Outcome != string(rec.Outcome) || e.ErrorCode != rec.ErrorCode || e.Key != rec.Key {
			t.Errorf("ledger entry %+v disagrees with its record %+v", e, rec)
		}
	}
}

// TestRegression_QuotaOfARunsAPIRunIsKept: a run of the runs API is
// dispatched by a request of its own, not the POST that submitted it;
// the POST's reservation must be settled (to what it reserved), not
// cancelled as if nothing had run, or runs would bypass the quota.
func TestRegression_QuotaOfARunsAPIRunIsKept(t *testing.T) {
	t.Parallel()
	lim := quota.Limits{TokensPerMinute: 1000}
	k := apitest.NewKeys(t, auth.Key{Quota: lim})
	l := quota.New(quota.Config{})
	keys, teams := auth.QuotaScopes([]auth.Key{{Name: "alice", Quota: lim}}, nil)
	l.Configure(keys, teams, nil)
	env := newEnv(t, api.Config{Keys: k.Keys, Quota: l}, okRun)
	body := `{"model":"m","prompt":"x","max_tokens":300}`
	if resp := env.send(t, "POST", "/v1/runs", body, bearer(k.Alice)); resp.Status/100 != 2 {
		t.Fatalf("%d %s", resp.Status, resp.Body)
	}
	st := l.Status("alice")
	if len(st) != 1 || st[0].Used != int64(len(body)+300) {
		t.Fatalf("after a run: %+v, want %d used", st, len(body)+300)
	}
}

// TestRunTunnelWholeAnswer: a tunnel answer that came in one message is
// recorded as one that came in three.
func TestRunTunnelWholeAnswer(t *testing.T) {
	t.Parallel()
	const answer = `{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"from upstream"},"finish_reason":"stop"}]}`
	jsonHead := map[string]string{"Content-Type": "application/json"}
	for name, msgs := range map[string]func() []*nodev1.RunUp{
		"one message": func() []*nodev1.RunUp {
			return []*nodev1.RunUp{{Msg: &nodev1.RunUp_TunnelHead{TunnelHead: &nodev1.TunnelHead{Status: 200, Headers: jsonHead, Data: []byte(answer), End: true}}}}
		},
		"three messages": func() []*nodev1.RunUp {
			return []*nodev1.RunUp{apitest.TunnelHead(200, jsonHead), apitest.TunnelData(answer), apitest.TunnelEnd()}
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			env := newEnv(t, api.Config{}, apitest.RunWith(apitest.ScriptedRun(tunnel, msgs()...)))
			resp := env.Post(t, "/v1/runs", "application/json", `{"model":"m","prompt":"hi"}`)
			if resp.Status != 200 || !strings.Contains(resp.Body, `"state":"complete"`) {
				t.Errorf("/v1/runs: %d %s", resp.Status, resp.Body)
			}
		})
	}
}

// awkwardStream is an OpenAI chat stream with CRLF line ends whose output
// is "héllo" and whose usage is 11/2, before its end (end).
func awkwardStream(end string) string {
	return `data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":"h"}}]}` + "\r\n\r\n" +
		`data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"éllo"},"finish_reason":"stop"}]}` + "\r\n\r\n" +
		`data: {"id":"c1","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":11,"completion_tokens":2,"total_tokens":13}}` + "\r\n\r\n" +
		end
}

// tunnelRun is a tunnel-path run sending chunks of an event stream, then
// last.
func tunnelRun(chunks []string, last *nodev1.RunUp) *apitest.FakeRun {
	msgs := []*nodev1.RunUp{apitest.TunnelHead(200, map[string]string{"Content-Type": "text/event-stream"})}
	for _, c := range chunks {
		msgs = append(msgs, apitest.TunnelData(c))
	}
	return apitest.ScriptedRun(tunnel, append(msgs, last)...)
}

// TestRunTunnelStreamObserversAgree: the runs API reads a tunnel stream's
// usage and its failure from the frame's one reading of its bytes
// (Answer.RelayRecorded), so the run's record agrees with the metrics
// (the Observer's record) and the usage ledger whatever the framing
// (CRLF line ends; cut byte by byte, or whole). The stream completes; or
// the provider sends an error event mid-stream (the node's end event says
// it); or the tunnel fails after that error event, whose held bytes a
// chat client never gets (it gets the edge's error event) and the run
// never records: its error is the edge's.
func TestRunTunnelStreamObserversAgree(t *testing.T) {
	t.Parallel()
	errorEvent := `data: {"error":{"message":"boom","type":"server_error","code":"provider_failed"}}` + "\r\n\r\n"
	for _, tc := range []struct {
		name     string
		stream   string
		last     *nodev1.RunUp
		outcome  contract.Outcome
		state    string
		runError string // "" for none; "edge" for the edge's error event
	}{
		{"completed", awkwardStream("data: [DONE]\r\n\r\n"), apitest.TunnelEnd(), contract.OutcomeCompleted, "complete", ""},
		{"error event mid-stream", awkwardStream(errorEvent),
			&nodev1.RunUp{Msg: &nodev1.RunUp_TunnelEnd{TunnelEnd: &nodev1.TunnelEnd{ProviderError: "boom"}}},
			contract.OutcomeUpstreamError, "error", "boom"},
		{"tunnel failing after an error event", awkwardStream(errorEvent), apitest.TunnelError(502, "connection reset"),
			contract.OutcomeUpstreamError, "error", "edge"},
	} {
		for how, chunks := range map[string][]string{"bytewise": strings.Split(tc.stream, ""), "whole": {tc.stream}} {
			t.Run(tc.name+"/"+how, func(t *testing.T) {
				t.Parallel()
				recs, led := &records{}, &apitest.Ledger{}
				env := newEnv(t, api.Config{Observer: recs, Ledger: led}, func(context.Context, contract.Request) (Run, error) {
					return tunnelRun(chunks, tc.last), nil
				})
				run := submitRun(t, env)
				env.WaitHandlers()
				all, entries := waitRecorded(t, recs, led, 1)
				rec, e := all[0], entries[0]
				if rec.API != "runs" || !rec.TokensKnown || rec.InputTokens != 11 || rec.OutputTokens != 2 || e.PromptTokens != 11 || e.CompletionTokens != 2 {
					t.Errorf("record %+v, ledger %+v: want operation runs, usage 11/2", rec, e)
				}
				if rec.Outcome != tc.outcome || e.Outcome != tc.outcome.String() || e.ErrorCode != rec.ErrorCode {
					t.Errorf("outcome %q (code %q), ledger %q (code %q), want %q", rec.Outcome, rec.ErrorCode, e.Outcome, e.ErrorCode, tc.outcome)
				}
				if run.Usage.PromptTokens != 11 || run.Usage.CompletionTokens != 2 {
					t.Errorf("runs record usage %d/%d, want 11/2", run.Usage.PromptTokens, run.Usage.CompletionTokens)
				}
				if run.State != tc.state || run.Outcome == nil || *run.Outcome != tc.outcome.String() || run.Output != "héllo" {
					t.Errorf("runs record %+v, want state %s, outcome %s, output héllo", run, tc.state, tc.outcome)
				}
				events := env.Get(t, "/v1/runs/"+run.ID+"/events")
				wantErr := tc.runError
				if wantErr == "edge" {
					if wantErr = lastErrorMessage(t, []byte(events.Body)); wantErr == "" || wantErr == "boom" {
						t.Fatalf("the run's events do not end with the edge's error event: %q", events.Body)
					}
				}
				switch {
				case wantErr == "" && run.Error != nil:
					t.Errorf("runs record error %q, want none", *run.Error)
				case wantErr != "" && (run.Error == nil || *run.Error != wantErr):
					t.Errorf("runs record error %v, want %q (its last event's)", run.Error, wantErr)
				}
			})
		}
	}
}

// TestRegression_TunnelUsageReadOnceForAll: the metrics, the
// ledger and the runs API read a tunnel stream's usage from the same one
// reading of each event. When the runs recorder decoded each chunk again
// for itself, a usage chunk whose choices it could not decode (an index
// that is a string) gave the metrics and the ledger the usage and the run
// none (0/0).
func TestRegression_TunnelUsageReadOnceForAll(t *testing.T) {
	t.Parallel()
	stream := `data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}` + "\n\n" +
		`data: {"choices":[{"index":"0","delta":{}}],"usage":{"prompt_tokens":5,"completion_tokens":1}}` + "\n\n" +
		"data: [DONE]\n\n"
	recs, led := &records{}, &apitest.Ledger{}
	env := newEnv(t, api.Config{Observer: recs, Ledger: led}, func(context.Context, contract.Request) (Run, error) {
		return tunnelRun([]string{stream}, apitest.TunnelEnd()), nil
	})
	run := submitRun(t, env)
	all, entries := waitRecorded(t, recs, led, 1)
	rec := all[0]
	if rec.InputTokens != 5 || rec.OutputTokens != 1 || entries[0].PromptTokens != 5 || entries[0].CompletionTokens != 1 ||
		run.Usage.PromptTokens != 5 || run.Usage.CompletionTokens != 1 {
		t.Fatalf("usage: metrics %d/%d, ledger %d/%d, runs %d/%d; want 5/1 for all", rec.InputTokens, rec.OutputTokens,
			entries[0].PromptTokens, entries[0].CompletionTokens, run.Usage.PromptTokens, run.Usage.CompletionTokens)
	}
}
