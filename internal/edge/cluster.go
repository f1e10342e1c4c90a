package edge

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"

	"iop/internal/clock"
	"iop/internal/cluster"
	"iop/internal/edge/contract"
	"iop/internal/scheduler"
	"iop/internal/wire/clusterv1"
	"iop/internal/wire/nodev1"
)

// Several edges, one elected scheduler (Config.Cluster; package cluster).
//
// Every edge serves clients and relays their runs over its own node
// connections; the elected leader alone admits. The leader's own requests
// admit in its scheduler as a single edge's do. A follower's go to the
// leader's Admission service (clusterAdmit): the leader runs the same
// resolver on its own registry, with the follower's needs and excluded
// (node, provider) pairs, and answers with a lease stamped with its epoch;
// the follower dispatches over its own connection to the chosen node (one
// it lacks: it releases and admits again excluding that node, as for a
// stale generation).
//
// Who releases a lease (the leader's scheduler counts them all), each
// exactly once, whichever comes first:
//   - a leader's own lease: its run, as on a single edge (a fence of its
//     connection ends the run and the lease);
//   - a follower's lease: the follower, by lease id, when its run ends
//     (Release, idempotent; retried until a ready leader takes it). The
//     leader's fence of its OWN connection to that node never releases it
//     (scheduler.Lease.KeepOnFence): the run goes on over the follower's
//     connection;
//   - the nodes, which are the truth: every heartbeat of a node reconciles
//     the leader's leases on it (reconcile): one held for another edge's
//     run, or adopted, that the node does not list is released once it is
//     unlistedGrace old;
//   - the end of the leadership (endTerm): a deposed leader refuses its
//     waiting admissions (not_leader) and drops every lease it held for
//     other edges' runs;
//   - a new leader adopts every run the nodes report in flight from older
//     epochs (scheduler.Adopt), before it admits anything, and releases each
//     at the follower's Release of its (epoch, lease id) or when the node's
//     reports no longer list the run. A run is adopted once, by (node, run
//     id), whatever the number of edges the node reports it to.
//
// A leader leads while the elector says so and its session lease cannot
// have expired (cluster.Elector.Leads): a leader frozen past its session
// TTL grants nothing when it wakes. A follower judges its leader dead
// when it is silent on the Follow session for followDeadAfter: its Admit
// calls to it are cancelled and its requests wait for the next leader,
// in their order (awaitTurn).
//
// While no leader is known (or the leader cannot be reached, or is
// rebuilding), a follower's request waits at most leaderWait, then fails
// with contract.ErrNoLeader (503 with Retry-After).

// leaderWait bounds how long a request waits for a reachable, ready leader.
const leaderWait = 5 * time.Second

// rebuildWait bounds how long a new leader waits for the nodes' reports of
// their runs in flight before it admits.
const rebuildWait = 3 * time.Second

// Refused codes of the Admission service (clusterv1.Refused.code).
const (
	refusedNotLeader = "not_leader"
	refusedStale     = "stale_epoch"
	refusedLimited   = "limited"
)

type leaseKey struct {
	epoch int64
	id    uint64
}

// heldLease is a lease the leader's scheduler holds for another edge's run
// (or an adopted run of an older epoch).
type heldLease struct {
	key   leaseKey
	l     *scheduler.Lease
	edge  string // the follower that owns its release; "" adopted
	node  string
	runID string
	// since is when it was granted or adopted: from since +
	// reconcileGrace, a node report that does not list its run releases it.
	since time.Time

	keyTaken   bool   // adoptKey took (or is taking) its key's slot
	keyRelease func() // gives that slot back (cluster_keys.go)
}

// leadTerm is one leadership of this edge (one epoch): ctx ends the
// instant the edge stops leading it, which withdraws every admission
// waiting in its scheduler.
type leadTerm struct {
	epoch  int64
	ctx    context.Context
	cancel context.CancelFunc
}

// leaderLife is what a follower knows of one leader (one epoch) it calls:
// ctx ends when it is judged dead (silent on the Follow session for
// followDeadAfter) or superseded by a newer epoch, which cancels every
// Admit call to it; heard is when it last answered.
type leaderLife struct {
	ctx    context.Context
	cancel context.CancelFunc
	heard  time.Time
	dead   bool
}

// elector is the election as the cluster side sees it: *cluster.Elector
// on etcd, or a test's simulated election. Its changes are events
// (Changes is closed at each); Leads is the only reading that depends on
// time (a lapsed session leads no more).
type elector interface {
	State() cluster.State
	Leads() int64
	Depose(epoch int64, addr string)
	Changes() <-chan struct{}
	Campaigners(ctx context.Context) ([]string, error)
	// NameInUseBy is the advertise address of another edge with this
	// edge's cluster name ("": none).
	NameInUseBy() string
	Close() error
}

// peerNet is how a follower reaches the leader's Admission service by its
// advertise address: gRPC between edges (grpcPeers), or a test's
// simulated network.
type peerNet interface {
	client(addr string) (clusterv1.AdmissionClient, error)
	// close ends every connection it made.
	close()
}

var (
	_ elector = (*cluster.Elector)(nil)
	_ peerNet = (*grpcPeers)(nil)
)

// clusterMode is an edge's cluster side; nil without Config.Cluster.
type clusterMode struct {
	s     *Service
	cfg   cluster.Config
	el    elector
	net   peerNet
	clk   clock.Clock // every wait and timer of the cluster side
	name  string
	peers *peerAuth // identity, token and TLS between edges (cluster_auth.go); nil on a simulated network
	keys  clusterKeys
	quota clusterQuota // quota reservations at the leader (cluster_quota.go)
	born  time.Time    // when this edge started (its nodes connect from then on)

	ready   atomic.Int64 // the epoch whose rebuild is done (this edge leads it)
	session atomic.Int64 // the epoch of this follower's open admission session (0: none)

	// mu guards the fields below; a leaf: nothing is called while it is
	// held (the scheduler, Service.mu and the network are called without).
	mu        sync.Mutex
	term      *leadTerm // the leadership held now (nil: none)
	lives     map[int64]*leaderLife
	leases    leaseTable
	followed  map[string]int64 // follower advertise → the epoch it opened a session to
	joined    chan struct{}    // closed and replaced when a follower opens a session
	reports   map[int64]chan reportOf
	permitSeq uint64
	permits   map[uint64]func()

	// keyAdmit, when set (the HTTP layer's keys), takes one request slot
	// of the named key for a follower (AdmitKey).
	keyAdmit atomic.Pointer[func(name string) (func(), error)]

	// The follower's waiting admissions, by arrival (resubmit order).
	qmu      sync.Mutex
	qseq     uint64
	tickets  map[uint64]*admitTicket
	qchanged chan struct{} // closed and replaced at every change of tickets

	stop    chan struct{} // closed by close
	stopCtx context.Context
	stopNow context.CancelFunc
	wg      sync.WaitGroup
}

type reportOf struct {
	node string
	runs []*nodev1.RunInFlight
}

func newClusterMode(s *Service, cfg cluster.Config) (*clusterMode, error) {
	peers, err := newPeerAuth(cfg, s.log)
	if err != nil {
		return nil, err
	}
	el, err := cluster.Start(cfg, s.log)
	if err != nil {
		return nil, err
	}
	return startClusterMode(s, cfg, el, newGRPCPeers(peers), peers), nil
}

// startClusterMode starts the cluster side of s on the election el and
// the network pn, with s's clock.
func startClusterMode(s *Service, cfg cluster.Config, el elector, pn peerNet, peers *peerAuth) *clusterMode {
	cfg.SetDefaults()
	cm := &clusterMode{
		s: s, cfg: cfg, el: el, net: pn, clk: s.clock, name: cfg.Name, peers: peers, born: s.clock.Now(),
		leases:   newLeaseTable(),
		lives:    make(map[int64]*leaderLife),
		followed: make(map[string]int64),
		joined:   make(chan struct{}),
		tickets:  make(map[uint64]*admitTicket),
		qchanged: make(chan struct{}),
		reports:  make(map[int64]chan reportOf),
		permits:  make(map[uint64]func()),
		stop:     make(chan struct{}),
	}
	cm.quota.deps = s.quotaDeps
	cm.stopCtx, cm.stopNow = context.WithCancel(context.Background())
	cm.wg.Add(2)
	go cm.leadLoop()
	go cm.followLoop()
	return cm
}

