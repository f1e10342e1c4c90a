package edge

import "time"

// leaseTable is a leader's table of the leases it holds for other edges'
// runs (and adopted runs of older epochs), by (epoch, lease id) and by
// (node, run id). It is pure bookkeeping: the caller (clusterMode) guards
// it with its mu, calls the scheduler (Release) outside that lock, and
// owns the rules:
//   - a lease is in the table at most once, by key and by run (add);
//   - it leaves the table exactly once (remove, stale, drain return each
//     removed lease once): whoever removed it releases it, so a node's
//     report and a follower's late Release never both free the slot;
//   - stale lists the leases on a node whose run its report does not list
//     and that are older than a grace: the nodes are the truth.
type leaseTable struct {
	held  map[leaseKey]*heldLease
	byRun map[string]*heldLease // node + "\x00" + run id
}

func newLeaseTable() leaseTable {
	return leaseTable{held: make(map[leaseKey]*heldLease), byRun: make(map[string]*heldLease)}
}

func runKey(node, runID string) string { return node + "\x00" + runID }

// add records h unless its key or its run is in the table already.
func (lt *leaseTable) add(h *heldLease) bool {
	rk := runKey(h.node, h.runID)
	if lt.held[h.key] != nil || lt.byRun[rk] != nil {
		return false
	}
	lt.held[h.key], lt.byRun[rk] = h, h
	return true
}

// get returns the lease of k, or nil.
func (lt *leaseTable) get(k leaseKey) *heldLease { return lt.held[k] }

// knowsRun reports whether a lease of node's run runID is in the table.
func (lt *leaseTable) knowsRun(node, runID string) bool { return lt.byRun[runKey(node, runID)] != nil }

// remove takes h out of the table; false when it was not in it (removed
// already): the caller releases h only on true.
func (lt *leaseTable) remove(h *heldLease) bool {
	if lt.held[h.key] != h {
		return false
	}
	delete(lt.held, h.key)
	delete(lt.byRun, runKey(h.node, h.runID))
	return true
}

// stale lists the leases on node granted or adopted before before whose
// run is not in listed (the node's report of its runs in flight).
func (lt *leaseTable) stale(node string, listed map[string]bool, before time.Time) []*heldLease {
	var out []*heldLease
	for _, h := range lt.held {
		if h.node == node && h.since.Before(before) && !listed[h.runID] {
			out = append(out, h)
		}
	}
	return out
}

// drain empties the table and returns every lease it held.
func (lt *leaseTable) drain() []*heldLease {
	out := make([]*heldLease, 0, len(lt.held))
	for _, h := range lt.held {
		out = append(out, h)
	}
	clear(lt.held)
	clear(lt.byRun)
	return out
}

// len is the number of leases held.
func (lt *leaseTable) len() int { return len(lt.held) }
