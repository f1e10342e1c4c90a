package api

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"iop/internal/edge/api/apitest"
	"iop/internal/edge/api/observe"
	"iop/internal/edge/contract"
	"iop/internal/wire/nodev1"
)

// records is an Observer that keeps every record.
type records = apitest.Records[observe.RequestRecord]

func TestRecordOfANormalizedStream(t *testing.T) {
	run := scriptedRun(normalized,
		events(started()),
		events(delta("hel")),
		events(delta("lo"), delta("")),
		events(usageEvent(7, 3)),
		events(complete("stop")),
	)
	run.info.QueueReason, run.info.QueueWait = "queued", 1500*time.Millisecond
	recs := &records{}
	env := newEnv(t, Config{Observer: recs, Now: apitest.Ticking()}, runWith(run))
	resp := env.post(t, "/v1/chat/completions", "application/json", `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`)
	if resp.status != 200 {
		t.Fatalf("status %d", resp.status)
	}
	env.waitHandlers()
	rec := recs.Only(t)
	want := observe.RequestRecord{API: "chat.completions", Model: "m", Stream: true, RunID: "run1", NodeID: "node1", ProviderID: "prov1",
		ProviderType: "sim", ServedModel: "served-model", Generation: 1, Path: "normalized", Admission: contract.AdmissionQueued,
		QueueWait: 1500 * time.Millisecond, Priority: "standard", FlowFromKey: true, Status: 200, Outcome: contract.OutcomeCompleted, InputTokens: 7, OutputTokens: 3, TokensKnown: true}
	got := rec
	if !strings.HasPrefix(got.RequestID, "req_") || len(got.RequestID) != len("req_")+32 {
		t.Errorf("request id %q, want req_ and 32 hex digits", got.RequestID)
	}
	got.Start, got.Duration, got.SlotTime, got.TimeToFirstToken, got.InterTokenLatency, got.RequestID = time.Time{}, 0, 0, 0, 0, ""
	if got != want {
		t.Fatalf("record\n got %+v\nwant %+v", got, want)
	}
	if rec.TimeToFirstToken <= 0 || rec.Duration <= rec.TimeToFirstToken || rec.InterTokenLatency <= 0 {
		t.Fatalf("times: ttft %s, duration %s, inter-token %s", rec.TimeToFirstToken, rec.Duration, rec.InterTokenLatency)
	}
	// The slot is held from the lease's grant (after the queue wait) to
	// the end: less than the request's time after its queue wait.
	if rec.SlotTime <= 0 || rec.SlotTime >= rec.Duration-rec.QueueWait {
		t.Fatalf("slot time %s, duration %s, queue wait %s", rec.SlotTime, rec.Duration, rec.QueueWait)
	}
}

// The tunnel path's usage comes from the relayed bytes, here a final usage
// chunk cut across frames, and the bytes reach the client unchanged.
func TestRecordOfATunnelStreamParsesUsage(t *testing.T) {
	sse := `data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}` + "\r\n\r\n" +
		`data: {"choices":[{"index":0,"delta":{"content":"tun"}}]}` + "\n\n" +
		`data: {"choices":[{"index":0,"delta":{"content":"nel"},"finish_reason":"stop"}],"usage":null}` + "\n\n" +
		`data: {"choices":[],"usage":{"prompt_tokens":11,"completion_tokens":2,"total_tokens":13}}` + "\n\n" +
		"data: [DONE]\n\n"
	msgs := []*nodev1.RunUp{tunnelHead(200, map[string]string{"Content-Type": "text/event-stream"})}
	for i := 0; i < len(sse); i += 13 {
		msgs = append(msgs, tunnelData(sse[i:min(i+13, len(sse))]))
	}
	msgs = append(msgs, tunnelEnd())
	recs := &records{}
	env := newEnv(t, Config{Observer: recs}, runWith(scriptedRun(tunnel, msgs...)))
	resp := env.post(t, "/v1/chat/completions", "application/json", `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`)
	if resp.body != sse {
		t.Fatalf("relayed bytes changed:\n%q\nwant\n%q", resp.body, sse)
	}
	env.waitHandlers()
	rec := recs.Only(t)
	if !rec.TokensKnown || rec.InputTokens != 11 || rec.OutputTokens != 2 || rec.Path != "tunnel" || rec.Outcome != contract.OutcomeCompleted || rec.Admission != contract.AdmissionImmediate {
		t.Fatalf("record %+v", rec)
	}
}

