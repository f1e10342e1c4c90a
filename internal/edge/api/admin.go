package api

import (
	"net/http"

	"iop/internal/edge/adminwire"
	"iop/internal/edge/contract"
)

// Admin is what the admin routes need of the edge: one view of its nodes,
// providers and queues. A Gateway that also implements Admin gets the
// /admin/v1 routes; for any other Gateway they answer 404. The edge's
// *edge.Service implements it.
type Admin interface {
	// Snapshot returns the current nodes, providers and queues. The
	// slices are the caller's.
	Snapshot() AdminSnapshot
}

// AdminSnapshot is one view of the edge (contract.Snapshot).
type AdminSnapshot = contract.Snapshot

// AdminNode, AdminProvider and AdminQueue are one connected node, one
// provider and one model group's queue of an AdminSnapshot.
type (
	AdminNode     = contract.NodeSnapshot
	AdminProvider = contract.ProviderSnapshot
	AdminQueue    = contract.QueueSnapshot
)

// adminRoutes returns the admin routes, each answering a JSON array built
// from one AdminSnapshot.
func adminRoutes(adm Admin) map[string]route {
	serve := func(render func(AdminSnapshot) any) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			writeJSON(w, http.StatusOK, render(adm.Snapshot()))
		}
	}
	return map[string]route{
		"/admin/v1/nodes":     {http.MethodGet, serve(adminNodes)},
		"/admin/v1/providers": {http.MethodGet, serve(adminProviders)},
		"/admin/v1/queues":    {http.MethodGet, serve(adminQueues)},
		"/admin/v1/cluster":   {http.MethodGet, serve(adminCluster)},
	}
}

// adminCluster is GET /admin/v1/cluster: the edge's view of its cluster
// (several edges), {"cluster": false} for a single edge; "name_in_use_by"
// (only when so) names the advertise address of another edge with this
// edge's cluster name. "leases" counts
// the unreleased leases of this edge's scheduler (the leader's: every
// edge's), "runs" the runs this edge relays now.
func adminCluster(s AdminSnapshot) any {
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

type (
	adminNodeJSON     = adminwire.Node
	adminProviderJSON = adminwire.Provider
	adminQueueJSON    = adminwire.Queue
)

func adminNodes(s AdminSnapshot) any {
	out := make([]adminNodeJSON, 0, len(s.Nodes))
	for _, n := range s.Nodes {
		out = append(out, adminNodeJSON{
			ID: n.NodeID, Label: n.Label, Generation: n.Generation,
			ConnectedSince: n.ConnectedAt.UTC(), LastHeartbeat: n.LastSeen.UTC(),
			Version: n.Version, Providers: nonNil(n.Providers), Draining: n.Draining,
		})
	}
	return out
}

func adminProviders(s AdminSnapshot) any {
	out := make([]adminProviderJSON, 0, len(s.Providers))
	for _, p := range s.Providers {
		health := "unhealthy"
		if p.Healthy {
			health = "healthy"
		}
		out = append(out, adminProviderJSON{
			NodeID: p.NodeID, ProviderID: p.ProviderID, Type: p.Type,
			Capacity: p.Capacity, InFlight: p.InFlight, LongCapacity: p.LongCapacity, LongInFlight: p.LongInFlight,
			Queued: p.Queued, LoadRatio: p.Load, Health: health,
			Models: nonNil(p.Models), Capabilities: nonNil(p.Capabilities), Status: p.Status,
			Circuit: p.Circuit, ModelCapabilities: p.ModelCapabilities,
		})
	}
	return out
}

func adminQueues(s AdminSnapshot) any {
	out := make([]adminQueueJSON, 0, len(s.Queues))
	for _, q := range s.Queues {
		j := adminQueueJSON{Model: q.Model, Queued: q.Queued, Flows: make([]adminwire.QueueFlow, 0, len(q.Flows)),
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
