package edge

import (
	"fmt"

	"iop/internal/edge/lifecycle"
	"iop/internal/wire/nodev1"
)

// warmStream is a Run stream a node opened ahead of need (RunOpen.idle),
// waiting in its connection's idle list (conn.idle) for a run. Whoever
// takes it off the list (conn.takeIdle, conn.removeIdle, conn.endIdle)
// owns it, and sends exactly one value on assigned: the run whose
// Dispatch it sent down the stream (or that ended before), or nil when
// the stream is to end without a run.
type warmStream struct {
	stream   nodev1.NodeGateway_RunServer
	assigned chan *Run // one slot; exactly one send, by the stream's owner
}

// addIdle lists w as an idle stream of c, unless c drains or is closed
// (false).
func (c *conn) addIdle(w *warmStream) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || c.noIdle {
		return false
	}
	c.idle = append(c.idle, w)
	return true
}

// takeIdle takes the idle stream of c listed last, nil when none is (or c
// drains or is closed): the caller owns it.
func (c *conn) takeIdle() *warmStream {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := len(c.idle)
	if n == 0 || c.closed || c.noIdle {
		return nil
	}
	w := c.idle[n-1]
	c.idle[n-1] = nil
	c.idle = c.idle[:n-1]
	return w
}

// removeIdle takes w off c's idle list and reports whether it was still
// listed (the caller then owns it); false means another took it, and will
// send on w.assigned.
func (c *conn) removeIdle(w *warmStream) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, x := range c.idle {
		if x == w {
			c.idle = append(c.idle[:i], c.idle[i+1:]...)
			c.idle = c.idle[:len(c.idle):len(c.idle)]
			return true
		}
	}
	return false
}

// endIdle ends every idle stream of c and lists none from now on: c's node
// drains, or c closed.
func (c *conn) endIdle() {
	c.mu.Lock()
	idle := c.idle
	c.idle = nil
	c.noIdle = true
	c.mu.Unlock()
	for _, w := range idle {
		w.assigned <- nil
	}
}

// idleCount is the number of idle streams c lists.
func (c *conn) idleCount() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.idle)
}

// serveWarm serves a warm stream (its RunOpen, open, has idle set): it is
// refused (errRunStale) unless open names its node's current connection,
// and (errNodeDraining) when that connection drains. Else it waits in the
// connection's idle list until a dispatch takes it (dispatchWarm), then
// serves that run as serveRun serves one whose node opened its stream;
// it ends without a run when the connection drains or closes, the node
// ends the stream, or the edge stops.
func (s *Service) serveWarm(stream nodev1.NodeGateway_RunServer, open *nodev1.RunOpen) error {
	c := s.reg.current(open.GetNodeId())
	if c == nil || c.gen != open.GetGeneration() {
		return fmt.Errorf("%w: warm run stream of node %q generation %d: not its current connection", errRunStale, open.GetNodeId(), open.GetGeneration())
	}
	w := &warmStream{stream: stream, assigned: make(chan *Run, 1)}
	if !c.addIdle(w) {
		if s.reg.isDraining(c) {
			return fmt.Errorf("%w: warm run stream of node %q generation %d", errNodeDraining, c.nodeID, c.gen)
		}
		return fmt.Errorf("%w: warm run stream of node %q generation %d: its connection closed", errRunStale, c.nodeID, c.gen)
	}
	var r *Run
	var endErr error
	select {
	case r = <-w.assigned:
	case <-stream.Context().Done():
		endErr = stream.Context().Err()
	case <-s.shutdown:
		endErr = errShutdown
	}
	if endErr != nil {
		if c.removeIdle(w) {
			return endErr
		}
		r = <-w.assigned // taken meanwhile: its taker sends it at once
	}
	if r == nil {
		return nil
	}
	return s.serveOpen(stream, r)
}

// dispatchWarm sends r's Dispatch d down w, which the caller took off r's
// connection's idle list, and hands r to w's handler: the run is open
// from then on (RunStarted, r.opened). A run that ended before is handed
// on as it is; one whose Dispatch could not be sent ends with ErrNodeGone
// (its node never saw it: Dispatch admits the request again).
func (s *Service) dispatchWarm(w *warmStream, r *Run, d *nodev1.Dispatch) {
	if !r.attach(w.stream) {
		w.assigned <- r // ended meanwhile (its connection closed, its client left)
		return
	}
	if err := w.stream.Send(&nodev1.RunDown{Msg: &nodev1.RunDown_Dispatch{Dispatch: d}}); err != nil {
		r.finish("dispatch send failed", fmt.Errorf("%w: node %q run %q: dispatch on a warm run stream: %w", ErrNodeGone, r.info.NodeID, r.info.RunID, err), false)
		w.assigned <- r
		return
	}
	s.emitRun(lifecycle.RunStarted, r, "")
	close(r.opened) // after RunStarted, as serveRun does
	w.assigned <- r
}
