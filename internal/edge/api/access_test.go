package api

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"iop/internal/auth"
	"iop/internal/edge/api/apitest"
	"iop/internal/edge/contract"
	"iop/internal/ledger"
)

// keyFixture is a client keyring and an admin keyring with known secrets.
type keyFixture struct {
	keys, admin          *auth.Keyring
	alice, bob, adminKey string
}

// newKeys makes keys alice and bob (alice limited by alice's limits and
// models) and one admin key (apitest.NewKeys).
func newKeys(t *testing.T, alice auth.Key) keyFixture {
	t.Helper()
	k := apitest.NewKeys(t, alice)
	return keyFixture{keys: k.Keys, admin: k.Admin, alice: k.Alice, bob: k.Bob, adminKey: k.AdminKey}
}

// send makes a request with the given credential headers.
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

var reflectDeepEqual = reflect.DeepEqual

func bearer(key string) map[string]string { return map[string]string{"Authorization": "Bearer " + key} }

// stubAdminRoutes stand for package admin's routes, which the frame
// guards by their prefix: each answers [].
func stubAdminRoutes() map[string]Route {
	routes := map[string]Route{}
	for _, p := range []string{"/admin/v1/nodes", "/admin/v1/providers", "/admin/v1/queues"} {
		routes[p] = Route{Method: http.MethodGet, Serve: func(w http.ResponseWriter, r *http.Request) { WriteJSON(w, http.StatusOK, []any{}) }}
	}
	return routes
}

func okRun(context.Context, contract.Request) (Run, error) {
	return scriptedRun(normalized, events(started(), delta("hi"), usageEvent(3, 1), complete("stop"))), nil
}

