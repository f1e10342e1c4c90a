package e2e

// End-to-end test: every finished request has one
// outcome, the same in its log line, the metrics, the usage ledger, the
// events stream and the runs API record; refusals by a key's limits are
// requests too.

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"iop/internal/auth"
	"iop/internal/e2e/harness"
)

// eventLog reads an edge's /admin/v1/events stream and keeps its events.
type eventLog struct {
	mu      sync.Mutex
	events  []map[string]any
	dropped bool
	done    chan struct{}
}

// readEvents subscribes to the rig's events stream and reads it until ctx
// ends; it returns once the subscription is live.
func (rig *keyRig) readEvents(t *testing.T, ctx context.Context) *eventLog {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, rig.base+"/admin/v1/events", nil)
	req.Header.Set("Authorization", "Bearer "+rig.admin)
	resp, err := rig.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /admin/v1/events: %d", resp.StatusCode)
	}
	l := &eventLog{done: make(chan struct{})}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	if !sc.Scan() { // the stream's first line: subscribed
		t.Fatalf("events stream: %v", sc.Err())
	}
	go func() {
		defer close(l.done)
		defer resp.Body.Close()
		for sc.Scan() {
			line := sc.Text()
			if line == "event: dropped" {
				l.mu.Lock()
				l.dropped = true
				l.mu.Unlock()
			}
			data, ok := strings.CutPrefix(line, "data: ")
			if !ok {
				continue
			}
			var ev map[string]any
			if json.Unmarshal([]byte(data), &ev) == nil {
				l.mu.Lock()
				l.events = append(l.events, ev)
				l.mu.Unlock()
			}
		}
	}()
	return l
}

// ofType returns the events of type typ read so far.
func (l *eventLog) ofType(typ string) []map[string]any {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]any
	for _, ev := range l.events {
		if ev["type"] == typ {
			out = append(out, ev)
		}
	}
	return out
}

// ledgerRow is one usage_ledger row.
type ledgerRow struct {
	requestID, key, model, runID, outcome, errorCode string
}

