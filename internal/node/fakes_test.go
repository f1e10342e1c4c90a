package node

import (
	"google.golang.org/protobuf/proto"

	"context"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"iop/internal/clock"
	"iop/internal/wire/nodev1"
)

// failsafe bounds every wait in these tests so a bug fails instead of
// hanging; no test depends on it for its outcome.
const failsafe = 10 * time.Second

// recv returns the next value from ch, failing the test if none comes.
func recv[T any](t testing.TB, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(failsafe):
		t.Fatalf("timed out waiting for %s", what)
		panic("unreachable")
	}
}

// ---- fake clock ----

// testClock is a clock.Fake that reports the duration of every timer the
// agent arms, after arming it, so a test can wait for the agent to be
// waiting before it advances time.
type testClock struct {
	*clock.Fake
	created chan time.Duration
}

func newTestClock() *testClock {
	return &testClock{Fake: clock.NewFake(time.Unix(1_700_000_000, 0)), created: make(chan time.Duration, 1024)}
}

func (c *testClock) AfterFunc(d time.Duration, f func()) clock.Timer {
	t := c.Fake.AfterFunc(d, f)
	c.created <- d
	return t
}

// waitArmed waits until the agent arms a timer of d, skipping any other.
func (c *testClock) waitArmed(t *testing.T, d time.Duration) {
	t.Helper()
	for recv(t, c.created, "timer") != d {
	}
}

// ---- fake edge ----

// fakeEdge is a minimal NodeGateway server driven by the test: it hands
// every Connect stream (after its Hello) and every Run stream (after its
// RunOpen) to the test. A warm Run stream (RunOpen.idle) goes on warm,
// or, when warm is nil (startEdge), is refused as an edge without warm
// streams refuses it (NotFound: no pending run), which the node does not
// retry.
type fakeEdge struct {
	nodev1.UnimplementedNodeGatewayServer
	conns chan *edgeConn
	runs  chan *edgeRun
	warm  chan *edgeRun
}

// edgeConn is one Connect stream as the edge sees it. Only the test sends.
type edgeConn struct {
	// hello is the Hello without what it says of residency (Provider.loaded
	// and loaded_set: their first reading races the Hello); rawHello is
	// the Hello as sent.
	hello, rawHello *nodev1.Hello
	stream          grpc.BidiStreamingServer[nodev1.NodeMessage, nodev1.EdgeMessage]
	// in has every message after Hello but residency updates (a
	// ProviderUpdate that carries loaded models and nothing else), which
	// go to loaded: tests of other things need not expect them.
	in     chan *nodev1.NodeMessage
	loaded chan *nodev1.ProviderUpdate
	end    chan error    // the handler returns what is sent here
	done   chan struct{} // closed when the stream ended
}

// edgeRun is one Run stream as the edge sees it. Only the test sends.
type edgeRun struct {
	open   *nodev1.RunOpen
	stream grpc.BidiStreamingServer[nodev1.RunUp, nodev1.RunDown]
	up     chan *nodev1.RunUp // unbuffered: an unread run backpressures the node; closed at the node's half-close
	end    chan error
	// recvErr is why the stream's messages ended (io.EOF: the node
	// half-closed it); set before up is closed.
	recvErr error
}

func startEdge(t testing.TB) (*fakeEdge, string) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	e := &fakeEdge{conns: make(chan *edgeConn, 16), runs: make(chan *edgeRun, 16)}
	nodev1.RegisterNodeGatewayServer(srv, e)
	served := make(chan struct{})
	go func() { defer close(served); srv.Serve(lis) }()
	t.Cleanup(func() { srv.Stop(); <-served })
	return e, lis.Addr().String()
}

