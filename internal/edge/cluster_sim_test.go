package edge

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"sort"
	"strconv"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"iop/internal/clock"
	"iop/internal/cluster"
	"iop/internal/edge/contract"
	"iop/internal/wire/clusterv1"
	"iop/internal/wire/nodev1"
)

// A deterministic test of the admission protocol of several edges: three
// real edges (Service, scheduler, clusterMode: the leader's Admission
// service, its lease table, the followers' admission, the depose logic)
// and two nodes in memory, over a simulated network and a simulated etcd
// election, each edge on its own fake clock. It all runs in a synctest
// bubble; the test goroutine alone moves time and delivers messages, in
// FIFO order per pipe, so a seed gives one schedule of requests,
// completions and faults: freeze an edge (its clock and its inbound
// messages stop, then resume with the backlog), stall, cut or delay a link
// between two edges, cut an edge from etcd. The election behaves as etcd's:
// a session expires sessionTTL after its last renewal, the lowest live
// key leads, its create revision is the epoch.
//
// Invariants: no provider runs above its capacity and no run or lease
// runs twice (checked by the nodes, which are the truth); every request
// is answered within simAnswerBound of its edge's own time, and none
// waits at a running edge beside a free slot for simStallBound; after
// the faults end and the runs complete, no edge's scheduler holds a
// lease (no phantom), and every edge admits again.
//
// Goroutines still interleave as they will within a step (two requests
// racing for one slot), so a seed fixes the schedule, not every
// outcome; a thawed edge's timers fire before its backlog arrives.
//
// IOP_SIM_SEEDS sets the number of seeds (default 4); IOP_SIM_SEED runs
// one seed.

const (
	simTTL       = cluster.DefaultSessionTTL
	simHeartbeat = time.Second
	simQueue     = 5 * time.Second
	simTick      = 50 * time.Millisecond
	simRunFor    = 60 * time.Second
	// simAnswerBound: a request queued at a leader that is lost is
	// submitted again to the next, whose queue timeout starts anew; the
	// wait for a leader is bounded by leaderWait.
	simAnswerBound = 2*simQueue + leaderWait + 2*simTTL
	// simStallBound: no request at a running edge waits while a provider
	// has a free slot for longer than a new leader takes (the session TTL,
	// then its rebuild) plus the time a lease of a run that ended on a
	// frozen edge takes to be released (a heartbeat, unlistedGrace).
	simStallBound = simTTL + rebuildWait + simHeartbeat + reconcileGrace + simTTL + time.Second
)

func TestClusterProtocolSim(t *testing.T) {
	seeds := []uint64{}
	if s := os.Getenv("IOP_SIM_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		seeds = append(seeds, v)
	} else {
		n := 4
		if s := os.Getenv("IOP_SIM_SEEDS"); s != "" {
			v, err := strconv.Atoi(s)
			if err != nil {
				t.Fatal(err)
			}
			n = v
		}
		for i := range n {
			seeds = append(seeds, uint64(i+1))
		}
	}
	for _, seed := range seeds {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				if err := runClusterSim(t, seed, simSchedule); err != nil {
					t.Fatalf("seed %d (IOP_SIM_SEED=%d): %v", seed, seed, err)
				}
			})
		})
	}
}

// ---- the world ----

type simWorld struct {
	t     *testing.T
	rng   *rand.Rand
	clk   *clock.Fake // the world's time: etcd, the network, the nodes
	edges []*simEdge
	nodes []*simNode
	etcd  simEtcd
	stop  chan struct{} // closed at the end: every call in flight fails

	pmu   sync.Mutex // guards pipes and the faults below
	pipes []*simPipe
	// Faults.
	stall map[[2]int]bool // edge → edge: messages held
	cut   map[[2]int]bool // edge → edge: calls fail, streams break
	delay map[[2]int]time.Duration

	reqs     []*simReq
	nreq     int
	errs     []string
	firstErr int // len(trace) at the first of errs
	trace    []string
}

func (w *simWorld) failf(format string, args ...any) {
	if len(w.errs) == 0 {
		w.firstErr = len(w.trace)
	}
	w.errs = append(w.errs, fmt.Sprintf("t=%s: ", w.since())+fmt.Sprintf(format, args...))
}

func (w *simWorld) logf(format string, args ...any) {
	w.trace = append(w.trace, fmt.Sprintf("t=%s: ", w.since())+fmt.Sprintf(format, args...))
}

var simStart = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func (w *simWorld) since() time.Duration { return w.clk.Now().Sub(simStart) }

// simEdge is one real edge on its own clock.
type simEdge struct {
	w    *simWorld
	i    int
	name string
	addr string
	clk  *clock.Fake
	svc  *Service
	cm   *clusterMode
	el   *simElector

	frozen      bool // its clock stands and nothing reaches it
	frozenSince time.Time
	frozenTotal time.Duration
	etcdCut     bool
}

// frozenFor is how long e has been frozen in all (the current freeze too).
func (e *simEdge) frozenFor() time.Duration {
	d := e.frozenTotal
	if e.frozen {
		d += e.w.clk.Now().Sub(e.frozenSince)
	}
	return d
}

// ---- pipes: ordered, delivered by the test goroutine ----

// simPipe is one direction of one call or stream: its items are run by
// the test goroutine, in order, once ok says they may pass and their
// delay passed. When cut says the pipe is cut, broken runs once and the
// items are dropped.
type simPipe struct {
	ok     func() bool
	cut    func() bool
	broken func()

	mu    sync.Mutex // guards the fields below
	items []simItem
	dead  bool
}

type simItem struct {
	at time.Time
	f  func()
}

func (w *simWorld) newPipe(ok, cut func() bool, broken func()) *simPipe {
	p := &simPipe{ok: ok, cut: cut, broken: broken}
	w.pmu.Lock()
	w.pipes = append(w.pipes, p)
	w.pmu.Unlock()
	return p
}

