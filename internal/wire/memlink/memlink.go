package memlink

import (
	"context"
	"io"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"iop/internal/wire/nodev1"
)

// streamBuffer is how many messages one direction of one stream holds
// that its receiver has not read: the in-memory counterpart of a gRPC
// stream's flow-control window. A sender finding it full waits, so a slow
// reader holds up its own stream alone.
const streamBuffer = 16

// ErrClosed is the error of a stream opened on a closed Link: the edge
// behind it stopped.
var ErrClosed = status.Error(codes.Unavailable, "in-process edge link closed")

// Link is an in-memory nodev1.NodeGatewayClient whose streams are served
// by a nodev1.NodeGatewayServer in the same process: each Connect or Run
// call starts the server's handler on a goroutine of its own, with a
// stream whose messages are handed over by pointer. Messages flowing down
// (edge to node: Dispatch, Body, Cancel) are not copied, so a request body
// reaches the node as the edge holds it; those flowing up (node to edge)
// are copied (upward), because the node reuses their messages and buffers
// once Send returns, as gRPC allows.
//
// Create it with New; Close waits for every handler it started.
type Link struct {
	srv nodev1.NodeGatewayServer
	// ctx is the parent of every handler's context; Close ends it.
	ctx  context.Context
	stop context.CancelFunc

	wg     sync.WaitGroup // one per handler goroutine
	mu     sync.Mutex     // guards closed
	closed bool
}

var _ nodev1.NodeGatewayClient = (*Link)(nil)

// New returns a Link whose streams srv serves.
func New(srv nodev1.NodeGatewayServer) *Link {
	ctx, stop := context.WithCancel(context.Background())
	return &Link{srv: srv, ctx: ctx, stop: stop}
}

// Close refuses new streams (ErrClosed), ends every stream (its handler's
// context ends, as grpc.Server.Stop ends a server's streams) and waits
// until every handler the Link started has returned.
func (l *Link) Close() {
	l.mu.Lock()
	l.closed = true
	l.mu.Unlock()
	l.stop()
	l.wg.Wait()
}

// Connect opens a control stream: srv.Connect serves it.
func (l *Link) Connect(ctx context.Context, _ ...grpc.CallOption) (grpc.BidiStreamingClient[nodev1.NodeMessage, nodev1.EdgeMessage], error) {
	return open(l, ctx, cloneNodeMessage, func(s grpc.BidiStreamingServer[nodev1.NodeMessage, nodev1.EdgeMessage]) error {
		return l.srv.Connect(s)
	})
}

// Run opens a run stream: srv.Run serves it.
func (l *Link) Run(ctx context.Context, _ ...grpc.CallOption) (grpc.BidiStreamingClient[nodev1.RunUp, nodev1.RunDown], error) {
	return open(l, ctx, cloneRunUp, func(s grpc.BidiStreamingServer[nodev1.RunUp, nodev1.RunDown]) error {
		return l.srv.Run(s)
	})
}

// open starts handler on a new stream of l for a client whose context is
// ctx; up copies what the client sends.
func open[Up, Down any](l *Link, ctx context.Context, up func(*Up) *Up, handler func(grpc.BidiStreamingServer[Up, Down]) error) (*clientStream[Up, Down], error) {
	if err := ctx.Err(); err != nil {
		return nil, status.FromContextError(err).Err()
	}
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil, ErrClosed
	}
	l.wg.Add(1)
	l.mu.Unlock()
	p := &pipe[Up, Down]{
		clientCtx: ctx,
		up:        make(chan *Up, streamBuffer),
		down:      make(chan *Down, streamBuffer),
		upClosed:  make(chan struct{}),
		done:      make(chan struct{}),
		copyUp:    up,
	}
	// The handler's context is not the client's (no value crosses, as
	// none crosses a network), but it ends when the client's does, when
	// the handler returns and when the Link closes, as a gRPC server
	// stream's does.
	p.srvCtx, p.cancel = context.WithCancel(l.ctx)
	stop := context.AfterFunc(ctx, p.cancel)
	go func() {
		defer l.wg.Done()
		err := handler(&serverStream[Up, Down]{p})
		stop()
		p.err = statusOf(err)
		p.cancel()
		close(p.done)
	}()
	return &clientStream[Up, Down]{p}, nil
}

// pipe is one stream: two bounded queues of messages and the end of its
// handler. The client's goroutines own the up queue's sending side and
// the down queue's receiving side; the handler's, the others.
type pipe[Up, Down any] struct {
	clientCtx context.Context
	srvCtx    context.Context
	cancel    context.CancelFunc
	copyUp    func(*Up) *Up

	up   chan *Up
	down chan *Down
	// upClosed is closed by the client's CloseSend: the handler's Recv
	// returns io.EOF once it read what came before.
	upClosed  chan struct{}
	closeOnce sync.Once
	// done is closed when the handler returned, after err is set.
	done chan struct{}
	err  error
}

// clientStream is the node's side of a stream.
type clientStream[Up, Down any] struct{ p *pipe[Up, Down] }

var _ grpc.BidiStreamingClient[nodev1.RunUp, nodev1.RunDown] = (*clientStream[nodev1.RunUp, nodev1.RunDown])(nil)

// Send hands a copy of m to the handler. As on gRPC it returns io.EOF
// once the stream ended (Recv then says why), and blocks while the
// handler has streamBuffer messages unread.
func (c *clientStream[Up, Down]) Send(m *Up) error {
	p := c.p
	select {
	case <-p.upClosed:
		return status.Error(codes.Internal, "SendMsg called after CloseSend")
	default:
	}
	select {
	case <-p.done:
		return io.EOF
	case <-p.srvCtx.Done():
		return io.EOF
	default:
	}
	m = p.copyUp(m)
	select {
	case p.up <- m:
		return nil
	case <-p.done:
		return io.EOF
	case <-p.srvCtx.Done():
		return io.EOF
	}
}

