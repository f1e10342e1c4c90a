package api

import (
	"context"
	"log/slog"
	"regexp"
	"strings"
	"testing"

	"iop/internal/edge/contract"
)

// Every answer carries the request's id: X-Request-Id on the OpenAI
// routes (on the Ollama routes and Request-Id on Anthropic's: packages
// ollama's and anthropic's TestRegression_RequestIDOnEveryAnswer), errors
// included, on both execution paths; the id is the one of the request's
// log line, ledger entry and record; a provider's own X-Request-Id and a
// client's are not it.
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
				all := recs.All()
				rec := all[len(all)-1]
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
