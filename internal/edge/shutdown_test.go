package edge

import (
	"context"
	"errors"
	"testing"
)

// TestShutdownEndsRequestsCleanly: Service.Shutdown (the end of an edge's
// drain) ends a run in flight with ErrShuttingDown and tells its node to
// cancel it, fails a queued request with ErrShuttingDown (not as a client
// that left: HTTP 503), refuses later requests with it, and leaves no lease
// or waiter. Before, a stopping edge cut such requests' connections (a
// stream without an error event, an empty reply) and recorded them as
// client_gone.
func TestShutdownEndsRequestsCleanly(t *testing.T) {
	e := startEdge(t, testConfig())
	n := e.connect(t, hello("n1", prov("p1", normalized, 1, "m1")))
	run, _, _ := e.startRun(t, n, chatReq("m1"))
	queued := e.dispatchAsync(context.Background(), chatReq("m1"))
	waitFor(t, func() bool { return e.svc.Snapshot().Waiters == 1 })

	e.svc.Shutdown()
	if r := wait(t, queued); !errors.Is(r.err, ErrShuttingDown) || errors.Is(r.err, context.Canceled) {
		t.Fatalf("queued request: %v, want ErrShuttingDown", r.err)
	}
	if _, err := recvAll(run); !errors.Is(err, ErrShuttingDown) {
		t.Fatalf("run in flight ended with %v, want ErrShuttingDown", err)
	}
	if c := n.nextCancel(t); c.GetRunId() != run.Info().RunID {
		t.Fatalf("cancel %+v, want run %s's", c, run.Info().RunID)
	}
	run.Close("edge_stopped")
	if _, err := e.svc.Dispatch(context.Background(), chatReq("m1")); !errors.Is(err, ErrShuttingDown) {
		t.Fatalf("request after Shutdown: %v, want ErrShuttingDown", err)
	}
	e.svc.Shutdown() // idempotent
	if s := e.svc.Snapshot(); s.Leases != 0 || s.Waiters != 0 {
		t.Fatalf("%d leases, %d waiters left", s.Leases, s.Waiters)
	}
}
