package api

import (
	"fmt"
	"strings"
	"testing"

	"iop/internal/edge/contract"
)

// TestNoLeaderIs503WithRetryAfter: several edges, and no scheduler leader
// reachable in time (a follower cut off from it): the client gets 503
// with Retry-After and the code no_leader, on the OpenAI and Ollama
// routes alike, never a hang or a 5xx without Retry-After.
func TestNoLeaderIs503WithRetryAfter(t *testing.T) {
	for _, route := range []struct{ path, body string }{
		{"/v1/chat/completions", simpleChat},
	} {
		env := newEnv(t, Config{}, failWith(fmt.Errorf("%w: none elected within 5s", ErrNoLeader)))
		resp := env.post(t, route.path, "application/json", route.body)
		if resp.status != 503 || resp.header.Get("Retry-After") == "" {
			t.Errorf("%s: %d Retry-After %q, want 503 with Retry-After", route.path, resp.status, resp.header.Get("Retry-After"))
		}
		if !strings.Contains(string(resp.body), "leader") {
			t.Errorf("%s: body %s does not say no leader is reachable", route.path, resp.body)
		}
	}
}

// TestProviderBusyIs503WithRetryAfter: every provider tried refused the
// dispatch as busy (its node runs its capacity for other edges): 503
// provider_busy with Retry-After on the OpenAI and Ollama routes (and
// Anthropic's: package anthropic), not the 502 of a failed node (TestRegression_BusyRefusal-
// IsNoProviderFailure in package edge).
func TestProviderBusyIs503WithRetryAfter(t *testing.T) {
	busy := fmt.Errorf("%w: %w: node %q: provider at capacity on this node", contract.ErrProviderBusy, ErrDispatchRefused, "n1")
	for _, route := range []struct{ path, body string }{
		{"/v1/chat/completions", simpleChat},
	} {
		env := newEnv(t, Config{}, failWith(busy))
		resp := env.post(t, route.path, "application/json", route.body)
		if resp.status != 503 || resp.header.Get("Retry-After") == "" {
			t.Errorf("%s: %d Retry-After %q, want 503 with Retry-After", route.path, resp.status, resp.header.Get("Retry-After"))
		}
		if !strings.Contains(string(resp.body), "busy") {
			t.Errorf("%s: body %s does not say the providers are busy", route.path, resp.body)
		}
	}
}
