package edge

import (
	"errors"
	"fmt"
	"io"
	"time"

	"iop/internal/edge/lifecycle"
	"iop/internal/wire/nodev1"
)

// grpcServer is the edge's side of the NodeGateway service.
type grpcServer struct {
	nodev1.UnimplementedNodeGatewayServer
	s *Service
}

var _ nodev1.NodeGatewayServer = (*grpcServer)(nil)

// Connect serves one node's control stream: Hello → Welcome (or
// HelloRefused and the end of the stream), then heartbeats, provider
// updates, dispatch refusals up and dispatches, cancels down, until the
// stream ends, 3 heartbeat intervals pass without a message from the node,
// a newer connection of the node replaces it, or the edge stops. Its end
// fences the connection's generation.
func (g *grpcServer) Connect(stream nodev1.NodeGateway_ConnectServer) error {
	err := g.s.serveConn(stream)
	if err != nil && !errors.Is(err, io.EOF) {
		return grpcError(err)
	}
	return nil
}

// Run serves one run's stream: its first message is RunOpen naming a
// pending run and the generation it was dispatched on; then the body goes
// down (unless it went inline in the Dispatch) and the caller of Run.Recv reads the node's messages directly from
// this stream. The handler returns when the run ends.
func (g *grpcServer) Run(stream nodev1.NodeGateway_RunServer) error {
	return grpcError(g.s.serveRun(stream))
}

// edgeFeatures are the Welcome features this edge reads (node.proto).
var edgeFeatures = []string{nodev1.FeatureTunnelHeadBody}

// received is one result of the control stream's reader goroutine.
type received struct {
	msg *nodev1.NodeMessage
	err error
}

