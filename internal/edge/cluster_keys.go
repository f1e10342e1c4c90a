package edge

import (
	"context"
	"sync/atomic"

	"iop/internal/auth"
	"iop/internal/wire/nodev1"
)

// A key's limits across failover (several edges). The leader counts every
// edge's requests of a key (AdmitKey); a new leader rebuilds that count:
//   - max_concurrent: each Dispatch names its key, the node reports it
//     with the run (RunInFlight.key), and the new leader takes one slot
//     of the key, never refused, for each run it adopts from an older
//     epoch; the slot goes with the adopted lease (dropHeld).
//   - requests_per_minute: the old leader's allowance cannot be known, so
//     an edge that takes over from another leader empties every key's
//     allowance before it admits: it refills from zero at the key's
//     steady rate, which never lets more through than one leader would
//     have. An edge that never saw another leader (the deployment's first
//     election) starts every allowance full.

// clusterKeys is the leader's access to the HTTP layer's keys.
type clusterKeys struct {
	adopt     atomic.Pointer[func(name string) (release func())]
	newEpoch  atomic.Pointer[func()]
	sawLeader atomic.Bool // this edge followed another leader once
}

// SetKeyLeader gives the leader the way to count a running request of a
// key it adopts (adopt: a slot above the limit if need be; release gives
// it back) and to empty every key's per-minute allowance when it is
// elected (newEpoch). Safe to call at any time; a no-op without a
// cluster.
func (s *Service) SetKeyLeader(adopt func(name string) (release func()), newEpoch func()) {
	s.adm.setKeyLeader(adopt, newEpoch)
}

func (cm *clusterMode) setKeyLeader(adopt func(name string) (release func()), newEpoch func()) {
	cm.keys.adopt.Store(&adopt)
	cm.keys.newEpoch.Store(&newEpoch)
}

// requestKey is the name of the client API key ctx carries ("" : none).
func requestKey(ctx context.Context) string {
	if c := auth.FromContext(ctx); c != nil {
		return c.Name()
	}
	return ""
}

// electedKeys prepares the keys for a new leadership, before it admits:
// when it takes over from another leader, every per-minute allowance is
// emptied.
func (cm *clusterMode) electedKeys() {
	if f := cm.keys.newEpoch.Load(); f != nil && cm.keys.sawLeader.Load() {
		(*f)()
	}
}

// adoptKey takes ri's key slot for the lease this leader (of epoch) holds
// for ri's run on node, when that lease was adopted from an older epoch
// and has none yet. The key's slot is taken with cm.mu released.
func (cm *clusterMode) adoptKey(epoch int64, node string, ri *nodev1.RunInFlight) {
	name := ri.GetKey()
	f := cm.keys.adopt.Load()
	if name == "" || f == nil {
		return
	}
	cm.mu.Lock()
	h := cm.leases.byRun[runKey(node, ri.GetRunId())]
	if h == nil || h.keyTaken || h.key.epoch >= epoch {
		cm.mu.Unlock()
		return
	}
	h.keyTaken = true
	cm.mu.Unlock()
	release := (*f)(name)
	cm.mu.Lock()
	if cm.leases.get(h.key) == h {
		h.keyRelease = release
		release = nil
	}
	cm.mu.Unlock()
	if release != nil {
		release() // dropped meanwhile
	}
}

// releaseKeySlot gives back the key slot adoptKey took for h, once: every
// path that releases a held lease calls it, with cm.mu not held.
func (cm *clusterMode) releaseKeySlot(h *heldLease) {
	cm.mu.Lock()
	release := h.keyRelease
	h.keyRelease = nil
	cm.mu.Unlock()
	if release != nil {
		release()
	}
}