func (p *simPipe) push(at time.Time, f func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.dead {
		p.items = append(p.items, simItem{at: at, f: f})
	}
}

// deliver runs every item that may pass now; it reports whether any did.
func (w *simWorld) deliver() bool {
	w.pmu.Lock()
	pipes := append([]*simPipe(nil), w.pipes...)
	w.pmu.Unlock()
	now := w.clk.Now()
	any := false
	var live []*simPipe
	for _, p := range pipes {
		p.mu.Lock()
		if p.dead {
			p.mu.Unlock()
			continue
		}
		if p.cut != nil && p.cut() {
			p.dead, p.items = true, nil
			p.mu.Unlock()
			if p.broken != nil {
				p.broken()
			}
			any = true
			continue
		}
		for len(p.items) > 0 && !p.items[0].at.After(now) && p.ok() {
			it := p.items[0]
			p.items = p.items[1:]
			p.mu.Unlock()
			it.f()
			any = true
			p.mu.Lock()
		}
		p.mu.Unlock()
		live = append(live, p)
	}
	w.pmu.Lock()
	// Pipes made meanwhile stay.
	w.pipes = append(live, w.pipes[len(pipes):]...)
	w.pmu.Unlock()
	return any
}

// settle lets every goroutine run until all wait, delivering messages,
// until nothing moves.
func (w *simWorld) settle() {
	for {
		synctest.Wait()
		if !w.deliver() {
			return
		}
	}
}

// link pipes between edges (from → to).
func (w *simWorld) linkPipe(from, to int, broken func()) *simPipe {
	k := [2]int{from, to}
	return w.newPipe(func() bool {
		w.pmu.Lock()
		defer w.pmu.Unlock()
		return !w.stall[k] && !w.edges[to].frozen
	}, func() bool {
		w.pmu.Lock()
		defer w.pmu.Unlock()
		return w.cut[k] || w.cut[[2]int{to, from}]
	}, broken)
}

func (w *simWorld) linkAt(from, to int) time.Time {
	w.pmu.Lock()
	defer w.pmu.Unlock()
	return w.clk.Now().Add(w.delay[[2]int{from, to}])
}

func (w *simWorld) linkCut(from, to int) bool {
	w.pmu.Lock()
	defer w.pmu.Unlock()
	return w.cut[[2]int{from, to}] || w.cut[[2]int{to, from}]
}

var errSimUnavailable = status.Error(codes.Unavailable, "simulated link cut")

// ---- the Admission service over the simulated network ----

// simPeers is one edge's peerNet: calls to another edge's admissionServer.
type simPeers struct {
	w    *simWorld
	from int
}

func (p simPeers) client(addr string) (clusterv1.AdmissionClient, error) {
	for _, e := range p.w.edges {
		if e.addr == addr {
			return &simClient{w: p.w, from: p.from, to: e.i}, nil
		}
	}
	return nil, fmt.Errorf("no edge at %s", addr)
}

func (simPeers) close() {}

type simClient struct {
	w        *simWorld
	from, to int
}

func (c *simClient) server() *admissionServer { return &admissionServer{cm: c.w.edges[c.to].cm} }

// simBox is a stream's receiving end.
type simBox[T any] struct {
	mu    sync.Mutex
	items []*T
	err   error
	wake  chan struct{}
}

func newBox[T any]() *simBox[T] { return &simBox[T]{wake: make(chan struct{})} }

func (b *simBox[T]) put(m *T, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.err != nil {
		return
	}
	if err != nil {
		b.err = err
	} else {
		b.items = append(b.items, m)
	}
	close(b.wake)
	b.wake = make(chan struct{})
}

func (b *simBox[T]) get(ctx context.Context, stop <-chan struct{}) (*T, error) {
	for {
		b.mu.Lock()
		if len(b.items) > 0 {
			m := b.items[0]
			b.items = b.items[1:]
			b.mu.Unlock()
			return m, nil
		}
		if b.err != nil {
			err := b.err
			b.mu.Unlock()
			return nil, err
		}
		wake := b.wake
		b.mu.Unlock()
		select {
		case <-wake:
		case <-ctx.Done():
			return nil, status.FromContextError(ctx.Err()).Err()
		case <-stop:
			return nil, errSimUnavailable
		}
	}
}

type simClientStream[T any] struct {
	grpc.ClientStream // nil: only Recv is used
	ctx               context.Context
	box               *simBox[T]
	stop              <-chan struct{}
}

func (s *simClientStream[T]) Recv() (*T, error) { return s.box.get(s.ctx, s.stop) }

type simServerStream[T any] struct {
	grpc.ServerStream // nil: only Send and Context are used
	ctx               context.Context
	send              func(*T) error
}

func (s *simServerStream[T]) Send(m *T) error          { return s.send(m) }
func (s *simServerStream[T]) Context() context.Context { return s.ctx }
func (s *simClientStream[T]) Context() context.Context { return s.ctx }

// simStream opens a server stream from c.from to c.to served by handler.
func simStream[T any](c *simClient, ctx context.Context, handler func(grpc.ServerStreamingServer[T]) error) (grpc.ServerStreamingClient[T], error) {
	w := c.w
	if w.linkCut(c.from, c.to) {
		return nil, errSimUnavailable
	}
	box := newBox[T]()
	sctx, scancel := context.WithCancel(context.Background())
	broken := func() { box.put(nil, errSimUnavailable); scancel() }
	up := w.linkPipe(c.from, c.to, broken)
	down := w.linkPipe(c.to, c.from, broken)
	srv := &simServerStream[T]{ctx: sctx, send: func(m *T) error {
		if err := sctx.Err(); err != nil {
			return err
		}
		down.push(w.linkAt(c.to, c.from), func() { box.put(m, nil) })
		return nil
	}}
	up.push(w.linkAt(c.from, c.to), func() {
		go func() {
			err := handler(srv)
			if err == nil {
				err = io.EOF
			}
			scancel()
			down.push(w.linkAt(c.to, c.from), func() { box.put(nil, err) })
		}()
	})
	context.AfterFunc(ctx, func() { up.push(w.linkAt(c.from, c.to), scancel) })
	return &simClientStream[T]{ctx: ctx, box: box, stop: w.stop}, nil
}

