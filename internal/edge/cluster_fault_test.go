package edge

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	"iop/internal/testenv"
	"iop/internal/testenv/etcdtest"
	"iop/internal/wire/clusterv1"
	"iop/internal/wire/nodev1"
)

// TestRegression_StaleEpochRefusalIsNoProviderFailure: a node refuses a
// Dispatch of a deposed leader's epoch (DispatchRefused.stale_epoch). A
// fault run of three edges after an etcd quorum loss saw each such
// refusal counted as a provider failure: healthy providers' circuits
// opened and followers answered 503 provider_unavailable for over 90 s.
// The refusal is no attempt and no failure: the request is admitted again
// with the same candidate and served by it, and the circuit stays closed,
// however many come.
func TestRegression_StaleEpochRefusalIsNoProviderFailure(t *testing.T) {
	cfg := testConfig()
	zero := 0
	cfg.MaxRetries = &zero
	e := startEdge(t, cfg)
	n := e.connect(t, hello("n1", prov("p1", normalized, 1, "m1")))
	for i := range 5 { // above the breaker's 3 failures in a row
		res := e.dispatchAsync(context.Background(), chatReq("m1"))
		d := n.nextDispatch(t)
		n.send(t, &nodev1.NodeMessage{Msg: &nodev1.NodeMessage_DispatchRefused{DispatchRefused: &nodev1.DispatchRefused{
			RunId: d.GetRunId(), Reason: "stale epoch: dispatch of epoch 5, the leader's is 7", StaleEpoch: 7}}})
		// Admitted again at once, to the same provider (the only one).
		r, rs, d2 := n.acceptRun(t, res)
		if d2.GetProviderId() != "p1" || d2.GetRunId() == d.GetRunId() {
			t.Fatalf("refusal %d: admitted again as %q on %q, want a new run on p1", i, d2.GetRunId(), d2.GetProviderId())
		}
		sendUp(t, rs, events(event(nodev1.RunEvent_TYPE_COMPLETE, "")))
		if _, err := recvAll(r); !errors.Is(err, io.EOF) {
			t.Fatalf("refusal %d: run after admitting again: %v", i, err)
		}
	}
	p, ok := providerOf(e.svc.Snapshot(), "n1", "p1")
	if !ok || p.Circuit != "closed" || p.Status != "available" {
		t.Fatalf("provider after 5 stale-epoch refusals: %+v, want available, circuit closed", p)
	}
}

// clusterPair starts a cluster of two edges with node n1 (provider p1 of
// capacity 1, model "m") connected to both; it returns the edges, the
// leader's and the follower's index, and the node's connections by edge.
func clusterPair(t *testing.T) (es []*testEdge, li, fi int, cn *clusterNode) {
	t.Helper()
	es, li, fi, cn, _ = clusterPairOn(t)
	return es, li, fi, cn
}

// clusterPairOn is clusterPair, also returning its etcd cluster.
func clusterPairOn(t *testing.T) (es []*testEdge, li, fi int, cn *clusterNode, etcd *etcdtest.Cluster) {
	t.Helper()
	etcd = etcdtest.Start(t)
	es = clusterEdges(t, etcd, 2)
	li = waitLeader(t, es, []bool{true, true}, 0)
	fi = 1 - li
	cn = &clusterNode{runs: map[string]*nodev1.RunInFlight{}}
	for _, e := range es {
		cn.conns = append(cn.conns, e.connect(t, hello("n1", prov("p1", normalized, 1, "m"))))
	}
	return es, li, fi, cn, etcd
}

// TestRegression_QuorumLossAnswersNoLeader: a follower's request waits at
// the leader when etcd loses its quorum. The leader steps down once its
// last renewal is a session TTL old and refuses the waiter (not_leader);
// the follower, whose view of the election cannot move without etcd,
// keeps finding the deposed edge, which keeps refusing. A fault run saw
// no_leader come up to 8.5 s after such a request arrived; the first
// version of the bound counted each refusal as a sign of a live leader
// and never answered. The request gets ErrNoLeader, within leaderWait of
// the last answer of the leader it waited at.
func TestRegression_QuorumLossAnswersNoLeader(t *testing.T) {
	es, li, fi, cn, etcd := clusterPairOn(t)
	leader, fol := es[li], es[fi]
	cn.accept(t, li, leader.dispatchAsync(context.Background(), chatReq("m")))
	queued := fol.dispatchAsync(context.Background(), chatReq("m"))
	waitCond(t, "the follower's request to wait at the leader", func() bool { return leader.svc.Snapshot().Waiters == 1 })
	etcd.Kill(0)
	etcd.Kill(1)
	defer etcd.Restart(1)
	defer etcd.Restart(0)
	got := wait(t, queued)
	if !errors.Is(got.err, ErrNoLeader) {
		t.Fatalf("request waiting at the leader when etcd lost its quorum: %v, want ErrNoLeader", got.err)
	}
	if cs, _ := leader.svc.Cluster(); cs.Leader || cs.Leases != 0 {
		t.Fatalf("the leader without etcd: %+v, want stepped down with no lease of other edges", cs)
	}
}

