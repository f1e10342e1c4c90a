package edge

import (
	"context"
	"errors"
	"testing"

	"iop/internal/edge/contract"
	"iop/internal/scheduler"
	"iop/internal/wire/nodev1"
)

// toolsProv is a provider of model with the capability "tools".
func toolsProv(id string, capacity int32, model string) *nodev1.Provider {
	p := prov(id, normalized, capacity, model)
	p.Capabilities = append(p.Capabilities, "tools")
	return p
}

// unavailable fails the test unless err is ErrProviderUnavailable, and not
// a rejection (HTTP 503, not 400).
func unavailable(t *testing.T, what string, err error) {
	t.Helper()
	if !errors.Is(err, scheduler.ErrProviderUnavailable) || errors.Is(err, scheduler.ErrCandidatesRejected) {
		t.Fatalf("%s: %v, want ErrProviderUnavailable and no rejection", what, err)
	}
}

// TestRegression_LostToolsProviderIsUnavailable: the only provider with
// "tools" is on a node that is killed while one tools request runs on it
// before its first byte (max_retries 1: it would be admitted again) and
// another is queued for it; the model has another, plain provider. Both
// got ErrCandidatesRejected (400, "no provider could ever take this"):
// the queued one at its re-resolution, the running one at its
// re-admission. Both are ErrProviderUnavailable (503). So is a fresh tools
// request while the gone node may come back (ForgetAfter); after that, and
// before any tools provider ever connected, it is a rejection.
func TestRegression_LostToolsProviderIsUnavailable(t *testing.T) {
	e := startEdge(t, retryConfig(1))
	e.connect(t, hello("plain-node", prov("plain", normalized, 4, "m")))
	if _, err := e.svc.Dispatch(context.Background(), toolsReq("m")); !errors.Is(err, scheduler.ErrCandidatesRejected) {
		t.Fatalf("tools request before any tools provider: %v, want ErrCandidatesRejected", err)
	}
	tools := e.connect(t, hello("tools-node", toolsProv("tools", 1, "m")))

	running := e.dispatchAsync(context.Background(), toolsReq("m"))
	d, _ := acceptRun(t, tools) // open, no byte of the answer yet
	if d.GetProviderId() != "tools" {
		t.Fatalf("tools request went to %q", d.GetProviderId())
	}
	queued := e.dispatchAsync(context.Background(), toolsReq("m"))
	e.clk.waitArmed(t, testQueueTimeout, 1)

	tools.cancel() // the node is killed
	// The running request is admitted again (as a retry before the first
	// byte, or as a dispatch lost with its node, depending on whether the
	// kill came before Dispatch returned the run to its retry loop).
	unavailable(t, "the request running before its first byte", wait(t, running).err)
	unavailable(t, "the queued request", wait(t, queued).err)

	_, err := e.svc.Dispatch(context.Background(), toolsReq("m"))
	unavailable(t, "a fresh tools request while the node may come back", err)

	// ForgetAfter later (and a node event), the edge no longer counts on
	// it: no live or configured provider has tools.
	e.clk.Advance(ForgetAfter)
	e.connect(t, hello("other", prov("x", normalized, 1, "x")))
	if _, err := e.svc.Dispatch(context.Background(), toolsReq("m")); !errors.Is(err, scheduler.ErrCandidatesRejected) {
		t.Fatalf("tools request after ForgetAfter: %v, want ErrCandidatesRejected", err)
	}
	if snap := e.svc.Snapshot(); snap.Waiters != 0 || snap.Leases != 0 {
		t.Fatalf("left %d waiters, %d leases", snap.Waiters, snap.Leases)
	}
}

