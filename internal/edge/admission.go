package edge

import (
	"context"

	"iop/internal/edge/contract"
	"iop/internal/scheduler"
	"iop/internal/wire/nodev1"
)

// admission is how an edge admits a request: localAdmission (a single
// edge: its own scheduler) or clusterMode (several edges: the elected
// leader's scheduler, this edge's own when it leads). Service sees only
// this interface and the grant it returns; the methods below admit are
// what only several edges do (no-ops on a single edge).
type admission interface {
	// admit admits req, never to a candidate tried excludes, with the
	// prefix route computed before it; onQueued runs when the request
	// waits. Errors: the scheduler's (ErrQueueFull, ErrQueueTimeout, ...),
	// contract.ErrNoLeader, ErrShuttingDown, the context's cause.
	admit(ctx context.Context, req contract.Request, tried []triedCandidate, route prefixRoute, onQueued func()) (grant, error)
	// admitKey is Service.AdmitKey.
	admitKey(ctx context.Context, name string) (local bool, release func(), err error)
	// nodeReport takes c's node's report of its runs in flight: a
	// heartbeat's list, or (isAnswer) the answer to a RunsRequest of epoch.
	nodeReport(c *conn, epoch int64, runs []*nodev1.RunInFlight, isAnswer bool)
	// sawEpoch takes a node's refusal naming epoch as the highest it saw.
	sawEpoch(epoch int64)
	// serving reports whether admission can answer now (Service.Ready).
	serving() bool
	// clusterState is Service.Cluster.
	clusterState() (ClusterState, bool)
	// setKeyAdmitter and setKeyLeader are Service.SetKeyAdmitter and
	// Service.SetKeyLeader.
	setKeyAdmitter(f func(name string) (release func(), err error))
	setKeyLeader(adopt func(name string) (release func()), newEpoch func())
	// bound returns ctx carrying a contract.LeaderBound for the request's
	// waits for a leader (ctx itself when it has one or there is none).
	bound(ctx context.Context) context.Context
	// awaitNode waits, while node may still connect to this edge, until
	// it does (clusterMode.awaitNode); it reports whether it did.
	awaitNode(ctx context.Context, node string) bool
}

// grant is one admitted slot, released exactly once (release reports
// whether this call released it).
type grant interface {
	candidate() scheduler.Candidate
	info() scheduler.DispatchInfo
	// track names the run the slot is used for (the scheduler's lease
	// tracks it; a leader's lease of a follower's run is tracked there).
	track(runID string)
	release(reason EndReason) bool
	// stamp is the epoch and lease id the run's Dispatch carries (several
	// edges); 0, 0 outside a cluster.
	stamp() (epoch int64, leaseID uint64)
	// local reports whether this edge's own scheduler counts the slot.
	local() bool
}

var (
	_ admission = localAdmission{}
	_ admission = (*clusterMode)(nil)
	_ grant     = localGrant{}
	_ grant     = (*remoteLease)(nil)
)

// localAdmission admits in the edge's own scheduler (a single edge).
type localAdmission struct{ s *Service }

func (a localAdmission) admit(ctx context.Context, req contract.Request, tried []triedCandidate, route prefixRoute, onQueued func()) (grant, error) {
	l, err := a.s.admitLocal(ctx, req, tried, route, onQueued)
	if err != nil {
		return nil, err
	}
	return localGrant{l: l}, nil
}

// A single edge takes its keys' slots itself, counts its own runs, and
// has no election.
func (localAdmission) admitKey(context.Context, string) (bool, func(), error) { return true, nil, nil }
func (localAdmission) nodeReport(*conn, int64, []*nodev1.RunInFlight, bool)   {}
func (localAdmission) sawEpoch(int64)                                         {}
func (localAdmission) serving() bool                                          { return true }
func (localAdmission) clusterState() (ClusterState, bool)                     { return ClusterState{}, false }
func (localAdmission) setKeyAdmitter(func(string) (func(), error))            {}
func (localAdmission) setKeyLeader(func(string) func(), func())               {}
func (localAdmission) bound(ctx context.Context) context.Context              { return ctx }
func (localAdmission) awaitNode(context.Context, string) bool                 { return false }

// admitLocal admits req in this edge's scheduler.
func (s *Service) admitLocal(ctx context.Context, req contract.Request, tried []triedCandidate, route prefixRoute, onQueued func()) (*scheduler.Lease, error) {
	return s.sched.Admit(ctx, scheduler.Request{
		Group:                req.Model,
		Long:                 s.cfg.LongContextTokens > 0 && req.EstimatedInputTokens >= s.cfg.LongContextTokens,
		EstimatedInputTokens: req.EstimatedInputTokens,
		Resolve:              s.resolver(req.Model, needsOf(req), tried),
		Prefer:               scheduler.ProviderRef{NodeID: req.PreferNodeID, ProviderID: req.PreferProviderID},
		Flow:                 req.Flow,
		Weight:               min(max(req.Weight, 0), scheduler.MaxWeight),
		Priority:             scheduler.Priority(min(max(req.Priority, contract.PriorityBatch), contract.PriorityCritical)),
		Affinity:             route.affinity(),
		AffinitySlack:        route.slack,
		OnQueued:             onQueued,
	})
}

// localGrant is a lease of this edge's scheduler; epoch is the leader's
// epoch that admitted it when this edge leads a cluster (0: a single edge).
type localGrant struct {
	l     *scheduler.Lease
	epoch int64
}

func (g localGrant) candidate() scheduler.Candidate { return g.l.Candidate() }
func (g localGrant) info() scheduler.DispatchInfo   { return g.l.Info() }
func (g localGrant) track(runID string)             { g.l.Track(runID) }
func (g localGrant) release(reason EndReason) bool  { return g.l.Release(string(reason)) }
func (g localGrant) local() bool                    { return true }
func (g localGrant) stamp() (int64, uint64) {
	if g.epoch == 0 {
		return 0, 0
	}
	return g.epoch, g.l.ID()
}
