package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"iop/internal/e2e/harness"
	"iop/internal/edge/adminwire"
	"iop/internal/testenv"
)

// startNodeOnEvery starts ONE `iop node` (node id n1, providers p1: model
// m, capacity 2, and p2: model k, capacity 8) whose `edges:` lists every
// edge of the rig, as a user deploys it, and waits until each edge lists
// both its providers available.
func (rig *clusterRig) startNodeOnEvery() *harness.Command {
	t := rig.t
	t.Helper()
	var addrs []string
	for _, e := range rig.edges {
		addrs = append(addrs, e.nodeAddr)
	}
	path := filepath.Join(t.TempDir(), "node.yaml")
	yaml := fmt.Sprintf(`node_id: n1
edges: [%s]
reconnect_min: 50ms
reconnect_max: 200ms
providers:
  - {id: p1, type: ollama, base_url: %q, models: [m], capacity: 2}
  - {id: p2, type: ollama, base_url: %q, models: [k], capacity: 8}
  - {id: p3, type: ollama, base_url: %q, models: [slow], capacity: 8}
`, strings.Join(addrs, ", "), rig.url1, rig.url2, rig.url3)
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	n := harness.StartProgram(t, nil, "node n1 on every edge", rig.bin, "node", "--config", path, "--log-level", "info")
	for _, e := range rig.edges {
		e.node = n
		rig.waitNodeOn(e)
	}
	return n
}

// nodeConn is node n1's connection as edge e sees it.
func (rig *clusterRig) nodeConn(e *clusterEdge) (adminwire.Node, error) {
	var ns []adminwire.Node
	if err := rig.admin2(e, "/admin/v1/nodes", &ns); err != nil {
		return adminwire.Node{}, err
	}
	for _, n := range ns {
		if n.ID == "n1" {
			return n, nil
		}
	}
	return adminwire.Node{}, fmt.Errorf("%s lists no node n1 (%d nodes)", e.name, len(ns))
}

// TestClusterOneNodeOnEveryEdge: three real edges of one cluster and ONE
// real node process listing all three in `edges:` (the deployment of the
// README's "Several edges"). A storm of clients spread over the edges,
// above both providers' capacities, never puts a provider above its
// capacity (the model server's own peak in-flight is the judge: the
// leader's count and the node's own slots both hold it), and every client
// is answered (completed, or a clean 503/429 with Retry-After). The leader
// is SIGKILLed mid-storm: another edge leads and admits (the time is
// printed); afterwards every surviving edge shows no run, lease or waiter
// (/admin/v1/cluster), no provider in flight or out of rotation
// (/admin/v1/providers), and the node's connections to the surviving edges
// are the same ones as before the kill (generation and connected_since
// unchanged: the node's capacity refusals and the lost edge disturbed
// neither).
func TestClusterOneNodeOnEveryEdge(t *testing.T) {
	harness.Parallel(t)
	rig := newClusterEdges(t)
	rig.startNodeOnEvery()
	var li int
	var epoch int64
	testenv.Eventually(t, "one ready leader", func() bool { li, epoch = rig.leader(0); return li >= 0 })
	conns := map[string]adminwire.Node{}
	for _, e := range rig.edges {
		n, err := rig.nodeConn(e)
		if err != nil {
			t.Fatal(err)
		}
		conns[e.name] = n
	}

	// Phase 1: the storm, above capacity on both providers: 12 clients on
	// m (p1, capacity 2), 12 on k (p2, capacity 8).
	tally := &stormTally{}
	stop := make(chan struct{})
	wgM := rig.storm(12, rig.big, "m", stop, tally)
	wgK := rig.storm(12, rig.big, "k", stop, tally)
	testenv.Eventually(t, "requests completed on every edge", func() bool {
		tally.mu.Lock()
		defer tally.mu.Unlock()
		return tally.completed >= 40
	})

	// Phase 2: SIGKILL the leader mid-storm.
	killed := rig.edges[li]
	tally.mu.Lock()
	before := tally.completed
	tally.mu.Unlock()
	killed.down.Store(true)
	killed.proc.Signal(t, syscall.SIGKILL)
	killedAt := time.Now()
	_ = killed.proc.Wait(t, 10*time.Second)
	var nl int
	var nepoch int64
	testenv.Eventually(t, "a new ready leader", func() bool { nl, nepoch = rig.leader(epoch); return nl >= 0 })
	electedIn := time.Since(killedAt)
	testenv.Eventually(t, "requests completed after the failover", func() bool {
		tally.mu.Lock()
		defer tally.mu.Unlock()
		return tally.completed > before+20
	})
	admittingIn := time.Since(killedAt)
	close(stop)
	wgM.Wait()
	wgK.Wait()
	t.Logf("leader %s SIGKILLed: %s leads at epoch %d (was %d), ready %s after the kill; 20 more completed %s after",
		killed.name, rig.edges[nl].name, nepoch, epoch, electedIn.Round(time.Millisecond), admittingIn.Round(time.Millisecond))
	fmt.Printf("cluster, one node on every edge: new leader ready %s after SIGKILL of the leader\n", electedIn.Round(time.Millisecond))

	s1, s2 := rig.sim1.Stats(), rig.sim2.Stats()
	tally.mu.Lock()
	bad, counts := tally.bad, fmt.Sprintf("completed %d, clean 503 %d, limited %d, to the killed edge %d; peak in flight p1 %d/2, p2 %d/8",
		tally.completed, tally.clean503, tally.limited, tally.edgeDown, s1.MaxInFlight, s2.MaxInFlight)
	tally.mu.Unlock()
	t.Log("storm: " + counts)
	if s1.MaxInFlight > 2 {
		t.Errorf("provider p1 (capacity 2) had %d requests at once at its model server", s1.MaxInFlight)
	}
	if s2.MaxInFlight > 8 {
		t.Errorf("provider p2 (capacity 8) had %d requests at once at its model server", s2.MaxInFlight)
	}
	if len(bad) > 0 {
		t.Fatalf("%d answers neither completed nor a clean 503/429 (%s); first: %s", len(bad), counts, bad[0])
	}

	// Phase 3: nothing leaked or counted twice on the surviving edges, and
	// the node's connections to them are the ones of before the kill.
	rig.waitQuiet("after the storm")
	for _, e := range rig.edges {
		if e.down.Load() {
			continue
		}
		var ps []adminwire.Provider
		if err := rig.admin2(e, "/admin/v1/providers", &ps); err != nil {
			t.Fatal(err)
		}
		for _, p := range ps {
			if p.InFlight != 0 || p.LongInFlight != 0 || p.Queued != 0 || p.Status != "available" || p.Circuit != "closed" {
				t.Errorf("%s after the storm: provider %s/%s in flight %d, long %d, queued %d, %s, circuit %s; want 0, 0, 0, available, closed",
					e.name, p.NodeID, p.ProviderID, p.InFlight, p.LongInFlight, p.Queued, p.Status, p.Circuit)
			}
		}
		n, err := rig.nodeConn(e)
		if err != nil {
			t.Fatal(err)
		}
		if was := conns[e.name]; n.Generation != was.Generation || !n.ConnectedSince.Equal(was.ConnectedSince) {
			t.Errorf("%s: node n1's connection is generation %d since %s, was %d since %s: the failover disturbed it",
				e.name, n.Generation, n.ConnectedSince, was.Generation, was.ConnectedSince)
		}
	}
}