// simUnary makes one call from c.from to c.to served by handler.
func simUnary[T any](c *simClient, ctx context.Context, handler func(context.Context) (*T, error)) (*T, error) {
	w := c.w
	if w.linkCut(c.from, c.to) {
		return nil, errSimUnavailable
	}
	box := newBox[T]()
	broken := func() { box.put(nil, errSimUnavailable) }
	up := w.linkPipe(c.from, c.to, broken)
	down := w.linkPipe(c.to, c.from, broken)
	sctx, scancel := context.WithCancel(context.Background())
	up.push(w.linkAt(c.from, c.to), func() {
		go func() {
			defer scancel()
			rep, err := handler(sctx)
			down.push(w.linkAt(c.to, c.from), func() {
				if err != nil {
					box.put(nil, err)
				} else {
					box.put(rep, nil)
				}
			})
		}()
	})
	return box.get(ctx, w.stop)
}

func (c *simClient) Admit(ctx context.Context, in *clusterv1.AdmitRequest, _ ...grpc.CallOption) (grpc.ServerStreamingClient[clusterv1.AdmitReply], error) {
	return simStream(c, ctx, func(s grpc.ServerStreamingServer[clusterv1.AdmitReply]) error { return c.server().Admit(in, s) })
}

func (c *simClient) Follow(ctx context.Context, in *clusterv1.FollowRequest, _ ...grpc.CallOption) (grpc.ServerStreamingClient[clusterv1.FollowReply], error) {
	return simStream(c, ctx, func(s grpc.ServerStreamingServer[clusterv1.FollowReply]) error { return c.server().Follow(in, s) })
}

func (c *simClient) Release(ctx context.Context, in *clusterv1.ReleaseRequest, _ ...grpc.CallOption) (*clusterv1.ReleaseReply, error) {
	return simUnary(c, ctx, func(sctx context.Context) (*clusterv1.ReleaseReply, error) { return c.server().Release(sctx, in) })
}

func (c *simClient) AdmitKey(ctx context.Context, in *clusterv1.AdmitKeyRequest, _ ...grpc.CallOption) (*clusterv1.AdmitKeyReply, error) {
	return simUnary(c, ctx, func(sctx context.Context) (*clusterv1.AdmitKeyReply, error) { return c.server().AdmitKey(sctx, in) })
}

func (c *simClient) ReleaseKey(ctx context.Context, in *clusterv1.ReleaseKeyRequest, _ ...grpc.CallOption) (*clusterv1.ReleaseKeyReply, error) {
	return simUnary(c, ctx, func(sctx context.Context) (*clusterv1.ReleaseKeyReply, error) { return c.server().ReleaseKey(sctx, in) })
}

func (c *simClient) ReserveQuota(ctx context.Context, in *clusterv1.ReserveQuotaRequest, _ ...grpc.CallOption) (*clusterv1.ReserveQuotaReply, error) {
	return simUnary(c, ctx, func(sctx context.Context) (*clusterv1.ReserveQuotaReply, error) {
		return c.server().ReserveQuota(sctx, in)
	})
}

func (c *simClient) SettleQuota(ctx context.Context, in *clusterv1.SettleQuotaRequest, _ ...grpc.CallOption) (*clusterv1.SettleQuotaReply, error) {
	return simUnary(c, ctx, func(sctx context.Context) (*clusterv1.SettleQuotaReply, error) {
		return c.server().SettleQuota(sctx, in)
	})
}

// ---- the election: etcd's, simulated ----

type simKey struct {
	edge  int
	rev   int64
	renew time.Time // world time of the last renewal
}

// simEtcd is the election's state; only the test goroutine touches it
// (edges reach it through pipes).
type simEtcd struct {
	rev    int64
	keys   []*simKey // by rev
	leader int64     // the leading key's rev (0: none)
}

// simElector is one edge's view of the election (cluster.Elector's
// rules: Leads needs a renewal granted within the TTL on the edge's own
// clock; a newer epoch deposes).
type simElector struct {
	e *simEdge
	// to and from etcd.
	up, down *simPipe

	mu         sync.Mutex // guards the fields below
	st         cluster.State
	ch         chan struct{}
	own        int64
	seen       int64
	validUntil time.Time // on the edge's clock
	key        int64     // rev of this edge's session key (0: none)
	renewing   bool
}

var _ elector = (*simElector)(nil)

// NameInUseBy: the simulated cluster gives each edge its own name.
func (el *simElector) NameInUseBy() string { return "" }

func (el *simElector) State() cluster.State {
	el.mu.Lock()
	defer el.mu.Unlock()
	return el.st
}

func (el *simElector) Leads() int64 {
	el.mu.Lock()
	defer el.mu.Unlock()
	if !el.st.Leader || !el.e.clk.Now().Before(el.validUntil) {
		return 0
	}
	return el.st.Epoch
}

func (el *simElector) Changes() <-chan struct{} {
	el.mu.Lock()
	defer el.mu.Unlock()
	return el.ch
}

func (el *simElector) Close() error { return nil }

func (el *simElector) publishLocked(epoch int64, addr string) {
	st := cluster.State{Epoch: epoch, LeaderAddr: addr, Leader: el.own != 0 && el.own == epoch}
	if st == el.st {
		return
	}
	el.st = st
	close(el.ch)
	el.ch = make(chan struct{})
}

