package e2e

import (
	"testing"
	"time"

	"iop/internal/e2e/harness"
	"iop/internal/process"
	"iop/internal/sim"
)

// TestStalledRunDoesNotHoldUpItsConnection: HTTP/2 flow control is per
// run (DESIGN.md: each run has its own stream). A client that stops
// reading a streamed answer of unlimited speed fills its run's window
// between node and edge, and stays in flight; meanwhile another run on the
// same node connection streams an answer larger than a run's window
// (about 600 KB; the edge's stream window is 256 KiB) and gets it whole.
func TestStalledRunDoesNotHoldUpItsConnection(t *testing.T) {
	harness.ParallelLong(t)
	// Unlimited token rate: the stalled answer fills every buffer on its
	// way; the write timeout outlasts the test.
	cfg := process.DefaultEdgeFile()
	cfg.WriteTimeout = 5 * time.Minute
	e, paths := startCancelStack(t, cfg, 2, sim.Config{})
	client := newClient(e)
	for _, p := range paths {
		t.Run(p.name, func(t *testing.T) {
			conn := stalledReader(t, e, p.model)
			defer conn.Close()
			const tokens = 4_000 // about 150 bytes of SSE each
			select {
			case err := <-intactRun(client, p.model, tokens):
				if err != nil {
					t.Fatalf("the run beside a stalled one: %v", err)
				}
			case <-time.After(2 * time.Minute): // a hang, not a speed check
				t.Fatal("the run beside a stalled one did not finish")
			}
			if got := p.backend.Stats().InFlight; got != 1 {
				t.Fatalf("backend in flight %d after the second run, want 1: the stalled run", got)
			}
			conn.Close()
			waitIdle(t, e)
		})
	}
}