// close stops the election (resigning when leading) and the loops.
func (cm *clusterMode) close() {
	select {
	case <-cm.stop:
		return
	default:
	}
	close(cm.stop)
	cm.stopNow()
	_ = cm.el.Close()
	cm.wg.Wait()
	cm.net.close()
}

// leadsReady returns the epoch this edge leads and has rebuilt (0: it does
// not lead, its session may have lapsed, or it is still rebuilding).
func (cm *clusterMode) leadsReady() int64 {
	if e := cm.el.Leads(); e != 0 && cm.ready.Load() == e {
		return e
	}
	return 0
}

// readyTerm is the leadership this edge holds and has rebuilt, or nil.
func (cm *clusterMode) readyTerm() *leadTerm {
	e := cm.leadsReady()
	cm.mu.Lock()
	defer cm.mu.Unlock()
	if t := cm.term; t != nil && t.epoch == e && e != 0 {
		return t
	}
	return nil
}

// leadLoop starts a term and rebuilds the lease table each time this edge
// is elected, and ends the term the instant it stops leading.
func (cm *clusterMode) leadLoop() {
	defer cm.wg.Done()
	defer cm.endTerm("the cluster side stopped")
	var led int64
	for {
		ch := cm.el.Changes()
		st := cm.el.State()
		if st.Leader && st.Epoch != led {
			cm.endTerm("a newer epoch")
			led = st.Epoch
			cm.electedKeys()
			cm.quotaElected(led)
			ctx, cancel := context.WithCancel(cm.stopCtx)
			t := &leadTerm{epoch: led, ctx: ctx, cancel: cancel}
			cm.mu.Lock()
			cm.term = t
			cm.mu.Unlock()
			cm.rebuild(st.Epoch)
			cm.quotaReady(t)
			cm.ready.Store(st.Epoch)
			cm.s.log.Info("cluster leader ready", "edge", cm.name, "epoch", st.Epoch)
			cm.s.reg.notify()
			cm.notifyWaiters()
		} else if !st.Leader && led != 0 {
			led = 0
			cm.ready.Store(0)
			cm.endTerm("deposed")
		}
		select {
		case <-cm.stop:
			return
		case <-ch:
		}
	}
}

// endTerm ends this edge's leadership: every admission waiting in its
// scheduler for another edge is refused (not_leader: the follower submits
// it to the next leader), and every lease held for another edge's run, or
// adopted, is released, once: the next leader counts those runs from the
// nodes' reports, and none of them stays here as a phantom should this
// edge lead again. Its own runs keep their leases.
func (cm *clusterMode) endTerm(reason string) {
	cm.mu.Lock()
	t := cm.term
	cm.term = nil
	hs := cm.leases.drain()
	cm.mu.Unlock()
	if t == nil {
		return
	}
	t.cancel()
	for _, h := range hs {
		cm.releaseKeySlot(h)
		h.l.Release(reason)
	}
	cm.s.log.Warn("cluster leadership ended: leases of other edges dropped", "edge", cm.name, "epoch", t.epoch, "reason", reason, "leases", len(hs))
}

// hold records h, a lease of term t for another edge's run (or adopted),
// unless t ended meanwhile: then the caller releases it.
func (cm *clusterMode) hold(t *leadTerm, h *heldLease) bool {
	cm.mu.Lock()
	defer cm.mu.Unlock()
	if cm.term != t || t.ctx.Err() != nil {
		return false
	}
	return cm.leases.add(h)
}

// term returns the leadership of epoch this edge holds (ready or not), or nil.
func (cm *clusterMode) termOf(epoch int64) *leadTerm {
	cm.mu.Lock()
	defer cm.mu.Unlock()
	if t := cm.term; t != nil && t.epoch == epoch {
		return t
	}
	return nil
}

// rebuild asks every connected node for its runs in flight and adopts each
// run of an older epoch not yet counted, before this leader admits.
func (cm *clusterMode) rebuild(epoch int64) {
	ch := make(chan reportOf, 64)
	cm.mu.Lock()
	cm.reports[epoch] = ch
	cm.mu.Unlock()
	defer func() {
		cm.mu.Lock()
		delete(cm.reports, epoch)
		cm.mu.Unlock()
	}()
	want := map[string]bool{}
	for node, cs := range cm.s.reg.load().nodes.all() {
		if cs.c.enqueue(&nodev1.EdgeMessage{Msg: &nodev1.EdgeMessage_RunsRequest{RunsRequest: &nodev1.RunsRequest{Epoch: epoch}}}) {
			want[node] = true
		}
	}
	timeout, stopTimeout := cm.after(rebuildWait)
	defer stopTimeout()
	// Every other edge campaigning now relays runs too: wait for its
	// session (which lists them) as well.
	var others []string
	gctx, gcancel := cm.withTimeout(cm.stopCtx, rebuildWait)
	if all, err := cm.el.Campaigners(gctx); err == nil {
		for _, a := range all {
			if a != cm.cfg.Advertise {
				others = append(others, a)
			}
		}
	}
	gcancel()
	adopted := 0
	for {
		cm.mu.Lock()
		joined := cm.joined
		missing := 0
		for _, a := range others {
			if cm.followed[a] != epoch {
				missing++
			}
		}
		cm.mu.Unlock()
		if len(want) == 0 && missing == 0 {
			break
		}
		select {
		case rep := <-ch:
			if !want[rep.node] {
				continue
			}
			delete(want, rep.node)
			for _, ri := range rep.runs {
				if cm.adoptRun(epoch, rep.node, ri.GetProviderId(), ri.GetRunId(), ri.GetEpoch(), ri.GetLeaseId(), ri.GetLong(), "") {
					adopted++
				}
				cm.adoptKey(epoch, rep.node, ri)
			}
		case <-joined:
		case <-timeout:
			cm.s.log.Warn("cluster rebuild: not every node and edge reported its runs in time", "edge", cm.name, "epoch", epoch, "nodes", len(want), "edges", missing)
			goto done
		case <-cm.stop:
			return
		}
	}
done:
	cm.s.log.Info("cluster rebuild done", "edge", cm.name, "epoch", epoch, "adopted", adopted)
}

// adoptRun counts one run in flight admitted at epoch oepoch (lease
// leaseID) on node's provider, when this leader (of epoch) has not counted
// it yet: its own epoch's runs and runs outside a cluster (oepoch 0) are
// counted already; a run is counted once by (node, run id) and by (epoch,
// lease). owner is the edge that relays it ("": known from the nodes'
// reports only). It reports whether it adopted the run.
func (cm *clusterMode) adoptRun(epoch int64, node, provider, runID string, oepoch int64, leaseID uint64, long bool, owner string) bool {
	if oepoch == 0 || oepoch >= epoch {
		return false
	}
	t := cm.termOf(epoch)
	if t == nil {
		return false
	}
	k := leaseKey{oepoch, leaseID}
	cm.mu.Lock()
	if h := cm.leases.get(k); h != nil {
		if owner != "" && h.edge == "" {
			h.edge = owner
		}
		cm.mu.Unlock()
		return false
	}
	known := cm.leases.knowsRun(node, runID)
	cm.mu.Unlock()
	// No lock of the edge is held while it calls the scheduler.
	if known || cm.s.ownsLocalLease(runID) {
		return false
	}
	l, err := cm.s.sched.Adopt(node, provider, "", "", long, "")
	if err != nil {
		return false
	}
	h := &heldLease{key: k, l: l, edge: owner, node: node, runID: runID, since: cm.clk.Now()}
	if !cm.hold(t, h) {
		// Counted by another report meanwhile, or the term ended: once only.
		l.Release("counted already")
		return false
	}
	return true
}