// heartbeat sends the node's heartbeat listing runs to edge i.
func (cn *clusterNode) heartbeat(t *testing.T, i int) {
	t.Helper()
	cn.conns[i].send(t, &nodev1.NodeMessage{Msg: &nodev1.NodeMessage_Heartbeat{Heartbeat: &nodev1.Heartbeat{UnixNano: time.Now().UnixNano(), Runs: cn.list(), RunsSet: true}}})
}

// waitCond waits until cond holds, polling.
func waitCond(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testenv.Eventually(t, what, cond)
}

// TestRegression_NodeReportReleasesPhantomLease: a follower's run ends on
// the node but the follower's Release never reaches the leader (it was
// cut off; after a failover it went to a leader that never held the
// lease). A fault run saw such leases stay at the leader for good
// ("leases: 6, runs: 0"): nothing was admitted again until every edge
// restarted. The node's next heartbeat that does not list the run,
// reconcileGrace after the grant, releases it at the leader, once: the
// follower's late Release frees nothing more.
func TestRegression_NodeReportReleasesPhantomLease(t *testing.T) {
	es, li, fi, cn := clusterPair(t)
	leader, fol := es[li], es[fi]
	r, rs, d := cn.accept(t, fi, fol.dispatchAsync(context.Background(), chatReq("m")))
	if cs, _ := leader.svc.Cluster(); cs.Leases != 1 || leaderInFlight(leader) != 1 {
		t.Fatalf("leader after the follower's grant: leases %d, in flight %d, want 1 and 1", cs.Leases, leaderInFlight(leader))
	}
	// The follower is cut off from the leader: its Release cannot land.
	blockLeader(t, fol)
	cn.complete(t, rs, d)
	if _, err := recvAll(r); !errors.Is(err, io.EOF) {
		t.Fatalf("run: %v", err)
	}
	// A heartbeat within the grace keeps the lease (a reserved lease is
	// in no report yet).
	cn.heartbeat(t, li)
	if cs, _ := leader.svc.Cluster(); cs.Leases != 1 {
		t.Fatalf("leader after a heartbeat within the grace: leases %d, want 1", cs.Leases)
	}
	leader.clk.Advance(leader.svc.cl.unlistedGrace() + time.Millisecond)
	cn.heartbeat(t, li)
	waitCond(t, "the node's report to release the phantom lease", func() bool {
		cs, _ := leader.svc.Cluster()
		return cs.Leases == 0 && leaderInFlight(leader) == 0
	})
	// The follower's Release arrives late: a no-op.
	rep, err := (&admissionServer{cm: leader.svc.cl}).Release(context.Background(), &clusterv1.ReleaseRequest{Epoch: d.GetEpoch(), LeaseId: d.GetLeaseId(), Reason: "late", Edge: "edge-x"})
	if err != nil || rep.GetReleased() {
		t.Fatalf("late Release after the reconciled release: %v released=%v, want a no-op", err, rep.GetReleased())
	}
	if got := leaderInFlight(leader); got != 0 {
		t.Fatalf("leader in flight after the late Release: %d, want 0", got)
	}
	// The slot is the leader's to give again.
	cn.accept(t, li, leader.dispatchAsync(context.Background(), chatReq("m")))
}

// TestRegression_DeposedLeaderDropsLeasesAndWaiters: the leader holds a
// lease for a follower's run and a follower's request waits in its queue
// when it learns of a newer epoch (here from a node's refusal). A fault
// run saw a deposed leader keep the leases it held for other edges (and
// carry them into its next leadership) and keep followers' waiters queued
// until their 30 s timeout. It stops at once: the waiter is refused
// not_leader (the follower re-submits it to the next leader, no error to
// its client) and every lease held for another edge is released.
func TestRegression_DeposedLeaderDropsLeasesAndWaiters(t *testing.T) {
	es, li, fi, cn := clusterPair(t)
	leader, fol := es[li], es[fi]
	st, _ := leader.svc.Cluster()
	cn.accept(t, fi, fol.dispatchAsync(context.Background(), chatReq("m")))
	queued := fol.dispatchAsync(context.Background(), chatReq("m"))
	waitCond(t, "the follower's second request to wait at the leader", func() bool { return leader.svc.Snapshot().Waiters == 1 })
	// A node names a newer epoch: the leader steps down at once.
	leader.svc.cl.sawEpoch(st.Epoch + 1000)
	waitCond(t, "the deposed leader to drop its leases and waiters", func() bool {
		cs, _ := leader.svc.Cluster()
		return !cs.Leader && cs.Leases == 0 && leaderInFlight(leader) == 0
	})
	if w := leader.svc.Snapshot().Waiters; w != 0 {
		t.Fatalf("deposed leader still queues %d requests", w)
	}
	// The follower's request was not failed: it waits for (or reached)
	// the next leader.
	select {
	case got := <-queued:
		if got.err != nil {
			t.Fatalf("follower's waiting request after the deposition: %v, want it re-submitted", got.err)
		}
		got.run.Close("test")
	case <-time.After(200 * time.Millisecond):
	}
}

