package edge

import (
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
	"time"

	"iop/internal/clock"
	"iop/internal/scheduler"
)

// leaseSeeds is how many seeds TestLeaseTableProtocol runs: 200, or
// IOP_LEASE_SEEDS.
func leaseSeeds(t *testing.T) int {
	if v := os.Getenv("IOP_LEASE_SEEDS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("IOP_LEASE_SEEDS=%q: want a positive count", v)
		}
		return n
	}
	return 200
}

// TestLeaseTableProtocol runs the leader's lease table (the real
// leaseTable, leases of a real scheduler) through random interleavings, one
// per seed, of what the cluster does to it: grants for followers' runs,
// their dispatch to and end at the nodes, the followers' Releases (some
// lost with their link, some late, some sent twice), node heartbeats (which
// reconcile, and adopt runs of older epochs), the clock moving, and the
// leader deposed and another term begun. After every step: no lease is
// released twice; the scheduler counts exactly the table's leases; no node
// runs more than its capacity; and right after a node's heartbeat the
// table holds on that node exactly the runs the node lists, plus reserved
// leases younger than reconcileGrace. IOP_LEASE_SEEDS=N runs more seeds;
// a failure names its seed.
func TestLeaseTableProtocol(t *testing.T) {
	t.Parallel()
	for seed := range leaseSeeds(t) {
		if err := runLeaseModel(uint64(seed), 400); err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
	}
}

type modelLease struct {
	h        *heldLease
	node     string
	run      string
	running  bool // the node runs it
	ended    bool // its run ended at the node
	released int  // times its scheduler lease said it released
}

func runLeaseModel(seed uint64, steps int) error {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	sched, err := scheduler.New(scheduler.Config{Clock: clk})
	if err != nil {
		return err
	}
	const capacity = 3
	nodes := []string{"n1", "n2"}
	for _, n := range nodes {
		if err := sched.Activate(n, 1, []scheduler.ResourceSpec{{ProviderID: "p", Capacity: capacity}}, func() bool { return true }); err != nil {
			return err
		}
	}
	lt := newLeaseTable()
	epoch, leaseSeq, runSeq := int64(1), uint64(0), 0
	all := map[*heldLease]*modelLease{}
	nodeRuns := map[string]map[string]*modelLease{"n1": {}, "n2": {}}
	var late []*modelLease // follower Releases on their way
	release := func(h *heldLease, why string) {
		if h.l.Release(why) {
			all[h].released++
		}
	}
	inFlight := func(node string) int {
		for _, p := range sched.Snapshot().Providers {
			if p.NodeID == node {
				return p.InFlight
			}
		}
		return -1
	}
	// A follower's Release reaching the leader.
	leaderRelease := func(m *modelLease) {
		if h := lt.get(m.h.key); h != nil && lt.remove(h) {
			release(h, "follower release")
		}
	}
	for step := range steps {
		now := clk.Now()
		var what string
		switch op := rng.IntN(100); {
		case op < 25: // grant a follower's request
			node := nodes[rng.IntN(len(nodes))]
			if len(nodeRuns[node]) >= capacity || inFlight(node) >= capacity {
				what = "grant: " + node + " full"
				break
			}
			l, err := sched.Adopt(node, "p", "", "", false, "")
			if err != nil {
				return err
			}
			leaseSeq++
			runSeq++
			h := &heldLease{key: leaseKey{epoch, leaseSeq}, l: l, edge: "f", node: node, runID: fmt.Sprintf("r%d", runSeq), since: now}
			if !lt.add(h) {
				return fmt.Errorf("step %d: a fresh lease was refused", step)
			}
			all[h] = &modelLease{h: h, node: node, run: h.runID}
			what = "grant " + h.runID
		case op < 45: // dispatch a reserved lease (within the grace) or time it out
			for _, m := range all {
				if m.running || m.ended || m.released > 0 || lt.get(m.h.key) != m.h {
					continue
				}
				if now.Sub(m.h.since) < reconcileGrace && len(nodeRuns[m.node]) < capacity {
					m.running = true
					nodeRuns[m.node][m.run] = m
					what = "dispatch " + m.run
				} else {
					m.ended = true // the follower's dispatch timed out: it releases
					late = append(late, m)
					what = "dispatch timeout " + m.run
				}
				break
			}
		case op < 60: // a run ends at its node; its follower's Release may be lost, late or twice
			for _, m := range all {
				if !m.running || m.ended {
					continue
				}
				m.ended = true
				delete(nodeRuns[m.node], m.run)
				switch r := rng.IntN(4); r {
				case 0: // the follower is cut off: lost
				case 1:
					leaderRelease(m)
				case 2:
					late = append(late, m)
				default:
					leaderRelease(m)
					late = append(late, m)
				}
				what = "end " + m.run
				break
			}
		case op < 70: // a late Release arrives
			if len(late) > 0 {
				i := rng.IntN(len(late))
				m := late[i]
				late = append(late[:i], late[i+1:]...)
				leaderRelease(m)
				what = "late release " + m.run
			}
		case op < 85: // a node's heartbeat: adopt older epochs' runs, release what it does not run
			node := nodes[rng.IntN(len(nodes))]
			listed := map[string]bool{}
			for run, m := range nodeRuns[node] {
				listed[run] = true
				if m.h.key.epoch < epoch && !lt.knowsRun(node, run) {
					l, err := sched.Adopt(node, "p", "", "", false, "")
					if err != nil {
						return err
					}
					h := &heldLease{key: m.h.key, l: l, node: node, runID: run, since: now}
					if lt.add(h) {
						all[h] = &modelLease{h: h, node: node, run: run, running: true}
						nodeRuns[node][run] = all[h]
					} else {
						l.Release("counted already")
					}
				}
			}
			for _, h := range lt.stale(node, listed, now.Add(-reconcileGrace)) {
				if lt.remove(h) {
					release(h, "not on its node")
				}
			}
			// Right after the report: the table is the node's runs plus
			// young reserved leases.
			for _, h := range lt.held {
				if h.node == node && !listed[h.runID] && now.Sub(h.since) > reconcileGrace {
					return fmt.Errorf("step %d: after %s's heartbeat the table holds %s (since %s), which the node does not run", step, node, h.runID, now.Sub(h.since))
				}
			}
			for run := range listed {
				if !lt.knowsRun(node, run) {
					return fmt.Errorf("step %d: after %s's heartbeat its run %s has no lease", step, node, run)
				}
			}
			what = "heartbeat " + node
		case op < 95:
			clk.Advance(time.Duration(rng.IntN(1500)) * time.Millisecond)
			what = "advance"
		default: // deposed: the term ends, a newer one begins
			for _, h := range lt.drain() {
				release(h, "deposed")
			}
			epoch++
			what = "depose"
		}
		// Invariants after every step.
		for h, m := range all {
			if m.released > 1 {
				return fmt.Errorf("step %d (%s): lease %v released %d times", step, what, h.key, m.released)
			}
		}
		for _, n := range nodes {
			inTable := 0
			for _, h := range lt.held {
				if h.node == n {
					inTable++
				}
			}
			if got := inFlight(n); got != inTable {
				return fmt.Errorf("step %d (%s): scheduler counts %d in flight on %s, the table %d", step, what, got, n, inTable)
			}
			if len(nodeRuns[n]) > capacity {
				return fmt.Errorf("step %d (%s): %s runs %d, capacity %d", step, what, n, len(nodeRuns[n]), capacity)
			}
		}
	}
	return nil
}