// ownsLocalLease reports whether runID is a run of this edge holding a
// lease of its own scheduler (counted there already).
func (s *Service) ownsLocalLease(runID string) bool {
	r := s.run(runID)
	return r != nil && r.grant.local()
}

// reconcileGrace is the time for a follower's Dispatch to reach the node
// once the follower has its grant (a reserved lease not yet dispatched is
// in no report); unlistedGrace adds the time the grant may take to arrive.
const reconcileGrace = 2 * time.Second

// unlistedGrace is how long a lease granted for another edge's run (or
// adopted) may go unlisted by its node's reports before they release it:
// followDeadAfter, for a follower uses a grant only while its leader is
// not judged dead (a grant held up in a stalled link longer than that is
// dropped, never dispatched), plus reconcileGrace. Shorter, and a grant
// that arrived late would run on a slot the leader gave away.
func (cm *clusterMode) unlistedGrace() time.Duration { return cm.followDeadAfter() + reconcileGrace }

// nodeReport handles a node's report of its runs in flight: the answer to
// a rebuild's RunsRequest, or a heartbeat's list. At the ready leader, a
// heartbeat reconciles the lease table with the node, which is the truth:
// its runs of older epochs not counted yet are adopted, and every lease
// held on that node for another edge's run (or adopted) whose run the
// report does not list is released once it is unlistedGrace old,
// whether or not its edge still holds a session: a run that ended
// without its Release reaching this leader leaves no phantom lease. A
// late Release of the same lease is a no-op (dropHeld: exactly once).
func (cm *clusterMode) nodeReport(c *conn, epoch int64, runs []*nodev1.RunInFlight, isAnswer bool) {
	if isAnswer {
		cm.mu.Lock()
		ch := cm.reports[epoch]
		cm.mu.Unlock()
		if ch != nil {
			select {
			case ch <- reportOf{node: c.nodeID, runs: runs}:
			default:
			}
		}
		return
	}
	epoch = cm.leadsReady()
	if epoch == 0 {
		return
	}
	cm.reconcile(epoch, c.nodeID, runs)
}

// reconcile is nodeReport's work at the leader of epoch for node's runs.
func (cm *clusterMode) reconcile(epoch int64, node string, runs []*nodev1.RunInFlight) {
	// A node that connected after the rebuild, or a run its reply missed.
	for _, ri := range runs {
		cm.adoptRun(epoch, node, ri.GetProviderId(), ri.GetRunId(), ri.GetEpoch(), ri.GetLeaseId(), ri.GetLong(), "")
		cm.adoptKey(epoch, node, ri)
	}
	listed := make(map[string]bool, len(runs))
	for _, ri := range runs {
		listed[ri.GetRunId()] = true
	}
	before := cm.clk.Now().Add(-cm.unlistedGrace())
	cm.mu.Lock()
	gone := cm.leases.stale(node, listed, before)
	cm.mu.Unlock()
	for _, h := range gone {
		if cm.dropHeld(h, "run no longer in flight on its node") {
			cm.s.log.Info("cluster: released a lease no node runs", "edge", cm.name, "node", h.node, "run", h.runID, "epoch", h.key.epoch, "lease", h.key.id, "owner", h.edge)
		}
	}
}

// dropHeld forgets and releases h (once).
func (cm *clusterMode) dropHeld(h *heldLease, reason string) bool {
	cm.mu.Lock()
	removed := cm.leases.remove(h)
	cm.mu.Unlock()
	if !removed {
		return false
	}
	cm.releaseKeySlot(h)
	return h.l.Release(reason)
}

// ---- the leader's Admission service ----

// admissionServer serves clusterv1.Admission for the other edges.
type admissionServer struct {
	clusterv1.UnimplementedAdmissionServer
	cm *clusterMode
}

// check refuses a call when this edge does not lead a rebuilt epoch, or
// the caller has seen a higher one (this edge was deposed: it steps down).
func (a *admissionServer) check(epoch int64) (*leadTerm, *clusterv1.Refused) {
	return a.checkLeader(epoch, true)
}

// checkLeader is check; with ready false, a leader still rebuilding
// passes too (a follower's session is part of the rebuild).
func (a *admissionServer) checkLeader(epoch int64, ready bool) (*leadTerm, *clusterv1.Refused) {
	cm := a.cm
	var t *leadTerm
	if ready {
		t = cm.readyTerm()
	} else if e := cm.el.Leads(); e != 0 {
		t = cm.termOf(e)
	}
	switch {
	case t != nil && epoch > t.epoch:
		cm.el.Depose(epoch, "")
		return nil, &clusterv1.Refused{Code: refusedStale, Message: fmt.Sprintf("epoch %d is older than %d", t.epoch, epoch), Epoch: t.epoch}
	case t == nil:
		return nil, cm.notLeader()
	}
	return t, nil
}

// notLeader is the refusal of a call to an edge that does not lead (a
// ready epoch): it names the current leader when this edge knows it.
func (cm *clusterMode) notLeader() *clusterv1.Refused {
	r := &clusterv1.Refused{Code: refusedNotLeader, Message: "this edge is not the ready scheduler leader"}
	if st := cm.el.State(); !st.Leader {
		r.Epoch, r.Leader = st.Epoch, st.LeaderAddr
	}
	return r
}

// Admit admits a follower's request in this leader's scheduler (the same
// resolver, flow, priority and prefix affinity as a local request): it
// sends Queued when the request waits, then Granted (epoch, lease id,
// node, provider, served model) or Refused (the scheduler's error as a
// code). When this edge stops leading meanwhile it answers Refused
// not_leader at once (naming the new leader when known), and never
// grants: the follower submits the request to the next leader. It ends
// with codes.Unavailable when this edge stops; the follower cancelling
// the stream withdraws the waiter.
func (a *admissionServer) Admit(req *clusterv1.AdmitRequest, stream grpc.ServerStreamingServer[clusterv1.AdmitReply]) error {
	cm, s := a.cm, a.cm.s
	t, ref := a.check(req.GetEpoch())
	if ref != nil {
		return stream.Send(&clusterv1.AdmitReply{Msg: &clusterv1.AdmitReply_Refused{Refused: ref}})
	}
	epoch := t.epoch
	tried := make([]triedCandidate, 0, len(req.GetExcluded()))
	for _, x := range req.GetExcluded() {
		tried = append(tried, tried1(scheduler.Candidate{NodeID: x.GetNodeId(), ProviderID: x.GetProviderId()}, false))
	}
	model := req.GetModel()
	long := s.cfg.LongContextTokens > 0 && int(req.GetEstimatedInputTokens()) >= s.cfg.LongContextTokens
	route := s.routeOfBlocks(model, req.GetPromptBlocks()) // before Admit: it takes the prefix index's lock
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	defer context.AfterFunc(t.ctx, cancel)()
	lease, err := s.sched.Admit(ctx, scheduler.Request{
		Group:                model,
		Long:                 long,
		EstimatedInputTokens: int(req.GetEstimatedInputTokens()),
		Resolve:              s.resolver(model, req.GetNeeds(), tried),
		Prefer:               scheduler.ProviderRef{NodeID: req.GetPrefer().GetNodeId(), ProviderID: req.GetPrefer().GetProviderId()},
		Flow:                 req.GetFlow(),
		Weight:               min(max(int(req.GetWeight()), 0), scheduler.MaxWeight),
		Priority:             scheduler.Priority(min(max(int(req.GetPriority()), contract.PriorityBatch), contract.PriorityCritical)),
		Affinity:             route.affinity(),
		AffinitySlack:        route.slack,
		OnQueued: func() {
			_ = stream.Send(&clusterv1.AdmitReply{Msg: &clusterv1.AdmitReply_Queued{Queued: &clusterv1.Queued{}}})
		},
	})
	if err != nil {
		if stream.Context().Err() != nil {
			return stream.Context().Err()
		}
		// A leader that stops (its own node connections end first) does
		// not answer for the next one: the follower submits the request
		// again to it.
		select {
		case <-s.shutdown:
			return status.Error(codes.Unavailable, "the scheduler leader is stopping")
		default:
		}
		if t.ctx.Err() != nil || cm.el.Leads() != epoch {
			return stream.Send(&clusterv1.AdmitReply{Msg: &clusterv1.AdmitReply_Refused{Refused: cm.notLeader()}})
		}
		return stream.Send(&clusterv1.AdmitReply{Msg: &clusterv1.AdmitReply_Refused{Refused: &clusterv1.Refused{Code: admissionCode(err), Message: err.Error(), Epoch: epoch}}})
	}
	lease.KeepOnFence()
	lease.Track(req.GetRunId())
	if route.blocks != nil {
		cand := lease.Candidate()
		s.prefix.record(cand.Target, scheduler.ProviderRef{NodeID: cand.NodeID, ProviderID: cand.ProviderID}, route.blocks)
	}
	li := lease.Info()
	h := &heldLease{key: leaseKey{epoch, lease.ID()}, l: lease, edge: req.GetEdge(), node: li.NodeID, runID: req.GetRunId(), since: cm.clk.Now()}
	if cm.el.Leads() != epoch || !cm.hold(t, h) {
		// Deposed between the grant and now: never a grant of an old epoch.
		lease.Release("deposed")
		return stream.Send(&clusterv1.AdmitReply{Msg: &clusterv1.AdmitReply_Refused{Refused: cm.notLeader()}})
	}
	err = stream.Send(&clusterv1.AdmitReply{Msg: &clusterv1.AdmitReply_Granted{Granted: &clusterv1.Granted{
		Epoch: epoch, LeaseId: lease.ID(), NodeId: li.NodeID, ProviderId: li.ProviderID, Target: li.Target,
		Long: li.Long, QueueReason: string(li.QueueReason), WaitNs: int64(li.Wait),
	}}})
	if err != nil {
		cm.dropHeld(h, "follower gone")
	}
	return err
}

