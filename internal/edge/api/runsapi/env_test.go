package runsapi

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"iop/internal/edge/api"
	"iop/internal/edge/api/apitest"
	"iop/internal/edge/api/observe"
	"iop/internal/edge/api/openai"
	"iop/internal/edge/contract"
	"iop/internal/ledger"
	"iop/internal/runs"
	"iop/internal/sse"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// Run is the run the tests' gateways hand out.
type Run = apitest.Run

const (
	normalized = apitest.Normalized
	tunnel     = apitest.Tunnel
)

// newRunsManager is a runs manager over an in-memory store.
func newRunsManager(t testing.TB) *runs.Manager {
	t.Helper()
	store, err := runs.OpenSQLite(":memory:")
	if err != nil {
		t.Fatal(err)
	}
	m, err := runs.NewManager(context.Background(), runs.Config{Store: store})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// okRun dispatches a run that answers "hi".
func okRun(context.Context, contract.Request) (Run, error) {
	return apitest.ScriptedRun(normalized, apitest.Events(apitest.Started(), apitest.Delta("hi"), apitest.Usage(3, 1), apitest.Complete("stop"))), nil
}

// newHandler is the frame with the runs API (over a new in-memory runs
// manager unless cfg has one) over gw.
func newHandler(t testing.TB, cfg api.Config, m *runs.Manager, gw *apitest.Gateway) http.Handler {
	if cfg.Now == nil {
		cfg.Now = func() time.Time { return time.Unix(1700000000, 0) }
	}
	if m == nil {
		m = newRunsManager(t)
	}
	cfg.APIs = append(cfg.APIs, openai.Routes, Routes(Config{Runs: m}))
	return api.New(cfg, gw, slog.New(slog.DiscardHandler))
}

// testEnv serves newHandler over a scripted gateway (models m and alias).
type testEnv struct{ *apitest.Env }

func newEnv(t *testing.T, cfg api.Config, dispatch func(context.Context, contract.Request) (Run, error)) *testEnv {
	t.Helper()
	gw := &apitest.Gateway{Names: []string{"m", "alias"}, DispatchFunc: dispatch}
	return &testEnv{Env: apitest.Start(t, gw, newHandler(t, cfg, nil, gw))}
}

// send makes a request with the given headers.
func (e *testEnv) send(t *testing.T, method, path, body string, header map[string]string) apitest.Response {
	t.Helper()
	var rd *strings.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	var req *http.Request
	var err error
	if rd != nil {
		req, err = http.NewRequest(method, e.Srv.URL+path, rd)
	} else {
		req, err = http.NewRequest(method, e.Srv.URL+path, nil)
	}
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	return e.Do(t, req)
}

func bearer(key string) map[string]string { return map[string]string{"Authorization": "Bearer " + key} }

// runRecord is what the runs API says of a finished run.
type runRecord struct {
	ID           string  `json:"id"`
	State        string  `json:"state"`
	Output       string  `json:"output"`
	FinishReason *string `json:"finish_reason"`
	Error        *string `json:"error"`
	Outcome      *string `json:"outcome"`
	Usage        struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
	} `json:"usage"`
}

// submitRun runs a synchronous POST /v1/runs and returns its record.
func submitRun(t *testing.T, env *testEnv) runRecord {
	t.Helper()
	resp := env.Post(t, "/v1/runs", "application/json", `{"model":"m","prompt":"x"}`)
	var rec runRecord
	if resp.Status != http.StatusOK || json.Unmarshal([]byte(resp.Body), &rec) != nil {
		t.Fatalf("POST /v1/runs: %d %s", resp.Status, resp.Body)
	}
	return rec
}

// eventData is the data of each event of an SSE stream, read by the
// WHATWG rules (package sse).
func eventData(t *testing.T, stream []byte) []string {
	t.Helper()
	var out []string
	if err := sse.ReadAll(bytes.NewReader(stream), func(e sse.Event) error {
		out = append(out, string(e.Data))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

// lastErrorMessage is the message of the last event of an SSE stream, an
// OpenAI error event; "" if it is none.
func lastErrorMessage(t *testing.T, stream []byte) string {
	t.Helper()
	events := eventData(t, stream)
	if len(events) == 0 {
		return ""
	}
	var e struct {
		Error *struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	if json.Unmarshal([]byte(events[len(events)-1]), &e) != nil || e.Error == nil {
		return ""
	}
	return e.Error.Message
}

// openAIError reads an OpenAI error body's code and param.
func openAIError(t *testing.T, body string) (code, param string) {
	t.Helper()
	var e struct {
		Error struct {
			Code  *string `json:"code"`
			Param *string `json:"param"`
		} `json:"error"`
	}
	if err := json.Unmarshal([]byte(body), &e); err != nil {
		t.Fatalf("not an OpenAI error body: %v: %s", err, body)
	}
	if e.Error.Code != nil {
		code = *e.Error.Code
	}
	if e.Error.Param != nil {
		param = *e.Error.Param
	}
	return code, param
}

type records = apitest.Records[observe.RequestRecord]

// waitRecorded waits until the observer and the ledger each have n
// records (failing at more) and returns them.
func waitRecorded(t *testing.T, recs *records, led *apitest.Ledger, n int) ([]observe.RequestRecord, []ledger.Entry) {
	t.Helper()
	var all []observe.RequestRecord
	var entries []ledger.Entry
	apitest.Eventually(t, fmt.Sprintf("%d records and ledger entries", n), func() bool {
		all, entries = recs.All(), led.All()
		if len(all) > n || len(entries) > n {
			t.Fatalf("%d records and %d ledger entries, want %d of each: %+v", len(all), len(entries), n, all)
		}
		return len(all) == n && len(entries) == n
	})
	return all, entries
}
