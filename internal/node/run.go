package node

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	"iop/internal/node/adapter"
	"iop/internal/wire/nodev1"
)

// runStream is the node's side of one Run stream.
type runStream = grpc.BidiStreamingClient[nodev1.RunUp, nodev1.RunDown]

// run is one dispatched request in flight on a connection.
type run struct {
	id         string
	streamCtx  context.Context // the Run stream's; a child of the connection's
	stopStream context.CancelFunc
	workCtx    context.Context // the provider request's; a child of streamCtx
	cancelWork context.CancelCauseFunc
	// edge, gen and provider say where the run came from and what runs it
	// (Agent.RunsInFlight); written once by admit.
	edge     string
	gen      uint64
	provider string
	model    string // the served model it asks the provider for

	slotMu sync.Mutex // guards slot
	slot   *slotPool  // the provider pool r holds a slot of (capacity.go); nil when none
	// over is set just before the run's terminal frame is sent: the
	// provider is done with it, so a drain that begins now counts it no
	// run in flight (the edge may have read its end before the run
	// goroutine forgets it).
	over atomic.Bool
	// counted: in the node-wide set of a cluster's runs in flight
	// (inflight.go); set before the run is shared.
	counted bool
}

// lastFrame is called just before r's terminal frame is sent: r is over
// at the provider, and its slot is free.
func (r *run) lastFrame() {
	r.over.Store(true)
	r.releaseSlot()
}

// bodyResult is a run's whole request body, or why there is none.
type bodyResult struct {
	data []byte
	// reader, for a streamed body (streamedOp), is the body as it comes
	// down the run stream; data is then nil.
	reader *io.PipeReader
	err    error
}

// streamedOp reports whether a body of op that does not come inline is
// handed to its adapter as it comes down the run stream, not whole: a
// multipart upload, which the edge streams and no adapter rewrites.
func streamedOp(op nodev1.Operation) bool {
	return op == nodev1.Operation_OPERATION_TRANSCRIPTION
}

// dispatch starts d, a Dispatch from the control stream, as a run on a
// Run stream of its own, or refuses it on the control stream (also when
// its provider stays at capacity on this node for slotWait: the edges
// together sent it more than it takes, see capacity.go).
func (c *conn) dispatch(d *nodev1.Dispatch) {
	streamCtx, stopStream := context.WithCancel(c.ctx)
	r, p, err := c.acceptDispatch(d, streamCtx, stopStream)
	if err != nil {
		stopStream()
		c.refuse(d.RunId, err)
		return
	}
	c.runWG.Add(1)
	go func() {
		defer c.runWG.Done()
		defer c.removeRun(r)
		defer r.stopStream()
		if err := c.a.acquireSlot(r); err != nil {
			c.refuse(r.id, err)
			return
		}
		c.serveRun(r, d, p)
	}()
}