func TestRecordOfATunnelJSONParsesUsage(t *testing.T) {
	recs := &records{}
	env := newEnv(t, Config{Observer: recs}, runWith(scriptedRun(tunnel,
		tunnelHead(200, map[string]string{"content-type": "application/json"}),
		tunnelData(tunnelJSON[:50]), tunnelData(tunnelJSON[50:]), tunnelEnd())))
	env.post(t, "/v1/chat/completions", "application/json", simpleChat)
	env.waitHandlers()
	if rec := recs.Only(t); !rec.TokensKnown || rec.InputTokens != 4 || rec.OutputTokens != 2 || rec.TimeToFirstToken != 0 {
		t.Fatalf("record %+v", rec)
	}
}

func TestRecordOfRefusalsAndInvalidRequests(t *testing.T) {
	cases := []struct {
		name      string
		err       error
		body      string
		status    int
		admission contract.Admission
		outcome   contract.Outcome
		code      string
	}{
		{"queue full", fmt.Errorf("%w: 16 waiting", ErrQueueFull), simpleChat, 429, contract.AdmissionQueueFull, contract.OutcomeRefused, "queue_full"},
		{"queue timeout", ErrQueueTimeout, simpleChat, 503, contract.AdmissionQueueTimeout, contract.OutcomeRefused, "queue_timeout"},
		{"rejected", fmt.Errorf("%w: tools", ErrCandidatesRejected), simpleChat, 400, contract.AdmissionRejected, contract.OutcomeRefused, "unsupported_capability"},
		{"no provider", ErrNoProvider, simpleChat, 503, contract.AdmissionUnavailable, contract.OutcomeRefused, "provider_unavailable"},
		{"unknown model", ErrUnknownModel, simpleChat, 404, contract.AdmissionUnknownModel, contract.OutcomeRefused, "model_not_found"},
		{"dispatch failed", ErrDispatchTimeout, simpleChat, 502, contract.AdmissionDispatchFailed, contract.OutcomeRefused, "upstream_unavailable"},
		{"bad body", nil, `{"model":`, 400, "", contract.OutcomeInvalidRequest, "invalid_request"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			recs := &records{}
			env := newEnv(t, Config{Observer: recs}, failWith(c.err))
			if resp := env.post(t, "/v1/chat/completions", "application/json", c.body); resp.status != c.status {
				t.Fatalf("status %d, want %d", resp.status, c.status)
			}
			env.waitHandlers()
			rec := recs.Only(t)
			if rec.Status != c.status || rec.Admission != c.admission || rec.Outcome != c.outcome || rec.ErrorCode != c.code || rec.RunID != "" {
				t.Fatalf("record %+v", rec)
			}
		})
	}
	// Routes that are not API requests get no record.
	recs := &records{}
	env := newEnv(t, Config{Observer: recs}, failWith(ErrNoProvider))
	env.get(t, "/v1/models")
	env.get(t, "/nope")
	env.waitHandlers()
	if all := recs.All(); len(all) != 0 {
		t.Fatalf("records for non-API routes: %+v", all)
	}
}

func TestRecordOfAnUpstreamFailureAndAClientThatLeft(t *testing.T) {
	recs := &records{}
	env := newEnv(t, Config{Observer: recs}, runWith(scriptedRun(normalized, events(errorEvent(502, "boom")))))
	env.post(t, "/v1/chat/completions", "application/json", simpleChat)
	env.waitHandlers()
	if rec := recs.Only(t); rec.Status != 502 || rec.Outcome != contract.OutcomeUpstreamError || rec.RunID != "run1" || rec.ErrorCode != "upstream_error" {
		t.Fatalf("record %+v", rec)
	}

	recs = &records{}
	queued := make(chan struct{})
	env = newEnv(t, Config{Observer: recs}, func(ctx context.Context, _ contract.Request) (Run, error) {
		close(queued)
		<-ctx.Done()
		return nil, ctx.Err()
	})
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, env.srv.URL+"/v1/chat/completions", strings.NewReader(simpleChat))
	go func() {
		<-queued
		cancel()
	}()
	if resp, err := env.srv.Client().Do(req); err == nil {
		resp.Body.Close()
	}
	env.waitHandlers()
	if rec := recs.Only(t); rec.Status != 0 || rec.Outcome != contract.OutcomeClientGone || rec.Admission != contract.AdmissionCancelled {
		t.Fatalf("record %+v", rec)
	}
}