// TestRegression_SilentLeaderReleasesTheFollowersWaiters: a follower's
// request waits at the leader, then the link to the leader stalls (a
// frozen leader process looks the same from the follower). A fault run
// saw every follower's admissions stay ordered behind gRPC streams to a
// frozen leader far past failover (grpc-go raises an edge's 2 s keepalive
// to 10 s). Silent on the Follow session for followDeadAfter on the
// follower's clock, the leader is judged dead: the Admit stream is
// cancelled, the request waits for the next leader and, none coming,
// answers ErrNoLeader; when the link flows again, admission resumes.
func TestRegression_SilentLeaderReleasesTheFollowersWaiters(t *testing.T) {
	es, li, fi, cn := clusterPair(t)
	leader, fol := es[li], es[fi]
	px := routeThroughProxy(t, fol)
	cn.accept(t, li, leader.dispatchAsync(context.Background(), chatReq("m")))
	queued := fol.dispatchAsync(context.Background(), chatReq("m"))
	waitCond(t, "the follower's request to wait at the leader", func() bool { return leader.svc.Snapshot().Waiters == 1 })
	px.freeze()
	// The follower's clock moves; the leader says nothing through the
	// stalled link, on any Follow session the follower opens.
	waitCond(t, "the follower to judge the leader dead", func() bool {
		fol.clk.Advance(fol.svc.cl.followDeadAfter())
		st, _ := fol.svc.Cluster()
		return fol.svc.cl.isDead(st.Epoch)
	})
	got := wait(t, queued)
	if !errors.Is(got.err, ErrNoLeader) {
		t.Fatalf("request behind a silent leader: %v, want ErrNoLeader", got.err)
	}
	px.thaw()
	// The stalled bytes flow: the leader sees the cancel and drops the
	// waiter; the follower hears it again and admits through it.
	waitCond(t, "the leader's queue to lose the follower's waiter", func() bool { return leader.svc.Snapshot().Waiters == 0 })
	res := fol.dispatchAsync(context.Background(), chatReq("m"))
	waitCond(t, "the follower's next request to wait at the leader", func() bool { return leader.svc.Snapshot().Waiters == 1 })
	_ = res
}

// stallProxy forwards TCP connections to target; freeze holds every byte
// in both directions until thaw, as a frozen process or a stalled link.
type stallProxy struct {
	lis    net.Listener
	target string
	mu     sync.Mutex
	gate   chan struct{} // closed while the proxy flows
}

func newStallProxy(t *testing.T, target string) *stallProxy {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &stallProxy{lis: lis, target: target, gate: make(chan struct{})}
	close(p.gate)
	t.Cleanup(func() { lis.Close(); p.thaw() })
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			go p.pipe(c, u)
			go p.pipe(u, c)
		}
	}()
	return p
}

func (p *stallProxy) pipe(dst, src net.Conn) {
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			gate := p.gate
			p.mu.Unlock()
			<-gate
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *stallProxy) freeze() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.gate:
		p.gate = make(chan struct{})
	default:
	}
}

func (p *stallProxy) thaw() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.gate:
	default:
		close(p.gate)
	}
}

// routeThroughProxy sends e's calls to its leader through a stallProxy
// and waits until its Follow session is open through it.
func routeThroughProxy(t *testing.T, e *testEdge) *stallProxy {
	t.Helper()
	st, _ := e.svc.Cluster()
	px := newStallProxy(t, st.LeaderAddr)
	// The edge's own dial options: its deployment id and token go on every call.
	cc, err := grpc.NewClient(px.lis.Addr().String(), e.svc.cl.peers.dialOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	gp := e.svc.cl.net.(*grpcPeers)
	gp.mu.Lock()
	old := gp.clients[st.LeaderAddr]
	gp.clients[st.LeaderAddr] = cc
	gp.mu.Unlock()
	if old != nil {
		_ = old.Close() // ends the Follow session; followLoop opens the next through the proxy
	}
	return px
}
