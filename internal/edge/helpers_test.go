package edge

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"iop/internal/clock"
	"iop/internal/edge/contract"
	"iop/internal/testenv"
	"iop/internal/wire/memlink"
	"iop/internal/wire/nodev1"
)

// failsafe bounds every wait of a test on another goroutine; it is never
// reached by a passing test.
const failsafe = 10 * time.Second

// Durations of the default test config: all different, so a test can wait
// for one kind of timer to be armed. The heartbeat interval is long enough
// that advancing the clock for a dispatch timeout never fences a node.
const (
	testHeartbeat       = time.Hour
	testDispatchTimeout = 7 * time.Second
	testQueueTimeout    = 30 * time.Second
)

// testClock is a clock.Fake that counts the timers armed per duration, so
// a test can wait until a goroutine armed the timer it is about to fire.
type testClock struct {
	*clock.Fake
	mu      sync.Mutex
	armed   map[time.Duration]int
	changed chan struct{}
}

func newTestClock() *testClock {
	return &testClock{
		Fake:    clock.NewFake(time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)),
		armed:   make(map[time.Duration]int),
		changed: make(chan struct{}),
	}
}

func (c *testClock) AfterFunc(d time.Duration, f func()) clock.Timer {
	t := c.Fake.AfterFunc(d, f)
	c.mu.Lock()
	c.armed[d]++
	close(c.changed)
	c.changed = make(chan struct{})
	c.mu.Unlock()
	return t
}

// waitArmed waits until at least n timers of duration d have been armed
// since the clock was made.
func (c *testClock) waitArmed(t *testing.T, d time.Duration, n int) {
	t.Helper()
	deadline := time.After(failsafe)
	for {
		c.mu.Lock()
		got, ch := c.armed[d], c.changed
		c.mu.Unlock()
		if got >= n {
			return
		}
		select {
		case <-ch:
		case <-deadline:
			t.Fatalf("timer of %s armed %d times, want %d", d, got, n)
		}
	}
}

type testEdge struct {
	srv    *Server
	svc    *Service
	clk    *testClock
	client nodev1.NodeGatewayClient
	stop   func() error // stops Serve and returns its error
}

// testConfig is the default test config. Its MaxRetries is 0, so Dispatch
// returns once the body went down (tests of retries set it).
func testConfig() Config {
	return Config{
		MaxRetries:        new(int),
		HeartbeatInterval: testHeartbeat,
		DispatchTimeout:   testDispatchTimeout,
		// No reconnect grace: a request whose providers went away fails at
		// once (the grace has its own tests, which set it).
		Queue: QueueConfig{QueueTimeout: testQueueTimeout, ReconnectGrace: -1},
		Models: map[string]ModelConfig{
			"chat": {Targets: []string{"m-big", "m-small"}},
		},
	}
}

// withClusterListener hands deps a listener for the Admission service of
// an edge of several (cfg.Cluster without Advertise) and advertises its
// address: a port freed for the edge to bind could be taken meanwhile.
func withClusterListener(t *testing.T, cfg *Config, deps Deps) Deps {
	t.Helper()
	if cfg.Cluster != nil && cfg.Cluster.Advertise == "" {
		deps.ClusterListener = clusterListener(t)
		c := *cfg.Cluster
		c.Advertise = deps.ClusterListener.Addr().String()
		cfg.Cluster = &c
	}
	return deps
}

// startEdge serves cfg on 127.0.0.1:0 with a fake clock and dials it.
func startEdge(t *testing.T, cfg Config) *testEdge {
	t.Helper()
	clk := newTestClock()
	deps := withClusterListener(t, &cfg, Deps{Clock: clk})
	srv, err := NewServer(cfg, deps)
	if err != nil {
		t.Fatalf("NewServer: %v", err)
	}
	if cfg.Cluster != nil {
		paceClock(t, clk)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, lis) }()
	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	client := nodev1.NewNodeGatewayClient(cc)
	var ml *memlink.Link
	if linkOf(t) == linkMemory {
		ml = memlink.New(srv.NodeGateway())
		client = ml
	}
	var once sync.Once
	var serveErr error
	stop := func() error {
		once.Do(func() {
			cancel()
			serveErr = <-served
			if ml != nil {
				ml.Close()
			}
		})
		return serveErr
	}
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Errorf("Serve: %v", err)
		}
		cc.Close()
	})
	return &testEdge{srv: srv, svc: srv.Service(), clk: clk, client: client, stop: stop}
}

