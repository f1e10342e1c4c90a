package anthropic

import (
	"context"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"iop/internal/auth"
	"iop/internal/edge/api"
	"iop/internal/edge/api/apitest"
	"iop/internal/edge/contract"
	"iop/internal/wire/nodev1"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// Run is the run the tests' gateways hand out.
type Run = apitest.Run

// The node messages and runs of package apitest, under the names the
// tests read.
var (
	events        = apitest.Events
	started       = apitest.Started
	delta         = apitest.Delta
	usageEvent    = apitest.Usage
	complete      = apitest.Complete
	errorEvent    = apitest.ErrorEvent
	tunnelHead    = apitest.TunnelHead
	tunnelData    = apitest.TunnelData
	tunnelEnd     = apitest.TunnelEnd
	tunnelError   = apitest.TunnelError
	scriptedRun   = apitest.ScriptedRun
	liveRun       = apitest.LiveRun
	failWith      = apitest.FailWith
	runWith       = func(run Run) func(context.Context, contract.Request) (Run, error) { return apitest.RunWith(run) }
	normalized    = apitest.Normalized
	tunnel        = apitest.Tunnel
	thinkingDelta = func(thinking string) *nodev1.RunEvent {
		return &nodev1.RunEvent{Type: nodev1.RunEvent_TYPE_DELTA, Thinking: thinking}
	}
)

// okRun dispatches a run that answers "hi".
func okRun(context.Context, contract.Request) (Run, error) {
	return scriptedRun(normalized, events(started(), delta("hi"), usageEvent(3, 1), complete("stop"))), nil
}

// newHandler is the frame with the Messages API over gw.
func newHandler(cfg api.Config, gw *apitest.Gateway) http.Handler {
	cfg.APIs = append(cfg.APIs, Routes)
	return api.New(cfg, gw, slog.New(slog.DiscardHandler))
}

// testEnv serves newHandler over a scripted gateway (models m and alias).
type testEnv struct{ *apitest.Env }

func newEnv(t *testing.T, cfg api.Config, dispatch func(context.Context, contract.Request) (Run, error)) *testEnv {
	t.Helper()
	if cfg.Now == nil {
		cfg.Now = func() time.Time { return time.Unix(1700000000, 0) }
	}
	gw := &apitest.Gateway{Names: []string{"m", "alias"}, DispatchFunc: dispatch}
	return &testEnv{Env: apitest.Start(t, gw, newHandler(cfg, gw))}
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

// keyFixture is two client keys, alice and bob, and an admin key.
type keyFixture struct {
	keys, admin          *auth.Keyring
	alice, bob, adminKey string
}

// newKeys makes keys alice (with alice's limits) and bob, and an admin key.
func newKeys(t *testing.T, alice auth.Key) keyFixture {
	t.Helper()
	var f keyFixture
	var h string
	f.alice, h = auth.Generate()
	alice.Name, alice.Hash = "alice", h
	f.bob, h = auth.Generate()
	bob := auth.Key{Name: "bob", Hash: h}
	f.adminKey, h = auth.Generate()
	adm := auth.Key{Name: "ops", Hash: h}
	var err error
	if f.keys, err = auth.NewKeyring("keys", []auth.Key{alice, bob}, nil); err != nil {
		t.Fatal(err)
	}
	if f.admin, err = auth.NewKeyring("admin_keys", []auth.Key{adm}, nil); err != nil {
		t.Fatal(err)
	}
	return f
}

// records keeps the RequestRecords the frame hands its Observer.
type records struct {
	mu   sync.Mutex
	recs []api.RequestRecord
}

func (r *records) RequestDone(rec api.RequestRecord) {
	r.mu.Lock()
	r.recs = append(r.recs, rec)
	r.mu.Unlock()
}

func (r *records) only(t *testing.T) api.RequestRecord {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.recs) != 1 {
		t.Fatalf("%d records, want 1: %+v", len(r.recs), r.recs)
	}
	return r.recs[0]
}

// ticking is a clock that moves one second each time it is read.
func ticking() func() time.Time {
	var mu sync.Mutex
	now := time.Unix(1700000000, 0)
	return func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		now = now.Add(time.Second)
		return now
	}
}