// TestWrongOrMissingKeys: with keys configured, every route but the
// probes needs a key; a missing or wrong one is answered 401 with
// WWW-Authenticate: Bearer and the route's error shape (OpenAI's here;
// package ollama's test has Ollama's), never echoing the key sent, and
// nothing is dispatched. A client key on the admin routes and an admin key on the
// model API get 403.
func TestWrongOrMissingKeys(t *testing.T) {
	f := newKeys(t, auth.Key{})
	cfg := Config{Keys: f.keys, AdminKeys: f.admin, Routes: stubAdminRoutes()}
	env := newEnv(t, cfg, okRun)
	const wrong = "iop-wrong-key-0123456789-do-not-echo"
	routes := []struct {
		method, path, body string
		ollama             bool
	}{
		{"POST", "/v1/chat/completions", simpleChat, false},
		{"POST", "/v1/completions", `{"model":"m","prompt":"x"}`, false},
		{"POST", "/v1/embeddings", `{"model":"m","input":"x"}`, false},
		{"GET", "/v1/models", "", false},
		{"GET", "/v1/models/m", "", false},
		{"GET", "/no/such/path", "", false},
	}
	for _, rt := range routes {
		for name, header := range map[string]map[string]string{
			"missing":         nil,
			"wrong bearer":    bearer(wrong),
			"wrong x-api-key": {"X-Api-Key": wrong},
			"empty bearer":    {"Authorization": "Bearer "},
			"basic":           {"Authorization": "Basic " + f.alice},
		} {
			resp := env.send(t, rt.method, rt.path, rt.body, header)
			if resp.status != http.StatusUnauthorized {
				t.Errorf("%s %s, %s key: status %d, want 401 (%s)", rt.method, rt.path, name, resp.status, resp.body)
				continue
			}
			if got := resp.header.Get("WWW-Authenticate"); !strings.HasPrefix(got, "Bearer") {
				t.Errorf("%s %s, %s key: WWW-Authenticate %q", rt.method, rt.path, name, got)
			}
			if strings.Contains(resp.body, wrong) || strings.Contains(resp.body, f.alice) {
				t.Errorf("%s %s: the key sent is echoed: %s", rt.method, rt.path, resp.body)
			}
			if rt.ollama {
				var body map[string]string
				if json.Unmarshal([]byte(resp.body), &body) != nil || body["error"] == "" || len(body) != 1 {
					t.Errorf("%s %s: Ollama error body %q", rt.method, rt.path, resp.body)
				}
			} else {
				_, typ, _, code := openAIError(t, resp.body)
				want := "invalid_api_key"
				if header == nil || name == "empty bearer" || name == "basic" {
					want = "missing_api_key"
				}
				if typ != "invalid_request_error" || str(code) != want {
					t.Errorf("%s %s, %s key: type %q code %q, want %s", rt.method, rt.path, name, typ, str(code), want)
				}
			}
		}
	}
	if n := len(env.gw.requests()); n != 0 {
		t.Fatalf("%d requests were dispatched without a valid key", n)
	}
	// The right key, both ways, passes.
	for _, header := range []map[string]string{bearer(f.alice), {"X-Api-Key": f.bob}, {"Authorization": "bearer " + f.alice}} {
		if resp := env.send(t, "POST", "/v1/chat/completions", simpleChat, header); resp.status != 200 {
			t.Errorf("valid key %v: %d %s", header, resp.status, resp.body)
		}
	}
	// Probes stay open.
	for _, p := range []string{"/healthz", "/readyz"} {
		if resp := env.get(t, p); resp.status != 200 {
			t.Errorf("%s without a key: %d", p, resp.status)
		}
	}
	// Admin routes: admin key only.
	for _, tc := range []struct {
		header map[string]string
		status int
	}{
		{nil, 401}, {bearer(wrong), 401}, {bearer(f.alice), 403}, {bearer(f.adminKey), 200}, {map[string]string{"X-Api-Key": f.adminKey}, 200},
	} {
		for _, p := range []string{"/admin/v1/nodes", "/admin/v1/providers", "/admin/v1/queues", "/metrics", "/ui/", "/admin", "/debug/pprof/"} {
			resp := env.send(t, "GET", p, "", tc.header)
			want := tc.status
			if want == 200 && !strings.HasPrefix(p, "/admin/v1/") {
				want = 404 // admitted, then not served by this handler
			}
			if resp.status != want {
				t.Errorf("GET %s with %v: %d, want %d (%s)", p, tc.header, resp.status, want, resp.body)
			}
		}
	}
	// Dot segments do not dodge the admin check.
	for _, p := range []string{"/v1/../admin/v1/nodes", "/api/../metrics", "//admin/v1/nodes"} {
		if resp := env.send(t, "GET", p, "", bearer(f.alice)); resp.status != 403 {
			t.Errorf("GET %s with a client key: %d, want 403", p, resp.status)
		}
	}
	// An admin key cannot call the model API.
	if resp := env.send(t, "POST", "/v1/chat/completions", simpleChat, bearer(f.adminKey)); resp.status != 403 {
		t.Errorf("admin key on the model API: %d %s", resp.status, resp.body)
	}
	// /metricsX is no admin path: a client route (404 with a client key).
	if resp := env.send(t, "GET", "/metricsX", "", bearer(f.alice)); resp.status != 404 {
		t.Errorf("/metricsX with a client key: %d", resp.status)
	}
	// A browser: the dashboard's 401 asks for Basic credentials too, and the
	// admin key given as their password opens the admin routes.
	resp := env.send(t, "GET", "/admin/v1/nodes", "", nil)
	if got := resp.header.Values("WWW-Authenticate"); len(got) != 2 || !strings.HasPrefix(got[1], "Basic ") {
		t.Errorf("admin 401 challenges %q, want Bearer and Basic", got)
	}
	if resp := env.send(t, "GET", "/v1/models", "", nil); len(resp.header.Values("WWW-Authenticate")) != 1 {
		t.Errorf("a client route asks for Basic credentials: %q", resp.header.Values("WWW-Authenticate"))
	}
	basic := func(user, password string) map[string]string {
		return map[string]string{"Authorization": "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+password))}
	}
	if resp := env.send(t, "GET", "/admin/v1/nodes", "", basic("admin", f.adminKey)); resp.status != 200 {
		t.Errorf("admin key as a Basic password: %d %s", resp.status, resp.body)
	}
	if resp := env.send(t, "GET", "/admin/v1/nodes", "", basic("admin", f.alice)); resp.status != 403 {
		t.Errorf("client key as a Basic password on an admin route: %d", resp.status)
	}
}

// newEnvWithGateway is newEnv with an explicit Gateway wrapping fake (for
// optional interfaces such as ModelCatalog).
func newEnvWithGateway(t *testing.T, cfg Config, gw Gateway[Run], fake *fakeGateway) *testEnv {
	t.Helper()
	if cfg.Now == nil {
		cfg.Now = func() time.Time { return time.Unix(1700000000, 0) }
	}
	env := &testEnv{t: t, gw: fake}
	h := New(withOpenAI(withFeatures(cfg, gw)), gw, nil)
	env.srv = newServer(env, h)
	return env
}

func TestOpenAPINeedsNoKey(t *testing.T) {
	env := newEnv(t, Config{}, okRun)
	if resp := env.post(t, "/v1/chat/completions", "application/json", simpleChat); resp.status != 200 {
		t.Fatalf("open API: %d %s", resp.status, resp.body)
	}
	// Admin keys alone guard the admin API but leave the model API open.
	f := newKeys(t, auth.Key{})
	env2 := newEnv(t, Config{AdminKeys: f.admin, Routes: stubAdminRoutes()}, okRun)
	if resp := env2.get(t, "/v1/models"); resp.status != 200 {
		t.Errorf("model API with only admin keys: %d", resp.status)
	}
	if resp := env2.get(t, "/admin/v1/nodes"); resp.status != 401 {
		t.Errorf("admin API with admin keys, no key sent: %d", resp.status)
	}
}

func TestModelsAllowedPerKey(t *testing.T) {
	f := newKeys(t, auth.Key{Models: []string{"m"}})
	gw := &fakeGateway{models: []string{"m", "alias", "secret-model"}, dispatch: okRun}
	env := newEnvWithGateway(t, Config{Keys: f.keys}, gw, gw)

	var list struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	resp := env.send(t, "GET", "/v1/models", "", bearer(f.alice))
	if err := json.Unmarshal([]byte(resp.body), &list); err != nil || len(list.Data) != 1 || list.Data[0].ID != "m" {
		t.Errorf("alice's /v1/models: %s", resp.body)
	}
	resp = env.send(t, "GET", "/v1/models", "", bearer(f.bob))
	if err := json.Unmarshal([]byte(resp.body), &list); err != nil || len(list.Data) != 3 {
		t.Errorf("bob (every model) sees: %s", resp.body)
	}
	if resp := env.send(t, "GET", "/v1/models/secret-model", "", bearer(f.alice)); resp.status != 404 {
		t.Errorf("alice GET /v1/models/secret-model: %d", resp.status)
	}

	before := len(gw.requests())
	for _, tc := range []struct {
		path, body string
	}{
		{"/v1/chat/completions", `{"model":"secret-model","messages":[{"role":"user","content":"x"}]}`},
		{"/v1/completions", `{"model":"alias","prompt":"x"}`},
		{"/v1/embeddings", `{"model":"secret-model","input":"x"}`},
	} {
		resp := env.send(t, "POST", tc.path, tc.body, bearer(f.alice))
		if resp.status != http.StatusForbidden {
			t.Errorf("%s: %d, want 403 (%s)", tc.path, resp.status, resp.body)
			continue
		}
		if _, _, param, code := openAIError(t, resp.body); str(code) != "model_not_allowed" || str(param) != "model" {
			t.Errorf("%s: code %s param %s", tc.path, str(code), str(param))
		}
	}
	if n := len(gw.requests()) - before; n != 0 {
		t.Errorf("%d refused requests reached the gateway", n)
	}
	// The allowed model passes (package ollama's test has the Ollama API).
	if resp := env.send(t, "POST", "/v1/chat/completions", simpleChat, bearer(f.alice)); resp.status != 200 {
		t.Errorf("allowed model: %d %s", resp.status, resp.body)
	}
}

// blockingRuns returns a dispatch func whose runs stay open until release
// is closed, and a channel that receives once per dispatch.
func blockingRuns(release <-chan struct{}) (func(context.Context, contract.Request) (Run, error), <-chan struct{}) {
	dispatched := make(chan struct{}, 64)
	return func(ctx context.Context, req contract.Request) (Run, error) {
		r := liveRun(normalized, 4)
		go func() {
			<-release
			r.up <- events(started(), delta("x"), complete("stop"))
			close(r.up)
		}()
		dispatched <- struct{}{}
		return r, nil
	}, dispatched
}

func TestKeyConcurrencyLimitRefusesBeforeDispatch(t *testing.T) {
	f := newKeys(t, auth.Key{MaxConcurrent: 2})
	release := make(chan struct{})
	dispatch, dispatched := blockingRuns(release)
	gw := &fakeGateway{models: []string{"m"}, dispatch: dispatch}
	env := newEnvWithGateway(t, Config{Keys: f.keys}, gw, gw)
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if resp := env.send(t, "POST", "/v1/chat/completions", simpleChat, bearer(f.alice)); resp.status != 200 {
				t.Errorf("request within the limit: %d", resp.status)
			}
		}()
	}
	<-dispatched
	<-dispatched
	for _, path := range []string{"/v1/chat/completions"} {
		body := simpleChat
		resp := env.send(t, "POST", path, body, bearer(f.alice))
		if resp.status != http.StatusTooManyRequests || resp.header.Get("Retry-After") == "" {
			t.Errorf("%s over max_concurrent: %d Retry-After %q (%s)", path, resp.status, resp.header.Get("Retry-After"), resp.body)
		}
	}
	if n := len(gw.requests()); n != 2 {
		t.Errorf("%d dispatches, want 2: the refused ones must not reach the gateway", n)
	}
	// Another key is not limited by alice's requests.
	go func() {
		<-dispatched
	}()
	bobDone := make(chan rawResponse, 1)
	go func() { bobDone <- env.send(t, "POST", "/v1/chat/completions", simpleChat, bearer(f.bob)) }()
	close(release)
	if resp := <-bobDone; resp.status != 200 {
		t.Errorf("bob while alice is at her limit: %d", resp.status)
	}
	wg.Wait()
	// Slots came back: alice may send again.
	if resp := env.send(t, "POST", "/v1/chat/completions", simpleChat, bearer(f.alice)); resp.status != 200 {
		t.Errorf("alice after her requests ended: %d %s", resp.status, resp.body)
	}
}

