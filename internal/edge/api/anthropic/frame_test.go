package anthropic

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"iop/internal/auth"
	"iop/internal/clock"
	"iop/internal/edge/api"
	"iop/internal/edge/api/apitest"
	"iop/internal/edge/contract"
	"iop/internal/quota"
)

// The frame's behaviours on the Messages API's routes: model names,
// request ids, rate-limit headers, refusals, the breaker signal.

// A bare Ollama name ("tiny-tools" for the served "tiny-tools:latest")
// that POST /v1/messages takes is counted by count_tokens too (it was
// 404), and GET /v1/models/{id} finds it; an unknown name stays 404.
func TestRegression_CountTokensResolvesModelAsMessages(t *testing.T) {
	t.Parallel()
	env := newEnv(t, api.Config{}, okRun)
	env.GW.Names = []string{"tiny-tools:latest"}
	for _, model := range []string{"tiny-tools", "tiny-tools:latest"} {
		body := `{"model":"` + model + `","messages":[{"role":"user","content":"hello there"}]}`
		resp := env.send(t, "POST", "/v1/messages/count_tokens", body, map[string]string{"anthropic-version": "2023-06-01"})
		if resp.status != 200 || !strings.Contains(resp.body, `"input_tokens"`) {
			t.Errorf("count_tokens %s: %d %s", model, resp.status, resp.body)
		}
		if resp := env.send(t, "POST", "/v1/messages", body[:len(body)-1]+`,"max_tokens":5}`, nil); resp.status != 200 {
			t.Errorf("messages %s: %d %s", model, resp.status, resp.body)
		}
		if resp := env.get(t, "/v1/models/"+model); resp.status != 200 {
			t.Errorf("GET /v1/models/%s: %d %s", model, resp.status, resp.body)
		}
	}
	resp := env.send(t, "POST", "/v1/messages/count_tokens", `{"model":"nope","messages":[{"role":"user","content":"x"}]}`, nil)
	if resp.status != 404 || !strings.Contains(resp.body, `"not_found_error"`) {
		t.Errorf("count_tokens of an unknown model: %d %s", resp.status, resp.body)
	}
}

// Anthropic's SDK lists models (it sends anthropic-version) in
// Anthropic's shape, paged; one model too; OpenAI's clients keep theirs.
func TestRegression_ModelsInAnthropicShape(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	env := newEnv(t, api.Config{Now: func() time.Time { return now }}, okRun)
	env.GW.Names = []string{"a", "b", "c", "d"}
	av := map[string]string{"anthropic-version": "2023-06-01"}
	type model struct {
		Type, ID, DisplayName, CreatedAt string
	}
	type page struct {
		Data    []map[string]any `json:"data"`
		HasMore bool             `json:"has_more"`
		FirstID *string          `json:"first_id"`
		LastID  *string          `json:"last_id"`
	}
	ids := func(p page) string {
		var s []string
		for _, m := range p.Data {
			s = append(s, m["id"].(string))
		}
		return strings.Join(s, ",")
	}
	for _, c := range []struct {
		query, ids, first, last string
		more                    bool
	}{
		{"", "a,b,c,d", "a", "d", false},
		{"?limit=2", "a,b", "a", "b", true},
		{"?limit=2&after_id=b", "c,d", "c", "d", false},
		{"?limit=1&before_id=c", "b", "b", "b", true},
		{"?after_id=d", "", "", "", false},
	} {
		resp := env.send(t, "GET", "/v1/models"+c.query, "", av)
		var p page
		if err := json.Unmarshal([]byte(resp.body), &p); err != nil || resp.status != 200 {
			t.Fatalf("GET /v1/models%s: %d %s", c.query, resp.status, resp.body)
		}
		str := func(s *string) string {
			if s == nil {
				return ""
			}
			return *s
		}
		if ids(p) != c.ids || p.HasMore != c.more || str(p.FirstID) != c.first || str(p.LastID) != c.last {
			t.Errorf("GET /v1/models%s: %s", c.query, resp.body)
		}
		if strings.Contains(resp.body, `"object"`) {
			t.Errorf("Anthropic's list has no object: %s", resp.body)
		}
		if c.ids == "" && (!strings.Contains(resp.body, `"first_id":null`) || !strings.Contains(resp.body, `"data":[]`)) {
			t.Errorf("an empty page: %s", resp.body)
		}
	}
	resp := env.send(t, "GET", "/v1/models", "", av)
	if !strings.Contains(resp.body, `{"type":"model","id":"a","display_name":"a","created_at":"2026-05-01T12:00:00Z"}`) {
		t.Errorf("model object: %s", resp.body)
	}
	resp = env.send(t, "GET", "/v1/models/b", "", av)
	if resp.status != 200 || strings.TrimSpace(resp.body) != `{"type":"model","id":"b","display_name":"b","created_at":"2026-05-01T12:00:00Z"}` {
		t.Errorf("GET /v1/models/b (Anthropic): %d %s", resp.status, resp.body)
	}
	resp = env.send(t, "GET", "/v1/models/zz", "", av)
	if resp.status != 404 || !strings.Contains(resp.body, `"type":"error"`) || !strings.Contains(resp.body, `"not_found_error"`) {
		t.Errorf("GET /v1/models/zz (Anthropic): %d %s", resp.status, resp.body)
	}
	resp = env.send(t, "GET", "/v1/models?limit=0", "", av)
	if resp.status != 400 || !strings.Contains(resp.body, `"invalid_request_error"`) {
		t.Errorf("limit=0: %d %s", resp.status, resp.body)
	}
	// OpenAI's shape without the header.
	resp = env.get(t, "/v1/models/b")
	if !strings.Contains(resp.body, `"object":"model"`) {
		t.Errorf("GET /v1/models/b (OpenAI): %s", resp.body)
	}
	resp = env.get(t, "/v1/models")
	if !strings.HasPrefix(resp.body, `{"object":"list","data":[{"id":"a","object":"model"`) {
		t.Errorf("GET /v1/models (OpenAI): %s", resp.body)
	}
}

