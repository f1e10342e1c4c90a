package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"iop/internal/wire/nodev1"
)

// WarmStreams is how many warm Run streams a connection keeps open to the
// edge ahead of need: streams opened with RunOpen{idle} and no run yet,
// down which the edge sends a Dispatch instead of on the control stream,
// so a run starts without the node opening a stream first (a new HTTP/2
// stream and a trip to the edge and back). One taken is replaced at once,
// in the background, while fewer than WarmStreams are opening or idle; a
// stream whose run ended cleanly comes back idle when the edge reuses it
// (up to its cap of 64 per connection), so a connection keeps about as
// many as its runs in flight at their peak and opens no stream per run.
// Two cover a burst of two dispatches arriving faster than a stream opens,
// at the cost of two idle HTTP/2 streams and a goroutine on each side. A
// dispatch that finds none idle goes on the control stream as before.
const WarmStreams = 2

// refillWarm opens warm streams until the connection has Agent.warm of them
// opening or idle, unless it drains or ended.
func (c *conn) refillWarm() {
	c.mu.Lock()
	n := 0
	if !c.draining && c.ctx.Err() == nil && c.warm < c.a.warm {
		n = c.a.warm - c.warm
		c.warm += n
	}
	c.mu.Unlock()
	for range n {
		c.runWG.Add(1) // by the session goroutine, or a run goroutine counted in runWG
		go func() {
			defer c.runWG.Done()
			c.serveWarm()
		}()
	}
}

// warmGone counts one warm stream less opening or idle.
func (c *conn) warmGone() {
	c.mu.Lock()
	c.warm--
	c.mu.Unlock()
}

// serveWarm opens one warm stream, waits for the edge's Dispatch down it,
// and serves that run on it as a run of its own stream (runOn), or
// refuses it on the stream (RunUp.refused), after the same checks as a
// control-stream Dispatch (admit). Once a Dispatch arrived it opens
// another warm stream in its place. A warm stream the edge ends without a
// Dispatch (its connection ended or drains, it refused the stream, the
// edge stops) is not replaced.
func (c *conn) serveWarm() {
	ctx, stop := context.WithCancel(c.ctx)
	defer stop()
	stream, err := c.client.Run(ctx)
	if err != nil {
		c.warmGone()
		return
	}
	open := &nodev1.RunOpen{NodeId: c.a.cfg.NodeID, Generation: c.gen, Idle: true}
	if err := stream.Send(&nodev1.RunUp{Msg: &nodev1.RunUp_Open{Open: open}}); err != nil {
		c.warmGone()
		return
	}
	m, err := stream.Recv()
	if err != nil {
		c.warmGone()
		c.a.logger.Debug("warm run stream ended", "err", err, "generation", c.gen)
		return
	}
	d := m.GetDispatch()
	if d == nil {
		c.warmGone()
		c.a.logger.Warn("ignoring a warm run stream whose first message is no Dispatch", "type", fmt.Sprintf("%T", m.GetMsg()), "generation", c.gen)
		return
	}
	rd := newDownReader(stream)
	defer rd.stop()
	for d != nil {
		c.warmGone()
		c.refillWarm()
		if d = c.serveWarmRun(ctx, stop, stream, rd, d); d == nil {
			return
		}
		// The edge reuses the stream for d: it was idle since the last
		// run's end (warmIdle).
	}
}

// serveWarmRun admits d, the Dispatch the warm stream brought, or refuses
// it on the stream; an admitted run is acknowledged with RunOpen naming
// it (the edge drops whatever comes before it on the stream: nothing of
// an earlier run can pass for this one's) and served. It returns the next
// Dispatch when the edge reuses the stream after the run's clean end,
// counting the stream idle meanwhile, else nil.
func (c *conn) serveWarmRun(ctx context.Context, stop context.CancelFunc, stream runStream, rd *downReader, d *nodev1.Dispatch) *nodev1.Dispatch {
	r, p, err := c.acceptDispatch(d, ctx, stop)
	if err != nil {
		c.refuseOn(stream, d.RunId, err)
		return nil
	}
	defer c.removeRun(r)
	// The stream outlives the run: the run's work context, a child of
	// the stream's, ends with the run, or the stream's context keeps it
	// (and its children) for as long as the edge reuses the stream.
	defer r.cancelWork(ErrRunEnded)
	if err := c.a.acquireSlot(r); err != nil {
		c.removeRun(r)
		c.refuseOn(stream, d.RunId, err)
		return nil
	}
	open := &nodev1.RunOpen{RunId: r.id, NodeId: c.a.cfg.NodeID, Generation: c.gen}
	if err := stream.Send(&nodev1.RunUp{Msg: &nodev1.RunUp_Open{Open: open}}); err != nil {
		c.logRun(slog.LevelDebug, r, d, "warm run stream failed", "err", err)
		return nil
	}
	return c.runOn(stream, rd, r, d, p)
}

// warmIdle counts one warm stream more idle: a run on it ended cleanly and
// the edge may send the next Dispatch down it.
func (c *conn) warmIdle() {
	c.mu.Lock()
	c.warm++
	c.mu.Unlock()
}

// refuseOn tells the edge, on the warm stream that brought its Dispatch,
// that the node will not run runID, and waits until the edge ends the
// stream (or the connection ends).
func (c *conn) refuseOn(stream runStream, runID string, reason error) {
	c.a.logger.Warn("refusing dispatch", "run_id", runID, "reason", reason, "generation", c.gen)
	m := &nodev1.RunUp{Msg: &nodev1.RunUp_Refused{Refused: &nodev1.DispatchRefused{RunId: runID, Reason: reason.Error(), Busy: errors.Is(reason, ErrProviderBusy), StaleEpoch: staleEpochOf(reason),
		Draining: errors.Is(reason, ErrDraining)}}}
	if err := stream.Send(m); err != nil {
		c.a.logger.Debug("cannot send the refusal", "run_id", runID, "err", err)
		return
	}
	_ = stream.CloseSend()
	for {
		if _, err := stream.Recv(); err != nil {
			return
		}
	}
}
