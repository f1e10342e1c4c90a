package ollama

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"iop/internal/auth"
	"iop/internal/edge/api"
	"iop/internal/edge/api/apitest"
	"iop/internal/edge/api/observe"
	"iop/internal/edge/contract"
	"iop/internal/wire/nodev1"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// Run is the run the tests' gateways hand out.
type Run = apitest.Run

// fakeRun is the tests' scripted run.
type fakeRun = apitest.FakeRun

// Run messages and runs (package apitest's).
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
	failWith    = apitest.FailWith
)

const (
	normalized = contract.PathNormalized
	tunnel     = contract.PathTunnel
)

// runWith makes a dispatch func that hands out run.
func runWith(run Run) func(context.Context, contract.Request) (Run, error) {
	return apitest.RunWith(run)
}

// thinkingDelta is a delta event of reasoning.
func thinkingDelta(thinking string) *nodev1.RunEvent {
	return &nodev1.RunEvent{Type: nodev1.RunEvent_TYPE_DELTA, Thinking: thinking}
}

// okRun dispatches a run that answers "hi".
func okRun(context.Context, contract.Request) (Run, error) {
	return scriptedRun(normalized, events(started(), delta("hi"), usageEvent(3, 1), complete("stop"))), nil
}

// testEnv serves the frame with the Ollama routes over a scripted gateway.
type testEnv struct {
	*apitest.Env
	gw  *apitest.Gateway
	srv *httptest.Server
}

// newEnv serves the frame with the Ollama routes over a gateway of models
// m and alias; dispatch scripts it.
func newEnv(t *testing.T, cfg api.Config, dispatch func(context.Context, contract.Request) (Run, error)) *testEnv {
	t.Helper()
	gw := &apitest.Gateway{Names: []string{"m", "alias"}, DispatchFunc: dispatch}
	return newEnvWithGateway(t, cfg, gw, gw)
}

// newEnvWithGateway serves the frame with the Ollama routes over gw,
// whose scripted part is fake; the optional features gw implements
// (ModelCatalog, ModelShower, Known) are on, as a composition root wires
// them.
func newEnvWithGateway(t *testing.T, cfg api.Config, gw api.Gateway[Run], fake *apitest.Gateway) *testEnv {
	t.Helper()
	return newEnvOf(t, cfg, gw, fake, nil)
}

// newEnvLogging is newEnv with the handler logging to logger.
func newEnvLogging(t *testing.T, cfg api.Config, logger *slog.Logger, dispatch func(context.Context, contract.Request) (Run, error)) *testEnv {
	t.Helper()
	gw := &apitest.Gateway{Names: []string{"m", "alias"}, DispatchFunc: dispatch}
	return newEnvOf(t, cfg, gw, gw, logger)
}

// newEnvOf is newEnvWithGateway with the handler logging to logger (nil:
// nowhere).
func newEnvOf(t *testing.T, cfg api.Config, gw api.Gateway[Run], fake *apitest.Gateway, logger *slog.Logger) *testEnv {
	t.Helper()
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = func() time.Time { return time.Unix(1700000000, 0) }
	}
	var ocfg Config
	if c, ok := gw.(ModelCatalog); ok {
		ocfg.Catalog = c
	}
	if s, ok := gw.(ModelShower); ok {
		ocfg.Shower = s
	}
	if k, ok := gw.(interface{ Known(string) bool }); ok && cfg.Known == nil {
		cfg.Known = k.Known
	}
	cfg.APIs = append(cfg.APIs, Routes(ocfg))
	env := apitest.Start(t, fake, api.New(cfg, gw, logger))
	return &testEnv{Env: env, gw: fake, srv: env.Srv}
}

// rawResponse is one raw HTTP exchange.
type rawResponse struct {
	status int
	header http.Header
	body   string
}

func raw(r apitest.Response) rawResponse { return rawResponse{r.Status, r.Header, r.Body} }

// post sends body to path with the given Content-Type ("" for none).
func (e *testEnv) post(t *testing.T, path, contentType, body string) rawResponse {
	t.Helper()
	return raw(e.Post(t, path, contentType, body))
}

func (e *testEnv) get(t *testing.T, path string) rawResponse {
	t.Helper()
	return raw(e.Get(t, path))
}

func (e *testEnv) do(t *testing.T, req *http.Request) rawResponse {
	t.Helper()
	return raw(e.Do(t, req))
}

// send makes a request with the given headers.
func (e *testEnv) send(t *testing.T, method, path, body string, header map[string]string) rawResponse {
	t.Helper()
	req, err := http.NewRequest(method, e.srv.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	return e.do(t, req)
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

// records keeps the RequestRecords the frame hands its Observer.
type records = apitest.Records[observe.RequestRecord]
