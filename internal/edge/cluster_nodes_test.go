package edge

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"
	"time"

	"iop/internal/cluster"
	"iop/internal/scheduler"
	"iop/internal/testenv/etcdtest"
	"iop/internal/wire/nodev1"
)

// TestRegression_FollowerWaitsForANodeStillConnecting: a follower that
// has just started is granted, by the leader, a node that has not
// connected to it yet (nodes dial every edge, each in its own time). The
// chaos suite's restart-follower runs saw 1–4 requests a run answered 503
// provider_unavailable so: the follower admitted the request again
// without that node, and the only provider of the model was on it. The
// follower now waits for the node while it may still come (the reconnect
// grace from its start), then admits the request again on it; a node
// that does not come within the grace is left out as before.
func TestRegression_FollowerWaitsForANodeStillConnecting(t *testing.T) {
	const grace = 30 * time.Second // the first part runs within it
	etcd := etcdtest.Start(t)
	var es []*testEdge
	for i := range 2 {
		cfg := testConfig()
		cfg.Queue.ReconnectGrace = grace
		cfg.Cluster = &cluster.Config{Etcd: etcd.Endpoints(), Name: fmt.Sprintf("edge-%d", i+1), SessionTTL: time.Second, ID: "test"}
		es = append(es, startEdge(t, cfg))
	}
	li := waitLeader(t, es, []bool{true, true}, 0)
	leader, fol := es[li], es[1-li]
	// The follower's grants of a node it has no connection to.
	lacking := make(chan scheduler.Candidate, 4)
	fol.svc.afterAdmit = func(c scheduler.Candidate) {
		if c.Generation == 0 {
			lacking <- c
		}
	}
	h := hello("n1", prov("p1", normalized, 1, "m"))
	leader.connect(t, h)
	// Served by the leader's node only, for now.
	res := fol.dispatchAsync(context.Background(), chatReq("m"))
	select {
	case c := <-lacking:
		if c.NodeID != "n1" {
			t.Fatalf("granted %+v, want n1", c)
		}
	case got := <-res:
		t.Fatalf("request at the follower before the node connected to it: %v, want a grant of n1", got.err)
	case <-time.After(failsafe):
		t.Fatal("no grant of n1 at the follower")
	}
	// The node connects to the follower now: the request runs on it (it
	// used to be admitted again without n1, and fail).
	n := fol.connect(t, h)
	r, rs, d := n.acceptRun(t, res)
	if d.GetEpoch() == 0 || d.GetProviderId() != "p1" {
		t.Fatalf("dispatch on the follower: %+v, want p1 under the leader's epoch", d)
	}
	sendUp(t, rs, events(event(nodev1.RunEvent_TYPE_COMPLETE, "")))
	if _, err := recvAll(r); !errors.Is(err, io.EOF) {
		t.Fatalf("run: %v", err)
	}

	// A node that never connects to the follower: once the grace (from
	// its start) is out, the follower no longer waits for it (the request
	// is admitted again without it).
	fol.clk.Advance(grace)
	ctx, cancel := context.WithTimeout(context.Background(), failsafe)
	defer cancel()
	if fol.svc.cl.awaitNode(ctx, "n2") || ctx.Err() != nil {
		t.Fatalf("awaitNode of a node that never came, past the grace: waited until %v, want false at once", ctx.Err())
	}
}