// TestQuotaAnthropicHeaders: /v1/messages answers carry
// anthropic-ratelimit-* with RFC 3339 resets, requests from the key's
// requests_per_minute.
func TestQuotaAnthropicHeaders(t *testing.T) {
	t.Parallel()
	env, f, clk, _ := newQuotaEnv(t, quota.Limits{TokensPerDay: 5000, RequestsPerMinute: 10})
	body := `{"model":"m","max_tokens":100,"messages":[{"role":"user","content":"hi"}]}`
	resp := env.send(t, "POST", "/v1/messages", body, map[string]string{"X-Api-Key": f.alice, "Anthropic-Version": "2023-06-01"})
	if resp.status != 200 {
		t.Fatalf("%d %s", resp.status, resp.body)
	}
	h := resp.header
	if h.Get("Anthropic-Ratelimit-Tokens-Limit") != "5000" || h.Get("Anthropic-Ratelimit-Requests-Limit") != "10" ||
		h.Get("Anthropic-Ratelimit-Requests-Remaining") != "9" || h.Get("X-Ratelimit-Limit-Tokens") != "" {
		t.Fatalf("headers %v", h)
	}
	if reset, err := time.Parse(time.RFC3339, h.Get("Anthropic-Ratelimit-Requests-Reset")); err != nil || reset.Before(clk.Now()) {
		t.Fatalf("requests reset %q (%v)", h.Get("Anthropic-Ratelimit-Requests-Reset"), err)
	}
}

// newQuotaEnv serves the Messages API to keys alice (with lim as her
// quota) and bob, over a quota ledger on a fake clock.
func newQuotaEnv(t *testing.T, lim quota.Limits) (*testEnv, keyFixture, *clock.Fake, *quota.Ledger) {
	t.Helper()
	f := newKeys(t, auth.Key{Quota: lim})
	clk := clock.NewFake(time.Unix(1700000000, 0))
	l := quota.New(quota.Config{Clock: clk})
	keys, teams := auth.QuotaScopes([]auth.Key{{Name: "alice", Quota: lim}, {Name: "bob"}}, nil)
	l.Configure(keys, teams, nil)
	env := newEnv(t, api.Config{Keys: f.keys, Quota: l, Now: clk.Now}, okRun)
	env.GW.Names = []string{"m"}
	return env, f, clk, l
}

// TestProviderBusyIs503WithRetryAfter: every provider tried refused the
// dispatch as busy: 503 provider_busy with Retry-After, as on the OpenAI
// routes (the frame's test of that name).
func TestProviderBusyIs503WithRetryAfter(t *testing.T) {
	busy := fmt.Errorf("%w: %w: node %q: provider at capacity on this node", contract.ErrProviderBusy, api.ErrDispatchRefused, "n1")
	env := newEnv(t, api.Config{}, apitest.FailWith(busy))
	resp := env.post(t, messagesPath, "application/json", `{"model":"m","max_tokens":8,"messages":[{"role":"user","content":"hello"}]}`)
	if resp.status != 503 || resp.header.Get("Retry-After") == "" {
		t.Errorf("%d Retry-After %q, want 503 with Retry-After", resp.status, resp.header.Get("Retry-After"))
	}
	if !strings.Contains(resp.body, "busy") {
		t.Errorf("body %s does not say the providers are busy", resp.body)
	}
}