// Every request gets one info log line with its run's details; it names no
// header and no body.
func TestOneLogLinePerRequest(t *testing.T) {
	var buf bytes.Buffer
	var mu sync.Mutex
	logger := slog.New(slog.NewJSONHandler(&lockedWriter{w: &buf, mu: &mu}, nil))
	run := scriptedRun(normalized, events(delta("hi")), events(usageEvent(3, 1)), events(complete("stop")))
	env := newEnvLogging(t, Config{}, logger, runWith(run))
	req, _ := http.NewRequest(http.MethodPost, env.srv.URL+"/v1/chat/completions", strings.NewReader(simpleChat))
	req.Header.Set("Authorization", "Bearer sk-client-secret")
	resp := env.do(t, req)
	if resp.status != 200 {
		t.Fatal(resp.status)
	}
	env.waitHandlers()
	mu.Lock()
	defer mu.Unlock()
	var lines []string
	for _, l := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		if strings.Contains(l, `"msg":"request"`) {
			lines = append(lines, l)
		}
	}
	if len(lines) != 1 {
		t.Fatalf("request lines %q", lines)
	}
	for _, want := range []string{`"level":"INFO"`, `"run_id":"run1"`, `"model":"m"`, `"node_id":"node1"`, `"provider_id":"prov1"`,
		`"served_model":"served-model"`, `"path":"normalized"`, `"queue_reason":"immediate"`, `"status":200`, `"input_tokens":3`, `"output_tokens":1`, `"outcome":"completed"`} {
		if !strings.Contains(lines[0], want) {
			t.Errorf("log line lacks %s: %s", want, lines[0])
		}
	}
	if strings.Contains(buf.String(), "sk-client-secret") {
		t.Fatal("the client's key is in the log")
	}
}

type lockedWriter struct {
	w  *bytes.Buffer
	mu *sync.Mutex
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// A client that leaves right after a tunnel stream's [DONE], before the
// node ended the run, got the whole answer: the request counts as completed.
func TestRegression_TunnelClientLeavingAfterDoneIsCompleted(t *testing.T) {
	run := liveRun(tunnel, 4)
	run.up <- tunnelHead(200, map[string]string{"Content-Type": "text/event-stream"})
	run.up <- tunnelData("data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\ndata: [DONE]\n\n")
	recs := &records{}
	env := newEnv(t, Config{Observer: recs}, runWith(run))
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, env.srv.URL+"/v1/chat/completions", strings.NewReader(simpleChat))
	resp, err := env.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4096)
	got := ""
	readUntil := func(suffix string) {
		for !strings.HasSuffix(got, suffix) {
			n, err := resp.Body.Read(buf)
			got += string(buf[:n])
			if err != nil && !strings.HasSuffix(got, suffix) {
				t.Fatalf("read %q: %v", got, err)
			}
		}
	}
	// The content event goes at once; the [DONE] that came with it waits
	// for the run's end (TunnelEnd), so the client cannot see the answer
	// end before the run has.
	readUntil("}}]}\n\n")
	if strings.Contains(got, "[DONE]") {
		t.Fatalf("the client got %q before the run ended", got)
	}
	run.up <- tunnelEnd()
	readUntil("data: [DONE]\n\n")
	cancel() // the client leaves as soon as it has the whole answer
	resp.Body.Close()
	env.waitHandlers()
	if rec := recs.Only(t); rec.Outcome != contract.OutcomeCompleted || rec.Status != 200 {
		t.Fatalf("record %+v", rec)
	}
	if n, outcomes := run.closeCalls(); n != 1 || outcomes[0] != contract.OutcomeCompleted {
		t.Fatalf("Close called %d times with %q, want once with %q", n, outcomes, contract.OutcomeCompleted)
	}
}

