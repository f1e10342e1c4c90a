package memlink

import (
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"iop/internal/wire/nodev1"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// deadline bounds every wait of these tests: generous, never a timing
// assertion.
const deadline = 10 * time.Second

// server is a NodeGatewayServer whose Run handler the test drives: each
// Run stream is handed to the test on runs, and the handler returns what
// the test sends on its stream's ret.
type server struct {
	nodev1.UnimplementedNodeGatewayServer
	runs chan *handled
}

type handled struct {
	s   grpc.BidiStreamingServer[nodev1.RunUp, nodev1.RunDown]
	ret chan error
}

func (s *server) Run(stream grpc.BidiStreamingServer[nodev1.RunUp, nodev1.RunDown]) error {
	h := &handled{s: stream, ret: make(chan error, 1)}
	s.runs <- h
	select {
	case err := <-h.ret:
		return err
	case <-stream.Context().Done():
		return stream.Context().Err()
	}
}

func newLink(t *testing.T) (*Link, *server) {
	t.Helper()
	srv := &server{runs: make(chan *handled, 16)}
	l := New(srv)
	t.Cleanup(l.Close)
	return l, srv
}

func openRun(t *testing.T, ctx context.Context, l *Link, srv *server) (grpc.BidiStreamingClient[nodev1.RunUp, nodev1.RunDown], *handled) {
	t.Helper()
	c, err := l.Run(ctx)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case h := <-srv.runs:
		return c, h
	case <-time.After(deadline):
		t.Fatal("the handler did not start")
		return nil, nil
	}
}

func recvWithin[T any](t *testing.T, recv func() (T, error)) (T, error) {
	t.Helper()
	type res struct {
		m   T
		err error
	}
	ch := make(chan res, 1)
	go func() { m, err := recv(); ch <- res{m, err} }()
	select {
	case r := <-ch:
		return r.m, r.err
	case <-time.After(deadline):
		t.Fatal("Recv did not return")
		var zero T
		return zero, nil
	}
}

// The body goes down as the edge holds it: the node gets the very slice.
// What goes up is a copy: the node reuses its buffer once Send returns.
func TestBodyDownIsHandedOverDataUpIsCopied(t *testing.T) {
	t.Parallel()
	l, srv := newLink(t)
	c, h := openRun(t, context.Background(), l, srv)

	body := []byte(`{"model":"m","messages":[]}`)
	if err := h.s.Send(&nodev1.RunDown{Msg: &nodev1.RunDown_Body{Body: &nodev1.Body{Data: body, Last: true}}}); err != nil {
		t.Fatal(err)
	}
	m, err := c.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if got := m.GetBody().GetData(); &got[0] != &body[0] || len(got) != len(body) {
		t.Fatalf("the body was copied: got %p, sent %p", &got[0], &body[0])
	}

	buf := []byte("data: one\n\n")
	if err := c.Send(&nodev1.RunUp{Msg: &nodev1.RunUp_TunnelData{TunnelData: &nodev1.TunnelData{Data: buf}}}); err != nil {
		t.Fatal(err)
	}
	ev := &nodev1.RunEvent{Type: nodev1.RunEvent_TYPE_DELTA, Text: "one"}
	up := &nodev1.RunUp{Msg: &nodev1.RunUp_Events{Events: &nodev1.RunEvents{Events: []*nodev1.RunEvent{ev}}}}
	if err := c.Send(up); err != nil {
		t.Fatal(err)
	}
	copy(buf, "XXXXXXXXXXX") // the node's next chunk in the same buffer
	ev.Text = "two"          // and its next event in the same message
	got, err := h.s.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if d := string(got.GetTunnelData().GetData()); d != "data: one\n\n" {
		t.Fatalf("tunnel data changed under the edge: %q", d)
	}
	got, err = h.s.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if s := got.GetEvents().GetEvents()[0].GetText(); s != "one" {
		t.Fatalf("event changed under the edge: %q", s)
	}
	h.ret <- nil
}

// The handler's end reaches the client after every message it sent: its
// status, or io.EOF for none; and then the client's Send says io.EOF.
func TestHandlerEndReachesClientAfterItsMessages(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		ret  error
		code codes.Code
	}{
		{"clean", nil, codes.OK},
		{"status", status.Error(codes.FailedPrecondition, "stale generation"), codes.FailedPrecondition},
		{"plain error", errors.New("boom"), codes.Unknown},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			l, srv := newLink(t)
			c, h := openRun(t, context.Background(), l, srv)
			for range 3 {
				if err := h.s.Send(&nodev1.RunDown{Msg: &nodev1.RunDown_Cancel{Cancel: &nodev1.Cancel{RunId: "r"}}}); err != nil {
					t.Fatal(err)
				}
			}
			h.ret <- tc.ret
			for i := range 3 {
				if _, err := recvWithin(t, c.Recv); err != nil {
					t.Fatalf("message %d: %v", i, err)
				}
			}
			_, err := recvWithin(t, c.Recv)
			switch {
			case tc.ret == nil && err != io.EOF:
				t.Fatalf("Recv after a clean end: %v, want io.EOF", err)
			case tc.ret != nil && status.Code(err) != tc.code:
				t.Fatalf("Recv after the handler failed: %v, want code %v", err, tc.code)
			}
			if err := c.Send(&nodev1.RunUp{}); err != io.EOF {
				t.Fatalf("Send after the end: %v, want io.EOF", err)
			}
		})
	}
}

