package edge

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"iop/internal/cluster"
	"iop/internal/edge/contract"
	"iop/internal/testenv/etcdtest"
	"iop/internal/wire/nodev1"
)

// clusterEdges starts n edges of one cluster on etcd, each with the test
// config and model "m", and waits until one leads, ready, and every edge
// names it at one epoch. It returns the edges and the leader's index.
func clusterEdges(t *testing.T, etcd *etcdtest.Cluster, n int) []*testEdge {
	t.Helper()
	var es []*testEdge
	for i := range n {
		cfg := testConfig()
		cfg.Cluster = &cluster.Config{Etcd: etcd.Endpoints(), Name: fmt.Sprintf("edge-%d", i+1), Advertise: freeAddr(t), SessionTTL: time.Second, ID: "test"}
		es = append(es, startEdge(t, cfg))
	}
	return es
}

// paceClock moves clk with the wall clock until the test ends (startEdge
// calls it for an edge of a cluster): the election runs on etcd's time, and the cluster side's waits (leaderWait,
// rebuildWait, its pauses) on the edge's clock must keep up with it. A
// test may still Advance clk further.
func paceClock(t *testing.T, clk *testClock) {
	done := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
				clk.Advance(10 * time.Millisecond)
			}
		}
	}()
	t.Cleanup(func() { close(done); <-stopped })
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// waitLeader waits until exactly one of the running edges es leads a
// rebuilt epoch above after and every running edge names it; it returns
// the leader's index.
func waitLeader(t *testing.T, es []*testEdge, running []bool, after int64) int {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		leader, epoch, agree := -1, int64(0), true
		for i, e := range es {
			if !running[i] {
				continue
			}
			st, _ := e.svc.Cluster()
			if epoch == 0 {
				epoch = st.Epoch
			}
			agree = agree && st.Epoch == epoch && st.Epoch > after
			if st.Leader && st.Ready {
				if leader >= 0 {
					agree = false
				}
				leader = i
			}
		}
		if agree && leader >= 0 {
			return leader
		}
		if time.Now().After(deadline) {
			t.Fatalf("no single ready leader above epoch %d within 30s", after)
		}
		select {
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// clusterNode is one node (one node id) connected to every edge, as a
// real node with `edges: [...]` is: it reports its runs in flight
// node-wide.
type clusterNode struct {
	conns []*fakeNode // by edge index; nil: not connected
	runs  map[string]*nodev1.RunInFlight
}

func (cn *clusterNode) list() []*nodev1.RunInFlight {
	var out []*nodev1.RunInFlight
	for _, r := range cn.runs {
		out = append(out, r)
	}
	return out
}

// accept takes the next Dispatch on edge i's connection, opens its run and
// records it in flight.
func (cn *clusterNode) accept(t *testing.T, i int, res <-chan dispatched) (*Run, runStream, *nodev1.Dispatch) {
	t.Helper()
	r, rs, d := cn.conns[i].acceptRun(t, res)
	cn.runs[d.GetRunId()] = &nodev1.RunInFlight{RunId: d.GetRunId(), ProviderId: d.GetProviderId(), Epoch: d.GetEpoch(), LeaseId: d.GetLeaseId(), Long: d.GetLong()}
	return r, rs, d
}

// complete ends run d on its stream rs as a node does.
func (cn *clusterNode) complete(t *testing.T, rs runStream, d *nodev1.Dispatch) {
	t.Helper()
	sendUp(t, rs, events(event(nodev1.RunEvent_TYPE_COMPLETE, "")))
	delete(cn.runs, d.GetRunId())
}

// leaderInFlight is the in-flight count of n1/p1 in the leader's scheduler.
func leaderInFlight(e *testEdge) int { return e.inFlight("n1", "p1") }

// TestClusterLeaderCountsEveryEdge: three edges, one node on each with one
// provider of capacity 2. Requests through the two followers are admitted
// at the leader and dispatched over each follower's own connection (their
// Dispatch names the leader's epoch and lease); the leader's scheduler
// counts both, so a third request, through the leader, queues until one
// of them ends (released by its follower, by lease id). The leader's own
// connection to the node going away does not release the followers'
// leases (their runs go on over the followers' connections).
func TestClusterLeaderCountsEveryEdge(t *testing.T) {
	etcd := etcdtest.Start(t)
	es := clusterEdges(t, etcd, 3)
	running := []bool{true, true, true}
	li := waitLeader(t, es, running, 0)
	leader := es[li]
	var fol []int
	for i := range es {
		if i != li {
			fol = append(fol, i)
		}
	}
	cn := &clusterNode{runs: map[string]*nodev1.RunInFlight{}}
	for _, e := range es {
		cn.conns = append(cn.conns, e.connect(t, hello("n1", prov("p1", nodev1.ExecutionPath_EXECUTION_PATH_NORMALIZED, 2, "m"))))
	}
	st, _ := leader.svc.Cluster()

	r1, rs1, d1 := cn.accept(t, fol[0], es[fol[0]].dispatchAsync(context.Background(), chatReq("m")))
	if d1.GetEpoch() != st.Epoch || d1.GetLeaseId() == 0 {
		t.Fatalf("follower's Dispatch epoch %d lease %d, want epoch %d and a lease", d1.GetEpoch(), d1.GetLeaseId(), st.Epoch)
	}
	_, _, _ = cn.accept(t, fol[1], es[fol[1]].dispatchAsync(context.Background(), chatReq("m")))
	if got := leaderInFlight(leader); got != 2 {
		t.Fatalf("leader counts %d in flight, want 2 (both followers' runs)", got)
	}
	for _, i := range fol {
		if got := es[i].inFlight("n1", "p1"); got != 0 {
			t.Fatalf("follower %d's own scheduler counts %d, want 0 (the leader admits)", i, got)
		}
	}
	third := leader.dispatchAsync(context.Background(), chatReq("m"))
	select {
	case got := <-third:
		t.Fatalf("a third request was admitted above capacity 2: %+v", got)
	case <-time.After(100 * time.Millisecond):
	}
	cn.complete(t, rs1, d1)
	if _, err := recvAll(r1); !errors.Is(err, io.EOF) {
		t.Fatalf("run 1: %v", err)
	}
	_, _, d3 := cn.accept(t, li, third)
	if d3.GetEpoch() != st.Epoch || d3.GetLeaseId() == 0 {
		t.Fatalf("leader's own Dispatch epoch %d lease %d", d3.GetEpoch(), d3.GetLeaseId())
	}
	if got := leaderInFlight(leader); got != 2 {
		t.Fatalf("leader counts %d in flight, want 2", got)
	}
	// The leader's own connection goes: its own run ends, the follower's
	// lease stays counted.
	cn.conns[li].cancel()
	waitFor(t, func() bool {
		cs, _ := leader.svc.Cluster()
		p, ok := providerOf(leader.svc.Snapshot(), "n1", "p1")
		return cs.Leases == 1 && ok && p.InFlight == 1
	})
}

// TestClusterFailoverRebuildsFromNodeReports: with runs in flight through
// both followers, the leader stops. A follower is elected at a higher
// epoch; before it admits anything it asks the node for its runs in
// flight, and counts them (adopted once each, though the node reports
// them on every connection): a new request queues at capacity. A run that
// ends is released (its follower's release of the old epoch's lease
// reaches the new leader); and no request gets a 503 but from a bounded
// wait.
func TestClusterFailoverRebuildsFromNodeReports(t *testing.T) {
	etcd := etcdtest.Start(t)
	es := clusterEdges(t, etcd, 3)
	running := []bool{true, true, true}
	li := waitLeader(t, es, running, 0)
	st, _ := es[li].svc.Cluster()
	var fol []int
	for i := range es {
		if i != li {
			fol = append(fol, i)
		}
	}
	cn := &clusterNode{runs: map[string]*nodev1.RunInFlight{}}
	for _, e := range es {
		cn.conns = append(cn.conns, e.connect(t, hello("n1", prov("p1", nodev1.ExecutionPath_EXECUTION_PATH_NORMALIZED, 2, "m"))))
	}
	r1, rs1, d1 := cn.accept(t, fol[0], es[fol[0]].dispatchAsync(context.Background(), chatReq("m")))
	_, _, _ = cn.accept(t, fol[1], es[fol[1]].dispatchAsync(context.Background(), chatReq("m")))

	// The leader stops (resigning); its connection to the node ends.
	if err := es[li].stop(); err != nil {
		t.Fatal(err)
	}
	running[li] = false
	cn.conns[li] = nil
	// The new leader asks its node connection for the runs in flight; the
	// node answers node-wide (both runs).
	answered := make(chan int, 2)
	report := cn.list()
	stopAnswer := make(chan struct{})
	var wg sync.WaitGroup
	for _, i := range fol {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			for {
				select {
				case m := <-cn.conns[i].msgs:
					if rq := m.GetRunsRequest(); rq != nil {
						_ = cn.conns[i].stream.Send(&nodev1.NodeMessage{Msg: &nodev1.NodeMessage_RunsReport{RunsReport: &nodev1.RunsReport{Epoch: rq.GetEpoch(), Runs: report}}})
						answered <- i
					}
				case <-cn.conns[i].done:
					return
				case <-stopAnswer:
					return
				}
			}
		}(i)
	}
	ni := waitLeader(t, es, running, st.Epoch)
	close(stopAnswer)
	wg.Wait()
	if got := <-answered; got != ni {
		t.Fatalf("edge %d asked for the runs, want the new leader %d", got, ni)
	}
	nl := es[ni]
	if got := leaderInFlight(nl); got != 2 {
		t.Fatalf("new leader counts %d in flight after its rebuild, want 2 (adopted once each)", got)
	}
	// The node lists the same runs again in a heartbeat: never counted twice.
	cn.conns[ni].send(t, &nodev1.NodeMessage{Msg: &nodev1.NodeMessage_Heartbeat{Heartbeat: &nodev1.Heartbeat{UnixNano: 1, Runs: report, RunsSet: true}}})
	cn.conns[ni].send(t, &nodev1.NodeMessage{Msg: &nodev1.NodeMessage_Heartbeat{Heartbeat: &nodev1.Heartbeat{UnixNano: 2, Runs: report, RunsSet: true}}})
	if cs, _ := nl.svc.Cluster(); cs.Leases != 2 || leaderInFlight(nl) != 2 {
		t.Fatalf("after heartbeats listing the same runs: leases %d in flight %d, want 2 and 2", cs.Leases, leaderInFlight(nl))
	}
	other := fol[0]
	if other == ni {
		other = fol[1]
	}
	queued := es[other].dispatchAsync(context.Background(), chatReq("m"))
	select {
	case got := <-queued:
		t.Fatalf("admitted above capacity after failover: %+v", got)
	case <-time.After(100 * time.Millisecond):
	}
	// Run 1 ends: its follower releases the old epoch's lease at the new
	// leader; the queued request gets the slot.
	cn.complete(t, rs1, d1)
	if _, err := recvAll(r1); !errors.Is(err, io.EOF) {
		t.Fatalf("run 1: %v", err)
	}
	d := cn.conns[other].nextDispatch(t)
	if d.GetEpoch() <= st.Epoch {
		t.Fatalf("dispatch after failover has epoch %d, want > %d", d.GetEpoch(), st.Epoch)
	}
}

// TestClusterNoLeaderIs503: a follower cut off from every leader answers
// ErrNoLeader within its bound, never hangs.
func TestClusterNoLeaderIs503(t *testing.T) {
	etcd := etcdtest.Start(t)
	es := clusterEdges(t, etcd, 2)
	running := []bool{true, true}
	li := waitLeader(t, es, running, 0)
	fi := 1 - li
	for _, e := range es {
		e.connect(t, hello("n1", prov("p1", nodev1.ExecutionPath_EXECUTION_PATH_NORMALIZED, 2, "m")))
	}
	// Partition: the follower's calls to the leader fail (its connection
	// to the leader's address goes to a closed port) while the leader's
	// election stands.
	blockLeader(t, es[fi])
	start := time.Now()
	_, err := es[fi].svc.Dispatch(context.Background(), chatReq("m"))
	if !errors.Is(err, ErrNoLeader) {
		t.Fatalf("Dispatch through a partitioned follower: %v, want ErrNoLeader", err)
	}
	t.Logf("partitioned follower answered ErrNoLeader after %s", time.Since(start).Round(time.Millisecond))
}

// blockLeader points e's client for its leader's address at a closed
// port, as a network partition between them would.
func blockLeader(t *testing.T, e *testEdge) {
	t.Helper()
	st, _ := e.svc.Cluster()
	cc, err := grpc.NewClient(freeAddr(t), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	gp := e.svc.cl.net.(*grpcPeers)
	gp.mu.Lock()
	if old := gp.clients[st.LeaderAddr]; old != nil {
		_ = old.Close()
	}
	gp.clients[st.LeaderAddr] = cc
	gp.mu.Unlock()
}

// TestClusterFailoverKeepsTheWaitingOrder: a follower's three requests
// wait at the leader, in order, behind a run holding the one slot. The
// leader stops; the follower submits them again to the new leader in
// their original order, so they are served r1, r2, r3 as the slot frees.
func TestClusterFailoverKeepsTheWaitingOrder(t *testing.T) {
	etcd := etcdtest.Start(t)
	es := clusterEdges(t, etcd, 3)
	running := []bool{true, true, true}
	li := waitLeader(t, es, running, 0)
	st, _ := es[li].svc.Cluster()
	var fol []int
	for i := range es {
		if i != li {
			fol = append(fol, i)
		}
	}
	cn := &clusterNode{runs: map[string]*nodev1.RunInFlight{}}
	for _, e := range es {
		cn.conns = append(cn.conns, e.connect(t, hello("n1", prov("p1", nodev1.ExecutionPath_EXECUTION_PATH_NORMALIZED, 1, "m"))))
	}
	holder, hs, hd := cn.accept(t, fol[1], es[fol[1]].dispatchAsync(context.Background(), chatReq("m")))
	a := es[fol[0]]
	var waiting []<-chan dispatched
	for i := 1; i <= 3; i++ {
		req := chatReq("m")
		req.RunID = fmt.Sprintf("r%d", i)
		waiting = append(waiting, a.dispatchAsync(context.Background(), req))
		waitFor(t, func() bool { return es[li].svc.Snapshot().Waiters == i })
	}
	report := cn.list()
	stopAnswer := make(chan struct{})
	var wg sync.WaitGroup
	for _, i := range fol {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			for {
				select {
				case m := <-cn.conns[i].msgs:
					if rq := m.GetRunsRequest(); rq != nil {
						_ = cn.conns[i].stream.Send(&nodev1.NodeMessage{Msg: &nodev1.NodeMessage_RunsReport{RunsReport: &nodev1.RunsReport{Epoch: rq.GetEpoch(), Runs: report}}})
					}
				case <-cn.conns[i].done:
					return
				case <-stopAnswer:
					return
				}
			}
		}(i)
	}
	if err := es[li].stop(); err != nil {
		t.Fatal(err)
	}
	running[li] = false
	ni := waitLeader(t, es, running, st.Epoch)
	close(stopAnswer)
	wg.Wait()
	deadline := time.Now().Add(failsafe)
	for es[ni].svc.Snapshot().Waiters != 3 {
		if time.Now().After(deadline) {
			for i, e := range es {
				cs, _ := e.svc.Cluster()
				t.Logf("edge %d: %+v waiters %d leases %d", i, cs, e.svc.Snapshot().Waiters, e.svc.Snapshot().Leases)
			}
			for i, res := range waiting {
				select {
				case got := <-res:
					t.Logf("r%d ended: %v", i+1, got.err)
				default:
					t.Logf("r%d still waiting", i+1)
				}
			}
			t.Fatalf("the new leader (edge %d) has not the 3 requests queued", ni)
		}
		runtime.Gosched()
	}
	// The slot frees: r1, then r2, then r3.
	cn.complete(t, hs, hd)
	if _, err := recvAll(holder); !errors.Is(err, io.EOF) {
		t.Fatalf("holder: %v", err)
	}
	for i, res := range waiting {
		r, rs, d := cn.accept(t, fol[0], res)
		if want := fmt.Sprintf("r%d", i+1); d.GetRunId() != want {
			t.Fatalf("served %s, want %s (the original order)", d.GetRunId(), want)
		}
		cn.complete(t, rs, d)
		if _, err := recvAll(r); !errors.Is(err, io.EOF) {
			t.Fatalf("%s: %v", d.GetRunId(), err)
		}
	}
}

// TestClusterFollowerCancelLeavesTheLeadersQueue: a follower's request
// queued at the leader leaves the leader's queue when its client leaves,
// and takes no slot afterwards.
func TestClusterFollowerCancelLeavesTheLeadersQueue(t *testing.T) {
	etcd := etcdtest.Start(t)
	es := clusterEdges(t, etcd, 2)
	li := waitLeader(t, es, []bool{true, true}, 0)
	fi := 1 - li
	cn := &clusterNode{runs: map[string]*nodev1.RunInFlight{}}
	for _, e := range es {
		cn.conns = append(cn.conns, e.connect(t, hello("n1", prov("p1", nodev1.ExecutionPath_EXECUTION_PATH_NORMALIZED, 1, "m"))))
	}
	holder, hs, hd := cn.accept(t, li, es[li].dispatchAsync(context.Background(), chatReq("m")))
	ctx, cancel := context.WithCancel(context.Background())
	res := es[fi].dispatchAsync(ctx, chatReq("m"))
	waitFor(t, func() bool { return es[li].svc.Snapshot().Waiters == 1 })
	cancel()
	if got := wait(t, res); !errors.Is(got.err, context.Canceled) {
		t.Fatalf("cancelled follower request: %v, want context.Canceled", got.err)
	}
	waitFor(t, func() bool { return es[li].svc.Snapshot().Waiters == 0 })
	cn.complete(t, hs, hd)
	if _, err := recvAll(holder); !errors.Is(err, io.EOF) {
		t.Fatalf("holder: %v", err)
	}
	waitFor(t, func() bool { return leaderInFlight(es[li]) == 0 })
	if cs, _ := es[li].svc.Cluster(); cs.Leases != 0 {
		t.Fatalf("leader holds %d leases for followers after the cancel, want 0", cs.Leases)
	}
}

// TestClusterFollowerKeepsFlowAndPriority: a follower's requests reach the
// leader's scheduler with their priority (and flow), so the leader's fair
// order and priority bands hold for every edge's clients alike. With the
// one slot taken, a sheddable request and then a critical one queue at the
// leader through a follower; when the slot frees, the critical one is
// granted first although it came second (before this, the follower sent
// neither, and both queued as standard, FIFO).
func TestClusterFollowerKeepsFlowAndPriority(t *testing.T) {
	etcd := etcdtest.Start(t)
	es := clusterEdges(t, etcd, 2)
	li := waitLeader(t, es, []bool{true, true}, 0)
	fi := 1 - li
	leader, follower := es[li], es[fi]
	cn := &clusterNode{runs: map[string]*nodev1.RunInFlight{}}
	for _, e := range es {
		cn.conns = append(cn.conns, e.connect(t, hello("n1", prov("p1", nodev1.ExecutionPath_EXECUTION_PATH_NORMALIZED, 1, "m"))))
	}
	r1, rs1, d1 := cn.accept(t, li, leader.dispatchAsync(context.Background(), chatReq("m")))

	queued := func(n int) func() bool {
		return func() bool {
			p, ok := providerOf(leader.svc.Snapshot(), "n1", "p1")
			return ok && p.Queued == n
		}
	}
	shed := chatReq("m")
	shed.Flow, shed.Priority = "batch", contract.PrioritySheddable
	shedCh := follower.dispatchAsync(context.Background(), shed)
	waitFor(t, queued(1)) // the sheddable request waits at the leader
	crit := chatReq("m")
	crit.Flow, crit.Priority = "ops", contract.PriorityCritical
	critCh := follower.dispatchAsync(context.Background(), crit)
	waitFor(t, queued(2)) // and the critical one behind it

	cn.complete(t, rs1, d1)
	if _, err := recvAll(r1); !errors.Is(err, io.EOF) {
		t.Fatalf("run 1: %v", err)
	}
	r2, rs2, d2 := cn.accept(t, fi, critCh)
	if d2.GetEpoch() == 0 || d2.GetLeaseId() == 0 {
		t.Fatalf("the critical request's Dispatch has epoch %d lease %d: not admitted at the leader", d2.GetEpoch(), d2.GetLeaseId())
	}
	select {
	case got := <-shedCh:
		t.Fatalf("the sheddable request was admitted while the critical one held the only slot: %+v", got)
	default:
	}
	cn.complete(t, rs2, d2)
	if _, err := recvAll(r2); !errors.Is(err, io.EOF) {
		t.Fatalf("run 2: %v", err)
	}
	cn.accept(t, fi, shedCh)
}