// waitUntil waits until cond holds for the service's snapshot, re-checking
// at every registry change.
func (e *testEdge) waitUntil(t *testing.T, what string, cond func(contract.Snapshot) bool) contract.Snapshot {
	t.Helper()
	deadline := time.After(failsafe)
	for {
		ch := e.svc.reg.changes()
		snap := e.svc.Snapshot()
		if cond(snap) {
			return snap
		}
		select {
		case <-ch:
		case <-deadline:
			t.Fatalf("timed out waiting for %s; snapshot %+v", what, snap)
		}
	}
}

func providerOf(snap contract.Snapshot, node, id string) (contract.ProviderSnapshot, bool) {
	for _, p := range snap.Providers {
		if p.NodeID == node && p.ProviderID == id {
			return p, true
		}
	}
	return contract.ProviderSnapshot{}, false
}

// inFlight returns the in-flight count of (node, provider), -1 if unknown.
func (e *testEdge) inFlight(node, id string) int {
	p, ok := providerOf(e.svc.Snapshot(), node, id)
	if !ok {
		return -1
	}
	return p.InFlight
}

func prov(id string, path nodev1.ExecutionPath, capacity int32, models ...string) *nodev1.Provider {
	return &nodev1.Provider{Id: id, Type: "sim", Models: models, Capacity: capacity, ExecutionPath: path, Healthy: true, Capabilities: []string{"stream", "cancel"}}
}

func hello(node string, providers ...*nodev1.Provider) *nodev1.Hello {
	return &nodev1.Hello{NodeId: node, Label: node + "-label", Version: "test", Providers: providers}
}

// fakeNode is a node written for tests: a Connect stream whose messages
// after Welcome are queued on msgs.
type fakeNode struct {
	e      *testEdge
	id     string
	gen    uint64
	stream grpc.BidiStreamingClient[nodev1.NodeMessage, nodev1.EdgeMessage]
	cancel context.CancelFunc
	msgs   chan *nodev1.EdgeMessage
	done   chan struct{} // closed when the stream ended; err is then set
	err    error
}

// dial opens a Connect stream and sends h; the caller reads the answer.
func (e *testEdge) dial(t *testing.T, h *nodev1.Hello) *fakeNode {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	stream, err := e.client.Connect(ctx)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(cancel)
	if err := stream.Send(&nodev1.NodeMessage{Msg: &nodev1.NodeMessage_Hello{Hello: h}}); err != nil {
		t.Fatal(err)
	}
	return &fakeNode{e: e, id: h.GetNodeId(), stream: stream, cancel: cancel, msgs: make(chan *nodev1.EdgeMessage, 1024), done: make(chan struct{})}
}

// connect connects a node that must be welcomed and waits until its
// providers are available in the scheduler.
func (e *testEdge) connect(t *testing.T, h *nodev1.Hello) *fakeNode {
	t.Helper()
	n := e.dial(t, h)
	first, err := n.stream.Recv()
	if err != nil {
		t.Fatalf("node %s: no welcome: %v", h.GetNodeId(), err)
	}
	w := first.GetWelcome()
	if w == nil {
		t.Fatalf("node %s: first message %v, want Welcome", h.GetNodeId(), first)
	}
	n.gen = w.GetGeneration()
	go n.read()
	e.waitUntil(t, "node "+n.id+" activated", func(s contract.Snapshot) bool {
		for _, hp := range h.GetProviders() {
			p, ok := providerOf(s, n.id, hp.GetId())
			if !ok || p.Generation != n.gen || p.Status != "available" {
				return false
			}
		}
		return true
	})
	return n
}