func (s *Service) serveConn(stream nodev1.NodeGateway_ConnectServer) error {
	ctx := stream.Context()
	in := make(chan received)
	done := make(chan struct{})
	defer close(done)
	// The reader: the only caller of stream.Recv. It ends when the stream
	// does, which happens once this handler returns.
	go func() {
		for {
			m, err := stream.Recv()
			select {
			case in <- received{m, err}:
			case <-done:
				return
			}
			if err != nil {
				return
			}
		}
	}()

	hb := s.cfg.HeartbeatInterval
	helloTimeout := make(chan struct{})
	helloTimer := s.clock.AfterFunc(3*hb, func() { close(helloTimeout) })
	defer helloTimer.Stop()
	var hello *nodev1.Hello
	select {
	case r := <-in:
		if r.err != nil {
			return r.err
		}
		if hello = r.msg.GetHello(); hello == nil {
			return fmt.Errorf("%w: first message is not Hello", errHelloInvalid)
		}
	case <-helloTimeout:
		return errHelloTimeout
	case <-ctx.Done():
		return ctx.Err()
	case <-s.shutdown:
		return errShutdown
	}
	helloTimer.Stop()

	c, err := s.accept(hello)
	if err != nil {
		s.log.Warn("node refused", "node", hello.GetNodeId(), "reason", err)
		_ = stream.Send(&nodev1.EdgeMessage{Msg: &nodev1.EdgeMessage_HelloRefused{HelloRefused: &nodev1.HelloRefused{Reason: err.Error()}}})
		return err
	}
	old := s.reg.add(c)
	s.forgetGone()
	cause := errors.New("unknown")
	defer func() { s.closeConn(c, cause) }()
	// Activate before the old connection is fenced and before Welcome, so a
	// request that the replaced connection loses is admitted again onto this
	// one at once. Dispatches wait in the outbox until after Welcome.
	specs := s.reg.specs(c)
	if err := s.sched.Activate(c.nodeID, c.gen, specs, func() bool { return s.reg.isCurrent(c) }); err != nil {
		cause = fmt.Errorf("%w: %w", errActivate, err)
		return cause
	}
	for _, spec := range specs {
		s.syncResidency(c, spec.ProviderID)
	}
	if old != nil {
		// A replaced connection that was still heartbeating usually means
		// two running nodes share one node_id: they will keep replacing
		// each other. Say so loudly.
		if silent := s.clock.Now().Sub(old.seen()); silent < s.cfg.HeartbeatInterval {
			s.log.Error("node connection replaced a live one: are two nodes using the same node_id?",
				"node", c.nodeID, "old_generation", old.gen, "new_generation", c.gen, "old_silent_for", silent)
		} else if old.instance != "" && c.instance != "" && old.instance != c.instance {
			// Another process took the id over from one that went silent:
			// no reconnect of the same node, and the log says so.
			s.log.Warn("node_id taken over by another node process: the previous one went silent", "node", c.nodeID,
				"old_generation", old.gen, "new_generation", c.gen, "old_silent_for", silent)
		} else {
			s.log.Info("node reconnected", "node", c.nodeID, "old_generation", old.gen, "new_generation", c.gen)
		}
		old.supersede()
	}
	log := s.log.With("node", c.nodeID, "generation", c.gen)

	// Heartbeats tick on the injected clock; the tick that finds the node
	// silent for 3 intervals ends the connection. Armed before Welcome so
	// the node's first heartbeat interval starts now.
	ticks := make(chan struct{}, 1)
	tick := func() {
		select {
		case ticks <- struct{}{}:
		default:
		}
	}
	t := s.clock.AfterFunc(hb, tick)
	defer func() { t.Stop() }()
	lastTick := s.clock.Now()

	// Published before Welcome: a node that has its Welcome (and may be
	// sent work) has had its node_connected, with its providers active.
	s.emitNode(lifecycle.NodeConnected, c, nil)
	welcome := &nodev1.EdgeMessage{Msg: &nodev1.EdgeMessage_Welcome{Welcome: &nodev1.Welcome{Generation: c.gen, HeartbeatIntervalMs: hb.Milliseconds(), Features: edgeFeatures}}}
	if err := stream.Send(welcome); err != nil {
		cause = err
		return err
	}
	s.reg.notify()
	log.Info("node connected", "label", c.label, "version", c.version, "providers", len(c.hello))

	for {
		select {
		case r := <-in:
			if r.err != nil {
				cause = s.connEnded(r.err)
				return r.err
			}
			c.touch(s.clock.Now())
			s.handleNodeMessage(c, r.msg)
		case <-c.wake:
			for _, m := range c.takeOutbox() {
				if err := stream.Send(m); err != nil {
					cause = err
					return err
				}
			}
		case <-ticks:
			now := s.clock.Now()
			// A tick two intervals late means this edge itself stalled
			// (a frozen process): the node's heartbeats may wait unread
			// in the stream, so the silence is judged at the next tick.
			late := now.Sub(lastTick) >= 2*hb
			lastTick = now
			if silent := now.Sub(c.seen()); silent >= 3*hb && !late {
				cause = fmt.Errorf("%w: node silent for %s", errHeartbeatMissed, silent)
				return cause
			}
			t = s.clock.AfterFunc(hb, tick)
			if err := stream.Send(&nodev1.EdgeMessage{Msg: &nodev1.EdgeMessage_Heartbeat{Heartbeat: &nodev1.Heartbeat{UnixNano: now.UnixNano()}}}); err != nil {
				cause = err
				return err
			}
		case <-c.superseded:
			cause = errSuperseded
			return cause
		case <-c.broken:
			cause = errOutboxFull
			return cause
		case <-ctx.Done():
			cause = s.connEnded(ctx.Err())
			return ctx.Err()
		case <-s.shutdown:
			cause = errShutdown
			return cause
		}
	}
}

// accept checks a Hello's token (trust.check), contents and node id
// binding (trust.bind), and builds its connection. A refused Hello leaves
// the node id's current connection, if any, untouched.
func (s *Service) accept(h *nodev1.Hello) (*conn, error) {
	if err := s.trust.check(h.GetNodeId(), h.GetToken()); err != nil {
		return nil, err
	}
	c, err := parseHello(h, s.clock.Now())
	if err != nil {
		return nil, err
	}
	// Another process with this node_id while its connection is live: two
	// nodes given one node_id replaced each other's connection forever,
	// cutting each other's runs. The newcomer is
	// refused (it retries with its backoff) and the live one keeps serving;
	// once that one has been silent two heartbeat intervals (a connection
	// the network lost), the newcomer gets in. The same instance, or none,
	// is the node reconnecting: it replaces its old connection.
	if cur := s.reg.current(c.nodeID); cur != nil && cur.instance != "" && c.instance != "" && cur.instance != c.instance {
		if silent := s.clock.Now().Sub(cur.seen()); silent < 2*s.cfg.HeartbeatInterval {
			return nil, fmt.Errorf("%w: node_id %q is in use by another running node (generation %d, heard from %s ago): give each node its own node_id",
				errNodeInUse, c.nodeID, cur.gen, silent.Round(time.Millisecond))
		}
	}
	if err := s.trust.bind(c.nodeID, h.GetToken()); err != nil {
		return nil, err
	}
	return c, nil
}

