package node

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"iop/internal/clock"
	"iop/internal/wire/nodev1"
)

// flushTimeout bounds how long a drained connection waits for its last
// control messages (the Drain, refusals) to be sent before it closes.
const flushTimeout = 2 * time.Second

// outQueue is the capacity of a connection's queue of control messages to
// the edge (heartbeats, dispatch refusals, provider updates).
const outQueue = 64

// conn is one Connect stream, from Hello until it ends. Its context is the
// parent of every run it dispatched, so ending it cancels them all.
type conn struct {
	a      *Agent
	l      *link // the edge this connection is to
	client nodev1.NodeGatewayClient
	ctx    context.Context // ends when the connection does
	cancel context.CancelCauseFunc
	out    chan *nodev1.NodeMessage // control messages for the writer goroutine
	gen    uint64                   // written once, after Welcome, before any dispatch
	// headBody: the edge reads TunnelHead's data, end and content_length
	// (Welcome.features has nodev1.FeatureTunnelHeadBody). Written once with gen.
	headBody bool
	runWG    sync.WaitGroup // one per run goroutine
	auxWG    sync.WaitGroup // one per goroutine serving a ShowRequest or ResidencyRequest
	// shows holds a token per ShowRequest being served (at most maxShows).
	shows chan struct{}
	// runEnded has one slot; a run goroutine fills it when it leaves runs
	// (or its terminal frame was read) while the connection drains.
	runEnded chan struct{}

	mu   sync.Mutex      // guards the fields below
	runs map[string]*run // in-flight runs by run id
	// draining: the edge was told Drain; dispatches are refused. Written
	// by the session goroutine only.
	draining bool
	// warm counts the connection's warm Run streams opening or waiting for
	// a Dispatch (warm.go).
	warm int
	// unread counts the runs that sent their terminal frame up a warm
	// stream the edge has not yet ended or reused (finishWarm): no runs in
	// flight, but their answers may still be on their way, so a drain
	// waits for them too.
	unread int
}

// session runs one connection: Connect, Hello, Welcome, then heartbeats and
// dispatches until the connection ends. It returns whether the edge
// welcomed the node and why the connection ended, after every goroutine of
// the connection (reader, writer, runs) has finished.
func (a *Agent) session(ctx context.Context, l *link, client nodev1.NodeGatewayClient) (welcomed bool, err error) {
	cctx, cancel := context.WithCancelCause(ctx)
	c := &conn{a: a, l: l, client: client, ctx: cctx, cancel: cancel,
		out: make(chan *nodev1.NodeMessage, outQueue), runEnded: make(chan struct{}, 1), runs: make(map[string]*run),
		shows: make(chan struct{}, maxShows)}
	var wg sync.WaitGroup // reader and writer
	defer func() {
		cancel(err) // ends the stream and every run of this connection
		c.runWG.Wait()
		c.auxWG.Wait()
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
	flush := make(chan struct{})
	go func() { // writer: the only caller of stream.Send from here on
		defer wg.Done()
		for {
			select {
			case m := <-c.out:
				if err := stream.Send(m); err != nil {
					cancel(fmt.Errorf("%w: send: %w", ErrConnectionLost, err))
					return
				}
			case <-flush: // the connection ends: send what is queued, then half-close
				for {
					select {
					case m := <-c.out:
						if stream.Send(m) != nil {
							return
						}
					default:
						_ = stream.CloseSend()
						return
					}
				}
			case <-cctx.Done():
				return
			}
		}
	}()
	// drained ends the connection after a drain, gracefully: the Drain and
	// any refusal still queued go out, the node half-closes the stream and
	// the edge ends it, within flushTimeout. (Cancelling the stream at
	// once would drop what gRPC had not yet written.)
	drained := func() (bool, error) {
		close(flush)
		timeout := make(chan struct{})
		t := a.clock.AfterFunc(flushTimeout, func() { close(timeout) })
		defer t.Stop()
		for {
			select {
			case <-msgs: // late: the edge ends a dispatch sent now with the connection
				continue
			case <-recvErr: // the edge ended the stream
			case <-timeout:
			case <-cctx.Done():
			}
			return true, ErrDrained
		}
	}

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
	case <-l.draining:
		helloTimer.Stop()
		return false, ErrDrained // nothing in flight yet
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
	c.headBody = slices.Contains(w.GetFeatures(), nodev1.FeatureTunnelHeadBody)
	a.setGeneration(l, c.gen)
	defer a.setGeneration(l, 0)
	a.readyOnce.Do(func() { close(a.ready) })
	l.logger.Info("connected to edge", "generation", c.gen, "heartbeat", interval)
	c.refillWarm()

	drain := l.draining // nil once the drain began on this connection
	// idleAtDrain: no run was in flight when the drain began (the node
	// then waits only for the edge to have read the answers of runs that
	// just finished: c.unread).
	idleAtDrain := false
	for {
		select {
		case <-drain:
			drain = nil
			idleAtDrain = c.startDrain()
			if c.drainDone() {
				a.logger.Info("drained: no run in flight; disconnecting", "generation", c.gen)
				return drained()
			}
		case <-c.runEnded:
			if c.drainDone() {
				if idleAtDrain {
					a.logger.Info("drained: no run in flight; disconnecting", "generation", c.gen)
				} else {
					a.logger.Info("drained: every run in flight finished; disconnecting", "generation", c.gen)
				}
				return drained()
			}
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
			case c.out <- &nodev1.NodeMessage{Msg: &nodev1.NodeMessage_Heartbeat{Heartbeat: &nodev1.Heartbeat{UnixNano: now.UnixNano(), Runs: a.inflight.list(), RunsSet: true}}}:
			default: // the writer is stuck; the edge's silence will end us
			}
			arm()
		case err := <-recvErr:
			return true, fmt.Errorf("%w: %w", ErrConnectionLost, err)
		case <-cctx.Done():
			if cause := context.Cause(cctx); errors.Is(cause, ErrDrainTimeout) {
				a.logger.Warn("drain grace period over: aborting the runs still in flight", "runs", c.inFlight(), "grace", a.cfg.DrainTimeout, "generation", c.gen)
			}
			return true, context.Cause(cctx)
		}
	}
}