func (n *fakeNode) read() {
	defer close(n.done)
	for {
		m, err := n.stream.Recv()
		if err != nil {
			n.err = err
			return
		}
		n.msgs <- m
	}
}

// next returns the next control message that is not a heartbeat.
func (n *fakeNode) next(t *testing.T) *nodev1.EdgeMessage {
	t.Helper()
	for {
		m := n.nextAny(t)
		if m.GetHeartbeat() == nil {
			return m
		}
	}
}

func (n *fakeNode) nextAny(t *testing.T) *nodev1.EdgeMessage {
	t.Helper()
	select {
	case m := <-n.msgs:
		return m
	case <-n.done:
		t.Fatalf("node %s: control stream ended: %v", n.id, n.err)
	case <-time.After(failsafe):
		t.Fatalf("node %s: no control message", n.id)
	}
	return nil
}

func (n *fakeNode) nextDispatch(t *testing.T) *nodev1.Dispatch {
	t.Helper()
	m := n.next(t)
	if m.GetDispatch() == nil {
		t.Fatalf("node %s: got %v, want Dispatch", n.id, m)
	}
	return m.GetDispatch()
}

func (n *fakeNode) nextCancel(t *testing.T) *nodev1.Cancel {
	t.Helper()
	m := n.next(t)
	if m.GetCancel() == nil {
		t.Fatalf("node %s: got %v, want Cancel", n.id, m)
	}
	return m.GetCancel()
}

// waitClosed waits until the edge ended the control stream and returns
// its error.
func (n *fakeNode) waitClosed(t *testing.T) error {
	t.Helper()
	for {
		select {
		case <-n.msgs:
		case <-n.done:
			return n.err
		case <-time.After(failsafe):
			t.Fatalf("node %s: control stream still open", n.id)
		}
	}
}

func (n *fakeNode) send(t *testing.T, m *nodev1.NodeMessage) {
	t.Helper()
	if err := n.stream.Send(m); err != nil {
		t.Fatalf("node %s: send: %v", n.id, err)
	}
}

type runStream = grpc.BidiStreamingClient[nodev1.RunUp, nodev1.RunDown]

// openRun opens a Run stream naming runID and gen.
func (n *fakeNode) openRun(t *testing.T, runID string, gen uint64) runStream {
	t.Helper()
	return n.e.openRunAs(t, n.id, runID, gen)
}