// CloseSend ends the handler's reading after what came before.
func TestCloseSendEndsHandlerReads(t *testing.T) {
	t.Parallel()
	l, srv := newLink(t)
	c, h := openRun(t, context.Background(), l, srv)
	for _, id := range []string{"a", "b"} {
		if err := c.Send(&nodev1.RunUp{Msg: &nodev1.RunUp_Open{Open: &nodev1.RunOpen{RunId: id}}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.CloseSend(); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"a", "b"} {
		m, err := recvWithin(t, h.s.Recv)
		if err != nil || m.GetOpen().GetRunId() != want {
			t.Fatalf("Recv: %v %v, want open %q", m, err, want)
		}
	}
	if _, err := recvWithin(t, h.s.Recv); err != io.EOF {
		t.Fatalf("Recv after CloseSend: %v, want io.EOF", err)
	}
	h.ret <- nil
}

// The client's context ending cancels the handler's (its Recv fails, its
// Send fails), as a gRPC client's cancel does; the client's Recv says
// Canceled.
func TestClientCancelReachesHandler(t *testing.T) {
	t.Parallel()
	l, srv := newLink(t)
	ctx, cancel := context.WithCancel(context.Background())
	c, h := openRun(t, ctx, l, srv)
	recvErr := make(chan error, 1)
	go func() { _, err := h.s.Recv(); recvErr <- err }()
	cancel()
	select {
	case err := <-recvErr:
		if status.Code(err) != codes.Canceled {
			t.Fatalf("handler's Recv: %v, want Canceled", err)
		}
	case <-time.After(deadline):
		t.Fatal("the handler's Recv did not end with the client's context")
	}
	<-h.s.Context().Done()
	if err := h.s.Send(&nodev1.RunDown{}); status.Code(err) != codes.Canceled {
		t.Fatalf("handler's Send after the cancel: %v, want Canceled", err)
	}
	if _, err := recvWithin(t, c.Recv); status.Code(err) != codes.Canceled {
		t.Fatalf("client's Recv after its cancel: %v, want Canceled", err)
	}
}

// A client that stops reading holds up its own stream (the handler's Send
// waits once streamBuffer messages are unread) and no other.
func TestSlowReaderHoldsUpOnlyItsStream(t *testing.T) {
	t.Parallel()
	l, srv := newLink(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	_, stalled := openRun(t, ctx, l, srv)
	fast, other := openRun(t, context.Background(), l, srv)

	sent := make(chan int, streamBuffer+2)
	go func() {
		for i := 0; ; i++ {
			if stalled.s.Send(&nodev1.RunDown{Msg: &nodev1.RunDown_Body{Body: &nodev1.Body{Data: make([]byte, 1024)}}}) != nil {
				close(sent)
				return
			}
			sent <- i
		}
	}()
	for range streamBuffer {
		select {
		case <-sent:
		case <-time.After(deadline):
			t.Fatal("the stalled stream took fewer than streamBuffer messages")
		}
	}
	// The stalled stream's sender now waits; the other stream flows.
	for i := range 3 * streamBuffer {
		if err := other.s.Send(&nodev1.RunDown{Msg: &nodev1.RunDown_Cancel{Cancel: &nodev1.Cancel{}}}); err != nil {
			t.Fatal(err)
		}
		if _, err := recvWithin(t, fast.Recv); err != nil {
			t.Fatalf("message %d on the other stream: %v", i, err)
		}
	}
	select {
	case i, ok := <-sent:
		if ok {
			t.Fatalf("the stalled stream took message %d beyond its buffer of %d", i, streamBuffer)
		}
	default:
	}
	other.ret <- nil
	cancel() // ends the stalled stream: its sender's Send fails
	for range sent {
	}
}

// Close refuses new streams, ends the open ones and waits for their
// handlers.
func TestCloseEndsStreamsAndRefusesNew(t *testing.T) {
	t.Parallel()
	srv := &server{runs: make(chan *handled, 16)}
	l := New(srv)
	c, _ := openRun(t, context.Background(), l, srv)
	l.Close()
	if _, err := recvWithin(t, c.Recv); err == nil {
		t.Fatal("a stream's Recv after Close returned no error")
	}
	if _, err := l.Run(context.Background()); status.Code(err) != codes.Unavailable {
		t.Fatalf("Run after Close: %v, want Unavailable", err)
	}
	if _, err := l.Connect(context.Background()); status.Code(err) != codes.Unavailable {
		t.Fatalf("Connect after Close: %v, want Unavailable", err)
	}
}