// ledgerRows reads every usage_ledger row of the rig's database file.
func (rig *keyRig) ledgerRows(t *testing.T) []ledgerRow {
	t.Helper()
	rig.e.Ledger.Flush()
	db, err := sql.Open("sqlite", "file:"+rig.db+"?_pragma=busy_timeout(5000)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	rows, err := db.Query(`SELECT request_id, key_name, model, run_id, outcome, error_code FROM usage_ledger`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []ledgerRow
	for rows.Next() {
		var r ledgerRow
		if err := rows.Scan(&r.requestID, &r.key, &r.model, &r.runID, &r.outcome, &r.errorCode); err != nil {
			t.Fatal(err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// requestLines returns the edge's request log lines.
func (rig *keyRig) requestLines(t *testing.T) []map[string]any {
	var out []map[string]any
	for _, l := range harness.JSONLines(t, rig.log.String()) {
		if l["msg"] == "request" {
			out = append(out, l)
		}
	}
	return out
}

// requestsTotal scrapes iop_requests_total, summed by api and outcome
// ("api outcome" → count).
func (rig *keyRig) requestsTotal(t *testing.T) map[string]int {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, rig.base+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+rig.admin)
	resp, err := rig.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for _, m := range fams["iop_requests_total"].GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		out[labels["api"]+" "+labels["outcome"]] += int(m.GetCounter().GetValue())
	}
	return out
}

// str is a log or event field as a string ("" when absent).
func str(v any) string {
	s, _ := v.(string)
	return s
}

// TestRecordsAgreeRequestByRequest runs a concurrent streamed workload
// (concurrency 8; both execution paths; the OpenAI and the Ollama chat
// APIs and the runs API; answers that complete, fail inside their stream,
// or whose client leaves midway; clients that close their connection as
// soon as they have the answer's end) and then refusals by each of a
// key's limits, through a real edge, node and simulators with a usage
// ledger in SQLite. Each request is then found exactly once in the JSON
// log, the ledger, the events stream (run_ended for a run, request_refused
// for a refusal) and the runs API (for a run), with the same outcome, and
// iop_requests_total counts the same outcomes; each outcome is the one
// the client saw.
func TestRecordsAgreeRequestByRequest(t *testing.T) {
	harness.Parallel(t)
	load, loadHash := auth.Generate()
	tight, tightHash := auth.Generate()
	rpm, rpmHash := auth.Generate()
	narrow, narrowHash := auth.Generate()
	rig := startKeyRig(t, []auth.Key{
		{Name: "load", Hash: loadHash},
		{Name: "tight", Hash: tightHash, MaxConcurrent: 1},
		{Name: "rpm", Hash: rpmHash, RequestsPerMinute: 2},
		{Name: "narrow", Hash: narrowHash, Models: []string{normModel}},
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	events := rig.readEvents(t, ctx)

	chat := func(m string) string {
		return `{"model":"` + m + `","stream":true,"messages":[{"role":"user","content":"hi"}]}`
	}
	ollamaChat := func(m string) string { return `{"model":"` + m + `","messages":[{"role":"user","content":"hi"}]}` }
	run := func(m string) string { return `{"model":"` + m + `","prompt":"hi"}` }
	type work struct {
		api, path, model, body string
		kind                   answerKind
		leave                  bool   // the client leaves after the first line
		want                   string // the outcome
	}
	var cases []work
	for _, m := range []string{normModel, tunModel} {
		cases = append(cases,
			work{"chat.completions", "/v1/chat/completions", m, chat(m), kindSSE, false, "completed"},
			work{"ollama.chat", "/api/chat", m, ollamaChat(m), kindNDJSON, false, "completed"},
			work{"runs", "/v1/runs", m, run(m), kindJSON, false, "completed"})
	}
	for _, m := range []string{normErrModel, tunErrModel} {
		cases = append(cases,
			work{"chat.completions", "/v1/chat/completions", m, chat(m), kindSSE, false, "upstream_error"},
			work{"ollama.chat", "/api/chat", m, ollamaChat(m), kindNDJSON, false, "upstream_error"})
	}
	for _, m := range []string{normSlowModel, tunSlowModel} {
		cases = append(cases,
			work{"chat.completions", "/v1/chat/completions", m, chat(m), kindSSE, true, "client_gone"},
			work{"ollama.chat", "/api/chat", m, ollamaChat(m), kindNDJSON, true, "client_gone"})
	}

	// want counts the outcomes the clients saw, by "api model outcome".
	var (
		mu   sync.Mutex
		want = map[string]int{}
	)
	saw := func(api, model, outcome string) {
		mu.Lock()
		want[api+" "+model+" "+outcome]++
		mu.Unlock()
	}
	const workers, rounds = 8, 40
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range rounds {
				c := cases[(w+i*workers)%len(cases)]
				reqCtx, leave := context.WithCancel(ctx)
				a, err := rig.sendUntil(reqCtx, load, c.path, c.body, c.kind, c.leave)
				leave()
				switch {
				case err != nil || a.status != 200:
					t.Errorf("%s %s: status %d err %v: %s", c.path, c.model, a.status, err, a.text)
				case c.leave:
				case c.want == "completed" && (!a.whole || a.code != "" || a.state != "" && a.state != "complete"),
					c.want == "upstream_error" && (!a.whole || a.code == ""):
					t.Errorf("%s %s: client saw whole %v code %q state %q, want %s: %s", c.path, c.model, a.whole, a.code, a.state, c.want, a.text)
				}
				saw(c.api, c.model, c.want)
			}
		})
	}
	wg.Wait()

	// Refusals by each of a key's limits, on the OpenAI, Ollama and runs
	// APIs: a key at its max_concurrent, one past its requests_per_minute,
	// a model the key may not use.
	refuse := func(key, api, path, model, body string, status int, code string) {
		t.Helper()
		a, err := rig.send(ctx, key, path, body, kindJSON)
		if err != nil || a.status != status {
			t.Fatalf("%s with a key over its limit: %d %v, want %d: %s", path, a.status, err, status, a.text)
		}
		if !strings.HasPrefix(path, "/api/") && a.code != code {
			t.Fatalf("%s: code %q, want %q", path, a.code, code)
		}
		logModel := ""
		if code == "model_not_allowed" {
			logModel = model
		}
		saw(api, logModel, "refused")
	}
	held, leave := context.WithCancel(ctx)
	if a, err := rig.sendUntil(held, tight, "/v1/chat/completions", chat(normSlowModel), kindSSE, true); err != nil || a.status != 200 {
		t.Fatalf("the tight key's first stream: %d %v", a.status, err)
	}
	refuse(tight, "chat.completions", "/v1/chat/completions", normModel, chat(normModel), 429, "concurrency_limit_exceeded")
	refuse(tight, "ollama.chat", "/api/chat", normModel, ollamaChat(normModel), 429, "concurrency_limit_exceeded")
	refuse(tight, "runs", "/v1/runs", normModel, run(normModel), 429, "concurrency_limit_exceeded")
	leave()
	saw("chat.completions", normSlowModel, "client_gone")
	for range 2 {
		if a, err := rig.send(ctx, rpm, "/v1/chat/completions", chat(tunModel), kindSSE); err != nil || !a.whole || a.code != "" {
			t.Fatalf("the rpm key within its limit: %d %v %s", a.status, err, a.text)
		}
		saw("chat.completions", tunModel, "completed")
	}
	refuse(rpm, "chat.completions", "/v1/chat/completions", tunModel, chat(tunModel), 429, "rate_limit_exceeded")
	refuse(rpm, "ollama.chat", "/api/chat", tunModel, ollamaChat(tunModel), 429, "rate_limit_exceeded")
	refuse(narrow, "chat.completions", "/v1/chat/completions", tunModel, chat(tunModel), 403, "model_not_allowed")
	refuse(narrow, "ollama.chat", "/api/chat", tunModel, ollamaChat(tunModel), 403, "model_not_allowed")
	refuse(narrow, "runs", "/v1/runs", tunModel, run(tunModel), 403, "model_not_allowed")
	total := 0
	for _, n := range want {
		total += n
	}

	// Every record is written once the request's handler ends, just after
	// its client had the answer: poll, bounded, until all are in.
	var (
		lines  []map[string]any
		rows   []ledgerRow
		ended  []map[string]any
		denied []map[string]any
	)
	deadline := time.Now().Add(30 * time.Second)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		lines, rows = rig.requestLines(t), rig.ledgerRows(t)
		ended, denied = events.ofType("run_ended"), events.ofType("request_refused")
		dispatched, refused := 0, 0
		for _, l := range lines {
			if str(l["run_id"]) != "" {
				dispatched++
			}
			if str(l["outcome"]) == "refused" {
				refused++
			}
		}
		// The events stream is read on its own connection: its events may
		// come after the log lines and ledger rows; wait for them too.
		if len(lines) >= total && len(rows) >= total && len(ended) >= dispatched && len(denied) >= refused || time.Now().After(deadline) {
			break
		}
		<-tick.C
	}
	waitIdle(t, rig.e)

	// The log: one line per request, with the outcomes the clients saw.
	got := map[string]int{}
	byRequest := map[string]map[string]any{}
	for _, l := range lines {
		got[str(l["api"])+" "+str(l["model"])+" "+str(l["outcome"])]++
		id := str(l["request_id"])
		if !strings.HasPrefix(id, "req_") || byRequest[id] != nil {
			t.Errorf("log line without a request id of its own: %v", l)
		}
		byRequest[id] = l
	}
	if len(lines) != total || !maps.Equal(got, want) {
		t.Errorf("%d request lines, want %d; by api, model, outcome:\n got %v\nwant %v", len(lines), total, sorted(got), sorted(want))
	}

	// The ledger: the same requests, each once, with the same outcome, key
	// and run.
	if len(rows) != len(lines) {
		t.Errorf("%d ledger rows for %d requests", len(rows), len(lines))
	}
	inLedger := map[string]bool{}
	for _, r := range rows {
		l := byRequest[r.requestID]
		switch {
		case l == nil || inLedger[r.requestID]:
			t.Errorf("ledger row %+v: not one of the requests logged, or twice", r)
		case r.outcome != str(l["outcome"]) || r.runID != str(l["run_id"]) || r.key != str(l["key"]) || r.errorCode != str(l["error_code"]):
			t.Errorf("ledger row %+v disagrees with the request's log line %v", r, l)
		}
		inLedger[r.requestID] = true
	}

	// The events: one run_ended per run, one request_refused per refusal,
	// with the request's outcome.
	endedRun := map[string]string{}
	for _, ev := range ended {
		id := str(ev["run_id"])
		if _, twice := endedRun[id]; twice || str(ev["outcome"]) == "" {
			t.Errorf("run_ended %v: twice, or without an outcome", ev)
		}
		endedRun[id] = str(ev["outcome"])
	}
	refusedReq := map[string]map[string]any{}
	for _, ev := range denied {
		id := str(ev["request_id"])
		if refusedReq[id] != nil {
			t.Errorf("request_refused twice: %v", ev)
		}
		refusedReq[id] = ev
	}
	runs, refusals := 0, 0
	for id, l := range byRequest {
		if runID := str(l["run_id"]); runID != "" {
			runs++
			if outcome, ok := endedRun[runID]; !ok || outcome != str(l["outcome"]) {
				t.Errorf("run %s: run_ended outcome %q (seen %v), log %v", runID, outcome, ok, l)
			}
		}
		if str(l["outcome"]) == "refused" {
			refusals++
			ev := refusedReq[id]
			if ev == nil || str(ev["outcome"]) != "refused" || str(ev["reason"]) != str(l["error_code"]) || ev["status"] != l["status"] {
				t.Errorf("refusal %v: request_refused %v", l, ev)
			}
		}
	}
	if len(endedRun) != runs || len(refusedReq) != refusals {
		t.Errorf("%d run_ended for %d runs, %d request_refused for %d refusals", len(endedRun), runs, len(refusedReq), refusals)
	}
	if refusals != 8 {
		t.Errorf("%d refusals logged, want 8", refusals)
	}
	events.mu.Lock()
	if events.dropped {
		t.Error("the events stream was dropped: events were missed")
	}
	events.mu.Unlock()

	// The metrics count the same outcomes.
	byAPIOutcome := map[string]int{}
	for _, l := range lines {
		byAPIOutcome[str(l["api"])+" "+str(l["outcome"])]++
	}
	if m := rig.requestsTotal(t); !maps.Equal(m, byAPIOutcome) {
		t.Errorf("iop_requests_total by api and outcome:\n got %v\nwant %v", sorted(m), sorted(byAPIOutcome))
	}

	// The runs API records its runs with the same outcome.
	for _, l := range lines {
		if str(l["api"]) != "runs" || str(l["run_id"]) == "" {
			continue
		}
		req, _ := http.NewRequest(http.MethodGet, rig.base+"/v1/runs/"+str(l["run_id"]), nil)
		req.Header.Set("Authorization", "Bearer "+load)
		resp, err := rig.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var rec struct {
			State   string  `json:"state"`
			Outcome *string `json:"outcome"`
		}
		err = json.NewDecoder(resp.Body).Decode(&rec)
		resp.Body.Close()
		if err != nil || rec.Outcome == nil || *rec.Outcome != str(l["outcome"]) {
			t.Errorf("run %s: record %+v (%v), log %v", str(l["run_id"]), rec, err, l)
		}
	}
}

// sorted renders a count map in key order, for messages.
func sorted(m map[string]int) string {
	keys := slices.Collect(maps.Keys(m))
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "\n  %s: %d", k, m[k])
	}
	return b.String()
}