func TestKeyRequestsPerMinute(t *testing.T) {
	f := newKeys(t, auth.Key{RequestsPerMinute: 2})
	gw := &fakeGateway{models: []string{"m"}, dispatch: okRun}
	env := newEnvWithGateway(t, Config{Keys: f.keys}, gw, gw)
	for i := range 2 {
		if resp := env.send(t, "POST", "/v1/chat/completions", simpleChat, bearer(f.alice)); resp.status != 200 {
			t.Fatalf("request %d: %d", i, resp.status)
		}
	}
	// Listing models is not a model run: not counted.
	if resp := env.send(t, "GET", "/v1/models", "", bearer(f.alice)); resp.status != 200 {
		t.Errorf("GET /v1/models: %d", resp.status)
	}
	resp := env.send(t, "POST", "/v1/chat/completions", simpleChat, bearer(f.alice))
	if resp.status != http.StatusTooManyRequests {
		t.Fatalf("third request in a minute: %d", resp.status)
	}
	if ra := resp.header.Get("Retry-After"); ra == "" || ra == "0" {
		t.Errorf("Retry-After %q", ra)
	}
	if _, typ, _, code := openAIError(t, resp.body); typ != "rate_limit_error" || str(code) != "rate_limit_exceeded" {
		t.Errorf("type %s code %s", typ, str(code))
	}
	if n := len(gw.requests()); n != 2 {
		t.Errorf("%d dispatches, want 2", n)
	}
}