// TestRegression_QueueTimeoutRecordsItsWait: a request refused because its
// queue timeout passed was logged and recorded with queue_wait=0s after
// waiting seconds. Its record has the time it waited.
func TestRegression_QueueTimeoutRecordsItsWait(t *testing.T) {
	var (
		mu  sync.Mutex
		now = time.Unix(1700000000, 0)
	)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	recs := &records{}
	env := newEnv(t, Config{Observer: recs, Now: clock}, func(context.Context, contract.Request) (Run, error) {
		mu.Lock()
		now = now.Add(3 * time.Second) // the queue timeout
		mu.Unlock()
		return nil, ErrQueueTimeout
	})
	if resp := env.post(t, "/v1/chat/completions", "application/json", simpleChat); resp.status != 503 {
		t.Fatalf("status %d, want 503", resp.status)
	}
	env.waitHandlers()
	if rec := recs.Only(t); rec.QueueWait != 3*time.Second || rec.Admission != contract.AdmissionQueueTimeout {
		t.Fatalf("record queue wait %s admission %q, want 3s queue_timeout", rec.QueueWait, rec.Admission)
	}
}

// TestRegression_HeldRequestRecordsItsWait: a request held for its
// providers' reconnect grace that then fails unavailable (503) was
// recorded with queue_wait=0s. Its record has the time it waited.
func TestRegression_HeldRequestRecordsItsWait(t *testing.T) {
	var (
		mu  sync.Mutex
		now = time.Unix(1700000000, 0)
	)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	recs := &records{}
	env := newEnv(t, Config{Observer: recs, Now: clock}, func(context.Context, contract.Request) (Run, error) {
		mu.Lock()
		now = now.Add(5 * time.Second) // the reconnect grace
		mu.Unlock()
		return nil, fmt.Errorf("%w: no candidate came back within reconnect_grace 5s", ErrProviderUnavailable)
	})
	if resp := env.post(t, "/v1/chat/completions", "application/json", simpleChat); resp.status != 503 {
		t.Fatalf("status %d, want 503", resp.status)
	}
	env.waitHandlers()
	if rec := recs.Only(t); rec.QueueWait != 5*time.Second || rec.Admission != contract.AdmissionUnavailable {
		t.Fatalf("record queue wait %s admission %q, want 5s unavailable", rec.QueueWait, rec.Admission)
	}
}

// A stream that began with 200 and then failed logged "request failed"
// with status=502 while the request's line said 200: the failure line now
// says the status the client got, and the mapped one apart.
func TestRegression_FailureAfterTheStreamBeganLogsTheSentStatus(t *testing.T) {
	var buf bytes.Buffer
	var mu sync.Mutex
	logger := slog.New(slog.NewJSONHandler(&lockedWriter{w: &buf, mu: &mu}, nil))
	run := scriptedRun(normalized, events(delta("hi")), events(errorEvent(502, "boom")))
	env := newEnvLogging(t, Config{}, logger, runWith(run))
	resp := env.post(t, "/v1/chat/completions", "application/json", `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`)
	if resp.status != 200 {
		t.Fatal(resp.status)
	}
	env.waitHandlers()
	mu.Lock()
	defer mu.Unlock()
	if strings.Contains(buf.String(), `"msg":"request failed"`) {
		t.Fatalf("a started answer logged as a failed request: %s", buf.String())
	}
	var line string
	for _, l := range strings.Split(buf.String(), "\n") {
		if strings.Contains(l, `"msg":"answer failed after it began"`) {
			line = l
		}
	}
	for _, want := range []string{`"level":"WARN"`, `"status":200`, `"error_status":502`, `"path":"/v1/chat/completions"`} {
		if !strings.Contains(line, want) {
			t.Errorf("failure line lacks %s: %q", want, line)
		}
	}
}
