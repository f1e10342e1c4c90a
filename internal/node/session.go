package node

import (
	"context"
	"fmt"
	"sync"
	"time"

	"iop/internal/clock"
	"iop/internal/wire/nodev1"
)

// outQueue is the capacity of a connection's queue of control messages to
// the edge (heartbeats, dispatch refusals, provider updates).
const outQueue = 64

// conn is one Connect stream, from Hello until it ends. Its context is the
// parent of every run it dispatched, so ending it cancels them all.
type conn struct {
	a      *Agent
	client nodev1.NodeGatewayClient
	ctx    context.Context // ends when the connection does
	cancel context.CancelCauseFunc
	out    chan *nodev1.NodeMessage // control messages for the writer goroutine
	gen    uint64                   // written once, after Welcome, before any dispatch
	runWG  sync.WaitGroup           // one per run goroutine

	mu   sync.Mutex      // guards the fields below
	runs map[string]*run // in-flight runs by run id
}

// session runs one connection: Connect, Hello, Welcome, then heartbeats and
// dispatches until the connection ends. It returns whether the edge
// welcomed the node and why the connection ended, after every goroutine of
// the connection (reader, writer, runs) has finished.
func (a *Agent) session(ctx context.Context, client nodev1.NodeGatewayClient) (welcomed bool, err error) {
	cctx, cancel := context.WithCancelCause(ctx)
	c := &conn{a: a, client: client, ctx: cctx, cancel: cancel,
		out: make(chan *nodev1.NodeMessage, outQueue), runs: make(map[string]*run)}
	var wg sync.WaitGroup // reader and writer
	defer func() {
		cancel(err) // ends the stream and every run of this connection
		c.runWG.Wait()
		wg.Wait()
	}()

	stream, err := client.Connect(cctx)
	if err != nil {
		return false, fmt.Errorf("%w: %w", ErrConnectionLost, err)
	}
	// The Hello says what is advertised now; later changes of an advert go
	// as ProviderUpdates (sent holds the versions the edge knows).
	hello, sent, advChanged := a.helloNow()
	if err := stream.Send(&nodev1.NodeMessage{Msg: &nodev1.NodeMessage_Hello{Hello: hello}}); err != nil {
		_, err = stream.Recv() // the stream's real status
		return false, fmt.Errorf("%w: send hello: %w", ErrConnectionLost, err)
	}

	msgs := make(chan *nodev1.EdgeMessage)
	recvErr := make(chan error, 1)
	wg.Add(2)
	go func() { // reader: the only caller of stream.Recv
		defer wg.Done()
		for {
			m, err := stream.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			select {
			case msgs <- m:
			case <-cctx.Done():
				return
			}
		}
	}()
	go func() { // writer: the only caller of stream.Send from here on
		defer wg.Done()
		for {
			select {
			case m := <-c.out:
				if err := stream.Send(m); err != nil {
					cancel(fmt.Errorf("%w: send: %w", ErrConnectionLost, err))
					return
				}
			case <-cctx.Done():
				return
			}
		}
	}()

	// Hello -> Welcome | HelloRefused, within helloTimeout.
	helloTimer := a.clock.AfterFunc(helloTimeout, func() { cancel(ErrWelcomeTimeout) })
	var w *nodev1.Welcome
	select {
	case m := <-msgs:
		helloTimer.Stop()
		switch x := m.Msg.(type) {
		case *nodev1.EdgeMessage_Welcome:
			w = x.Welcome
		case *nodev1.EdgeMessage_HelloRefused:
			return false, fmt.Errorf("%w: %s", ErrHelloRefused, x.HelloRefused.Reason)
		default:
			return false, fmt.Errorf("%w: %T before welcome", ErrProtocol, m.Msg)
		}
	case err := <-recvErr:
		helloTimer.Stop()
		return false, fmt.Errorf("%w: %w", ErrConnectionLost, err)
	case <-cctx.Done():
		helloTimer.Stop()
		return false, context.Cause(cctx) // ErrWelcomeTimeout, or why ctx ended
	}

	interval := time.Duration(w.HeartbeatIntervalMs) * time.Millisecond
	if interval <= 0 {
		interval = DefaultHeartbeatInterval
	}
	// One heartbeat timer at a time, armed by this goroutine only: after
	// Welcome and after each tick. Its callback never blocks.
	ticks := make(chan struct{}, 1)
	var tick clock.Timer
	arm := func() {
		tick = a.clock.AfterFunc(interval, func() {
			select {
			case ticks <- struct{}{}:
			default:
			}
		})
	}
	// Silence counts from the instant the first tick is armed, so a clock
	// that moves between the two cannot stretch the window.
	lastHeard := a.clock.Now()
	arm()
	defer func() { tick.Stop() }()
	c.gen = w.Generation
	a.setGeneration(c.gen)
	defer a.setGeneration(0)
	a.readyOnce.Do(func() { close(a.ready) })
	a.logger.Info("connected to edge", "edge", a.cfg.Edge, "generation", c.gen, "heartbeat", interval)

	for {
		select {
		case m := <-msgs:
			lastHeard = a.clock.Now()
			c.handle(m)
		case <-advChanged:
			var updates []*nodev1.ProviderUpdate
			updates, advChanged = a.updatesSince(sent)
			for _, u := range updates {
				m := &nodev1.NodeMessage{Msg: &nodev1.NodeMessage_ProviderUpdate{ProviderUpdate: u}}
				select {
				case c.out <- m:
				case <-cctx.Done():
					return true, context.Cause(cctx)
				}
			}
		case <-ticks:
			now := a.clock.Now()
			if now.Sub(lastHeard) >= missedHeartbeats*interval {
				return true, fmt.Errorf("%w: silent for %v", ErrHeartbeatTimeout, now.Sub(lastHeard))
			}
			select {
			case c.out <- &nodev1.NodeMessage{Msg: &nodev1.NodeMessage_Heartbeat{Heartbeat: &nodev1.Heartbeat{UnixNano: now.UnixNano()}}}:
			default: // the writer is stuck; the edge's silence will end us
			}
			arm()
		case err := <-recvErr:
			return true, fmt.Errorf("%w: %w", ErrConnectionLost, err)
		case <-cctx.Done():
			return true, context.Cause(cctx)
		}
	}
}

// handle acts on one message from the edge after Welcome. Any message
// counts as a sign of life; heartbeats need nothing more.
func (c *conn) handle(m *nodev1.EdgeMessage) {
	switch x := m.Msg.(type) {
	case *nodev1.EdgeMessage_Heartbeat:
	case *nodev1.EdgeMessage_Dispatch:
		c.dispatch(x.Dispatch)
	case *nodev1.EdgeMessage_Cancel:
		c.cancelRun(x.Cancel.RunId, x.Cancel.Reason)
	default:
		c.a.logger.Warn("ignoring unexpected message from edge", "type", fmt.Sprintf("%T", m.Msg), "generation", c.gen)
	}
}

// refuse tells the edge the node will not run runID.
func (c *conn) refuse(runID string, reason error) {
	c.a.logger.Warn("refusing dispatch", "run_id", runID, "reason", reason, "generation", c.gen)
	m := &nodev1.NodeMessage{Msg: &nodev1.NodeMessage_DispatchRefused{
		DispatchRefused: &nodev1.DispatchRefused{RunId: runID, Reason: reason.Error()}}}
	select {
	case c.out <- m:
	case <-c.ctx.Done():
	}
}