// openRunAs opens a Run stream naming node, runID and gen.
func (e *testEdge) openRunAs(t *testing.T, node, runID string, gen uint64) runStream {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	rs, err := e.client.Run(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := rs.Send(&nodev1.RunUp{Msg: &nodev1.RunUp_Open{Open: &nodev1.RunOpen{RunId: runID, NodeId: node, Generation: gen}}}); err != nil {
		t.Fatal(err)
	}
	return rs
}

// readBody returns the request body of d's run, once the edge attached
// the run stream rs: d's own when it came inline (sizes nil: nothing is
// read from rs; it waits until the edge opened the run (r.opened: a node
// lost before that counts as a dispatch that never reached the provider,
// TestRetryWhenNodeLostBeforeFirstByte failed 1 in 30 when it waited for
// the attach alone) or ended it),
// else the Body chunks read from rs until the last one, with their sizes.
func (e *testEdge) readBody(t *testing.T, d *nodev1.Dispatch, rs runStream) ([]byte, []int) {
	t.Helper()
	if d.GetBodyInline() {
		waitFor(t, func() bool {
			r := e.svc.run(d.GetRunId())
			if r == nil {
				return true
			}
			select {
			case <-r.opened: // attached, and RunStarted published
				return true
			case <-r.ended:
				return true
			default:
				return false
			}
		})
		return d.GetBody(), nil
	}
	var body []byte
	var sizes []int
	for {
		m, err := rs.Recv()
		if err != nil {
			t.Fatalf("reading body: %v", err)
		}
		b := m.GetBody()
		if b == nil {
			t.Fatalf("got %v, want Body", m)
		}
		body = append(body, b.GetData()...)
		sizes = append(sizes, len(b.GetData()))
		if b.GetLast() {
			return body, sizes
		}
	}
}

func sendUp(t *testing.T, rs runStream, m *nodev1.RunUp) {
	t.Helper()
	if err := rs.Send(m); err != nil {
		t.Fatalf("run send: %v", err)
	}
}

func events(evs ...*nodev1.RunEvent) *nodev1.RunUp {
	return &nodev1.RunUp{Msg: &nodev1.RunUp_Events{Events: &nodev1.RunEvents{Events: evs}}}
}

func event(typ nodev1.RunEvent_Type, text string) *nodev1.RunEvent {
	return &nodev1.RunEvent{Type: typ, Text: text}
}

// drainRun reads the run stream until the edge ends it and returns what
// came down and the end error (io.EOF for a clean end).
func drainRun(t *testing.T, rs runStream) ([]*nodev1.RunDown, error) {
	t.Helper()
	var got []*nodev1.RunDown
	for {
		m, err := rs.Recv()
		if err != nil {
			return got, err
		}
		got = append(got, m)
	}
}

type dispatched struct {
	run *Run
	err error
}

// dispatchAsync runs Dispatch on its own goroutine.
func (e *testEdge) dispatchAsync(ctx context.Context, req contract.Request) <-chan dispatched {
	ch := make(chan dispatched, 1)
	go func() {
		r, err := e.svc.Dispatch(ctx, req)
		ch <- dispatched{r, err}
	}()
	return ch
}

func wait[T any](t *testing.T, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(failsafe):
		t.Fatal("timed out")
	}
	var zero T
	return zero
}

// startRun dispatches req, lets node open the run and read its body, and
// returns the run, its stream and the Dispatch message.
func (e *testEdge) startRun(t *testing.T, n *fakeNode, req contract.Request) (*Run, runStream, *nodev1.Dispatch) {
	t.Helper()
	return n.acceptRun(t, e.dispatchAsync(context.Background(), req))
}

// acceptRun plays the node's part in the dispatch res waits for: it takes
// the next Dispatch, opens its run stream and reads the body; it returns
// the run Dispatch returned, its stream and the Dispatch.
func (n *fakeNode) acceptRun(t *testing.T, res <-chan dispatched) (*Run, runStream, *nodev1.Dispatch) {
	t.Helper()
	d := n.nextDispatch(t)
	rs := n.openRun(t, d.GetRunId(), n.gen)
	n.e.readBody(t, d, rs)
	got := wait(t, res)
	if got.err != nil {
		t.Fatalf("Dispatch: %v", got.err)
	}
	t.Cleanup(func() { got.run.Close("test cleanup") })
	return got.run, rs, d
}

func chatReq(model string) contract.Request {
	return contract.Request{Model: model, Operation: contract.OperationChat, Stream: true, Body: []byte(`{"model":"` + model + `"}`)}
}

// recvAll reads the run until an error, returning the messages and the error.
func recvAll(r *Run) ([]contract.Message, error) {
	var got []contract.Message
	for {
		m, err := r.Recv()
		if err != nil {
			return got, err
		}
		got = append(got, m)
	}
}

// decoded is m as Recv hands it on.
func decoded(m *nodev1.RunUp) contract.Message {
	d, _ := DecodeRunUp(m)
	return d
}

// first is m's first event (a tunnel message's Part); the zero Event when
// it has none.
func first(m contract.Message) contract.Event {
	if m.Tunnel {
		return m.Part
	}
	if len(m.Events) == 0 {
		return contract.Event{}
	}
	return m.Events[0]
}

// waitFor polls cond until it holds, failing after the failsafe.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	testenv.Eventually(t, "the condition", cond)
}