// acceptDispatch validates d, a Dispatch from the control stream or down a warm
// stream, and registers it as a run of c whose stream lives in streamCtx
// (stopStream ends it), or says why the node refuses it: ErrDraining
// after a drain began, ErrMissingRunID, ErrUnknownProvider,
// ErrPathMismatch, ErrUnsupportedOperation, ErrDuplicateRun for a run id
// in flight, ErrStaleEpoch for a deposed scheduler leader's (inflight.go). The drain check and the registration are one step under
// c.mu, so a drain that finds no run in flight accepts none after.
// (Admission is the edge's word: the scheduler admits; a node accepts.)
func (c *conn) acceptDispatch(d *nodev1.Dispatch, streamCtx context.Context, stopStream context.CancelFunc) (*run, *provider, error) {
	p := c.a.providers[d.ProviderId]
	var invalid error
	switch {
	case d.RunId == "":
		invalid = ErrMissingRunID
	case p == nil:
		invalid = fmt.Errorf("%w %q", ErrUnknownProvider, d.ProviderId)
	case d.ExecutionPath != nodev1.ExecutionPath_EXECUTION_PATH_UNSPECIFIED && d.ExecutionPath != p.path:
		invalid = fmt.Errorf("%w: provider %q answers on %v", ErrPathMismatch, d.ProviderId, p.path)
	}
	if invalid == nil {
		switch d.Operation {
		case nodev1.Operation_OPERATION_CHAT, nodev1.Operation_OPERATION_COMPLETION, nodev1.Operation_OPERATION_EMBEDDINGS,
			nodev1.Operation_OPERATION_RERANK, nodev1.Operation_OPERATION_TRANSCRIPTION, nodev1.Operation_OPERATION_SPEECH,
			nodev1.Operation_OPERATION_IMAGES, nodev1.Operation_OPERATION_INFILL, nodev1.Operation_OPERATION_LLAMA_COMPLETION:
		default:
			invalid = fmt.Errorf("%w %v", ErrUnsupportedOperation, d.Operation)
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.draining:
		return nil, nil, ErrDraining
	case invalid != nil:
		return nil, nil, invalid
	}
	if _, dup := c.runs[d.RunId]; dup {
		return nil, nil, ErrDuplicateRun
	}
	r := &run{id: d.RunId, streamCtx: streamCtx, stopStream: stopStream, edge: c.l.addr, gen: c.gen, provider: p.cfg.ID, model: d.ServedModel}
	if err := c.a.inflight.add(r, d); err != nil {
		return nil, nil, err
	}
	r.workCtx, r.cancelWork = context.WithCancelCause(streamCtx)
	c.runs[r.id] = r
	c.a.track(r)
	return r, p, nil
}

// cancelRun cancels the provider request of runID, if it is in flight.
func (c *conn) cancelRun(runID, reason string) {
	c.mu.Lock()
	r := c.runs[runID]
	c.mu.Unlock()
	if r == nil {
		c.a.logger.Debug("cancel for a run not in flight", "run_id", runID)
		return
	}
	r.cancelWork(fmt.Errorf("%w: %s", ErrCancelledByEdge, reason))
}

// finishWarm forgets r, whose terminal frame went up a warm stream the
// edge has not yet ended or reused, and counts it unacknowledged (c.unread)
// in the same step, so a drain never sees it neither in flight nor
// unacknowledged; acknowledged ends that count, and wakes the session
// goroutine as removeRun does. finishWarm wakes nobody: with the run
// unacknowledged, no drain can be done.
func (c *conn) finishWarm(r *run) {
	c.mu.Lock()
	if c.runs[r.id] == r {
		delete(c.runs, r.id)
	}
	c.unread++
	c.mu.Unlock()
	c.a.untrack(r)
	c.a.inflight.remove(r)
	c.a.kickResidencyAfter(r.provider, r.model)
}

// acknowledged ends the count finishWarm started: the edge ended or
// reused the stream, so it read the run's terminal frame.
func (c *conn) acknowledged() {
	c.mu.Lock()
	c.unread--
	draining := c.draining
	c.mu.Unlock()
	if draining {
		c.wakeSession()
	}
}

// removeRun forgets r and, while a drain waits for the last run, wakes
// the session goroutine.
func (c *conn) removeRun(r *run) {
	c.mu.Lock()
	if c.runs[r.id] == r {
		delete(c.runs, r.id)
	}
	draining := c.draining
	c.mu.Unlock()
	c.a.untrack(r)
	c.a.inflight.remove(r)
	c.a.kickResidencyAfter(r.provider, r.model)
	if draining {
		c.wakeSession()
	}
}

// wakeSession fills runEnded's one slot: the session goroutine checks
// whether a drain is done. Only a change seen while c.draining needs it:
// one before the drain began is seen by the session goroutine's own
// check after startDrain (both under c.mu). Runs end without it while
// no drain is under way: no goroutine hand-off per run.
func (c *conn) wakeSession() {
	select {
	case c.runEnded <- struct{}{}:
	default:
	}
}

// serveRun opens the run's own stream, receives the body (or takes it from
// d when it came inline: the provider is then called right after RunOpen
// is sent, without a trip back from the edge), runs the provider, and
// sends the answer up, ending with one terminal frame. It
// returns once the edge has ended the stream (or the connection ended).
func (c *conn) serveRun(r *run, d *nodev1.Dispatch, p *provider) {
	stream, err := c.client.Run(r.streamCtx)
	if err != nil {
		c.refuse(r.id, fmt.Errorf("%w: %s", ErrRunStreamFailed, status.Convert(err).Message()))
		return
	}
	open := &nodev1.RunOpen{RunId: r.id, NodeId: c.a.cfg.NodeID, Generation: c.gen}
	if err := stream.Send(&nodev1.RunUp{Msg: &nodev1.RunUp_Open{Open: open}}); err != nil {
		c.logRun(slog.LevelWarn, r, d, "run stream failed before open", "err", err)
		return
	}
	c.runOn(stream, nil, r, d, p)
}

// runOn serves run r, whose Dispatch is d, on its open stream: it
// receives the body (or takes it from d when it came inline: the provider
// is called at once), runs the provider, and sends the answer up, ending
// with one terminal frame, after which it sends nothing more on the
// stream. It returns once the edge has ended the stream (or the connection
// ended). On a warm stream (rd, the stream's one reader, is set; nil on
// a stream of the run's own) it does not half-close the stream after
// the terminal frame: the edge may send the next run's Dispatch down it
// instead of ending it, which runOn then returns (nil when the stream
// ended). A run that sent no terminal frame (its adapter ended without
// one) half-closes the stream, as on a stream of its own, so the edge ends
// the run as aborted.
func (c *conn) runOn(stream runStream, rd *downReader, r *run, d *nodev1.Dispatch, p *provider) (next *nodev1.Dispatch) {
	warm := rd != nil
	var bodies chan bodyResult // nil for a body that came inline: none is delivered
	if !d.BodyInline {
		bodies = make(chan bodyResult, 1)
	}
	down := readDown(stream, rd, r, d, bodies)
	events := &eventSink{s: stream, last: r.lastFrame}
	workCtx := r.workCtx
	var spans *runSpans
	if c.a.tracer != nil {
		workCtx, spans = c.startRunSpan(workCtx, d, p)
		events.spans = spans
	}

	var body bodyResult
	switch {
	case d.BodyInline:
		// The body came with the Dispatch: call the provider now, without
		// waiting for anything on the run stream.
		body = inlineBody(d.Body)
	default:
		select {
		case body = <-bodies:
		case <-r.workCtx.Done():
			body.err = fmt.Errorf("%w: %w", adapter.ErrCancelled, context.Cause(r.workCtx))
		}
	}
	if body.err == nil && r.workCtx.Err() != nil {
		body.err = fmt.Errorf("%w: %w", adapter.ErrCancelled, context.Cause(r.workCtx))
	}
	err := body.err
	sentLast := false // the adapter's last message ended the run (tunnelSink.ended)
	if err == nil {
		req := adapter.Request{Op: d.Operation, Stream: d.Stream, ServedModel: d.ServedModel, Body: body.data, OllamaFields: d.OllamaFields, Headers: d.Headers}
		if body.reader != nil {
			req.BodyReader = body.reader
		}
		callCtx := workCtx
		if spans != nil {
			callCtx = spans.startCall(workCtx, c.a.tracer, d, p)
		}
		switch ad := p.adapter.(type) {
		case adapter.Normalizer:
			err = ad.Normalize(callCtx, req, events)
		case adapter.Tunneler:
			ts := &tunnelSink{s: stream, split: !c.headBody, last: r.lastFrame}
			ts.spans = spans
			err = ad.Tunnel(callCtx, req, ts)
			sentLast = ts.ended
		default:
			err = fmt.Errorf("%w: provider %q of type %q has a %T", ErrNoAdapter, p.cfg.ID, p.cfg.Type, p.adapter)
			c.logRun(slog.LevelError, r, d, "cannot run the request", "err", err)
		}
		if spans != nil {
			spans.endCall(err)
		}
		if body.reader != nil {
			// What the adapter left unread no longer holds up the
			// stream's reader (readRunDownTo), which runOn waits for.
			body.reader.CloseWithError(errBodyUnread)
		}
	}
	// A run aborted with its connection (the node stopping, the edge lost)
	// sends no last frame and does not half-close: the edge ends it as it
	// ends every run of a connection that closed (its node gone), so that
	// every client of the aborted runs sees that one error rather than
	// some "cancelled".
	if c.ctx.Err() == nil {
		// The adapter sent the terminal frame itself: a terminal event,
		// or a tunnel head with the whole body (End).
		ended := events.ended || sentLast
		var last *nodev1.RunUp
		if !ended {
			last = terminal(p.path, err)
		}
		if last != nil {
			r.lastFrame() // before the edge can read the end
			if spans != nil {
				spans.lastAt = time.Now()
			}
			if serr := stream.Send(last); serr != nil {
				c.logRun(slog.LevelDebug, r, d, "cannot send the run's last frame", "err", serr)
			} else {
				ended = true
			}
		}
		if !warm || !ended {
			_ = stream.CloseSend()
			warm = false
		}
	} else {
		warm = false
	}
	if spans != nil {
		spans.end(err)
	}
	switch {
	case err == nil:
		c.logRun(slog.LevelDebug, r, d, "run complete")
	case errors.Is(err, adapter.ErrCancelled), errors.Is(err, adapter.ErrSink):
		c.logRun(slog.LevelDebug, r, d, "run ended early", "err", err)
	default:
		c.logRun(slog.LevelWarn, r, d, "run failed", "err", err)
	}
	if !warm {
		<-down // the edge ends the stream after our last frame
		return nil
	}
	// The run is over at the provider: it is no run in flight while its
	// stream waits idle, until the edge ends the stream or sends the next
	// Dispatch. But the terminal frame is only queued: until the edge ends
	// or reuses the stream it may not have read it, so the run stays
	// unacknowledged and a drain waits for it (the edge ends a draining
	// connection's streams once it read their runs' ends). A drain that
	// closed the connection at once cut answers the provider had finished
	// (TestRegression_DrainKeepsAnswersFinishedAsItBegan).
	c.finishWarm(r)
	c.warmIdle()
	next = <-down
	if next == nil {
		c.warmGone()
	}
	c.acknowledged()
	return next
}

// readDown starts reading r's side of stream (readRunDownTo, for d's
// body) and returns the channel that gives what it returned: the next
// Dispatch, or nil once the stream ended. On a warm stream the stream's
// one reader (rd) reads it; on a stream of the run's own, a goroutine of
// its own. Either is the only caller of stream.Recv until that value is
// received.
func readDown(stream runStream, rd *downReader, r *run, d *nodev1.Dispatch, bodies chan<- bodyResult) <-chan *nodev1.Dispatch {
	if rd != nil {
		rd.jobs <- downJob{r: r, inline: d.BodyInline, streamed: streamedOp(d.Operation), bodies: bodies}
		return rd.next
	}
	down := make(chan *nodev1.Dispatch, 1)
	inline, streamed := d.BodyInline, streamedOp(d.Operation)
	go func() { down <- readRunDownTo(stream, r, inline, streamed, bodies) }()
	return down
}

// downReader is a warm run stream's one reader, for the stream's whole
// life: it reads each run's side of the stream (readRunDownTo) when that
// run's goroutine hands it the run (jobs), and gives back what it
// returned (next: the next Dispatch, or nil once the stream ended) before
// it reads again. Between runs it is parked on jobs and nothing calls
// stream.Recv but the warm stream's goroutine (serveWarm, refuseOn). One
// goroutine per stream, not one per run, so the stack protobuf's decoder
// grows serves every run of the stream.
type downReader struct {
	jobs chan downJob
	next chan *nodev1.Dispatch
	done chan struct{} // closed when the reader returned
}

// downJob is one run for a downReader: readRunDownTo's arguments.
type downJob struct {
	r                *run
	inline, streamed bool
	bodies           chan<- bodyResult
}

// newDownReader starts stream's reader; stop ends it.
func newDownReader(stream runStream) *downReader {
	rd := &downReader{jobs: make(chan downJob), next: make(chan *nodev1.Dispatch, 1), done: make(chan struct{})}
	go func() {
		defer close(rd.done)
		for j := range rd.jobs {
			rd.next <- readRunDownTo(stream, j.r, j.inline, j.streamed, j.bodies)
		}
	}()
	return rd
}

// stop ends the reader and waits for it; every run handed to it must
// have received its next value.
func (rd *downReader) stop() {
	close(rd.jobs)
	<-rd.done
}

// inlineBody is the body a Dispatch carried inline, or ErrBodyTooLarge
// (413) above MaxBodyBytes, as for a body sent in chunks.
func inlineBody(data []byte) bodyResult {
	if len(data) > MaxBodyBytes {
		return bodyResult{err: &adapter.Error{Kind: adapter.ErrBadRequest, Status: http.StatusRequestEntityTooLarge, Message: ErrBodyTooLarge.Error()}}
	}
	return bodyResult{data: data}
}

// readRunDown reads the edge's side of a run stream: body chunks until
// last (delivered once on bodies; none are expected, and any is ignored,
// when the body came inline in the Dispatch), and Cancel. When the stream
// ends, for any reason, the run's work is cancelled: nobody is left to
// answer. On a warm stream the edge sends the next run's Dispatch once
// this run ended cleanly: readRunDown returns it, reading no further.
//
// The body is not copied when it came in one Body message (the codec
// unmarshalled it into a slice of its own); chunks are joined once, at the
// last one, into a slice of the body's size.
func readRunDown(stream runStream, r *run, inline bool, bodies chan<- bodyResult) *nodev1.Dispatch {
	return readRunDownTo(stream, r, inline, false, bodies)
}

// readRunDownTo is readRunDown; with streamed set, the body is delivered
// at its first chunk as a pipe its chunks are written to as they come,
// under the run stream's flow control (the adapter's reads pace the
// edge), without MaxBodyBytes (the edge bounds it); the pipe fails with
// the stream's error if the stream ends before the last chunk.
func readRunDownTo(stream runStream, r *run, inline, streamed bool, bodies chan<- bodyResult) *nodev1.Dispatch {
	var chunks [][]byte
	size := 0
	delivered := inline
	var pipe *io.PipeWriter // the streamed body's, until its last chunk
	for {
		m, err := stream.Recv()
		if err != nil {
			if pipe != nil {
				pipe.CloseWithError(fmt.Errorf("%w: %w", ErrRunStreamEnded, err))
			}
			r.cancelWork(fmt.Errorf("%w: %w", ErrRunStreamEnded, err))
			return nil
		}
		switch x := m.Msg.(type) {
		case *nodev1.RunDown_Dispatch:
			return x.Dispatch
		case *nodev1.RunDown_Body:
			if streamed && !delivered {
				pr, pw := io.Pipe()
				pipe, delivered = pw, true
				// Once the run's work ends (cancelled, the connection
				// gone, the run over) nobody may read the pipe: its
				// writes below must fail, not wait, or the stream's
				// reader (which runOn waits for) never reads again.
				context.AfterFunc(r.workCtx, func() {
					pr.CloseWithError(fmt.Errorf("%w: %w", adapter.ErrCancelled, context.Cause(r.workCtx)))
				})
				bodies <- bodyResult{reader: pr}
			}
			if pipe != nil {
				if len(x.Body.Data) > 0 {
					if _, err := pipe.Write(x.Body.Data); err != nil {
						pipe = nil // the adapter is done with it: the rest is dropped
						continue
					}
				}
				if x.Body.Last {
					pipe.Close()
					pipe = nil
				}
				continue
			}
			if delivered {
				continue
			}
			if size+len(x.Body.Data) > MaxBodyBytes {
				delivered, chunks = true, nil
				bodies <- bodyResult{err: &adapter.Error{Kind: adapter.ErrBadRequest, Status: http.StatusRequestEntityTooLarge, Message: ErrBodyTooLarge.Error()}}
				continue
			}
			chunks = append(chunks, x.Body.Data)
			size += len(x.Body.Data)
			if x.Body.Last {
				delivered = true
				data := chunks[0]
				if len(chunks) > 1 {
					data = bytes.Join(chunks, nil)
				}
				chunks = nil
				bodies <- bodyResult{data: data}
			}
		case *nodev1.RunDown_Cancel:
			r.cancelWork(fmt.Errorf("%w: %s", ErrCancelledByEdge, x.Cancel.Reason))
		}
	}
}

// terminal is the one mapping from a run's outcome to its last frame on
// the wire; nil when nothing more needs or can be sent.
//
//	outcome                normalized                 tunnel
//	nil                    nil (COMPLETE was sent)    TunnelEnd
//	adapter.ErrProviderReported  ERROR{message, status}  TunnelEnd{provider_error: message}
//	adapter.ErrSink        nil (the stream is gone)   nil
//	adapter.ErrCancelled   CANCELLED                  TunnelError{"run cancelled", 0}
//	adapter.ErrBadRequest  ERROR{message, 400,        TunnelError{message, 400}
//	  (status 400)           invalid_request, param}
//	*adapter.Error         ERROR{message, status}     TunnelError{message, status,
//	                                                    model_failure}
//	anything else          ERROR{..., 502}            TunnelError{..., 502}
//
// An ERROR event's invalid_request tells the edge that the node itself
// could not turn the request into its provider's protocol (a client error,
// with param naming the field when the error names one), not that the
// provider refused it. A TunnelError of status 400 is always the node's own
// (a tunnel relays a provider's error answers as TunnelHead and TunnelData).
func terminal(path nodev1.ExecutionPath, err error) *nodev1.RunUp {
	tunnel := path == nodev1.ExecutionPath_EXECUTION_PATH_TUNNEL
	var (
		aerr      *adapter.Error
		msg       string
		code      int32
		cancelled bool
		modelOnly bool
	)
	switch {
	case err == nil:
		if tunnel {
			return &nodev1.RunUp{Msg: &nodev1.RunUp_TunnelEnd{TunnelEnd: &nodev1.TunnelEnd{}}}
		}
		return nil
	case errors.Is(err, adapter.ErrSink):
		return nil
	case tunnel && errors.Is(err, adapter.ErrProviderReported):
		// The body went through whole; only the outcome says it failed.
		provErr := "provider reported an error"
		if errors.As(err, &aerr) {
			provErr = aerr.Message
		}
		return &nodev1.RunUp{Msg: &nodev1.RunUp_TunnelEnd{TunnelEnd: &nodev1.TunnelEnd{ProviderError: provErr}}}
	case errors.Is(err, adapter.ErrCancelled):
		msg, cancelled = "run cancelled", true
	case errors.Is(err, ErrNoAdapter):
		msg, code = err.Error(), http.StatusBadGateway
	case errors.As(err, &aerr):
		msg, code, modelOnly = aerr.Message, int32(aerr.Status), aerr.ModelFailure
		if !tunnel && errors.Is(err, adapter.ErrBadRequest) && aerr.Status == http.StatusBadRequest {
			ev := &nodev1.RunEvent{Type: nodev1.RunEvent_TYPE_ERROR, Error: msg, Status: code, InvalidRequest: true, Param: aerr.Param}
			return &nodev1.RunUp{Msg: &nodev1.RunUp_Events{Events: &nodev1.RunEvents{Events: []*nodev1.RunEvent{ev}}}}
		}
	default:
		msg, code = "node failed to run the request", http.StatusBadGateway
	}
	if tunnel {
		return &nodev1.RunUp{Msg: &nodev1.RunUp_TunnelError{TunnelError: &nodev1.TunnelError{Message: msg, Status: code, ModelFailure: modelOnly}}}
	}
	ev := &nodev1.RunEvent{Type: nodev1.RunEvent_TYPE_ERROR, Error: msg, Status: code}
	if cancelled {
		ev = &nodev1.RunEvent{Type: nodev1.RunEvent_TYPE_CANCELLED}
	}
	return &nodev1.RunUp{Msg: &nodev1.RunUp_Events{Events: &nodev1.RunEvents{Events: []*nodev1.RunEvent{ev}}}}
}

// eventSink sends run events up a run stream, one message per Send,
// until one carries a terminal event (complete, error, cancelled): it
// drops whatever comes after, so nothing of a run follows its terminal
// frame on the wire (a reused warm stream carries the next run after it).
// It belongs to the run goroutine. The message (its RunUp, oneof and
// RunEvents) is pooled: gRPC marshals a message before Send returns and
// keeps no reference to it (no stats handler or binary log is installed),
// so it is reused at once.
type eventSink struct {
	s     runStream
	ended bool   // a terminal event was sent
	last  func() // called just before the terminal event is sent (frees the provider slot)
	// spans, when set (a traced run), get the time the terminal frame was
	// sent (runSpans.lastAt).
	spans *runSpans
}

var _ adapter.EventSink = (*eventSink)(nil)

func (s *eventSink) Send(events ...*nodev1.RunEvent) error {
	if s.ended {
		return nil
	}
	for _, e := range events {
		switch e.GetType() {
		case nodev1.RunEvent_TYPE_COMPLETE, nodev1.RunEvent_TYPE_ERROR, nodev1.RunEvent_TYPE_CANCELLED:
			s.ended = true
		}
	}
	if s.ended && s.last != nil {
		s.last()
	}
	if s.ended && s.spans != nil {
		s.spans.lastAt = time.Now()
	}
	m := eventsMsgPool.Get().(*eventsMsg)
	m.events.Events = events
	err := s.s.Send(&m.up)
	m.events.Events = nil
	eventsMsgPool.Put(m)
	return err
}

// eventsMsg is one RunUp of run events, its three parts in one allocation.
type eventsMsg struct {
	up     nodev1.RunUp
	oneof  nodev1.RunUp_Events
	events nodev1.RunEvents
}

var eventsMsgPool = sync.Pool{New: func() any {
	m := &eventsMsg{}
	m.oneof.Events, m.up.Msg = &m.events, &m.oneof
	return m
}}

// tunnelSink sends a tunneled answer up a run stream: the head, with the
// body's start or all of it, as one TunnelHead; each chunk as a
// TunnelData. gRPC serializes a message before Send returns and keeps
// nothing of it (no stats handler or binary log is installed), so the
// adapter's buffers may be reused at once, and so is Data's message
// (pooled, as eventSink's).
type tunnelSink struct {
	s runStream
	// ended is set once a head with the whole body (End) was sent: it was
	// the run's last frame, so serveRun sends no TunnelEnd after it.
	ended bool
	// split: the edge does not read TunnelHead's data, end and
	// content_length (no nodev1.FeatureTunnelHeadBody in its Welcome): a head's
	// body goes as a TunnelData after it, and its end as the TunnelEnd
	// serveRun sends (ended stays false).
	split bool
	last  func() // called just before a head with the whole body is sent (frees the provider slot)
	// spans, when set (a traced run), get the answer's status and the
	// time the terminal frame was sent.
	spans *runSpans
}

var _ adapter.TunnelSink = (*tunnelSink)(nil)

func (s *tunnelSink) Head(h adapter.TunnelHead) error {
	if s.spans != nil {
		s.spans.status = h.Status
	}
	headers := make(map[string]string, len(h.Header))
	for k, vs := range h.Header {
		headers[k] = strings.Join(vs, ", ")
	}
	if s.split {
		if err := s.s.Send(&nodev1.RunUp{Msg: &nodev1.RunUp_TunnelHead{TunnelHead: &nodev1.TunnelHead{Status: int32(h.Status), Headers: headers}}}); err != nil {
			return err
		}
		if len(h.Body) == 0 {
			return nil
		}
		return s.Data(h.Body)
	}
	head := &nodev1.TunnelHead{Status: int32(h.Status), Headers: headers, Data: h.Body, End: h.End}
	if !h.End && h.ContentLength > 0 { // 0 on the wire is unknown (node.proto)
		head.ContentLength = h.ContentLength
	}
	s.ended = h.End
	if s.ended && s.last != nil {
		s.last()
	}
	if s.ended && s.spans != nil {
		s.spans.lastAt = time.Now()
	}
	return s.s.Send(&nodev1.RunUp{Msg: &nodev1.RunUp_TunnelHead{TunnelHead: head}})
}

func (s *tunnelSink) Data(p []byte) error {
	m := tunnelDataMsgPool.Get().(*tunnelDataMsg)
	m.data.Data = p
	err := s.s.Send(&m.up)
	m.data.Data = nil
	tunnelDataMsgPool.Put(m)
	return err
}

// tunnelDataMsg is one RunUp of tunnel data, its three parts in one
// allocation.
type tunnelDataMsg struct {
	up    nodev1.RunUp
	oneof nodev1.RunUp_TunnelData
	data  nodev1.TunnelData
}

var tunnelDataMsgPool = sync.Pool{New: func() any {
	m := &tunnelDataMsg{}
	m.oneof.TunnelData, m.up.Msg = &m.data, &m.oneof
	return m
}}

// logRun logs msg about run r at level, with the run's id, provider and
// generation. The attributes are built only when level is enabled: a
// logger made with With for every run formatted them even when its lines
// were then dropped (most are at debug).
func (c *conn) logRun(level slog.Level, r *run, d *nodev1.Dispatch, msg string, args ...any) {
	if !c.a.logger.Enabled(r.streamCtx, level) {
		return
	}
	c.a.logger.Log(r.streamCtx, level, msg, append([]any{"run_id", r.id, "provider", d.ProviderId, "generation", c.gen}, args...)...)
}