// recordingLedger is a Ledger that keeps entries in memory.
type recordingLedger struct {
	mu      sync.Mutex
	entries []ledger.Entry
}

func (l *recordingLedger) Record(e ledger.Entry) {
	l.mu.Lock()
	l.entries = append(l.entries, e)
	l.mu.Unlock()
}

func (l *recordingLedger) Aggregate(context.Context, ledger.Query) ([]ledger.Group, error) {
	return nil, errors.New("unused")
}

func (l *recordingLedger) all() []ledger.Entry {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.entries)
}

func TestLedgerRecordsEveryFinishedRun(t *testing.T) {
	f := newKeys(t, auth.Key{})
	led := &recordingLedger{}
	sseUsage := "data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\n" +
		"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":11,\"completion_tokens\":12,\"total_tokens\":23}}\n\ndata: [DONE]\n\n"
	jsonAnswer := `{"id":"c","object":"chat.completion","choices":[{"message":{"content":"a \"usage\": {\"prompt_tokens\": 999}"}}],"usage":{"prompt_tokens":21,"completion_tokens":22}}`
	scripts := map[string]func() Run{
		"normalized": func() Run {
			return scriptedRun(normalized, events(started(), delta("hi"), usageEvent(3, 4), complete("stop")))
		},
		"tunnel-sse": func() Run {
			return scriptedRun(tunnel, tunnelHead(200, map[string]string{"content-type": "text/event-stream"}),
				tunnelData(sseUsage[:40]), tunnelData(sseUsage[40:90]), tunnelData(sseUsage[90:]), tunnelEnd())
		},
		"tunnel-json": func() Run {
			return scriptedRun(tunnel, tunnelHead(200, map[string]string{"Content-Type": "application/json"}),
				tunnelData(jsonAnswer[:30]), tunnelData(jsonAnswer[30:]), tunnelEnd())
		},
		"upstream-error": func() Run {
			return scriptedRun(normalized, events(started(), errorEvent(500, "boom")))
		},
	}
	gw := &fakeGateway{models: []string{"m"}, dispatch: func(ctx context.Context, req contract.Request) (Run, error) {
		var sel string
		_ = json.Unmarshal(req.Body, &struct {
			User *string `json:"user"`
		}{&sel})
		switch sel {
		case "full":
			return nil, ErrQueueFull
		case "":
			sel = "normalized"
		}
		return scripts[sel](), nil
	}}
	env := newEnvWithGateway(t, Config{Keys: f.keys, Ledger: led}, gw, gw)
	chat := func(script string) string {
		return `{"model":"m","user":"` + script + `","messages":[{"role":"user","content":"x"}]}`
	}
	for _, s := range []string{"normalized", "tunnel-sse", "tunnel-json", "upstream-error", "full"} {
		env.send(t, "POST", "/v1/chat/completions", chat(s), bearer(f.alice))
	}
	env.waitHandlers()
	got := led.all()
	type row struct {
		key, outcome string
		p, c         int64
	}
	var rows []row
	for _, e := range got {
		rows = append(rows, row{e.Key, e.Outcome, e.PromptTokens, e.CompletionTokens})
		if e.Model != "m" || e.Time.IsZero() {
			t.Errorf("entry %+v", e)
		}
		if e.ErrorCode != "queue_full" && (e.NodeID != "node1" || e.ProviderID != "prov1" || e.RunID != "run1") {
			t.Errorf("entry without its dispatch: %+v", e)
		}
		if !strings.HasPrefix(e.RequestID, "req_") {
			t.Errorf("entry without its request id: %+v", e)
		}
		// The slot is held from the dispatch to the end: never longer than
		// the request, and not at all by a request never dispatched.
		if e.SlotTime < 0 || e.SlotTime > e.Duration || (e.ErrorCode == "queue_full") != (e.SlotTime == 0 && e.RunID == "") {
			t.Errorf("entry's slot time %s (duration %s): %+v", e.SlotTime, e.Duration, e)
		}
	}
	want := []row{
		{"alice", "completed", 3, 4}, {"alice", "completed", 11, 12}, {"alice", "completed", 21, 22},
		{"alice", "upstream_error", 0, 0}, {"alice", "refused", 0, 0},
	}
	if !slices.Equal(rows, want) {
		t.Errorf("ledger rows\n got %+v\nwant %+v", rows, want)
	}
}