func (el *simElector) Depose(epoch int64, addr string) {
	el.mu.Lock()
	defer el.mu.Unlock()
	if el.own != 0 && el.own < epoch {
		el.own = 0
		// The hold ends: the session is closed, a new one campaigns.
		el.resignLocked()
	}
	if epoch > el.st.Epoch || (epoch == el.st.Epoch && el.st.LeaderAddr == "" && addr != "") {
		el.publishLocked(epoch, addr)
	}
}

// resignLocked closes the session (its key goes) and campaigns anew.
func (el *simElector) resignLocked() {
	old := el.key
	el.key = 0
	w, i := el.e.w, el.e.i
	el.up.push(w.clk.Now(), func() { w.etcdResign(i, old) })
	el.up.push(w.clk.Now(), func() { w.etcdCampaign(i) })
}

func (el *simElector) Campaigners(ctx context.Context) ([]string, error) {
	w := el.e.w
	box := newBox[[]string]()
	el.up.push(w.clk.Now(), func() {
		var out []string
		for _, k := range w.etcd.keys {
			out = append(out, w.edges[k.edge].addr)
		}
		el.down.push(w.clk.Now(), func() { box.put(&out, nil) })
	})
	got, err := box.get(ctx, w.stop)
	if err != nil {
		return nil, err
	}
	return *got, nil
}

// renewTick renews the session every third of the TTL, on the edge's clock.
func (el *simElector) renewTick() {
	w, e := el.e.w, el.e
	sent := e.clk.Now()
	el.mu.Lock()
	key := el.key
	el.mu.Unlock()
	if key != 0 {
		el.up.push(w.clk.Now(), func() {
			ok := w.etcdRenew(e.i, key)
			el.down.push(w.clk.Now(), func() { el.renewed(key, sent, ok) })
		})
	}
	e.clk.AfterFunc(simTTL/3, el.renewTick)
}

func (el *simElector) renewed(key int64, sent time.Time, ok bool) {
	el.mu.Lock()
	defer el.mu.Unlock()
	if key != el.key {
		return
	}
	if ok {
		if u := sent.Add(simTTL); u.After(el.validUntil) {
			el.validUntil = u
		}
		return
	}
	// The session expired at etcd: a leader steps down, a new session campaigns.
	if el.own != 0 {
		el.own = 0
		el.publishLocked(0, "")
	}
	el.key = 0
	w, i := el.e.w, el.e.i
	el.up.push(w.clk.Now(), func() { w.etcdCampaign(i) })
}

// granted: etcd made this edge's session key rev (valid from sent).
func (el *simElector) granted(rev int64, sent time.Time) {
	el.mu.Lock()
	defer el.mu.Unlock()
	el.key = rev
	if u := sent.Add(simTTL); u.After(el.validUntil) {
		el.validUntil = u
	}
}

// see: etcd's watch names the leader (epoch 0: none); elected when it is
// this edge's key.
func (el *simElector) see(epoch int64, addr string, mine bool) {
	el.mu.Lock()
	defer el.mu.Unlock()
	if mine && epoch == el.key && epoch != 0 {
		el.own = epoch
		el.seen = epoch
		el.publishLocked(epoch, addr)
		return
	}
	if epoch == 0 {
		if el.own == 0 {
			el.publishLocked(0, "")
		}
		return
	}
	if epoch < el.seen {
		return
	}
	el.seen = epoch
	if el.own != 0 && el.own < epoch {
		el.own = 0
		el.resignLocked()
	}
	el.publishLocked(epoch, addr)
}

func (w *simWorld) etcdCampaign(i int) {
	e := w.edges[i]
	w.etcd.rev++
	k := &simKey{edge: i, rev: w.etcd.rev, renew: w.clk.Now()}
	w.etcd.keys = append(w.etcd.keys, k)
	sent := e.clk.Now() // the edge's time the grant is valid from (approximately)
	e.el.down.push(w.clk.Now(), func() { e.el.granted(k.rev, sent) })
	w.etcdElect()
}

func (w *simWorld) etcdResign(i int, rev int64) {
	for j, k := range w.etcd.keys {
		if k.edge == i && k.rev == rev {
			w.etcd.keys = append(w.etcd.keys[:j], w.etcd.keys[j+1:]...)
			break
		}
	}
	w.etcdElect()
}

func (w *simWorld) etcdRenew(i int, rev int64) bool {
	for _, k := range w.etcd.keys {
		if k.edge == i && k.rev == rev {
			k.renew = w.clk.Now()
			return true
		}
	}
	return false
}

// etcdExpire drops the keys not renewed for the TTL.
func (w *simWorld) etcdExpire() {
	now := w.clk.Now()
	kept := w.etcd.keys[:0]
	gone := false
	for _, k := range w.etcd.keys {
		if now.Sub(k.renew) >= simTTL {
			gone = true
			w.logf("etcd: session of %s (rev %d) expired", w.edges[k.edge].name, k.rev)
			continue
		}
		kept = append(kept, k)
	}
	w.etcd.keys = kept
	if gone {
		w.etcdElect()
	}
}

// etcdElect publishes a change of leader to every edge's watch.
func (w *simWorld) etcdElect() {
	var lead *simKey
	if len(w.etcd.keys) > 0 {
		lead = w.etcd.keys[0]
	}
	var rev int64
	if lead != nil {
		rev = lead.rev
	}
	if rev == w.etcd.leader {
		return
	}
	w.etcd.leader = rev
	addr := ""
	if lead != nil {
		addr = w.edges[lead.edge].addr
		w.logf("etcd: %s leads, epoch %d", w.edges[lead.edge].name, rev)
	} else {
		w.logf("etcd: no leader")
	}
	for _, e := range w.edges {
		mine := lead != nil && lead.edge == e.i
		e.el.down.push(w.clk.Now(), func() { e.el.see(rev, addr, mine) })
	}
}

