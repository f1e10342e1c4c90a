package edge

import (
	"context"
	"time"

	"iop/internal/edge/contract"
)

// bound returns ctx carrying a contract.LeaderBound: every admission of
// the request (again after a failed dispatch) waits for a leader within
// one bound, shared with its key's admission when the HTTP API attached
// it first.
func (cm *clusterMode) bound(ctx context.Context) context.Context {
	if contract.LeaderBoundOf(ctx) != nil {
		return ctx
	}
	return contract.WithLeaderBound(ctx)
}

// awaitNode waits until node has a connection to this edge, while it may
// still come: this edge started, or its last connection of node ended,
// less than the reconnect grace (queue.reconnect_grace, the longest of
// the config) ago. It returns whether node is connected. It ends early
// when ctx ends or the edge stops.
//
// A follower calls it when the leader grants it a node it has no
// connection to: nodes dial every edge, so after this edge (re)starts, or
// while a node reconnects to it, the leader may know a node this edge does
// not have yet. The request is then admitted again, on that node once it
// is here, rather than failed for want of a provider. Its lease was
// released before the wait: no slot is held idle meanwhile.
func (cm *clusterMode) awaitNode(ctx context.Context, node string) bool {
	s := cm.s
	grace := time.Duration(s.cat.awayFor.Load())
	until := cm.born.Add(grace)
	if g, ok := s.reg.load().gone.get(node); ok && g.at.Add(grace).After(until) {
		until = g.at.Add(grace)
	}
	for {
		changed := s.reg.changes()
		if s.reg.current(node) != nil {
			return true
		}
		d := until.Sub(s.clock.Now())
		if d <= 0 {
			return false
		}
		expired := make(chan struct{})
		t := s.clock.AfterFunc(d, func() { close(expired) })
		select {
		case <-changed:
			t.Stop()
		case <-expired:
		case <-ctx.Done():
			t.Stop()
			return false
		case <-s.shutdown:
			t.Stop()
			return false
		}
	}
}
