package edge

import (
	"context"
	"errors"
	"fmt"
	"time"

	"iop/internal/wire/nodev1"
)

// showTimeout bounds how long Service.Show waits for a node's answer (the
// node bounds its own call to the model server at 10 s).
const showTimeout = 15 * time.Second

// maxShowAnswer caps an /api/show answer a node sends (the node's own cap
// is 64 MiB).
const maxShowAnswer = 64 << 20

// Errors of Service.Show.
var (
	// errShowUnavailable: the node connection is gone or not current, the
	// provider is not an Ollama, or the node could not ask its server.
	errShowUnavailable = errors.New("/api/show unavailable")
	// errShowTimeout: the node did not answer within showTimeout.
	errShowTimeout = errors.New("/api/show timed out")
	// errShowTooLarge: the answer is over maxShowAnswer.
	errShowTooLarge = errors.New("/api/show answer too large")
)

// showWait is one ShowRequest waiting for its ShowAnswer parts.
type showWait struct {
	done   chan struct{} // closed when the answer is whole, or failed
	status int
	body   []byte
	err    error
}

// Show asks the node nodeID, on its current connection, what the Ollama
// server of its provider providerID says of its served model (Ollama's
// POST /api/show, with "verbose" when asked), and returns that server's
// HTTP status and JSON body, with paths of the provider's host removed by
// the node. The call goes down the node's control stream and its answer up
// in parts of at most 1 MiB, 64 MiB in all. Errors: errShowUnavailable
// (no such current connection or provider, not an Ollama, the node could
// not ask its server, the connection ended), errShowTimeout (no answer
// within 15 s), errShowTooLarge, or ctx's error.
func (s *Service) Show(ctx context.Context, nodeID, providerID, model string, verbose bool) (status int, body []byte, err error) {
	c := s.reg.current(nodeID)
	if c == nil {
		return 0, nil, fmt.Errorf("%w: node %q is not connected", errShowUnavailable, nodeID)
	}
	p := c.lastState().byID[providerID]
	if p == nil || !p.ollamaAPI() {
		return 0, nil, fmt.Errorf("%w: node %q has no Ollama provider %q", errShowUnavailable, nodeID, providerID)
	}
	id, w := c.addShow()
	defer c.dropShow(id)
	m := &nodev1.EdgeMessage{Msg: &nodev1.EdgeMessage_ShowRequest{ShowRequest: &nodev1.ShowRequest{
		RequestId: id, ProviderId: providerID, Model: model, Verbose: verbose}}}
	if !c.enqueue(m) {
		return 0, nil, fmt.Errorf("%w: node %q: connection closed", errShowUnavailable, nodeID)
	}
	timeout := make(chan struct{})
	t := s.clock.AfterFunc(showTimeout, func() { close(timeout) })
	defer t.Stop()
	select {
	case <-w.done:
		return w.status, w.body, w.err
	case <-timeout:
		return 0, nil, fmt.Errorf("%w: node %q provider %q", errShowTimeout, nodeID, providerID)
	case <-ctx.Done():
		return 0, nil, ctx.Err()
	case <-s.shutdown:
		return 0, nil, ErrShuttingDown
	}
}

// addShow registers a ShowRequest of c and returns its id.
func (c *conn) addShow() (uint64, *showWait) {
	w := &showWait{done: make(chan struct{})}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.nextShow++
	if c.shows == nil {
		c.shows = make(map[uint64]*showWait)
	}
	c.shows[c.nextShow] = w
	if c.closed {
		w.err = fmt.Errorf("%w: node %q: connection closed", errShowUnavailable, c.nodeID)
		close(w.done)
		delete(c.shows, c.nextShow)
	}
	return c.nextShow, w
}

// dropShow forgets ShowRequest id (answered, or no longer awaited).
func (c *conn) dropShow(id uint64) {
	c.mu.Lock()
	delete(c.shows, id)
	c.mu.Unlock()
}

// showPart takes one ShowAnswer part from c's node. A part of a request
// no longer awaited is dropped.
func (c *conn) showPart(a *nodev1.ShowAnswer) {
	c.mu.Lock()
	defer c.mu.Unlock()
	w := c.shows[a.GetRequestId()]
	if w == nil {
		return
	}
	switch {
	case a.GetError() != "":
		w.err = fmt.Errorf("%w: node %q: %s", errShowUnavailable, c.nodeID, a.GetError())
	case len(w.body)+len(a.GetData()) > maxShowAnswer:
		w.err = fmt.Errorf("%w: over %d bytes", errShowTooLarge, maxShowAnswer)
	default:
		w.status = int(a.GetStatus())
		w.body = append(w.body, a.GetData()...)
		if !a.GetLast() {
			return
		}
	}
	if w.err != nil {
		w.status, w.body = 0, nil
	}
	delete(c.shows, a.GetRequestId())
	close(w.done)
}

// failShowsLocked ends every ShowRequest of c still waiting: its
// connection closed. The caller holds c.mu.
func (c *conn) failShowsLocked() {
	for id, w := range c.shows {
		w.err = fmt.Errorf("%w: node %q: connection closed", errShowUnavailable, c.nodeID)
		close(w.done)
		delete(c.shows, id)
	}
}