// connEnded is the cause of a connection whose stream ended with err (or
// whose context ended): the edge stopping, the node closing it (io.EOF),
// or the connection lost (a node killed, a network cut).
func (s *Service) connEnded(err error) error {
	select {
	case <-s.shutdown:
		return errShutdown
	default:
	}
	if errors.Is(err, io.EOF) {
		return errConnClosed
	}
	return fmt.Errorf("%w: %w", errConnLost, err)
}

// closeConn settles a connection that ended: it leaves the registry, its
// generation is fenced in the scheduler (which releases its leases and
// re-resolves waiters), and its unfinished runs end with ErrNodeGone.
func (s *Service) closeConn(c *conn, cause error) {
	if s.reg.isDraining(c) {
		cause = fmt.Errorf("%w: %w", errNodeDraining, cause)
	}
	s.reg.remove(c)
	s.forgetGone()
	c.close()
	s.sched.Fence(c.nodeID, c.gen)
	for _, r := range s.runsOf(c) {
		r.finish(EndNodeGone, fmt.Errorf("%w: node %q generation %d: %w", ErrNodeGone, c.nodeID, c.gen, cause), false)
	}
	s.reg.notify()
	s.log.Info("node fenced", "node", c.nodeID, "generation", c.gen, "cause", cause)
	s.emitNode(lifecycle.NodeFenced, c, cause)
}

// forgetGone forgets the nodes gone longer than ForgetAfter: the
// registry's memory of them (and of the model names left unserved as long),
// their circuit breakers, and the requested model names no longer known
// (so their queues are no longer listed). It runs at every connect and
// disconnect; it costs O(forgotten + requested names). It takes
// registry.mu, then breakers.mu, then Service.statsMu, one after the
// other, never one under another.
func (s *Service) forgetGone() {
	for _, node := range s.reg.forget() {
		s.breakers.forgetNode(node)
	}
	s.statsMu.Lock()
	names := make([]string, 0, len(s.requested))
	for m := range s.requested {
		names = append(names, m)
	}
	s.statsMu.Unlock()
	for _, m := range names {
		if !s.cat.known(m) {
			s.statsMu.Lock()
			delete(s.requested, m)
			s.statsMu.Unlock()
		}
	}
}

func (s *Service) handleNodeMessage(c *conn, m *nodev1.NodeMessage) {
	switch msg := m.GetMsg().(type) {
	case *nodev1.NodeMessage_Heartbeat:
		if msg.Heartbeat.GetRunsSet() {
			s.adm.nodeReport(c, 0, msg.Heartbeat.GetRuns(), false)
		}
	case *nodev1.NodeMessage_RunsReport:
		s.adm.nodeReport(c, msg.RunsReport.GetEpoch(), msg.RunsReport.GetRuns(), true)
	case *nodev1.NodeMessage_ProviderUpdate:
		s.updateProvider(c, msg.ProviderUpdate)
	case *nodev1.NodeMessage_DispatchRefused:
		id := msg.DispatchRefused.GetRunId()
		if r := s.run(id); r != nil && r.conn == c {
			r.finishIf(func(st runState) bool { return st == runPending }, EndDispatchRefused, "", s.refusal(c, msg.DispatchRefused), false)
		}
	case *nodev1.NodeMessage_Drain:
		s.drainConn(c, msg.Drain.GetReason())
	case *nodev1.NodeMessage_ShowAnswer:
		c.showPart(msg.ShowAnswer)
	case *nodev1.NodeMessage_ResidencyAnswer:
		c.keepAnswer(msg.ResidencyAnswer)
	default:
		s.log.Warn("unexpected control message", "node", c.nodeID, "generation", c.gen, "type", fmt.Sprintf("%T", msg))
	}
}