// Release gives back the lease (epoch, lease id) a follower held, once:
// an unknown or already released lease is a no-op (the reply's Released
// false). errNotLeaderRPC when this edge is not the ready leader.
func (a *admissionServer) Release(_ context.Context, req *clusterv1.ReleaseRequest) (*clusterv1.ReleaseReply, error) {
	cm := a.cm
	if cm.readyTerm() == nil {
		return &clusterv1.ReleaseReply{}, errNotLeaderRPC
	}
	cm.mu.Lock()
	h := cm.leases.get(leaseKey{req.GetEpoch(), req.GetLeaseId()})
	cm.mu.Unlock()
	if h == nil {
		return &clusterv1.ReleaseReply{}, nil
	}
	return &clusterv1.ReleaseReply{Released: cm.dropHeld(h, req.GetReason())}, nil
}

var errNotLeaderRPC = errors.New("not the scheduler leader")

// AdmitKey takes one request slot of the named key (max_concurrent and
// requests_per_minute, counted here for every edge): a permit id, or
// Refused with the limit, its maximum and Retry-After.
func (a *admissionServer) AdmitKey(_ context.Context, req *clusterv1.AdmitKeyRequest) (*clusterv1.AdmitKeyReply, error) {
	cm := a.cm
	t, ref := a.check(req.GetEpoch())
	if ref != nil {
		return &clusterv1.AdmitKeyReply{Refused: ref}, nil
	}
	epoch := t.epoch
	f := cm.keyAdmit.Load()
	if f == nil {
		return &clusterv1.AdmitKeyReply{Refused: &clusterv1.Refused{Code: refusedNotLeader, Message: "the leader knows no keys", Epoch: epoch}}, nil
	}
	release, err := (*f)(req.GetKey())
	if err != nil {
		r := &clusterv1.Refused{Code: refusedLimited, Message: err.Error(), Epoch: epoch}
		var le interface {
			LimitDetails() (string, int, time.Duration)
		}
		if errors.As(err, &le) {
			r.Limit, r.Max, r.RetryAfterNs = limitFields(le.LimitDetails())
		}
		return &clusterv1.AdmitKeyReply{Refused: r}, nil
	}
	cm.mu.Lock()
	cm.permitSeq++
	id := cm.permitSeq
	cm.permits[id] = release
	cm.mu.Unlock()
	return &clusterv1.AdmitKeyReply{PermitId: id}, nil
}

func limitFields(limit string, max int, after time.Duration) (string, int32, int64) {
	return limit, int32(max), int64(after)
}

// ReleaseKey gives back a permit of AdmitKey, once; an unknown id is a
// no-op.
func (a *admissionServer) ReleaseKey(_ context.Context, req *clusterv1.ReleaseKeyRequest) (*clusterv1.ReleaseKeyReply, error) {
	cm := a.cm
	cm.mu.Lock()
	release := cm.permits[req.GetPermitId()]
	delete(cm.permits, req.GetPermitId())
	cm.mu.Unlock()
	if release != nil {
		release()
	}
	return &clusterv1.ReleaseKeyReply{}, nil
}

// Follow is a follower's admission session: the runs it relays (adopted
// when this leader has not counted them) and its presence for a new
// leader's rebuild; this leader answers at once and then every
// followBeat, so the follower knows within its session TTL when this
// leader is dead or frozen. It ends when this edge stops leading the
// epoch.
func (a *admissionServer) Follow(req *clusterv1.FollowRequest, stream grpc.ServerStreamingServer[clusterv1.FollowReply]) error {
	cm := a.cm
	t, ref := a.checkLeader(req.GetEpoch(), false)
	if ref != nil {
		return fmt.Errorf("%s: %s", ref.GetCode(), ref.GetMessage())
	}
	epoch := t.epoch
	edge := req.GetEdge()
	defer cm.followSession(edge, req.GetQuotas())()
	for _, hr := range req.GetRuns() {
		cm.adoptRun(epoch, hr.GetNodeId(), hr.GetProviderId(), hr.GetRunId(), hr.GetEpoch(), hr.GetLeaseId(), hr.GetLong(), edge)
	}
	cm.mu.Lock()
	if a := req.GetAdvertise(); a != "" {
		cm.followed[a] = epoch
	}
	close(cm.joined)
	cm.joined = make(chan struct{})
	cm.mu.Unlock()
	if err := stream.Send(&clusterv1.FollowReply{Epoch: epoch}); err != nil {
		return err
	}
	for {
		beat, stopBeat := cm.after(cm.followBeat())
		select {
		case <-stream.Context().Done():
			stopBeat()
			return nil
		case <-t.ctx.Done():
			stopBeat()
			return status.Error(codes.Unavailable, "no longer the leader of this epoch")
		case <-beat:
			if cm.el.Leads() != epoch {
				return status.Error(codes.Unavailable, "no longer the leader of this epoch")
			}
			if err := stream.Send(&clusterv1.FollowReply{Epoch: epoch}); err != nil {
				return nil
			}
		}
	}
}

// followBeat is how often a leader answers on a Follow session: a third
// of its session TTL, at most a second.
func (cm *clusterMode) followBeat() time.Duration { return min(time.Second, cm.cfg.SessionTTL/3) }

// followDeadAfter is how long a follower waits for its leader's answer on
// the Follow session before it judges the leader dead or frozen: the
// session TTL (etcd elects the next leader about as soon), at least 1.5 s.
func (cm *clusterMode) followDeadAfter() time.Duration {
	return max(cm.cfg.SessionTTL, 1500*time.Millisecond)
}

// admissionCode is err's Refused code.
func admissionCode(err error) string {
	switch {
	case errors.Is(err, scheduler.ErrUnknownModel):
		return "unknown_model"
	case errors.Is(err, scheduler.ErrCandidatesRejected):
		return "candidates_rejected"
	case errors.Is(err, scheduler.ErrQueueFull):
		return "queue_full"
	case errors.Is(err, scheduler.ErrQueueTimeout):
		return "queue_timeout"
	case errors.Is(err, scheduler.ErrProviderUnavailable):
		return "provider_unavailable"
	case errors.Is(err, scheduler.ErrNoProvider):
		return "no_provider"
	}
	return "invalid"
}

