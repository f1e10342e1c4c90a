package anthropic

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
	"iop/internal/edge/api/observe"
	"iop/internal/edge/contract"
	"iop/internal/wire/nodev1"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// Run is the run the tests' gateways hand out.
type Run = apitest.Run

// runWith makes a DispatchFunc that hands out run.
func runWith(run Run) func(context.Context, contract.Request) (Run, error) {
	return apitest.RunWith(run)
}

// thinkingDelta is a delta event of reasoning.
func thinkingDelta(thinking string) *nodev1.RunEvent {
	return &nodev1.RunEvent{Type: nodev1.RunEvent_TYPE_DELTA, Thinking: thinking}
}

// okRun dispatches a run that answers "hi".
func okRun(context.Context, contract.Request) (Run, error) {
	return apitest.ScriptedRun(apitest.Normalized, apitest.Events(apitest.Started(), apitest.Delta("hi"), apitest.Usage(3, 1), apitest.Complete("stop"))), nil
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
