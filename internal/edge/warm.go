package edge

import (
	"fmt"

	"iop/internal/edge/lifecycle"
	"iop/internal/wire/nodev1"
)

// maxIdleStreams is the most idle warm streams a connection holds: a warm
// stream whose run ended cleanly goes back to its connection's idle list,
// for the next dispatch, unless the connection holds as many already (it
// then ends). The node opens a few (node.WarmStreams) and replaces those
// taken only while it has fewer idle, so its connection holds about as
// many as its runs in flight at their peak, up to this.
const maxIdleStreams = 64

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
	if c.closed || c.noIdle || len(c.idle) >= maxIdleStreams {
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
// serves that run as serveRun serves one whose node opened its stream.
// After a run that ended cleanly (Run.reusable: its node's terminal
// message read, no cancel) it waits in the idle list again, for the next
// run; after any other end the stream ends, as a run's own does. It ends
// without a run when the connection drains or closes (or holds
// maxIdleStreams idle), the node ends the stream, or the edge stops.
func (s *Service) serveWarm(stream nodev1.NodeGateway_RunServer, open *nodev1.RunOpen) error {
	c := s.reg.current(open.GetNodeId())
	if c == nil || c.gen != open.GetGeneration() {
		return fmt.Errorf("%w: warm run stream of node %q generation %d: not its current connection", errRunStale, open.GetNodeId(), open.GetGeneration())
	}
	for first := true; ; first = false {
		w := &warmStream{stream: stream, assigned: make(chan *Run, 1)}
		if !c.addIdle(w) {
			switch {
			case !first:
				return nil // the run is over: the stream ends as its own would
			case s.reg.isDraining(c):
				return fmt.Errorf("%w: warm run stream of node %q generation %d", errNodeDraining, c.nodeID, c.gen)
			default:
				return fmt.Errorf("%w: warm run stream of node %q generation %d: its connection closed or holds enough idle streams", errRunStale, c.nodeID, c.gen)
			}
		}
		r, err := s.awaitRun(stream, c, w)
		if r == nil || err != nil {
			return err
		}
		if err := s.serveOpen(stream, r); err != nil || !r.reusable() {
			return err
		}
	}
}

// awaitRun waits until the idle stream w of c is handed a run (nil: end
// the stream), the node ends the stream, or the edge stops.
func (s *Service) awaitRun(stream nodev1.NodeGateway_RunServer, c *conn, w *warmStream) (*Run, error) {
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
			return nil, endErr
		}
		r = <-w.assigned // taken meanwhile: its taker sends it at once
	}
	return r, nil
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
		r.finish(EndDispatchSendFailed, fmt.Errorf("%w: node %q run %q: dispatch on a warm run stream: %w", ErrNodeGone, r.info.NodeID, r.info.RunID, err), false)
		w.assigned <- r
		return
	}
	s.emitRun(lifecycle.RunStarted, r, "")
	close(r.opened) // after RunStarted, as serveRun does
	w.assigned <- r
}