// withUnmatched adds to a leader's unknown-model refusal of model, when
// this edge's catalog also finds model an alias every target of which is
// unmatched (same config, same nodes), the *contract.UnmatchedAliasError
// naming them, which the refusal's code alone cannot carry.
func (cm *clusterMode) withUnmatched(err error, model string) error {
	if !errors.Is(err, scheduler.ErrUnknownModel) {
		return err
	}
	targets, alias := cm.s.cat.targets(model)
	if !alias {
		return err
	}
	if un := unmatched(cm.s.reg.load(), targets); len(un) == len(targets) {
		return fmt.Errorf("%w: %w", err, &contract.UnmatchedAliasError{Alias: model, Targets: slices.Clone(targets)})
	}
	return err
}

// refusedError is the error a follower returns for r.
func refusedError(r *clusterv1.Refused) error {
	var base error
	switch r.GetCode() {
	case "unknown_model":
		base = scheduler.ErrUnknownModel
	case "candidates_rejected":
		base = scheduler.ErrCandidatesRejected
	case "queue_full":
		base = scheduler.ErrQueueFull
	case "queue_timeout":
		base = scheduler.ErrQueueTimeout
	case "provider_unavailable":
		base = scheduler.ErrProviderUnavailable
	case "no_provider":
		base = scheduler.ErrNoProvider
	default:
		base = contract.ErrNoLeader
	}
	// The leader's text already names its cause ("queue full: ...").
	return fmt.Errorf("%w (leader: %s)", base, r.GetMessage())
}

// serveAdmission serves the Admission service on lis until ctx ends.
func (cm *clusterMode) serveAdmission(ctx context.Context, lis net.Listener) error {
	gs := grpc.NewServer(append([]grpc.ServerOption{
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: time.Second, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 2 * time.Second, Timeout: 2 * time.Second}),
	}, cm.peers.serverOptions()...)...)
	clusterv1.RegisterAdmissionServer(gs, &admissionServer{cm: cm})
	errc := make(chan error, 1)
	go func() { errc <- gs.Serve(lis) }()
	select {
	case <-ctx.Done():
		gs.Stop()
		<-errc
		return nil
	case err := <-errc:
		return err
	}
}

// ---- the follower side ----

// client returns the Admission client of the leader at addr.
func (cm *clusterMode) client(addr string) (clusterv1.AdmissionClient, error) {
	return cm.net.client(addr)
}

// grpcPeers is the gRPC network between edges: one client connection per
// leader address, with the cluster's identity, token and TLS.
type grpcPeers struct {
	peers *peerAuth

	mu      sync.Mutex                  // guards clients
	clients map[string]*grpc.ClientConn // leader address → connection
}

func newGRPCPeers(peers *peerAuth) *grpcPeers {
	return &grpcPeers{peers: peers, clients: make(map[string]*grpc.ClientConn)}
}

func (g *grpcPeers) client(addr string) (clusterv1.AdmissionClient, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if cc := g.clients[addr]; cc != nil {
		return clusterv1.NewAdmissionClient(cc), nil
	}
	cc, err := grpc.NewClient(addr, append(g.peers.dialOptions(),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 2 * time.Second, Timeout: 2 * time.Second, PermitWithoutStream: true}),
	)...)
	if err != nil {
		return nil, err
	}
	g.clients[addr] = cc
	return clusterv1.NewAdmissionClient(cc), nil
}

func (g *grpcPeers) close() {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, cc := range g.clients {
		_ = cc.Close()
	}
	clear(g.clients)
}

// followLoop keeps this edge's admission session (Follow) open to the
// current leader while it follows, and forgets the leaders older than it.
func (cm *clusterMode) followLoop() {
	defer cm.wg.Done()
	for {
		ch := cm.el.Changes()
		st := cm.el.State()
		cm.supersede(st.Epoch)
		if !st.Leader && st.LeaderAddr != "" {
			cm.keys.sawLeader.Store(st.LeaderAddr != cm.cfg.Advertise || cm.keys.sawLeader.Load())
			cm.followOnce(st)
		}
		poll, stopPoll := cm.after(200 * time.Millisecond)
		select {
		case <-cm.stop:
		case <-ch:
		case <-poll:
		}
		stopPoll()
		select {
		case <-cm.stop:
			return
		default:
		}
	}
}

// followOnce holds one Follow session to the leader of st until it ends,
// the election changes, or the leader stays silent for followDeadAfter:
// then it judges that leader dead (judgeDead), which cancels every Admit
// call to it. Any answer of the leader revives it.
func (cm *clusterMode) followOnce(st cluster.State) {
	cli, err := cm.client(st.LeaderAddr)
	if err != nil {
		return
	}
	ctx, cancel := context.WithCancel(cm.stopCtx)
	defer cancel()
	stream, err := cli.Follow(ctx, &clusterv1.FollowRequest{Epoch: st.Epoch, Edge: cm.name, Advertise: cm.cfg.Advertise, Runs: cm.s.heldRuns(), Quotas: cm.heldQuotas()})
	if err != nil {
		return
	}
	defer cm.session.Store(0)
	replies := make(chan struct{}, 1)
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		for {
			if _, err := stream.Recv(); err != nil {
				return
			}
			select {
			case replies <- struct{}{}:
			default:
			}
		}
	}()
	defer func() { cancel(); <-ended }()
	for {
		changes := cm.el.Changes()
		if cm.el.State().Epoch != st.Epoch {
			return
		}
		silent, stopSilent := cm.after(cm.followDeadAfter())
		select {
		case <-replies:
			stopSilent()
			cm.heard(st.Epoch)
			cm.session.Store(st.Epoch)
		case <-silent:
			cm.judgeDead(st.Epoch, st.LeaderAddr)
			return
		case <-ended:
			stopSilent()
			return
		case <-changes:
			stopSilent()
		case <-cm.stop:
			stopSilent()
			return
		}
	}
}

// clockAfter returns a channel closed after d on clk, and the stop of its
// timer.
func clockAfter(clk clock.Clock, d time.Duration) (<-chan struct{}, func() bool) {
	ch := make(chan struct{})
	t := clk.AfterFunc(d, func() { close(ch) })
	return ch, t.Stop
}

// after is clockAfter on the cluster clock.
func (cm *clusterMode) after(d time.Duration) (<-chan struct{}, func() bool) {
	return clockAfter(cm.clk, d)
}

// errClusterTimeout is the cause of a context of withTimeout that timed out.
var errClusterTimeout = fmt.Errorf("cluster call: %w", context.DeadlineExceeded)

// withTimeout is context.WithTimeout on the cluster clock (cause
// errClusterTimeout).
func (cm *clusterMode) withTimeout(parent context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(parent)
	t := cm.clk.AfterFunc(d, func() { cancel(errClusterTimeout) })
	return ctx, func() {
		t.Stop()
		cancel(context.Canceled)
	}
}

// lifeLocked is the follower's view of the leader of epoch (made on first
// use, heard now). cm.mu is held.
func (cm *clusterMode) lifeLocked(epoch int64) *leaderLife {
	l := cm.lives[epoch]
	if l == nil {
		ctx, cancel := context.WithCancel(cm.stopCtx)
		l = &leaderLife{ctx: ctx, cancel: cancel, heard: cm.clk.Now()}
		cm.lives[epoch] = l
	}
	return l
}

// leaderCtx returns a context that ends when the leader of epoch is judged
// dead or superseded, and whether it is judged dead now.
func (cm *clusterMode) leaderCtx(epoch int64) (context.Context, bool) {
	cm.mu.Lock()
	defer cm.mu.Unlock()
	l := cm.lifeLocked(epoch)
	return l.ctx, l.dead
}