// refusal is the error of a run whose Dispatch c's node refused (ref):
// ErrDispatchRefused, also wrapping errNodeDraining when the node said
// Drain or its refusal says so (sent before the Drain arrived: no failure of its
// provider; Dispatch admits the request again elsewhere), and
// contract.ErrProviderBusy when the node said its provider was busy, and
// errStaleEpoch when it refused a deposed leader's epoch (which this edge
// learns: sawEpoch). None is a failure of the provider.
func (s *Service) refusal(c *conn, ref *nodev1.DispatchRefused) error {
	err := fmt.Errorf("%w: node %q: %s", ErrDispatchRefused, c.nodeID, ref.GetReason())
	if ref.GetBusy() {
		err = fmt.Errorf("%w: %w", ErrProviderBusy, err)
	}
	if e := ref.GetStaleEpoch(); e != 0 {
		err = fmt.Errorf("%w: %w", errStaleEpoch, err)
		s.adm.sawEpoch(e)
	}
	if ref.GetDraining() || s.reg.isDraining(c) {
		err = fmt.Errorf("%w: %w", errNodeDraining, err)
	}
	return err
}

// drainConn takes a connection whose node said Drain out of rotation: its
// providers are no candidates from now on (the catalog skips them), queued
// requests re-resolve their candidates (those left with none fail with
// scheduler.ErrProviderUnavailable), and its runs in flight go on to their
// end. The node closes the connection when they are done. A dispatch it
// refuses after Drain (sent before the Drain arrived) is admitted again
// elsewhere and counts nothing against its provider's circuit (refusal).
func (s *Service) drainConn(c *conn, reason string) {
	if !s.reg.drain(c) {
		return
	}
	c.endIdle()
	s.log.Info("node draining: its providers take no new requests", "node", c.nodeID, "generation", c.gen,
		"reason", reason, "runs_in_flight", len(s.runsOf(c)))
	if err := s.sched.Activate(c.nodeID, c.gen, s.reg.specs(c), func() bool { return s.reg.isCurrent(c) }); err != nil {
		s.log.Warn("re-activation failed", "node", c.nodeID, "err", err)
	}
	s.reg.notify()
	s.emitNode(lifecycle.NodeDraining, c, nil)
}

// updateProvider applies a ProviderUpdate: a capacity change goes to the
// scheduler at once; a change of health or of the served models (models_set:
// the registry's index of served names, the models' capabilities and
// details) re-activates the connection's resources so queued requests
// re-resolve their candidates (a waiter whose model is no longer served by
// any live provider fails with scheduler.ErrProviderUnavailable).
func (s *Service) updateProvider(c *conn, u *nodev1.ProviderUpdate) {
	ch, ok := s.reg.update(c, u)
	if !ok {
		s.log.Warn("provider update ignored", "node", c.nodeID, "provider", u.GetProviderId(), "healthy", u.GetHealthy(),
			"capacity", u.GetCapacity(), "long_capacity", u.GetLongCapacity(), "models_set", u.GetModelsSet(), "models", len(u.GetModels()))
		return
	}
	if ch.healthChanged || ch.modelsChanged {
		s.log.Info("provider updated", "node", c.nodeID, "generation", c.gen, "provider", u.GetProviderId(),
			"healthy", u.GetHealthy(), "models_changed", ch.modelsChanged)
	}
	if ch.capacityChanged {
		if err := s.sched.SetCapacity(c.nodeID, u.GetProviderId(), ch.capacity, ch.longCapacity); err != nil {
			s.log.Warn("capacity update failed", "node", c.nodeID, "provider", u.GetProviderId(), "err", err)
		}
	}
	if ch.healthChanged || ch.modelsChanged {
		if err := s.sched.Activate(c.nodeID, c.gen, s.reg.specs(c), func() bool { return s.reg.isCurrent(c) }); err != nil {
			s.log.Warn("re-activation failed", "node", c.nodeID, "err", err)
		}
	}
	if ch.loadedChanged || ch.modelsChanged {
		s.syncResidency(c, u.GetProviderId())
	}
	s.reg.notify()
}