// ---- nodes ----

type simRun struct {
	id       string
	node     *simNode
	provider string
	epoch    int64
	lease    uint64
	owner    *simEdge
	done     func() // tells its edge the run ended
}

type simNode struct {
	w     *simWorld
	id    string
	hello *nodev1.Hello
	caps  map[string]int
	epoch int64 // the highest seen
	runs  map[string]*simRun
	conns map[int]*simConn
}

// simConn is the node's control stream to one edge, served by the edge's
// real serveConn.
type simConn struct {
	n      *simNode
	e      *simEdge
	up     *simPipe // node → edge
	down   *simPipe // edge → node
	in     *simBox[nodev1.NodeMessage]
	ctx    context.Context
	cancel context.CancelFunc
	ended  bool // serveConn returned (set by the test goroutine)
}

type simConnStream struct {
	grpc.ServerStream
	c *simConn
}

func (s *simConnStream) Context() context.Context { return s.c.ctx }
func (s *simConnStream) Recv() (*nodev1.NodeMessage, error) {
	return s.c.in.get(s.c.ctx, s.c.n.w.stop)
}

func (s *simConnStream) Send(m *nodev1.EdgeMessage) error {
	c := s.c
	c.down.push(c.n.w.clk.Now(), func() { c.n.receive(c, m) })
	return nil
}

func (n *simNode) connect(e *simEdge) {
	w := n.w
	c := &simConn{n: n, e: e, in: newBox[nodev1.NodeMessage]()}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	c.up = w.newPipe(func() bool {
		w.pmu.Lock()
		defer w.pmu.Unlock()
		return !e.frozen
	}, nil, nil)
	c.down = w.newPipe(func() bool { return true }, nil, nil)
	w.pmu.Lock()
	n.conns[e.i] = c
	w.pmu.Unlock()
	c.send(&nodev1.NodeMessage{Msg: &nodev1.NodeMessage_Hello{Hello: n.hello}})
	go func() {
		_ = e.svc.serveConn(&simConnStream{c: c})
		c.cancel()
		c.down.push(w.clk.Now(), func() { c.ended = true })
	}()
}

func (c *simConn) send(m *nodev1.NodeMessage) {
	c.up.push(c.n.w.clk.Now(), func() { c.in.put(m, nil) })
}

func (n *simNode) list() []*nodev1.RunInFlight {
	var out []*nodev1.RunInFlight
	ids := make([]string, 0, len(n.runs))
	for id := range n.runs {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		r := n.runs[id]
		out = append(out, &nodev1.RunInFlight{RunId: r.id, ProviderId: r.provider, Epoch: r.epoch, LeaseId: r.lease})
	}
	return out
}

func (n *simNode) heartbeat() {
	for _, i := range sortedConns(n) {
		c := n.conns[i]
		if c.ended {
			n.connect(c.e)
			continue
		}
		c.send(&nodev1.NodeMessage{Msg: &nodev1.NodeMessage_Heartbeat{Heartbeat: &nodev1.Heartbeat{UnixNano: n.w.clk.Now().UnixNano(), Runs: n.list(), RunsSet: true}}})
	}
}

func sortedConns(n *simNode) []int {
	var out []int
	for i := range n.conns {
		out = append(out, i)
	}
	sort.Ints(out)
	return out
}

func (n *simNode) receive(c *simConn, m *nodev1.EdgeMessage) {
	if rq := m.GetRunsRequest(); rq != nil {
		// A new leader's request raises the epoch below which a Dispatch
		// is refused, as a real node's does.
		n.epoch = max(n.epoch, rq.GetEpoch())
		c.send(&nodev1.NodeMessage{Msg: &nodev1.NodeMessage_RunsReport{RunsReport: &nodev1.RunsReport{Epoch: rq.GetEpoch(), Runs: n.list()}}})
	}
}

// start is a Dispatch reaching the node (the node's rules: an epoch below
// the highest seen is refused, naming that one).
func (n *simNode) start(r *simRun) (staleEpoch int64) {
	w := n.w
	if r.epoch < n.epoch {
		return n.epoch
	}
	n.epoch = r.epoch
	for _, o := range w.nodes {
		if o.runs[r.id] != nil {
			w.failf("run %s admitted twice (running on %s, dispatched to %s)", r.id, o.id, n.id)
		}
		for _, x := range o.runs {
			if x.epoch == r.epoch && x.lease == r.lease {
				w.failf("lease (%d, %d) runs twice: %s and %s", r.epoch, r.lease, x.id, r.id)
			}
		}
	}
	n.runs[r.id] = r
	busy := 0
	for _, x := range n.runs {
		if x.provider == r.provider {
			busy++
		}
	}
	if busy > n.caps[r.provider] {
		w.failf("provider %s/%s runs %d, capacity %d", n.id, r.provider, busy, n.caps[r.provider])
	}
	w.logf("%s runs %s on %s (epoch %d, lease %d, from %s)", n.id, r.id, r.provider, r.epoch, r.lease, r.owner.name)
	return 0
}

// complete ends r on its node; its edge learns it over its connection.
func (n *simNode) complete(r *simRun) {
	delete(n.runs, r.id)
	c := n.conns[r.owner.i]
	c.up.push(n.w.clk.Now(), r.done)
}

// ---- requests ----

type simReq struct {
	id      string
	e       *simEdge
	start   time.Time
	frozen0 time.Duration // e.frozenFor() at start

	mu       sync.Mutex
	freeWait time.Duration // waited while some provider had a free slot
	stalled  bool          // reported
	answered bool
	err      error
	at       time.Time
}