// isDead reports whether the leader of epoch is judged dead.
func (cm *clusterMode) isDead(epoch int64) bool {
	cm.mu.Lock()
	defer cm.mu.Unlock()
	l := cm.lives[epoch]
	return l != nil && l.dead
}

// lastHeard is when the leader of epoch last answered (or was first
// called); zero when never called.
func (cm *clusterMode) lastHeard(epoch int64) time.Time {
	cm.mu.Lock()
	defer cm.mu.Unlock()
	if l := cm.lives[epoch]; l != nil {
		return l.heard
	}
	return time.Time{}
}

// heard records an answer of the leader of epoch: alive (again).
func (cm *clusterMode) heard(epoch int64) {
	cm.mu.Lock()
	l := cm.lifeLocked(epoch)
	l.heard = cm.clk.Now()
	revived := l.dead
	if revived {
		l.dead = false
		l.ctx, l.cancel = context.WithCancel(cm.stopCtx)
	}
	cm.mu.Unlock()
	if revived {
		cm.s.log.Info("cluster leader answers again", "edge", cm.name, "epoch", epoch)
		cm.notifyWaiters()
	}
}

// judgeDead marks the leader of epoch dead: every Admit call to it is
// cancelled and its requests wait for the next leader (waitLeader).
func (cm *clusterMode) judgeDead(epoch int64, addr string) {
	cm.mu.Lock()
	l := cm.lifeLocked(epoch)
	was := l.dead
	l.dead = true
	cancel := l.cancel
	cm.mu.Unlock()
	cancel()
	if !was {
		cm.s.log.Warn("cluster leader silent: judged dead; its admissions wait for the next leader", "edge", cm.name, "epoch", epoch, "leader_addr", addr, "silent_for", cm.followDeadAfter())
		cm.notifyWaiters()
	}
}

// supersede forgets every leader older than epoch, cancelling the Admit
// calls still open to them.
func (cm *clusterMode) supersede(epoch int64) {
	cm.mu.Lock()
	var cancels []context.CancelFunc
	for e, l := range cm.lives {
		if e < epoch {
			cancels = append(cancels, l.cancel)
			delete(cm.lives, e)
		}
	}
	cm.mu.Unlock()
	for _, c := range cancels {
		c()
	}
}

// notifyWaiters wakes the admissions waiting for a leader (waitLeader).
func (cm *clusterMode) notifyWaiters() {
	cm.qmu.Lock()
	close(cm.qchanged)
	cm.qchanged = make(chan struct{})
	cm.qmu.Unlock()
}

// sawEpoch handles a node's refusal naming epoch as the highest it has
// seen: this edge learns that a leader of epoch exists (stepping down if
// it leads an older one).
func (cm *clusterMode) sawEpoch(epoch int64) {
	cm.el.Depose(epoch, "")
}

// heldRuns lists the runs this edge relays now that a leader admitted
// (several edges), for a new leader's rebuild.
func (s *Service) heldRuns() []*clusterv1.HeldRun {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*clusterv1.HeldRun, 0, len(s.runs))
	for _, r := range s.runs {
		if r.epoch == 0 {
			continue
		}
		out = append(out, &clusterv1.HeldRun{NodeId: r.info.NodeID, RunId: r.info.RunID, ProviderId: r.info.ProviderID, Epoch: r.epoch, LeaseId: r.leaseID, Long: r.long})
	}
	return out
}

// remoteLease is a lease the leader holds for one of this follower's runs.
type remoteLease struct {
	cm    *clusterMode
	key   leaseKey
	cand  scheduler.Candidate // Generation: this edge's connection to the node
	inf   scheduler.DispatchInfo
	freed atomic.Bool
}

func (rl *remoteLease) candidate() scheduler.Candidate { return rl.cand }
func (rl *remoteLease) info() scheduler.DispatchInfo   { return rl.inf }
func (rl *remoteLease) track(string)                   {} // the leader tracked it at the grant
func (rl *remoteLease) release(reason EndReason) bool  { return rl.Release(string(reason)) }
func (rl *remoteLease) stamp() (int64, uint64)         { return rl.key.epoch, rl.key.id }
func (rl *remoteLease) local() bool                    { return false }

// Release gives the lease back at the leader, once; it returns at once
// (the call goes on in the background, retried until a ready leader took
// it: the one of its epoch releases it, a newer one releases it if it
// adopted the run and ignores it otherwise). The nodes' reports release it
// at the leader anyway once its run is gone (reconcile); whichever comes
// first frees the slot, the other is a no-op.
func (rl *remoteLease) Release(reason string) bool {
	if rl.freed.Swap(true) {
		return false
	}
	cm := rl.cm
	req := &clusterv1.ReleaseRequest{Epoch: rl.key.epoch, LeaseId: rl.key.id, Reason: reason, Edge: cm.name}
	cm.untilLeaderTakes(func() error {
		if cm.el.Leads() == 0 {
			return errNotLeaderRPC // elected, its term not begun: wait for it
		}
		// Elected meanwhile: release it here (a no-op when it led no term
		// that counted it).
		(&admissionServer{cm: cm}).Release(context.Background(), req) //nolint:errcheck
		return nil
	}, func(ctx context.Context, cli clusterv1.AdmissionClient) error {
		_, err := cli.Release(ctx, req)
		return err
	})
	return true
}

// untilLeaderTakes hands one message to the scheduler leader of the
// moment on a goroutine of cm.wg, retried (50 ms backoff doubling to 1 s)
// until a call returns nil or the edge stops: local when this edge leads,
// remote (2 s a try) on the leader's client otherwise; nothing while no
// leader is known.
func (cm *clusterMode) untilLeaderTakes(local func() error, remote func(context.Context, clusterv1.AdmissionClient) error) {
	cm.wg.Add(1)
	go func() {
		defer cm.wg.Done()
		backoff := 50 * time.Millisecond
		for {
			st := cm.el.State()
			switch {
			case st.Epoch == 0:
			case st.Leader:
				if local() == nil {
					return
				}
			case st.LeaderAddr != "":
				if cli, err := cm.client(st.LeaderAddr); err == nil {
					ctx, cancel := cm.withTimeout(cm.stopCtx, 2*time.Second)
					err = remote(ctx, cli)
					cancel()
					if err == nil {
						return
					}
				}
			}
			wait, stopWait := cm.after(backoff)
			select {
			case <-cm.stop:
				stopWait()
				return
			case <-wait:
			}
			backoff = min(2*backoff, time.Second)
		}
	}()
}

// waitLeader waits (until deadline) for a leader this edge can call: a
// ready term of its own, or another edge's address whose leader is not
// judged dead. It returns the state, or ErrNoLeader.
func (cm *clusterMode) waitLeader(ctx context.Context, deadline time.Time) (cluster.State, error) {
	for {
		ch := cm.el.Changes()
		cm.qmu.Lock()
		woken := cm.qchanged
		cm.qmu.Unlock()
		st := cm.el.State()
		switch {
		case st.Leader && cm.leadsReady() == st.Epoch:
			return st, nil
		case !st.Leader && st.Epoch != 0 && st.LeaderAddr != "" && !cm.isDead(st.Epoch):
			return st, nil
		}
		d := deadline.Sub(cm.clk.Now())
		if d <= 0 {
			return st, fmt.Errorf("%w: none reachable within %s", contract.ErrNoLeader, leaderWait)
		}
		// The election's changes and the follower's own (a leader judged
		// dead or alive again, a term ready) are events; the poll catches
		// what is not (a session lease renewed again).
		timeout, stop := cm.after(min(d, 100*time.Millisecond))
		select {
		case <-ctx.Done():
			stop()
			return st, context.Cause(ctx)
		case <-cm.stop:
			stop()
			return st, fmt.Errorf("%w: the cluster side stopped", ErrShuttingDown)
		case <-ch:
		case <-woken:
		case <-timeout:
		}
		stop()
	}
}

