package admin

import (
	"net/http"

	"iop/internal/edge/adminwire"
	"iop/internal/edge/api"
	"iop/internal/edge/api/httpconn"
	"iop/internal/edge/contract"
)

// Snapshots is what the state routes need of the edge: one view of its
// nodes, providers and queues. The edge's *edge.Service is one.
type Snapshots interface {
	// Snapshot returns the current nodes, providers and queues. The
	// slices are the caller's.
	Snapshot() contract.Snapshot
}

// stateRoutes returns GET /admin/v1/nodes, /providers, /queues and
// /cluster, each answering JSON built from one snapshot.
func stateRoutes(snaps Snapshots) map[string]api.Route {
	serve := func(render func(contract.Snapshot) any) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			httpconn.WriteJSON(w, http.StatusOK, render(snaps.Snapshot()))
		}
	}
	return map[string]api.Route{
		"/admin/v1/nodes":     {Method: http.MethodGet, Serve: serve(adminNodes)},
		"/admin/v1/providers": {Method: http.MethodGet, Serve: serve(adminProviders)},
		"/admin/v1/queues":    {Method: http.MethodGet, Serve: serve(adminQueues)},
		"/admin/v1/cluster":   {Method: http.MethodGet, Serve: serve(adminCluster)},
	}
}

// adminCluster is GET /admin/v1/cluster: the edge's view of its cluster
// (several edges), {"cluster": false} for a single edge; "name_in_use_by"
// (only when so) names the advertise address of another edge with this
// edge's cluster name. "leases" counts
// the unreleased leases of this edge's scheduler (the leader's: every
// edge's), "runs" the runs this edge relays now.
func adminCluster(s contract.Snapshot) any {
	c := s.Cluster
	if c == nil {
		return map[string]any{"cluster": false, "leases": s.Leases}
	}
	out := map[string]any{
		"cluster": true, "name": c.Name, "leader": c.Leader, "ready": c.Ready, "epoch": c.Epoch,
		"leader_addr": c.LeaderAddr, "held_leases": c.HeldLeases, "leases": s.Leases, "runs": c.Runs, "waiters": s.Waiters,
	}
	if c.NameInUseBy != "" {
		// Another edge of the cluster has this edge's name.
		out["name_in_use_by"] = c.NameInUseBy
	}
	return out
}

// The wire shapes of the admin routes. Times are RFC 3339 and slices are
// never null.

func adminNodes(s contract.Snapshot) any {
	out := make([]adminwire.Node, 0, len(s.Nodes))
	for _, n := range s.Nodes {
		out = append(out, adminwire.Node{
			ID: n.NodeID, Label: n.Label, Generation: n.Generation,
			ConnectedSince: n.ConnectedAt.UTC(), LastHeartbeat: n.LastSeen.UTC(),
			Version: n.Version, Providers: nonNil(n.Providers), Draining: n.Draining,
		})
	}
	return out
}

func adminProviders(s contract.Snapshot) any {
	out := make([]adminwire.Provider, 0, len(s.Providers))
	for _, p := range s.Providers {
		health := "unhealthy"
		if p.Healthy {
			health = "healthy"
		}
		ap := adminwire.Provider{
			NodeID: p.NodeID, ProviderID: p.ProviderID, Type: p.Type,
			Capacity: p.Capacity, InFlight: p.InFlight, LongCapacity: p.LongCapacity, LongInFlight: p.LongInFlight,
			BatchInFlight: p.BatchInFlight, Queued: p.Queued, LoadRatio: p.Load, Health: health,
			Models: nonNil(p.Models), Capabilities: nonNil(p.Capabilities), Status: p.Status,
			Circuit: p.Circuit, ModelCapabilities: p.ModelCapabilities, ReadsLoaded: p.Loaded != nil,
		}
		for _, m := range p.Loaded {
			ap.Loaded = append(ap.Loaded, adminwire.Loaded{Model: m.Model, Since: m.Since, Kept: m.Kept})
		}
		out = append(out, ap)
	}
	return out
}

func adminQueues(s contract.Snapshot) any {
	out := make([]adminwire.Queue, 0, len(s.Queues))
	for _, q := range s.Queues {
		j := adminwire.Queue{Model: q.Model, Queued: q.Queued, Batch: q.Batch, Flows: make([]adminwire.QueueFlow, 0, len(q.Flows)),
			Targets: q.Targets, UnmatchedTargets: q.UnmatchedTargets}
		j.Policy.MaxQueue, j.Policy.QueueTimeoutMS, j.Policy.Fairness = q.MaxQueue, q.QueueTimeout.Milliseconds(), q.Fairness
		for _, f := range q.Flows {
			j.Flows = append(j.Flows, adminwire.QueueFlow{Flow: f.Flow, Priority: f.Priority, Queued: f.Queued})
		}
		out = append(out, j)
	}
	return out
}

// nonNil returns s, or an empty slice for nil, so that it encodes as [].
func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
