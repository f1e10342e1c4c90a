package api

import (
	"context"
	"encoding/json"
	"log/slog"
	"regexp"
	"strings"
	"testing"
	"time"

	"iop/internal/edge/contract"
)

// A bare Ollama name ("tiny-tools" for the served "tiny-tools:latest")
// that POST /v1/messages takes is counted by count_tokens too (it was
// 404), and GET /v1/models/{id} finds it; an unknown name stays 404.
func TestRegression_CountTokensResolvesModelAsMessages(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Config{}, okRun)
	env.gw.models = []string{"tiny-tools:latest"}
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

// Every answer carries the request's id: X-Request-Id on the OpenAI and
// Ollama routes, Request-Id on Anthropic's (and to a request naming an
// anthropic-version), errors included, on both execution paths; the
// id is the one of the request's log line, ledger entry and record; a
// provider's own X-Request-Id and a client's are not it.
func TestRegression_RequestIDOnEveryAnswer(t *testing.T) {
	t.Parallel()
	sse := "data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\ndata: [DONE]\n\n"
	scripts := map[string]func(context.Context, contract.Request) (Run, error){
		"normalized": okRun,
		"tunnel": func(context.Context, contract.Request) (Run, error) {
			return scriptedRun(tunnel, tunnelHead(200, map[string]string{"content-type": "text/event-stream", "x-request-id": "provider-id"}),
				tunnelData(sse), tunnelEnd()), nil
		},
	}
	idForm := regexp.MustCompile(`^req_[0-9a-f]{32}$`)
	for path, dispatch := range scripts {
		t.Run(path, func(t *testing.T) {
			t.Parallel()
			recs, led := &records{}, &recordingLedger{}
			mu := &syncBuffer{}
			env := newEnvLogging(t, Config{Observer: recs, Ledger: led}, slog.New(slog.NewJSONHandler(mu, nil)), func(ctx context.Context, req contract.Request) (Run, error) {
				if req.Model == "nope" {
					return nil, ErrUnknownModel
				}
				return dispatch(ctx, req)
			})
			cases := []struct {
				method, path, body string
				header             map[string]string
				want               string // the header
				status             int
				recorded           bool
			}{
				{"POST", "/v1/chat/completions", `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`, map[string]string{"X-Request-Id": "client-id"}, "X-Request-Id", 200, true},
				{"POST", "/v1/chat/completions", `{"model":"nope","messages":[{"role":"user","content":"hi"}]}`, nil, "X-Request-Id", 404, true},
				{"POST", "/v1/chat/completions", `{`, nil, "X-Request-Id", 400, true},
				{"GET", "/v1/nothing", "", nil, "X-Request-Id", 404, false},
				{"GET", "/v1/models", "", nil, "X-Request-Id", 200, false},
				{"GET", "/v1/models", "", map[string]string{"anthropic-version": "2023-06-01"}, "Request-Id", 200, false},
				{"POST", "/v1/messages", `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`, nil, "Request-Id", 200, true},
				{"POST", "/v1/messages", `{"model":"nope","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`, nil, "Request-Id", 404, true},
				{"POST", "/v1/messages/count_tokens", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, nil, "Request-Id", 200, false},
				{"POST", "/api/chat", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, nil, "X-Request-Id", 200, true},
			}
			seen := map[string]bool{}
			for _, c := range cases {
				resp := env.send(t, c.method, c.path, c.body, c.header)
				if resp.status != c.status {
					t.Errorf("%s %s: %d %s, want %d", c.method, c.path, resp.status, resp.body, c.status)
				}
				id := resp.header.Get(c.want)
				other := map[string]string{"X-Request-Id": "Request-Id", "Request-Id": "X-Request-Id"}[c.want]
				if !idForm.MatchString(id) || resp.header.Get(other) != "" || seen[id] {
					t.Errorf("%s %s: %s %q, %s %q: want a new req_<32 hex> in %s only", c.method, c.path, c.want, id, other, resp.header.Get(other), c.want)
				}
				seen[id] = true
				if !c.recorded {
					continue
				}
				env.waitHandlers()
				recs.mu.Lock()
				rec := recs.recs[len(recs.recs)-1]
				recs.mu.Unlock()
				entries := led.all()
				if rec.RequestID != id || entries[len(entries)-1].RequestID != id {
					t.Errorf("%s %s: header id %s, record %s, ledger %s", c.method, c.path, id, rec.RequestID, entries[len(entries)-1].RequestID)
				}
				if !strings.Contains(mu.String(), `"request_id":"`+id+`"`) {
					t.Errorf("%s %s: no log line with request_id %s:\n%s", c.method, c.path, id, mu.String())
				}
				if c.header["X-Request-Id"] != "" && rec.ClientRequestID != c.header["X-Request-Id"] {
					t.Errorf("client request id %q, want %q", rec.ClientRequestID, c.header["X-Request-Id"])
				}
			}
		})
	}
}

// Anthropic's SDK lists models (it sends anthropic-version) in
// Anthropic's shape, paged; one model too; OpenAI's clients keep theirs.
func TestRegression_ModelsInAnthropicShape(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	env := newEnv(t, Config{Now: func() time.Time { return now }}, okRun)
	env.gw.models = []string{"a", "b", "c", "d"}
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