// admitTicket is one of the follower's admissions; epoch is that of the leader
// that queued it (0: not queued yet).
type admitTicket struct {
	seq   uint64
	epoch int64
}

func (cm *clusterMode) newTicket() *admitTicket {
	cm.qmu.Lock()
	defer cm.qmu.Unlock()
	cm.qseq++
	tk := &admitTicket{seq: cm.qseq}
	cm.tickets[tk.seq] = tk
	return tk
}

// setTicket records that the leader of epoch queued tk (0: tk is done).
func (cm *clusterMode) setTicket(tk *admitTicket, epoch int64, done bool) {
	cm.qmu.Lock()
	if done {
		delete(cm.tickets, tk.seq)
	} else {
		tk.epoch = epoch
	}
	close(cm.qchanged)
	cm.qchanged = make(chan struct{})
	cm.qmu.Unlock()
}

// awaitTurn waits until no earlier admission that an older leader had
// queued still waits to be submitted to the leader of epoch: so the
// follower's waiting requests reach a new leader in their original order,
// and a new request never passes them. In steady state (every queued
// admission queued at the current epoch) it returns at once.
func (cm *clusterMode) awaitTurn(ctx context.Context, tk *admitTicket, epoch int64) {
	// No deadline of its own: each earlier admission is re-queued, ends,
	// or fails within its own bound (leaderWait after the loss), so this
	// wait is bounded by theirs.
	for {
		cm.qmu.Lock()
		ch, blocked := cm.qchanged, false
		for seq, o := range cm.tickets {
			if seq < tk.seq && o.epoch != 0 && o.epoch < epoch {
				blocked = true
				break
			}
		}
		cm.qmu.Unlock()
		if !blocked {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-cm.stop:
			return
		case <-ch:
		}
	}
}