// newServer serves h for env as newEnvLogging does: its cleanup waits for
// every handler, then checks each run was closed exactly once.
func newServer(env *testEnv, h http.Handler) *httptest.Server {
	t := env.t
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		env.handlers.Add(1)
		defer env.handlers.Done()
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(func() {
		srv.Close()
		env.handlers.Wait()
		for i, run := range env.gw.allRuns() {
			if n, reasons := run.closeCalls(); n != 1 {
				t.Errorf("run %d: Close called %d times (reasons %q), want exactly 1", i, n, reasons)
			}
		}
	})
	return srv
}

// TestUsageAttributionNeverInfluencesScheduling: the request the edge
// schedules carries no trace of the caller but its flow (the seeds' rule:
// caller identity is no part of pool selection; the key names
// the request's flow, with its weight and priority, which order the
// model's queue and never choose its candidates): the same body sent with
// two different keys reaches the gateway as the same Request, field for
// field but the flow, on every route.
func TestUsageAttributionNeverInfluencesScheduling(t *testing.T) {
	f := newKeys(t, auth.Key{})
	gw := &fakeGateway{models: []string{"m"}, dispatch: okRun}
	env := newEnvWithGateway(t, Config{Keys: f.keys, Ledger: &recordingLedger{}}, gw, gw)
	bodies := []struct{ path, body string }{
		{"/v1/chat/completions", simpleChat},
		{"/v1/chat/completions", `{"model":"m","stream":true,"messages":[{"role":"user","content":"hello"}],"tools":[{"type":"function","function":{"name":"f"}}]}`},
		{"/v1/completions", `{"model":"m","prompt":"x"}`},
	}
	for _, b := range bodies {
		for _, key := range []string{f.alice, f.bob} {
			env.send(t, "POST", b.path, b.body, map[string]string{"Authorization": "Bearer " + key, "X-Request-Id": "same"})
		}
	}
	env.waitHandlers()
	reqs := gw.requests()
	if len(reqs) != 2*len(bodies) {
		t.Fatalf("%d requests dispatched, want %d", len(reqs), 2*len(bodies))
	}
	for i := 0; i < len(reqs); i += 2 {
		a, b := reqs[i], reqs[i+1]
		if a.Flow != "alice" || b.Flow != "bob" || a.Weight != 1 || b.Weight != 1 || a.Priority != 0 || b.Priority != 0 {
			t.Errorf("%s: flows %q (weight %d, priority %d) and %q (%d, %d), want alice and bob (1, standard)",
				bodies[i/2].path, a.Flow, a.Weight, a.Priority, b.Flow, b.Weight, b.Priority)
		}
		a.Flow, b.Flow = "", ""
		if !reflectDeepEqual(a, b) {
			t.Errorf("%s: alice's request %+v\ndiffers from bob's %+v", bodies[i/2].path, a, b)
		}
		for _, v := range a.Headers {
			if strings.Contains(v, f.alice) {
				t.Errorf("the key reached the dispatched request: %v", a.Headers)
			}
		}
	}
}