func (r *simReq) answer(w *simWorld, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.answered {
		r.answered, r.err, r.at = true, err, w.clk.Now()
	}
}

// request runs one request at e as Service.Dispatch does with a
// grant: admit, dispatch to the node stamped with epoch and lease, release
// when the run ends (or the node refuses a stale epoch: learn the epoch,
// admit again).
func (w *simWorld) request(ctx context.Context, e *simEdge, r *simReq) {
	for attempt := 0; ; attempt++ {
		g, err := e.cm.admit(ctx, contract.Request{Model: "m", RunID: r.id}, nil, prefixRoute{}, func() {})
		if err != nil {
			r.answer(w, err)
			return
		}
		cand := g.candidate()
		epoch, lease := g.stamp()
		if cand.Generation == 0 {
			g.release("no connection")
			r.answer(w, errors.New("no connection to the node"))
			return
		}
		g.track(r.id)
		inf := g.info()
		e.svc.mu.Lock()
		e.svc.runs[r.id] = &Run{grant: g, epoch: epoch, leaseID: lease, info: contract.DispatchInfo{RunID: r.id, NodeID: cand.NodeID, ProviderID: cand.ProviderID, ServedModel: inf.Target}}
		e.svc.mu.Unlock()
		done := make(chan struct{})
		refused := make(chan int64, 1)
		var n *simNode
		for _, x := range w.nodes {
			if x.id == cand.NodeID {
				n = x
			}
		}
		sr := &simRun{id: r.id, node: n, provider: cand.ProviderID, epoch: epoch, lease: lease, owner: e, done: func() { close(done) }}
		w.pmu.Lock()
		c := n.conns[e.i]
		w.pmu.Unlock()
		c.down.push(w.clk.Now(), func() {
			if stale := n.start(sr); stale != 0 {
				c.up.push(w.clk.Now(), func() { refused <- stale })
			} else {
				// The run started: the request is answered.
				c.up.push(w.clk.Now(), func() { r.answer(w, nil) })
			}
		})
		var stale int64
		select {
		case <-done:
		case stale = <-refused:
		case <-ctx.Done():
		}
		e.svc.mu.Lock()
		delete(e.svc.runs, r.id)
		e.svc.mu.Unlock()
		if stale != 0 && attempt < 3 {
			g.release("stale epoch")
			e.cm.sawEpoch(stale)
			continue
		}
		r.answer(w, nil)
		g.release("run ended")
		return
	}
}

// ---- the schedule ----

type simFault struct {
	what  string
	until time.Time
	heal  func()
}

// simSchedule drives one seed: requests, completions, one fault at a
// time; then the faults end, the runs complete, and the cluster must come
// back to zero leases and admit again.
func simSchedule(w *simWorld, ctx context.Context) {
	var fault *simFault
	var nextFault = simStart.Add(3 * time.Second)
	for w.since() < simRunFor {
		now := w.clk.Now()
		if fault != nil && !now.Before(fault.until) {
			w.logf("fault ends: %s", fault.what)
			fault.heal()
			fault = nil
			nextFault = now.Add(time.Duration(1+w.rng.IntN(4)) * time.Second)
		}
		if fault == nil && !now.Before(nextFault) {
			fault = w.newFault()
			w.logf("fault starts: %s", fault.what)
		}
		if w.rng.IntN(100) < 12 {
			w.newRequest(ctx, w.edges[w.rng.IntN(len(w.edges))])
		}
		if w.rng.IntN(100) < 10 {
			w.completeOne()
		}
		w.tick()
		w.checkStall()
		w.checkAnswers()
	}
	if fault != nil {
		w.logf("fault ends: %s", fault.what)
		fault.heal()
	}
	// Quiet: every run completes; the leases must follow.
	for range int((2*time.Second + simHeartbeat + reconcileGrace + max(simTTL, 1500*time.Millisecond) + 4*simTTL + rebuildWait) / simTick) {
		w.completeOne()
		w.tick()
		w.checkAnswers()
	}
	for _, n := range w.nodes {
		for _, r := range n.runs {
			w.failf("run %s still on %s after the quiet period", r.id, n.id)
		}
	}
	for _, e := range w.edges {
		for _, p := range []string{"n1/p1", "n2/p2"} {
			if got := simInFlight(e, p); got != 0 {
				w.failf("%s (leader %v) holds %d leases on %s that no node runs", e.name, e.cm.el.State().Leader, got, p)
			}
		}
		if cs, _ := e.svc.Cluster(); cs.Leases != 0 {
			w.failf("%s holds %d leases of other edges' runs that no node runs", e.name, cs.Leases)
		}
	}
	// Admission resumes: a request at every edge is granted.
	var probes []*simReq
	for _, e := range w.edges {
		probes = append(probes, w.newRequest(ctx, e))
	}
	for range int((leaderWait + 2*simTTL) / simTick) {
		w.tick()
	}
	for _, r := range probes {
		r.mu.Lock()
		if !r.answered || r.err != nil {
			w.failf("probe %s at %s after the faults: answered %v, %v: admission did not resume", r.id, r.e.name, r.answered, r.err)
		}
		r.mu.Unlock()
	}
}

func simInFlight(e *simEdge, np string) int {
	for _, p := range e.svc.Snapshot().Providers {
		if p.NodeID+"/"+p.ProviderID == np {
			return p.InFlight
		}
	}
	return 0
}

func (w *simWorld) leaderIndex() int {
	if w.etcd.leader == 0 {
		return -1
	}
	for _, k := range w.etcd.keys {
		if k.rev == w.etcd.leader {
			return k.edge
		}
	}
	return -1
}