// TestRegression_BrokenTunnelAnswerFailsTheRun: a Messages answer stops
// reading a tunnel at the provider's error object inside its 200
// stream; the run ends with Fail (the provider's failure, for its circuit
// breaker), streamed or not; a clean answer ends with Cancel alone.
func TestRegression_BrokenTunnelAnswerFailsTheRun(t *testing.T) {
	const broken = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"he\"}}]}\n\n" +
		"data: {\"error\":{\"message\":\"generation failed\",\"type\":\"server_error\"}}\n\n"
	const clean = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"he\"}}]}\n\n" +
		"data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n"
	for _, stream := range []bool{true, false} {
		for _, answer := range []string{broken, clean} {
			wantFail := answer == broken
			t.Run(fmt.Sprintf("stream=%v/broken=%v", stream, wantFail), func(t *testing.T) {
				run := apitest.ScriptedRun(contract.PathTunnel,
					apitest.TunnelHead(200, map[string]string{"Content-Type": "text/event-stream"}), apitest.TunnelData(answer), apitest.TunnelEnd())
				env := newEnv(t, api.Config{}, runWith(run))
				env.post(t, messagesPath, "application/json", messagesBody+fmt.Sprintf(`,"stream":%v}`, stream))
				failed := false
				for _, r := range run.CancelReasons() {
					failed = failed || strings.HasPrefix(r, "fail: ")
				}
				if failed != wantFail {
					t.Errorf("run ended with Fail: %v, want %v (cancels %q)", failed, wantFail, run.CancelReasons())
				}
			})
		}
	}
}

// TestRegression_RequestIDOnEveryAnswer: every answer of the Messages
// API carries the request's id as Request-Id (and GET /v1/models to a
// request naming an anthropic-version), errors included, on both
// execution paths, and no X-Request-Id; the id is the one of the
// request's log line and record.
func TestRegression_RequestIDOnEveryAnswer(t *testing.T) {
	t.Parallel()
	sse := "data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\ndata: [DONE]\n\n"
	scripts := map[string]func(context.Context, contract.Request) (Run, error){
		"normalized": okRun,
		"tunnel": func(context.Context, contract.Request) (Run, error) {
			return apitest.ScriptedRun(apitest.Tunnel, apitest.TunnelHead(200, map[string]string{"content-type": "text/event-stream", "x-request-id": "provider-id"}),
				apitest.TunnelData(sse), apitest.TunnelEnd()), nil
		},
	}
	idForm := regexp.MustCompile(`^req_[0-9a-f]{32}$`)
	for path, dispatch := range scripts {
		t.Run(path, func(t *testing.T) {
			t.Parallel()
			recs := &records{}
			logs := &syncBuffer{}
			gw := &apitest.Gateway{Names: []string{"m", "alias"}, DispatchFunc: func(ctx context.Context, req contract.Request) (Run, error) {
				if req.Model == "nope" {
					return nil, api.ErrUnknownModel
				}
				return dispatch(ctx, req)
			}}
			cfg := api.Config{Observer: recs, APIs: []api.API{Routes}, Now: func() time.Time { return time.Unix(1700000000, 0) }}
			env := &testEnv{Env: apitest.Start(t, gw, api.New(cfg, gw, slog.New(slog.NewJSONHandler(logs, nil))))}
			cases := []struct {
				method, path, body string
				header             map[string]string
				status             int
				recorded           bool
			}{
				{"GET", "/v1/models", "", map[string]string{"anthropic-version": "2023-06-01"}, 200, false},
				{"POST", "/v1/messages", `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`, nil, 200, true},
				{"POST", "/v1/messages", `{"model":"nope","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`, nil, 404, true},
				{"POST", "/v1/messages/count_tokens", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, nil, 200, false},
			}
			seen := map[string]bool{}
			for _, c := range cases {
				resp := env.send(t, c.method, c.path, c.body, c.header)
				if resp.status != c.status {
					t.Errorf("%s %s: %d %s, want %d", c.method, c.path, resp.status, resp.body, c.status)
				}
				id := resp.header.Get("Request-Id")
				if !idForm.MatchString(id) || resp.header.Get("X-Request-Id") != "" || seen[id] {
					t.Errorf("%s %s: Request-Id %q, X-Request-Id %q: want a new req_<32 hex> in Request-Id only", c.method, c.path, id, resp.header.Get("X-Request-Id"))
				}
				seen[id] = true
				if !c.recorded {
					continue
				}
				env.WaitHandlers()
				all := recs.All()
				rec := all[len(all)-1]
				if rec.RequestID != id {
					t.Errorf("%s %s: header id %s, record %s", c.method, c.path, id, rec.RequestID)
				}
				if !strings.Contains(logs.String(), `"request_id":"`+id+`"`) {
					t.Errorf("%s %s: no log line with request_id %s:\n%s", c.method, c.path, id, logs.String())
				}
			}
		})
	}
}

// syncBuffer is a log sink safe for concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
