package edge

import (
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"iop/internal/edge/contract"
)

// TestRegression_OneLeaderBoundPerRequest: a follower's request waited
// for a leader twice, leaderWait each: in its key's admission (AdmitKey)
// and again in its own admission, so a request whose key was admitted
// late could answer no_leader nearly 2×leaderWait after it arrived. The
// two share the request's contract.LeaderBound now: a request whose
// bound was spent (here fixed leaderWait ago) and that finds no leader
// answers ErrNoLeader at once, where it used to wait a fresh leaderWait
// (beyond the 2 s its client waits here). A request whose bound was spent
// but whose leader answers is still admitted (its body may have taken
// that long to arrive).
func TestRegression_OneLeaderBoundPerRequest(t *testing.T) {
	es, li, fi, cn := clusterPair(t)
	leader, fol := es[li], es[fi]
	spent := func() context.Context {
		ctx := contract.WithLeaderBound(context.Background())
		contract.LeaderBoundOf(ctx).Deadline(fol.clk.Now().Add(-leaderWait), leaderWait)
		return ctx
	}

	// The leader answers: admitted, though the bound passed.
	r, rs, d := cn.accept(t, fi, fol.dispatchAsync(spent(), chatReq("m")))
	cn.complete(t, rs, d)
	if _, err := recvAll(r); !errors.Is(err, io.EOF) {
		t.Fatalf("run: %v", err)
	}
	waitCond(t, "the follower's release at the leader", func() bool { return leaderInFlight(leader) == 0 })

	// No leader the follower can reach: ErrNoLeader, not another wait.
	blockLeader(t, fol)
	ctx, cancel := context.WithTimeout(spent(), 2*time.Second)
	defer cancel()
	_, err := fol.svc.Dispatch(ctx, chatReq("m"))
	if !errors.Is(err, ErrNoLeader) {
		t.Fatalf("request with its leader bound spent, the leader unreachable: %v, want ErrNoLeader at once", err)
	}
}