// TestRegression_ProviderDroppedFromHelloIsUnavailable: a node reconnects
// without its tools provider while a tools request is queued for it: the
// request fails with ErrProviderUnavailable (it got ErrCandidatesRejected).
// A tools request after that is a rejection: the node said what it has.
func TestRegression_ProviderDroppedFromHelloIsUnavailable(t *testing.T) {
	e := startEdge(t, testConfig())
	first := e.connect(t, hello("n1", toolsProv("tools", 1, "m"), prov("plain", normalized, 1, "m")))
	_, _, d := e.startRun(t, first, toolsReq("m"))
	if d.GetProviderId() != "tools" {
		t.Fatalf("tools request went to %q", d.GetProviderId())
	}
	queued := e.dispatchAsync(context.Background(), toolsReq("m"))
	e.clk.waitArmed(t, testQueueTimeout, 1)
	e.connect(t, hello("n1", prov("plain", normalized, 1, "m")))
	unavailable(t, "the queued request", wait(t, queued).err)
	if _, err := e.svc.Dispatch(context.Background(), toolsReq("m")); !errors.Is(err, scheduler.ErrCandidatesRejected) {
		t.Fatalf("tools request after the reconnect without tools: %v, want ErrCandidatesRejected", err)
	}
}

// TestRegression_UnhealthyToolsProviderIsUnavailable: the only tools
// provider is live but unhealthy: a tools request got a rejection (400) as
// if no provider could ever take it; it is unavailable for now (503). A
// vision request, which no provider meets, is still rejected.
func TestRegression_UnhealthyToolsProviderIsUnavailable(t *testing.T) {
	e := startEdge(t, testConfig())
	e.connect(t, hello("n1", prov("plain", normalized, 1, "m")))
	n := e.connect(t, hello("n2", toolsProv("tools", 1, "m")))
	n.send(t, &nodev1.NodeMessage{Msg: &nodev1.NodeMessage_ProviderUpdate{ProviderUpdate: &nodev1.ProviderUpdate{ProviderId: "tools", Healthy: false}}})
	e.waitUntil(t, "tools unhealthy", func(s contract.Snapshot) bool {
		p, ok := providerOf(s, "n2", "tools")
		return ok && !p.Healthy
	})
	_, err := e.svc.Dispatch(context.Background(), toolsReq("m"))
	unavailable(t, "tools request", err)
	vision := chatReq("m")
	vision.Needs = []string{"vision"}
	if _, err := e.svc.Dispatch(context.Background(), vision); !errors.Is(err, scheduler.ErrCandidatesRejected) {
		t.Fatalf("vision request: %v, want ErrCandidatesRejected", err)
	}
}

// TestOpenCircuitOfToolsProviderIsUnavailable: the only tools provider's
// circuit opens (its node refused a dispatch, with failures: 1) while a
// tools request is queued for it: the queued request and a fresh one get
// 503 (ErrProviderUnavailable, ErrNoProvider), not a rejection.
func TestOpenCircuitOfToolsProviderIsUnavailable(t *testing.T) {
	cfg := testConfig()
	cfg.CircuitBreaker = BreakerConfig{Failures: 1}
	e := startEdge(t, cfg)
	e.connect(t, hello("plain-node", prov("plain", normalized, 4, "m")))
	tools := e.connect(t, hello("tools-node", toolsProv("tools", 1, "m")))
	first := e.dispatchAsync(context.Background(), toolsReq("m"))
	d := tools.nextDispatch(t)
	queued := e.dispatchAsync(context.Background(), toolsReq("m"))
	e.clk.waitArmed(t, testQueueTimeout, 1)
	tools.send(t, &nodev1.NodeMessage{Msg: &nodev1.NodeMessage_DispatchRefused{DispatchRefused: &nodev1.DispatchRefused{RunId: d.GetRunId(), Reason: "broken"}}})
	if r := wait(t, first); !errors.Is(r.err, ErrDispatchRefused) {
		t.Fatalf("the refused request: %v", r.err)
	}
	unavailable(t, "the queued request", wait(t, queued).err)
	// At arrival, a model whose every capable provider is out of rotation
	// has no provider (503 too).
	_, err := e.svc.Dispatch(context.Background(), toolsReq("m"))
	if !errors.Is(err, scheduler.ErrNoProvider) || errors.Is(err, scheduler.ErrCandidatesRejected) {
		t.Fatalf("a fresh tools request: %v, want ErrNoProvider and no rejection", err)
	}
}