func (e *fakeEdge) Connect(s grpc.BidiStreamingServer[nodev1.NodeMessage, nodev1.EdgeMessage]) error {
	m, err := s.Recv()
	if err != nil {
		return err
	}
	hello := proto.Clone(m.GetHello()).(*nodev1.Hello)
	for _, p := range hello.GetProviders() {
		p.Loaded, p.LoadedSet = nil, false
	}
	c := &edgeConn{hello: hello, rawHello: m.GetHello(), stream: s, in: make(chan *nodev1.NodeMessage, 256),
		loaded: make(chan *nodev1.ProviderUpdate, 256), end: make(chan error, 1), done: make(chan struct{})}
	defer close(c.done)
	ctx := s.Context()
	halfClosed := make(chan struct{})
	go func() {
		for {
			m, err := s.Recv()
			if err != nil {
				if err == io.EOF {
					close(halfClosed)
				}
				return
			}
			in := c.in
			if u := m.GetProviderUpdate(); u != nil && u.GetLoadedSet() && !u.GetModelsSet() && u.GetCapacity() == 0 && u.GetLongCapacity() == 0 {
				select {
				case c.loaded <- u:
				default: // a test that reads none
				}
				continue
			}
			select {
			case in <- m:
			case <-ctx.Done():
				return
			}
		}
	}()
	select {
	case e.conns <- c:
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case err := <-c.end:
		return err
	case <-halfClosed: // like the real edge: a node that half-closes is gone
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (e *fakeEdge) Run(s grpc.BidiStreamingServer[nodev1.RunUp, nodev1.RunDown]) error {
	m, err := s.Recv()
	if err != nil {
		return err
	}
	if m.GetOpen().GetIdle() && e.warm == nil {
		return status.Error(codes.NotFound, "run is not pending")
	}
	r := &edgeRun{open: m.GetOpen(), stream: s, up: make(chan *nodev1.RunUp), end: make(chan error, 1)}
	ctx := s.Context()
	runs := e.runs
	if r.open.GetIdle() {
		runs = e.warm
	}
	halfClosed := make(chan struct{})
	go func() {
		defer close(r.up)
		for {
			m, err := s.Recv()
			if err != nil {
				r.recvErr = err
				close(halfClosed)
				return
			}
			select {
			case r.up <- m:
			case <-ctx.Done():
				r.recvErr = ctx.Err()
				return
			}
		}
	}()
	select {
	case runs <- r:
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case err := <-r.end:
		return err
	case <-halfClosed: // like the real edge: the run is over when the node half-closes
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (c *edgeConn) send(t testing.TB, m *nodev1.EdgeMessage) {
	t.Helper()
	if err := c.stream.Send(m); err != nil {
		t.Fatalf("edge send: %v", err)
	}
}

// welcome welcomes the node as today's edge does, with its features.
func (c *edgeConn) welcome(t testing.TB, gen uint64, interval time.Duration) {
	t.Helper()
	c.welcomeWith(t, gen, interval, nodev1.FeatureTunnelHeadBody)
}

// welcomeWith welcomes the node naming only features: none is an edge
// older than every feature.
func (c *edgeConn) welcomeWith(t testing.TB, gen uint64, interval time.Duration, features ...string) {
	t.Helper()
	c.send(t, &nodev1.EdgeMessage{Msg: &nodev1.EdgeMessage_Welcome{Welcome: &nodev1.Welcome{Generation: gen, HeartbeatIntervalMs: interval.Milliseconds(), Features: features}}})
}

// next returns the next message from the node that is not a heartbeat.
func (c *edgeConn) next(t *testing.T) *nodev1.NodeMessage {
	t.Helper()
	for {
		m := recv(t, c.in, "node message")
		if m.GetHeartbeat() == nil {
			return m
		}
	}
}

// nextHeartbeat returns the next heartbeat from the node.
func (c *edgeConn) nextHeartbeat(t *testing.T) *nodev1.Heartbeat {
	t.Helper()
	for {
		if hb := recv(t, c.in, "heartbeat").GetHeartbeat(); hb != nil {
			return hb
		}
	}
}

func (r *edgeRun) sendBody(t *testing.T, chunks ...string) {
	t.Helper()
	for i, c := range chunks {
		m := &nodev1.RunDown{Msg: &nodev1.RunDown_Body{Body: &nodev1.Body{Data: []byte(c), Last: i == len(chunks)-1}}}
		if err := r.stream.Send(m); err != nil {
			t.Fatalf("edge send body: %v", err)
		}
	}
}

// next returns the node's next message on the run, or nil once the node
// half-closed.
func (r *edgeRun) next(t *testing.T) *nodev1.RunUp {
	t.Helper()
	return recv(t, r.up, "run message")
}

// rest returns the node's messages until it half-closes.
func (r *edgeRun) rest(t *testing.T) []*nodev1.RunUp {
	t.Helper()
	var out []*nodev1.RunUp
	for m := r.next(t); m != nil; m = r.next(t) {
		out = append(out, m)
	}
	return out
}

// tunnelAnswer reads a tunnel run's messages as node.proto defines them:
// a TunnelHead (which may carry the body's start, or all of it with end),
// TunnelData chunks, and a TunnelEnd; body is what the head and the data
// carried, complete whether the answer ended cleanly (a TunnelEnd without
// provider_error, or a head with end, as the last message).
func tunnelAnswer(msgs []*nodev1.RunUp) (head *nodev1.TunnelHead, body string, complete bool) {
	for i, m := range msgs {
		last := i == len(msgs)-1
		switch {
		case m.GetTunnelHead() != nil:
			if head != nil {
				return head, body, false // a second head
			}
			head = m.GetTunnelHead()
			body += string(head.GetData())
			complete = last && head.GetEnd()
		case m.GetTunnelData() != nil:
			body += string(m.GetTunnelData().GetData())
		case m.GetTunnelEnd() != nil:
			complete = last && head != nil && !head.GetEnd() && m.GetTunnelEnd().GetProviderError() == ""
		}
	}
	return head, body, complete
}

// ---- agent ----

// logRecorder is a slog.Handler that keeps every record.
type logRecorder struct {
	mu      sync.Mutex
	records []slog.Record
}

func (h *logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (h *logRecorder) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *logRecorder) WithGroup(string) slog.Handler            { return h }
func (h *logRecorder) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.records = append(h.records, r.Clone())
	return nil
}

func (h *logRecorder) find(level slog.Level, attrSubstr string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, r := range h.records {
		if r.Level != level {
			continue
		}
		found := false
		r.Attrs(func(a slog.Attr) bool {
			if strings.Contains(a.Value.String(), attrSubstr) {
				found = true
			}
			return !found
		})
		if found {
			return true
		}
	}
	return false
}

// hasMessage reports whether a record with message msg was logged.
func (h *logRecorder) hasMessage(msg string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, r := range h.records {
		if r.Message == msg {
			return true
		}
	}
	return false
}

// startAgent builds an agent for cfg on clk, with backoff jitter turned off
// (every wait is its ceiling), and runs it until the test ends.
func startAgent(t testing.TB, cfg Config, clk clock.Clock, logs slog.Handler) *Agent {
	t.Helper()
	return startAgentWith(t, cfg, clk, logs, nil)
}

// startAgentWith is startAgent that lets setup change the agent before it
// runs. The agent reads no provider's /api/ps (noResidency) unless setup
// says otherwise.
func startAgentWith(t testing.TB, cfg Config, clk clock.Clock, logs slog.Handler, setup func(*Agent)) *Agent {
	t.Helper()
	if logs == nil {
		logs = slog.DiscardHandler
	}
	a, err := New(cfg, slog.New(logs), WithClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	a.jitter = func(d time.Duration) time.Duration { return d }
	a.noResidency = true
	if setup != nil {
		setup(a)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := recv(t, done, "Run to return"); err != nil {
			t.Errorf("Run returned %v, want nil", err)
		}
	})
	return a
}

// waitGeneration waits until a.Generation() == want.
func waitGeneration(t *testing.T, a *Agent, want uint64) {
	t.Helper()
	deadline := time.After(failsafe)
	for {
		changed := a.generationChanged()
		if a.Generation() == want {
			return
		}
		select {
		case <-changed:
		case <-deadline:
			t.Fatalf("generation %d, want %d", a.Generation(), want)
		}
	}
}