// TestRegression_NoLeaderRequestLineHasNoEmptyModel: a request refused at
// the door because no scheduler leader could count its key's limits (503
// no_leader, several edges) was logged with model "": its body, which
// names the model, is never read. Its request line names no model.
func TestRegression_NoLeaderRequestLineHasNoEmptyModel(t *testing.T) {
	f := newKeys(t, auth.Key{})
	var logs syncBuffer
	logger := slog.New(slog.NewJSONHandler(&logs, nil))
	cfg := Config{Keys: f.keys, AdminKeys: f.admin,
		KeyAdmit: func(context.Context, *auth.Caller) (func(), bool, error) { return nil, false, ErrNoLeader }}
	env := newEnvLogging(t, cfg, logger, okRun)
	resp := env.send(t, http.MethodPost, "/v1/chat/completions", simpleChat, map[string]string{"Authorization": "Bearer " + f.alice})
	if resp.status != http.StatusServiceUnavailable {
		t.Fatalf("status %d, want 503", resp.status)
	}
	env.waitHandlers()
	found := false
	for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if m["msg"] != "request" {
			continue
		}
		found = true
		if model, ok := m["model"]; ok {
			t.Errorf("request line names model %q: %s", model, line)
		}
	}
	if !found {
		t.Fatalf("no request line in\n%s", logs.String())
	}
}