// Recv returns the handler's next message; once the handler returned and
// every message it sent was read, its status (io.EOF for none); when the
// client's context ends first, that context's status.
func (c *clientStream[Up, Down]) Recv() (*Down, error) {
	p := c.p
	if err := p.clientCtx.Err(); err != nil {
		return nil, status.FromContextError(err).Err()
	}
	select {
	case m := <-p.down:
		return m, nil
	case <-p.done:
		select {
		case m := <-p.down: // sent before the handler returned
			return m, nil
		default:
		}
		if err := p.clientCtx.Err(); err != nil {
			return nil, status.FromContextError(err).Err()
		}
		if p.err != nil {
			return nil, p.err
		}
		return nil, io.EOF
	case <-p.clientCtx.Done():
		return nil, status.FromContextError(p.clientCtx.Err()).Err()
	}
}

// CloseSend ends the client's side: the handler's Recv returns io.EOF
// after what was sent before.
func (c *clientStream[Up, Down]) CloseSend() error {
	c.p.closeOnce.Do(func() { close(c.p.upClosed) })
	return nil
}

func (c *clientStream[Up, Down]) Context() context.Context { return c.p.clientCtx }

// Header and Trailer: the in-memory link carries no metadata.
func (c *clientStream[Up, Down]) Header() (metadata.MD, error) { return nil, nil }
func (c *clientStream[Up, Down]) Trailer() metadata.MD         { return nil }

func (c *clientStream[Up, Down]) SendMsg(m any) error {
	up, ok := m.(*Up)
	if !ok {
		return status.Errorf(codes.Internal, "memlink: cannot send %T", m)
	}
	return c.Send(up)
}

func (c *clientStream[Up, Down]) RecvMsg(m any) error {
	return status.Error(codes.Unimplemented, "memlink: RecvMsg: use Recv")
}

// serverStream is the edge's side of a stream.
type serverStream[Up, Down any] struct{ p *pipe[Up, Down] }

var _ grpc.BidiStreamingServer[nodev1.RunUp, nodev1.RunDown] = (*serverStream[nodev1.RunUp, nodev1.RunDown])(nil)

// Send hands m to the client as it is: the handler must not change it
// afterwards (the edge builds every message it sends afresh). It blocks
// while the client has streamBuffer messages unread, and fails once the
// client's context ended.
func (s *serverStream[Up, Down]) Send(m *Down) error {
	p := s.p
	if err := p.srvCtx.Err(); err != nil {
		return status.FromContextError(err).Err()
	}
	select {
	case p.down <- m:
		return nil
	case <-p.srvCtx.Done():
		return status.FromContextError(p.srvCtx.Err()).Err()
	}
}

// Recv returns the client's next message; io.EOF after CloseSend and what
// came before it; the context's status once the client's context ended.
func (s *serverStream[Up, Down]) Recv() (*Up, error) {
	p := s.p
	select {
	case m := <-p.up:
		return m, nil
	case <-p.upClosed:
		select {
		case m := <-p.up: // sent before CloseSend
			return m, nil
		default:
			return nil, io.EOF
		}
	case <-p.srvCtx.Done():
		return nil, status.FromContextError(p.srvCtx.Err()).Err()
	}
}

func (s *serverStream[Up, Down]) Context() context.Context { return s.p.srvCtx }

// SetHeader, SendHeader and SetTrailer: the in-memory link carries no
// metadata.
func (s *serverStream[Up, Down]) SetHeader(metadata.MD) error  { return nil }
func (s *serverStream[Up, Down]) SendHeader(metadata.MD) error { return nil }
func (s *serverStream[Up, Down]) SetTrailer(metadata.MD)       {}

func (s *serverStream[Up, Down]) SendMsg(m any) error {
	down, ok := m.(*Down)
	if !ok {
		return status.Errorf(codes.Internal, "memlink: cannot send %T", m)
	}
	return s.Send(down)
}

func (s *serverStream[Up, Down]) RecvMsg(m any) error {
	return status.Error(codes.Unimplemented, "memlink: RecvMsg: use Recv")
}

// statusOf is the status a handler's error err ends its stream with, as
// gRPC's server makes it: err's own status, a context error's code, else
// Unknown; nil for nil.
func statusOf(err error) error {
	if err == nil {
		return nil
	}
	if s, ok := status.FromError(err); ok {
		return s.Err()
	}
	return status.FromContextError(err).Err()
}

// cloneNodeMessage copies a control message of the node: it may reuse it.
func cloneNodeMessage(m *nodev1.NodeMessage) *nodev1.NodeMessage {
	return proto.Clone(m).(*nodev1.NodeMessage)
}

// cloneRunUp copies a run's message of the node, which reuses its
// message and its data buffer once Send returns (node.eventSink,
// node.tunnelSink): a tunnel's data chunk is one copy of its bytes, the
// rest proto.Clone.
func cloneRunUp(m *nodev1.RunUp) *nodev1.RunUp {
	if d, ok := m.GetMsg().(*nodev1.RunUp_TunnelData); ok {
		var data []byte
		if b := d.TunnelData.GetData(); b != nil {
			data = append(make([]byte, 0, len(b)), b...)
		}
		return &nodev1.RunUp{Msg: &nodev1.RunUp_TunnelData{TunnelData: &nodev1.TunnelData{Data: data}}}
	}
	return proto.Clone(m).(*nodev1.RunUp)
}
