package admin

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"iop/internal/auth"
	"iop/internal/edge/api"
	"iop/internal/edge/contract"
)

// noGateway is an api.Gateway that serves no model: the admin routes
// never dispatch.
type noGateway struct{}

func (noGateway) Dispatch(context.Context, contract.Request) (api.Run, error) {
	return nil, errors.New("the admin routes never dispatch")
}

func (noGateway) Models() []string { return nil }

// testEnv is an httptest server running the frame with the admin routes
// cfg turns on.
type testEnv struct {
	srv *httptest.Server
}

// newEnv serves Routes(cfg) on a frame configured by frame.
func newEnv(t *testing.T, frame api.Config, cfg Config) *testEnv {
	t.Helper()
	frame.Routes = Routes(cfg)
	env := &testEnv{srv: httptest.NewServer(api.New(frame, noGateway{}, nil))}
	t.Cleanup(env.srv.Close)
	return env
}

// rawResponse is an answer read whole.
type rawResponse struct {
	status int
	header http.Header
	body   string
}

// send makes a request with the given headers.
func (e *testEnv) send(t *testing.T, method, path string, header map[string]string) rawResponse {
	t.Helper()
	req, err := http.NewRequest(method, e.srv.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := e.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return rawResponse{resp.StatusCode, resp.Header, string(body)}
}

func (e *testEnv) get(t *testing.T, path string) rawResponse { return e.send(t, "GET", path, nil) }

// errorCode is the code of an OpenAI error body, "<null>" for none.
func errorCode(t *testing.T, body string) string {
	t.Helper()
	var e struct {
		Error struct {
			Code *string `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal([]byte(body), &e); err != nil {
		t.Fatalf("error body %q: %v", body, err)
	}
	if e.Error.Code == nil {
		return "<null>"
	}
	return *e.Error.Code
}

// keyFixture is a client keyring with key alice and an admin keyring with
// one key.
type keyFixture struct {
	keys, admin     *auth.Keyring
	alice, adminKey string
}

func newKeys(t *testing.T) keyFixture {
	t.Helper()
	var f keyFixture
	var alice, adm string
	f.alice, alice = auth.Generate()
	f.adminKey, adm = auth.Generate()
	var err error
	if f.keys, err = auth.NewKeyring("keys", []auth.Key{{Name: "alice", Hash: alice}}, nil); err != nil {
		t.Fatal(err)
	}
	if f.admin, err = auth.NewKeyring("admin_keys", []auth.Key{{Name: "ops", Hash: adm}}, nil); err != nil {
		t.Fatal(err)
	}
	return f
}

func bearer(key string) map[string]string { return map[string]string{"Authorization": "Bearer " + key} }

// snapshot is a Snapshots with a fixed snapshot.
type snapshot contract.Snapshot

func (s snapshot) Snapshot() contract.Snapshot { return contract.Snapshot(s) }