func (w *simWorld) newFault() *simFault {
	d := time.Duration(1000+w.rng.IntN(19000)) * time.Millisecond
	until := w.clk.Now().Add(d)
	pick := func() int {
		if li := w.leaderIndex(); li >= 0 && w.rng.IntN(3) > 0 {
			return li
		}
		return w.rng.IntN(len(w.edges))
	}
	switch w.rng.IntN(5) {
	case 0, 1:
		e := pick()
		w.freeze(e)
		return &simFault{what: fmt.Sprintf("freeze %s for %s", w.edges[e].name, d), until: until, heal: func() { w.thaw(e) }}
	case 2:
		a := pick()
		b := (a + 1 + w.rng.IntN(len(w.edges)-1)) % len(w.edges)
		w.setLink(w.stall, a, b, true)
		return &simFault{what: fmt.Sprintf("stall %s <-> %s for %s", w.edges[a].name, w.edges[b].name, d), until: until, heal: func() { w.setLink(w.stall, a, b, false) }}
	case 3:
		a := pick()
		b := (a + 1 + w.rng.IntN(len(w.edges)-1)) % len(w.edges)
		w.setLink(w.cut, a, b, true)
		return &simFault{what: fmt.Sprintf("cut %s <-> %s for %s", w.edges[a].name, w.edges[b].name, d), until: until, heal: func() { w.setLink(w.cut, a, b, false) }}
	default:
		e := pick()
		w.pmu.Lock()
		w.edges[e].etcdCut = true
		w.pmu.Unlock()
		return &simFault{what: fmt.Sprintf("cut %s from etcd for %s", w.edges[e].name, d), until: until, heal: func() {
			w.pmu.Lock()
			w.edges[e].etcdCut = false
			w.pmu.Unlock()
		}}
	}
}

func (w *simWorld) setLink(m map[[2]int]bool, a, b int, on bool) {
	w.pmu.Lock()
	defer w.pmu.Unlock()
	m[[2]int{a, b}], m[[2]int{b, a}] = on, on
}

func (w *simWorld) freeze(i int) {
	w.pmu.Lock()
	defer w.pmu.Unlock()
	e := w.edges[i]
	e.frozen, e.frozenSince = true, w.clk.Now()
}

// thaw resumes a frozen edge: its clock catches up at once (its timers
// fire), then its backlog of messages arrives.
func (w *simWorld) thaw(i int) {
	w.pmu.Lock()
	e := w.edges[i]
	d := w.clk.Now().Sub(e.frozenSince)
	e.frozen, e.frozenTotal = false, e.frozenTotal+d
	w.pmu.Unlock()
	e.clk.Advance(d)
	w.settle()
}

func (w *simWorld) newRequest(ctx context.Context, e *simEdge) *simReq {
	w.nreq++
	r := &simReq{id: fmt.Sprintf("r%d", w.nreq), e: e, start: w.clk.Now(), frozen0: e.frozenFor()}
	w.reqs = append(w.reqs, r)
	w.logf("request %s at %s", r.id, e.name)
	go w.request(ctx, e, r)
	return r
}

func (w *simWorld) completeOne() {
	var all []*simRun
	for _, n := range w.nodes {
		for _, id := range sortedRuns(n) {
			all = append(all, n.runs[id])
		}
	}
	if len(all) == 0 {
		return
	}
	r := all[w.rng.IntN(len(all))]
	w.logf("%s completes %s", r.node.id, r.id)
	r.node.complete(r)
}

