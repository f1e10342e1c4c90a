package edge

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"iop/internal/edge/contract"
	"iop/internal/scheduler"
	"iop/internal/wire/nodev1"
)

// TestDispatchErrorsAreTheContracts: the edge wraps its scheduler's
// admission errors with the contract's once, at its boundary
// (Service.Dispatch), so its callers need only the contract's errors; the
// scheduler's stay in the chain, with their details. The text says the
// contract's words once: where the scheduler's error says them already
// ("unknown model"), they are not said again before it.
func TestDispatchErrorsAreTheContracts(t *testing.T) {
	cfg := testConfig()
	cfg.Models["orphan"] = ModelConfig{Targets: []string{"sick-model"}}
	e := startEdge(t, cfg)
	p := prov("p1", normalized, 1, "m-small")
	p.Capabilities = []string{"stream"}
	e.connect(t, hello("n1", p))
	// orphan's only target is served, by an unhealthy provider: no
	// provider (an alias whose targets nobody serves is an unknown model).
	sick := e.connect(t, hello("n2", prov("p2", normalized, 1, "sick-model")))
	sick.send(t, &nodev1.NodeMessage{Msg: &nodev1.NodeMessage_ProviderUpdate{ProviderUpdate: &nodev1.ProviderUpdate{ProviderId: "p2", Healthy: false}}})
	e.waitUntil(t, "p2 unhealthy", func(s contract.Snapshot) bool {
		p, ok := providerOf(s, "n2", "p2")
		return ok && !p.Healthy
	})
	vision := chatReq("chat")
	vision.Needs = []string{"vision"}
	for _, tc := range []struct {
		name            string
		req             contract.Request
		contract, sched error
	}{
		{"unknown model", chatReq("nope"), contract.ErrUnknownModel, scheduler.ErrUnknownModel},
		{"missing capability", vision, contract.ErrCandidatesRejected, scheduler.ErrCandidatesRejected},
		{"no provider", chatReq("orphan"), contract.ErrNoProvider, scheduler.ErrNoProvider},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := e.svc.Dispatch(context.Background(), tc.req)
			if !errors.Is(err, tc.contract) || !errors.Is(err, tc.sched) || !strings.HasPrefix(err.Error(), tc.contract.Error()) ||
				strings.Count(err.Error(), tc.contract.Error()) != 1 {
				t.Fatalf("Dispatch = %v, want the contract's %q, said once, wrapping the scheduler's %q", err, tc.contract, tc.sched)
			}
		})
	}
}

// TestBoundaryErrorOrder: a lost provider is unavailable even when a
// rejection is in the chain; the edge's own outcomes and errors of no
// outcome pass as they are.
func TestBoundaryErrorOrder(t *testing.T) {
	both := fmt.Errorf("%w: %w", scheduler.ErrProviderUnavailable, scheduler.ErrCandidatesRejected)
	if err := boundaryError(both); !errors.Is(err, contract.ErrProviderUnavailable) || errors.Is(err, contract.ErrCandidatesRejected) {
		t.Errorf("boundaryError(%v) = %v, want only provider unavailable", both, err)
	}
	for _, err := range []error{ErrNodeGone, context.Canceled, ErrInvalidRequest} {
		if got := boundaryError(err); got != err {
			t.Errorf("boundaryError(%v) = %v, want it unchanged", err, got)
		}
	}
	if boundaryError(nil) != nil {
		t.Error("boundaryError(nil) != nil")
	}
}

// TestRegression_BoundaryErrorSaysItsPrefixOnce: after a node was killed,
// a request's 503 was logged as "provider unavailable: provider
// unavailable: node gone: ...": the contract's words before the
// scheduler's same words. Each boundary error says them once.
func TestRegression_BoundaryErrorSaysItsPrefixOnce(t *testing.T) {
	for _, err := range []error{
		fmt.Errorf("%w: %w", scheduler.ErrProviderUnavailable, ErrNodeGone),
		fmt.Errorf("model %q: %w (3 waiting)", "m", scheduler.ErrQueueFull),
		fmt.Errorf("model %q: %w after 30s", "m", scheduler.ErrQueueTimeout),
		fmt.Errorf("%w %q: no live healthy provider serves it", scheduler.ErrNoProvider, "m"),
		fmt.Errorf("model %q: %w: %w", "m", scheduler.ErrShed, scheduler.ErrDisplaced),
	} {
		got := boundaryError(err).Error()
		for _, words := range []string{"provider unavailable", "queue full", "queue timeout", "no provider for model", "shed", "displaced"} {
			if n := strings.Count(got, words); n > 1 {
				t.Errorf("boundaryError(%v) = %q: says %q %d times", err, got, words, n)
			}
		}
	}
}
