package api

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"iop/internal/auth"
	"iop/internal/edge/api/access"
	"iop/internal/edge/contract"
)

// TestFlowWeightAndPriorityOfARequest: the dispatched request's flow is
// its key's name, or the value of the configured header or of the body's
// "user" (cut to 64 bytes), falling back to the key's name; its weight is
// the key's; its priority the key's, or X-Iop-Priority's where the key's
// priority_header allows it, lowered to that; a header naming no priority
// is 400 when the key allows the header, ignored when it does not.
func TestFlowWeightAndPriorityOfARequest(t *testing.T) {
	secrets := map[string]string{}
	var keys []auth.Key
	for _, k := range []auth.Key{
		{Name: "plain"},
		{Name: "heavy", Weight: 3, Priority: "sheddable"},
		{Name: "vip", Priority: "critical"},
		{Name: "asks", PriorityHeader: "standard"},
	} {
		secret, hash := auth.Generate()
		k.Hash = hash
		secrets[k.Name] = secret
		keys = append(keys, k)
	}
	ring, err := auth.NewKeyring("keys", keys, nil)
	if err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("u", 100)
	for _, c := range []struct {
		name, flowSource, key, body string
		header                      map[string]string
		status                      int
		flow                        string
		weight, priority            int
	}{
		{"key flow", "", "plain", simpleChat, nil, 200, "plain", 1, contract.PriorityStandard},
		{"key weight and priority", "", "heavy", simpleChat, nil, 200, "heavy", 3, contract.PrioritySheddable},
		{"critical key", "", "vip", simpleChat, nil, 200, "vip", 1, contract.PriorityCritical},
		{"header ignored without priority_header", "", "vip", simpleChat, map[string]string{access.PriorityHeader: "sheddable"}, 200, "vip", 1, contract.PriorityCritical},
		{"bad header ignored without priority_header", "", "plain", simpleChat, map[string]string{access.PriorityHeader: "urgent"}, 200, "plain", 1, contract.PriorityStandard},
		{"header lowers", "", "asks", simpleChat, map[string]string{access.PriorityHeader: "sheddable"}, 200, "asks", 1, contract.PrioritySheddable},
		{"header capped at priority_header", "", "asks", simpleChat, map[string]string{access.PriorityHeader: "critical"}, 200, "asks", 1, contract.PriorityStandard},
		{"bad header with priority_header", "", "asks", simpleChat, map[string]string{access.PriorityHeader: "urgent"}, 400, "", 0, 0},
		{"flow header", "header:X-Iop-Flow", "heavy", simpleChat, map[string]string{"X-Iop-Flow": "tenant-7"}, 200, "tenant-7", 3, contract.PrioritySheddable},
		{"flow header absent", "header:X-Iop-Flow", "heavy", simpleChat, nil, 200, "heavy", 3, contract.PrioritySheddable},
		{"flow header cut", "header:X-Iop-Flow", "plain", simpleChat, map[string]string{"X-Iop-Flow": long}, 200, long[:64], 1, contract.PriorityStandard},
		{"user flow", "user", "plain", `{"model":"m","user":"end-user-1","messages":[{"role":"user","content":"hi"}]}`, nil, 200, "end-user-1", 1, contract.PriorityStandard},
		{"user flow absent", "user", "plain", simpleChat, nil, 200, "plain", 1, contract.PriorityStandard},
		{"flow header not UTF-8", "header:X-Iop-Flow", "plain", simpleChat, map[string]string{"X-Iop-Flow": "a\xffb"}, 200, "a\uFFFDb", 1, contract.PriorityStandard},
		{"flow header cut inside a character", "header:X-Iop-Flow", "plain", simpleChat, map[string]string{"X-Iop-Flow": "a" + strings.Repeat("ü", 40)}, 200, "a" + strings.Repeat("ü", 31), 1, contract.PriorityStandard},
		{"user flow cut inside a character", "user", "plain", `{"model":"m","user":"a` + strings.Repeat("ü", 40) + `","messages":[{"role":"user","content":"hi"}]}`, nil, 200, "a" + strings.Repeat("ü", 31), 1, contract.PriorityStandard},
	} {
		t.Run(c.name, func(t *testing.T) {
			env := newEnv(t, Config{Keys: ring, Flow: c.flowSource}, okRun)
			h := map[string]string{"Authorization": "Bearer " + secrets[c.key]}
			for k, v := range c.header {
				h[k] = v
			}
			resp := env.send(t, "POST", "/v1/chat/completions", c.body, h)
			if resp.status != c.status {
				t.Fatalf("status %d, want %d: %s", resp.status, c.status, resp.body)
			}
			reqs := env.gw.requests()
			if c.status != 200 {
				if len(reqs) != 0 || !strings.Contains(resp.body, access.PriorityHeader) {
					t.Fatalf("refused request: %d dispatched, body %s", len(reqs), resp.body)
				}
				return
			}
			if len(reqs) != 1 {
				t.Fatalf("%d requests dispatched", len(reqs))
			}
			r := reqs[0]
			if r.Flow != c.flow || r.Weight != c.weight || r.Priority != c.priority {
				t.Fatalf("flow %q weight %d priority %d, want %q %d %d", r.Flow, r.Weight, r.Priority, c.flow, c.weight, c.priority)
			}
		})
	}
}