func sortedRuns(n *simNode) []string {
	ids := make([]string, 0, len(n.runs))
	for id := range n.runs {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}

// tick moves the world and every running edge by simTick, with the
// nodes' heartbeats and etcd's expiries, and lets everything settle.
func (w *simWorld) tick() {
	before := w.clk.Now()
	w.clk.Advance(simTick)
	if before.Truncate(simHeartbeat) != w.clk.Now().Truncate(simHeartbeat) {
		for _, n := range w.nodes {
			n.heartbeat()
		}
	}
	w.etcdExpire()
	for _, e := range w.edges {
		if !e.frozen {
			e.clk.Advance(simTick)
		}
	}
	w.settle()
}

// checkAnswers: every request is answered within simAnswerBound of its
// edge's running time (a frozen edge answers nothing while frozen).
func (w *simWorld) checkAnswers() {
	now := w.clk.Now()
	kept := w.reqs[:0]
	for _, r := range w.reqs {
		r.mu.Lock()
		answered := r.answered
		r.mu.Unlock()
		if answered {
			continue
		}
		if age := now.Sub(r.start) - (r.e.frozenFor() - r.frozen0); age > simAnswerBound {
			w.failf("request %s at %s unanswered after %s (bound %s)", r.id, r.e.name, age, simAnswerBound)
			continue // reported once
		}
		kept = append(kept, r)
	}
	w.reqs = kept
}

// checkStall: admission goes on beside a fault. A request that waits at
// a running edge while some provider has a free slot (by its node's
// count) for simStallBound in all is stalled.
func (w *simWorld) checkStall() {
	free := false
	for _, n := range w.nodes {
		busy := map[string]int{}
		for _, r := range n.runs {
			busy[r.provider]++
		}
		for p, c := range n.caps {
			if busy[p] < c {
				free = true
			}
		}
	}
	if !free {
		return
	}
	for _, r := range w.reqs {
		r.mu.Lock()
		if !r.answered && !r.e.frozen {
			r.freeWait += simTick
			if r.freeWait > simStallBound && !r.stalled {
				r.stalled = true
				w.failf("admission stalled: request %s at %s waited %s beside a free slot (bound %s)", r.id, r.e.name, r.freeWait, simStallBound)
			}
		}
		r.mu.Unlock()
	}
}

// runClusterSim builds the world for seed, runs schedule in it, and
// returns the invariants it broke.
func runClusterSim(t *testing.T, seed uint64, schedule func(*simWorld, context.Context)) error {
	w := &simWorld{
		t:     t,
		rng:   rand.New(rand.NewPCG(seed, 0x1a2b)),
		clk:   clock.NewFake(simStart),
		stop:  make(chan struct{}),
		stall: map[[2]int]bool{},
		cut:   map[[2]int]bool{},
		delay: map[[2]int]time.Duration{},
	}
	for a := range 3 {
		for b := range 3 {
			if a != b {
				w.delay[[2]int{a, b}] = time.Duration(w.rng.IntN(30)) * time.Millisecond
			}
		}
	}
	for i := range 3 {
		cfg := testConfig()
		cfg.HeartbeatInterval = simHeartbeat
		cfg.Queue.QueueTimeout = simQueue
		clk := clock.NewFake(simStart)
		srv, err := NewServer(cfg, Deps{Clock: clk})
		if err != nil {
			t.Fatal(err)
		}
		e := &simEdge{w: w, i: i, name: fmt.Sprintf("edge-%d", i+1), addr: fmt.Sprintf("edge-%d:7000", i+1), clk: clk, svc: srv.svc}
		e.el = &simElector{e: e, ch: make(chan struct{})}
		e.el.up = w.newPipe(func() bool { // edge → etcd
			w.pmu.Lock()
			defer w.pmu.Unlock()
			return !e.etcdCut
		}, nil, nil)
		e.el.down = w.newPipe(func() bool { // etcd → edge
			w.pmu.Lock()
			defer w.pmu.Unlock()
			return !e.etcdCut && !e.frozen
		}, nil, nil)
		w.edges = append(w.edges, e)
	}
	for _, e := range w.edges {
		ccfg := cluster.Config{Etcd: []string{"sim"}, Name: e.name, Advertise: e.addr, SessionTTL: simTTL, ID: "sim"}
		e.cm = startClusterMode(e.svc, ccfg, e.el, simPeers{w: w, from: e.i}, nil)
		e.svc.cl, e.svc.adm = e.cm, e.cm
		e.el.mu.Lock()
		e.el.resignLocked() // campaign (no key to resign yet)
		e.el.mu.Unlock()
		e.clk.AfterFunc(simTTL/3, e.el.renewTick)
	}
	for _, spec := range []struct {
		id, p string
		cap   int32
	}{{"n1", "p1", 2}, {"n2", "p2", 3}} {
		n := &simNode{w: w, id: spec.id, hello: hello(spec.id, prov(spec.p, normalized, spec.cap, "m")), caps: map[string]int{spec.p: int(spec.cap)}, runs: map[string]*simRun{}, conns: map[int]*simConn{}}
		w.nodes = append(w.nodes, n)
		for _, e := range w.edges {
			n.connect(e)
		}
	}
	// The first election and the nodes' connections.
	for range int(2 * time.Second / simTick) {
		w.tick()
	}
	ctx, cancel := context.WithCancel(context.Background())
	schedule(w, ctx)
	// The end: every call in flight fails, every edge stops.
	cancel()
	close(w.stop)
	w.settle()
	var wg sync.WaitGroup
	for _, e := range w.edges {
		for _, n := range w.nodes {
			n.conns[e.i].cancel()
		}
		e.svc.stop()
		wg.Add(1)
		go func() { defer wg.Done(); e.cm.close() }()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	for {
		w.settle()
		select {
		case <-done:
			if len(w.errs) > 0 {
				t.Logf("events before the first failure:%s", joinLines(w.trace[max(0, w.firstErr-80):min(len(w.trace), w.firstErr+5)]))
				return errors.New(joinLines(w.errs))
			}
			return nil
		default:
		}
		for _, e := range w.edges {
			e.clk.Advance(time.Second)
		}
		w.clk.Advance(time.Second)
	}
}

func joinLines(ls []string) string {
	out := ""
	for _, l := range ls {
		out += "\n  " + l
	}
	return out
}

// TestRegression_ClusterStalledGrantRunsOverCapacity: a follower's
// request waits at the leader, which grants it while the link between
// them stalls. The leader's nodes did not list the run for reconcileGrace
// (2 s), so it released the lease and gave the slot to its own next
// request; the stall ended before the follower judged the leader dead
// (followDeadAfter: the session TTL, 3 s by default), and the follower
// dispatched the late grant: its provider ran 3 of capacity 2. The stall
// ends the instant the leader gives the lease up, at each of several
// offsets from the leader's Follow heartbeats.
func TestRegression_ClusterStalledGrantRunsOverCapacity(t *testing.T) {
	for k := range 10 {
		t.Run(fmt.Sprintf("offset=%dms", k*int(simTick/time.Millisecond)), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				err := runClusterSim(t, 1, func(w *simWorld, ctx context.Context) {
					li := w.leaderIndex()
					fi := (li + 1) % len(w.edges)
					l, f := w.edges[li], w.edges[fi]
					for range 5 { // every slot of n1/p1 (2) and n2/p2 (3)
						w.newRequest(ctx, l)
					}
					for range 10 {
						w.tick()
					}
					w.newRequest(ctx, f) // waits at the leader
					for range 10 + k {
						w.tick()
					}
					w.setLink(w.stall, li, fi, true)
					w.completeOne() // the grant waits in the stalled link
					w.tick()
					w.newRequest(ctx, l) // waits for the slot the leader might give away
					for range int(10 * time.Second / simTick) {
						w.tick()
						if cs, _ := l.svc.Cluster(); cs.Leases == 0 {
							break
						}
					}
					w.setLink(w.stall, li, fi, false)
					for range int(2 * time.Second / simTick) {
						w.tick()
					}
					for range 8 {
						w.completeOne()
						w.tick()
					}
				})
				if err != nil {
					t.Fatal(err)
				}
			})
		})
	}
}
