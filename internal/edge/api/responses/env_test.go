package responses

import (
	"context"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"iop/internal/auth"
	"iop/internal/edge/api"
	"iop/internal/edge/api/apitest"
	"iop/internal/edge/api/runsapi"
	"iop/internal/edge/contract"
	"iop/internal/runs"
	"iop/internal/wire/nodev1"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// Run is the run the tests' gateways hand out.
type Run = apitest.Run

// Run messages (package apitest's).
var (
	events      = apitest.Events
	started     = apitest.Started
	delta       = apitest.Delta
	usageEvent  = apitest.Usage
	complete    = apitest.Complete
	errorEvent  = apitest.ErrorEvent
	tunnelHead  = apitest.TunnelHead
	tunnelData  = apitest.TunnelData
	tunnelEnd   = apitest.TunnelEnd
	tunnelError = apitest.TunnelError
	scriptedRun = apitest.ScriptedRun
	liveRun     = apitest.LiveRun
	runWith     = apitest.RunWith
	failWith    = apitest.FailWith
)

const (
	normalized = contract.PathNormalized
	tunnel     = contract.PathTunnel
)

// thinkingDelta is a delta event of reasoning.
func thinkingDelta(thinking string) *nodev1.RunEvent {
	return &nodev1.RunEvent{Type: nodev1.RunEvent_TYPE_DELTA, Thinking: thinking}
}

// okRun dispatches a run that answers "hi".
func okRun(context.Context, contract.Request) (Run, error) {
	return scriptedRun(normalized, events(started(), delta("hi"), usageEvent(3, 1), complete("stop"))), nil
}

// envConfig is what a test sets of the frame (Keys, AdminKeys) and of
// the Responses API (Responses, Runs).
type envConfig struct {
	Keys, AdminKeys *auth.Keyring
	Responses       ResponseStore
	Runs            *runs.Manager
}

// testEnv serves the frame with the Responses API over a scripted
// gateway (models m and alias).
type testEnv struct{ *apitest.Env }

func newEnv(t *testing.T, cfg envConfig, dispatch func(context.Context, contract.Request) (Run, error)) *testEnv {
	t.Helper()
	gw := &apitest.Gateway{Names: []string{"m", "alias"}, DispatchFunc: dispatch}
	acfg := api.Config{
		Now:       func() time.Time { return time.Unix(1700000000, 0) },
		Keys:      cfg.Keys,
		AdminKeys: cfg.AdminKeys,
		// The runs API shows a background response's run.
		APIs: []api.API{Routes(Config{Store: cfg.Responses, Runs: cfg.Runs}), runsapi.Routes(runsapi.Config{Runs: cfg.Runs})},
	}
	return &testEnv{Env: apitest.Start(t, gw, api.New(acfg, gw, slog.New(slog.DiscardHandler)))}
}

// rawResponse is one raw HTTP exchange.
type rawResponse struct {
	status int
	header http.Header
	body   string
}

func raw(r apitest.Response) rawResponse { return rawResponse{r.Status, r.Header, r.Body} }

func (e *testEnv) post(t *testing.T, path, contentType, body string) rawResponse {
	t.Helper()
	return raw(e.Post(t, path, contentType, body))
}

func (e *testEnv) get(t *testing.T, path string) rawResponse {
	t.Helper()
	return raw(e.Get(t, path))
}

// send makes a request with the given headers.
func (e *testEnv) send(t *testing.T, method, path, body string, header map[string]string) rawResponse {
	t.Helper()
	req, err := http.NewRequest(method, e.Srv.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	return raw(e.Do(t, req))
}

func bearer(key string) map[string]string { return map[string]string{"Authorization": "Bearer " + key} }

// newKeys makes keys alice (with alice's limits) and bob, and an admin key.
func newKeys(t *testing.T, alice auth.Key) keyFixture {
	t.Helper()
	k := apitest.NewKeys(t, alice)
	return keyFixture{keys: k.Keys, admin: k.Admin, alice: k.Alice, bob: k.Bob, adminKey: k.AdminKey}
}

// keyFixture is apitest.Keys under the names the tests read.
type keyFixture struct {
	keys, admin          *auth.Keyring
	alice, bob, adminKey string
}

// newRunsManager is a runs manager over an in-memory store.
func newRunsManager(t *testing.T) *runs.Manager {
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

// eventually waits until cond holds, checking it every 5 ms (on a
// ticker); it fails the test, naming what, after 30 s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(30 * time.Second)
	for !cond() {
		select {
		case <-tick.C:
		case <-deadline:
			t.Fatalf("%s: not reached within 30 s", what)
		}
	}
}

// deref is *s, or "" for nil.
func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// errorBody is the OpenAI error shape, {"error":{...}}.
type errorBody struct {
	Error *struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    *string `json:"code"`
	} `json:"error"`
}