func (s *Service) serveRun(stream nodev1.NodeGateway_RunServer) error {
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	open := first.GetOpen()
	if open == nil {
		return errRunOpenMissing
	}
	if open.GetIdle() {
		return s.serveWarm(stream, open)
	}
	r := s.run(open.GetRunId())
	if r == nil {
		return fmt.Errorf("%w: run %q", errRunNotPending, open.GetRunId())
	}
	if r.info.NodeID != open.GetNodeId() || r.info.Generation != open.GetGeneration() {
		return fmt.Errorf("%w: run %q went to node %q generation %d, not node %q generation %d",
			errRunStale, r.info.RunID, r.info.NodeID, r.info.Generation, open.GetNodeId(), open.GetGeneration())
	}
	if !r.attach(stream) {
		return fmt.Errorf("%w: run %q", errRunNotPending, open.GetRunId())
	}
	s.emitRun(lifecycle.RunStarted, r, "")
	close(r.opened) // after RunStarted: Dispatch returns, and the run's end is published, after it
	return s.serveOpen(stream, r)
}

// serveOpen serves the open run r on its stream: it sends the body down
// (unless it went inline in the Dispatch), then blocks until the run ends,
// and sends Cancel when it ended before the node finished it. The stream
// ending first (the node cancelled it), or the edge stopping, ends the run.
func (s *Service) serveOpen(stream nodev1.NodeGateway_RunServer, r *Run) error {
	if err := s.sendBody(stream, r); err != nil {
		r.finish(EndBodySendFailed, fmt.Errorf("%w: node %q run %q: %w", ErrNodeGone, r.info.NodeID, r.info.RunID, err), false)
		return err
	}
	select {
	case <-r.ended:
	case <-stream.Context().Done():
		r.finish(EndRunStreamClosed, fmt.Errorf("%w: node %q run %q: %w", ErrNodeGone, r.info.NodeID, r.info.RunID, errRunAborted), false)
		return stream.Context().Err()
	case <-s.shutdown:
		r.finish(EndEdgeShuttingDown, fmt.Errorf("%w: %w", ErrNodeGone, errShutdown), true)
	}
	if cancel, reason := r.cancelled(); cancel {
		_ = stream.Send(&nodev1.RunDown{Msg: &nodev1.RunDown_Cancel{Cancel: &nodev1.Cancel{RunId: r.info.RunID, Reason: reason}}})
	}
	return nil
}

// streamBody sends r's streamed body (Request.BodyFrom) down its stream:
// each read, of at most maxBodyChunk bytes, as one Body message, then an
// empty last one. A body that fails to read ends the run as its client's
// failure (errBodyRead): the node is told to cancel, the provider's
// breaker hears nothing. It stops early, without error, when the run ends.
func (s *Service) streamBody(stream nodev1.NodeGateway_RunServer, r *Run) error {
	src := r.bodyFrom(r.info.ServedModel)
	for {
		select {
		case <-r.ended:
			return nil
		default:
		}
		// A buffer of its own for each message: the in-memory link
		// hands the message itself to the node.
		buf := make([]byte, maxBodyChunk)
		n, err := src.Read(buf)
		if n > 0 {
			if serr := stream.Send(&nodev1.RunDown{Msg: &nodev1.RunDown_Body{Body: &nodev1.Body{Data: buf[:n]}}}); serr != nil {
				return serr
			}
		}
		switch {
		case err == io.EOF:
			if serr := stream.Send(&nodev1.RunDown{Msg: &nodev1.RunDown_Body{Body: &nodev1.Body{Last: true}}}); serr != nil {
				return serr
			}
			close(r.bodySent)
			return nil
		case err != nil:
			r.finish("request body read failed", fmt.Errorf("%w: %w", errBodyRead, err), true)
			return nil
		}
	}
}

// sendBody sends r's body down its stream in chunks of at most
// maxBodyChunk bytes, the last one marked; an empty body is one empty last
// chunk. It sends nothing for a body that went inline in the Dispatch. It
// stops early, without error, when the run ends.
func (s *Service) sendBody(stream nodev1.NodeGateway_RunServer, r *Run) error {
	if r.inline {
		return nil
	}
	if r.bodyFrom != nil {
		return s.streamBody(stream, r)
	}
	body := r.body
	for {
		select {
		case <-r.ended:
			return nil
		default:
		}
		n := min(len(body), maxBodyChunk)
		last := n == len(body)
		if err := stream.Send(&nodev1.RunDown{Msg: &nodev1.RunDown_Body{Body: &nodev1.Body{Data: body[:n], Last: last}}}); err != nil {
			return err
		}
		body = body[n:]
		if last {
			close(r.bodySent)
			return nil
		}
	}
}