// startDrain begins the drain on this connection: from now on dispatches
// are refused, and the edge is told (Drain, ahead of any refusal on the
// control stream). It reports whether no run is in flight, so the
// connection may end at once.
func (c *conn) startDrain() (idle bool) {
	c.mu.Lock()
	c.draining = true
	n := 0
	for _, r := range c.runs {
		if !r.over.Load() { // a run sending its last frame is over
			n++
		}
	}
	c.mu.Unlock()
	c.a.logger.Info("draining: the edge is told, no more dispatches are taken, the runs in flight may finish",
		"edge", c.l.addr, "reason", c.l.drainReason, "runs_in_flight", n, "drain_timeout", c.a.cfg.DrainTimeout, "generation", c.gen)
	m := &nodev1.NodeMessage{Msg: &nodev1.NodeMessage_Drain{Drain: &nodev1.Drain{Reason: c.l.drainReason}}}
	select {
	case c.out <- m:
	case <-c.ctx.Done():
	}
	return n == 0
}

// drainDone reports whether a drain began, no run is in flight, and the
// edge read the last frame of every run that finished (c.unread).
func (c *conn) drainDone() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.draining && len(c.runs) == 0 && c.unread == 0
}

// inFlight counts the runs of the connection not yet finished.
func (c *conn) inFlight() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.runs)
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
	case *nodev1.EdgeMessage_ShowRequest:
		c.serveShow(x.ShowRequest)
	case *nodev1.EdgeMessage_ResidencyRequest:
		c.serveResidency(x.ResidencyRequest)
	case *nodev1.EdgeMessage_RunsRequest:
		// A new scheduler leader: from now on its epoch fences the old
		// one's dispatches; it counts the runs in flight before admitting.
		c.a.inflight.raise(x.RunsRequest.GetEpoch())
		m := &nodev1.NodeMessage{Msg: &nodev1.NodeMessage_RunsReport{RunsReport: &nodev1.RunsReport{Epoch: x.RunsRequest.GetEpoch(), Runs: c.a.inflight.list()}}}
		select {
		case c.out <- m:
		case <-c.ctx.Done():
		}
	default:
		c.a.logger.Warn("ignoring unexpected message from edge", "type", fmt.Sprintf("%T", m.Msg), "generation", c.gen)
	}
}

// refuse tells the edge the node will not run runID.
func (c *conn) refuse(runID string, reason error) {
	c.a.logger.Warn("refusing dispatch", "run_id", runID, "reason", reason, "generation", c.gen)
	m := &nodev1.NodeMessage{Msg: &nodev1.NodeMessage_DispatchRefused{
		DispatchRefused: &nodev1.DispatchRefused{RunId: runID, Reason: reason.Error(), Busy: errors.Is(reason, ErrProviderBusy), StaleEpoch: staleEpochOf(reason),
			Draining: errors.Is(reason, ErrDraining)}}}
	select {
	case c.out <- m:
	case <-c.ctx.Done():
	}
}