// admit admits req at the leader (clusterMode is the admission of several
// edges): in this edge's own scheduler while it leads a ready term (the
// waiter is withdrawn the instant the term ends, and the request goes on
// to the next leader), else at the leader's Admission service, with its
// flow, weight, priority and prompt blocks. A follower's grant names this
// edge's connection generation of the chosen node (0 when it has none:
// the caller releases and admits again excluding it).
//
// Bounds: a request that finds no leader it can call, or no answer from
// one, fails with contract.ErrNoLeader leaderWait after the later of its
// arrival and the last answer of the leader it was waiting at; requests
// that waited at a lost leader are submitted to the next in their order.
// Its arrival is its first wait for a leader: the request's
// contract.LeaderBound, shared with its key's admission (AdmitKey) and
// every admission of the request again.
func (cm *clusterMode) admit(ctx context.Context, req contract.Request, tried []triedCandidate, route prefixRoute, onQueued func()) (grant, error) {
	deadline := contract.LeaderBoundOf(ctx).Deadline(cm.clk.Now(), leaderWait)
	tk := cm.newTicket()
	defer cm.setTicket(tk, 0, true)
	for {
		st, err := cm.waitLeader(ctx, deadline)
		if err != nil {
			return nil, err
		}
		cm.awaitTurn(ctx, tk, st.Epoch)
		var g grant
		var retry, queued bool
		if st.Leader {
			g, retry, err = cm.admitHere(ctx, st.Epoch, req, tried, route, onQueued, tk)
		} else {
			g, retry, queued, err = cm.admitAt(ctx, st, req, tried, route.blocks, onQueued, tk, deadline)
		}
		if !retry {
			return g, err
		}
		if ctx.Err() != nil {
			return nil, context.Cause(ctx)
		}
		if queued {
			// It waited at that leader, which is lost: the bound on
			// waiting for the next runs from its last answer.
			if h := cm.lastHeard(st.Epoch); !h.IsZero() {
				deadline = maxTime(deadline, h.Add(leaderWait))
			}
		}
		if cm.clk.Now().After(deadline) {
			return nil, fmt.Errorf("%w: the leader at %s cannot be reached: %v", contract.ErrNoLeader, st.LeaderAddr, err)
		}
		pause, stop := cm.after(50 * time.Millisecond)
		select {
		case <-ctx.Done():
			stop()
			return nil, context.Cause(ctx)
		case <-cm.stop:
			stop()
			return nil, fmt.Errorf("%w: the cluster side stopped", ErrShuttingDown)
		case <-cm.el.Changes():
		case <-pause:
		}
		stop()
	}
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// admitHere admits req in this edge's own scheduler under its ready term
// of epoch; retry says the term ended first (the request goes on to the
// next leader).
func (cm *clusterMode) admitHere(ctx context.Context, epoch int64, req contract.Request, tried []triedCandidate, route prefixRoute, onQueued func(), tk *admitTicket) (grant, bool, error) {
	t := cm.readyTerm()
	if t == nil || t.epoch != epoch {
		return nil, true, errors.New("not the ready leader")
	}
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(t.ctx, cancel)()
	l, err := cm.s.admitLocal(lctx, req, tried, route, func() {
		cm.setTicket(tk, epoch, false)
		onQueued()
	})
	if t.ctx.Err() != nil && ctx.Err() == nil {
		if l != nil {
			l.Release("deposed")
		}
		return nil, true, errors.New("deposed while the request waited")
	}
	if err != nil {
		return nil, false, err
	}
	return localGrant{l: l, epoch: epoch}, false, nil
}

// admitAt makes one Admit call to the leader of st; retry says the call
// did not reach a ready leader (it may be tried again), queued that the
// leader queued the request in this call. The call ends when the leader
// is judged dead or superseded (leaderCtx), and when no first answer came
// by deadline.
func (cm *clusterMode) admitAt(ctx context.Context, st cluster.State, req contract.Request, tried []triedCandidate, blocks []uint64, onQueued func(), tk *admitTicket, deadline time.Time) (g grant, retry, queued bool, err error) {
	lctx, dead := cm.leaderCtx(st.Epoch)
	if dead {
		return nil, true, false, errLeaderSilent
	}
	cli, err := cm.client(st.LeaderAddr)
	if err != nil {
		return nil, true, false, err
	}
	ar := &clusterv1.AdmitRequest{
		Epoch:                st.Epoch,
		Edge:                 cm.name,
		Model:                req.Model,
		Needs:                needsOf(req),
		EstimatedInputTokens: int32(req.EstimatedInputTokens),
		RunId:                req.RunID,
		Flow:                 req.Flow,
		Weight:               int32(req.Weight),
		Priority:             int32(req.Priority),
		PromptBlocks:         blocks,
	}
	if req.PreferNodeID != "" || req.PreferProviderID != "" {
		ar.Prefer = &clusterv1.ProviderRef{NodeId: req.PreferNodeID, ProviderId: req.PreferProviderID}
	}
	for _, t := range tried {
		ar.Excluded = append(ar.Excluded, &clusterv1.ProviderRef{NodeId: t.NodeID, ProviderId: t.ProviderID})
	}
	// The leader must be connected at once and answer by deadline (Queued
	// when the request waits); a queued request then waits on the stream
	// as long as its queue says, or until the leader is judged dead.
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(cm.stopCtx, cancel)()
	defer context.AfterFunc(lctx, cancel)()
	// A request whose bound passed before this call (its body took that
	// long to arrive, it waited for a node, an earlier admission of it
	// waited) gives the leader it hears followDeadAfter to answer: it
	// would be judged dead by then.
	first := deadline.Sub(cm.clk.Now())
	if first <= 0 {
		first = cm.followDeadAfter()
	}
	firstBy := cm.clk.AfterFunc(first, cancel)
	defer firstBy.Stop()
	stream, err := cli.Admit(cctx, ar, grpc.WaitForReady(false))
	if err != nil {
		return nil, true, false, err
	}
	for {
		m, err := stream.Recv()
		if err != nil {
			if ctx.Err() != nil {
				return nil, false, queued, context.Cause(ctx)
			}
			if lctx.Err() != nil {
				return nil, true, queued, errLeaderSilent
			}
			return nil, true, queued, err
		}
		firstBy.Stop()
		switch msg := m.GetMsg().(type) {
		case *clusterv1.AdmitReply_Queued:
			// A leader that queues leads: alive (a refusal says nothing).
			cm.heard(st.Epoch)
			queued = true
			cm.setTicket(tk, st.Epoch, false)
			onQueued()
		case *clusterv1.AdmitReply_Refused:
			switch msg.Refused.GetCode() {
			case refusedNotLeader, refusedStale:
				if r := msg.Refused; r.GetEpoch() > st.Epoch {
					cm.el.Depose(r.GetEpoch(), r.GetLeader())
				}
				return nil, true, queued, refusedError(msg.Refused)
			}
			return nil, false, queued, cm.withUnmatched(refusedError(msg.Refused), req.Model)
		case *clusterv1.AdmitReply_Granted:
			g := msg.Granted
			if lctx.Err() != nil {
				// Judged dead before the grant was read: the leader may
				// have released it already (unlistedGrace). Never used.
				(&remoteLease{cm: cm, key: leaseKey{g.GetEpoch(), g.GetLeaseId()}}).Release("leader judged dead")
				return nil, true, queued, errLeaderSilent
			}
			rl := &remoteLease{cm: cm, key: leaseKey{g.GetEpoch(), g.GetLeaseId()}}
			rl.cand = scheduler.Candidate{NodeID: g.GetNodeId(), ProviderID: g.GetProviderId(), Target: g.GetTarget()}
			if c := cm.s.reg.current(g.GetNodeId()); c != nil {
				rl.cand.Generation = c.gen
			}
			rl.inf = scheduler.DispatchInfo{
				RunID: req.RunID, NodeID: g.GetNodeId(), Generation: rl.cand.Generation, ProviderID: g.GetProviderId(),
				Target: g.GetTarget(), Group: req.Model, Long: g.GetLong(), EstimatedInputTokens: req.EstimatedInputTokens,
				QueueReason: scheduler.QueueReason(g.GetQueueReason()), Wait: time.Duration(g.GetWaitNs()),
			}
			if ctx.Err() != nil {
				rl.Release("client gone")
				return nil, false, queued, context.Cause(ctx)
			}
			return rl, false, queued, nil
		}
	}
}

// errLeaderSilent: the leader called was judged dead (silent on the
// Follow session), superseded, or did not answer in time.
var errLeaderSilent = errors.New("the leader is silent")

// SetKeyAdmitter gives the leader the way to take a key's request slot
// for a follower (the HTTP layer's keys, by key name); without it a
// follower's AdmitKey is refused. Safe to call at any time; a no-op
// without a cluster.
func (s *Service) SetKeyAdmitter(f func(name string) (release func(), err error)) {
	s.adm.setKeyAdmitter(f)
}

func (cm *clusterMode) setKeyAdmitter(f func(name string) (release func(), err error)) {
	cm.keyAdmit.Store(&f)
}

// AdmitKey takes one request slot of the named key at the scheduler
// leader (several edges: a key's limits are counted once, at the leader).
// local says this edge leads or has no cluster: the caller takes the slot
// itself. Else the slot is the leader's and release gives it back.
// Errors: the key's limit error from the leader (an error whose
// LimitDetails say which), contract.ErrNoLeader when no leader answers in
// time: leaderWait from the first wait of the request's
// contract.LeaderBound (which its admission shares).
func (s *Service) AdmitKey(ctx context.Context, name string) (local bool, release func(), err error) {
	return s.adm.admitKey(ctx, name)
}

// admitKey is Service.AdmitKey of several edges.
func (cm *clusterMode) admitKey(ctx context.Context, name string) (local bool, release func(), err error) {
	deadline := contract.LeaderBoundOf(ctx).Deadline(cm.clk.Now(), leaderWait)
	for {
		st, err := cm.waitLeader(ctx, deadline)
		if err != nil {
			return false, nil, err
		}
		if st.Leader {
			return true, nil, nil
		}
		cli, err := cm.client(st.LeaderAddr)
		if err == nil {
			cctx, cancel := cm.withTimeout(ctx, min(deadline.Sub(cm.clk.Now()), 2*time.Second))
			var rep *clusterv1.AdmitKeyReply
			rep, err = cli.AdmitKey(cctx, &clusterv1.AdmitKeyRequest{Epoch: st.Epoch, Edge: cm.name, Key: name})
			cancel()
			if err == nil {
				if r := rep.GetRefused(); r != nil {
					if r.GetCode() == refusedLimited {
						return false, nil, &KeyLimitError{Limit: r.GetLimit(), Max: int(r.GetMax()), RetryAfter: time.Duration(r.GetRetryAfterNs()), msg: r.GetMessage()}
					}
				} else {
					id, addr := rep.GetPermitId(), st.LeaderAddr
					var once sync.Once
					return false, func() {
						once.Do(func() { cm.releaseKey(addr, st.Epoch, id) })
					}, nil
				}
			}
		}
		if ctx.Err() != nil {
			return false, nil, context.Cause(ctx)
		}
		if cm.clk.Now().After(deadline) {
			return false, nil, fmt.Errorf("%w: the leader at %s cannot be reached", contract.ErrNoLeader, st.LeaderAddr)
		}
		pause, stop := cm.after(50 * time.Millisecond)
		select {
		case <-ctx.Done():
		case <-cm.stop:
			stop()
			return false, nil, fmt.Errorf("%w: the cluster side stopped", ErrShuttingDown)
		case <-cm.el.Changes():
		case <-pause:
		}
		stop()
	}
}

// releaseKey gives a key's slot back at the leader that granted it, in the
// background (a few tries: a leader that is gone took the count with it).
func (cm *clusterMode) releaseKey(addr string, epoch int64, id uint64) {
	cm.wg.Add(1)
	go func() {
		defer cm.wg.Done()
		for range 5 {
			cli, err := cm.client(addr)
			if err == nil {
				ctx, cancel := cm.withTimeout(cm.stopCtx, 2*time.Second)
				_, err = cli.ReleaseKey(ctx, &clusterv1.ReleaseKeyRequest{Epoch: epoch, PermitId: id})
				cancel()
				if err == nil {
					return
				}
			}
			pause, stop := cm.after(200 * time.Millisecond)
			select {
			case <-cm.stop:
				stop()
				return
			case <-pause:
			}
		}
	}()
}

// KeyLimitError is a key over one of its limits, as the leader said.
type KeyLimitError struct {
	Limit      string // "max_concurrent" or "requests_per_minute"
	Max        int
	RetryAfter time.Duration
	msg        string
}

func (e *KeyLimitError) Error() string { return e.msg }

// ClusterState is what an edge knows of its cluster (for the admin
// snapshot): zero without Config.Cluster.
type ClusterState struct {
	Name       string `json:"name"`
	Leader     bool   `json:"leader"`
	Ready      bool   `json:"ready"`
	Epoch      int64  `json:"epoch"`
	LeaderAddr string `json:"leader_addr"`
	// Leases are the leases this leader holds for other edges' runs
	// (and adopted runs of older epochs).
	Leases int `json:"leases"`
	// NameInUseBy is the advertise address of another edge of the
	// cluster that has this edge's cluster.name (a mistake: give each
	// edge its own); omitted when none.
	NameInUseBy string `json:"name_in_use_by,omitempty"`
}

// Cluster returns the edge's cluster state; ok is false without a cluster.
func (s *Service) Cluster() (ClusterState, bool) { return s.adm.clusterState() }

func (cm *clusterMode) clusterState() (ClusterState, bool) {
	st := cm.el.State()
	cm.mu.Lock()
	n := cm.leases.len()
	cm.mu.Unlock()
	return ClusterState{Name: cm.name, Leader: st.Leader, Ready: st.Leader && cm.ready.Load() == st.Epoch, Epoch: st.Epoch, LeaderAddr: st.LeaderAddr, Leases: n, NameInUseBy: cm.el.NameInUseBy()}, true
}