// TestOpenAPIRequestsShareTheDefaultFlow: with no keys, requests without a
// flow value are of the default flow "", weight 1, standard; the priority
// header is ignored (no key allows it).
func TestOpenAPIRequestsShareTheDefaultFlow(t *testing.T) {
	env := newEnv(t, Config{Flow: "header:X-Iop-Flow"}, okRun)
	env.send(t, "POST", "/v1/chat/completions", simpleChat, map[string]string{access.PriorityHeader: "critical"})
	env.send(t, "POST", "/v1/chat/completions", simpleChat, map[string]string{"X-Iop-Flow": "a"})
	reqs := env.gw.requests()
	if len(reqs) != 2 || reqs[0].Flow != "" || reqs[0].Weight != 1 || reqs[0].Priority != 0 || reqs[1].Flow != "a" {
		t.Fatalf("requests %+v", reqs)
	}
}

// TestShedIsAnswered429: a shed request is answered 429 with Retry-After,
// in the OpenAI shape (rate_limit_error, code shed) on the OpenAI routes
// and Ollama's {"error"} on the Ollama routes; its record's admission is
// shed, with the reason.
func TestShedIsAnswered429(t *testing.T) {
	for _, reason := range []error{contract.ErrDisplaced, contract.ErrExpectedWait} {
		recs := &records{}
		env := newEnv(t, Config{Observer: recs}, failWith(fmt.Errorf("%w: %w: model m", contract.ErrShed, reason)))
		resp := env.send(t, "POST", "/v1/chat/completions", simpleChat, nil)
		if resp.status != http.StatusTooManyRequests || resp.header.Get("Retry-After") == "" {
			t.Fatalf("%v: status %d Retry-After %q", reason, resp.status, resp.header.Get("Retry-After"))
		}
		var body struct {
			Error struct{ Type, Code, Message string }
		}
		if err := json.Unmarshal([]byte(resp.body), &body); err != nil || body.Error.Type != "rate_limit_error" || body.Error.Code != "shed" {
			t.Fatalf("%v: body %s (%v)", reason, resp.body, err)
		}
		env.waitHandlers()
		want := map[error]string{contract.ErrDisplaced: "displaced", contract.ErrExpectedWait: "expected_wait"}[reason]
		for _, rec := range recs.All() {
			if rec.Admission != contract.AdmissionShed || rec.ShedReason != want || rec.Outcome != contract.OutcomeRefused {
				t.Fatalf("%v: record admission %q reason %q outcome %q", reason, rec.Admission, rec.ShedReason, rec.Outcome)
			}
		}
	}
}
