package edge

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"iop/internal/edge/contract"
	"iop/internal/wire/nodev1"
)

type runState uint8

const (
	runPending runState = iota // Dispatch sent, waiting for the node's Run stream
	runOpen                    // Run stream attached
	runEnded                   // terminal message seen, closed, or failed
)

// Run is one dispatched request, from the Dispatch message to its end. Its
// lease is released exactly once, by whichever ends it first: a terminal
// message seen by Recv, Cancel or Close, a failure of its stream or node
// connection, a dispatch timeout or refusal.
//
// Recv must be called from one goroutine at a time; Cancel may be called
// from any goroutine, also while Recv blocks. A caller that got a Run from
// Dispatch must call Close exactly once when done with it (after the run
// ended it only reports the outcome), as with an http.Response body: the
// run's RunEnded event is published then, carrying the caller's outcome.
type Run struct {
	s    *Service
	conn *conn
	// grant is the run's admitted slot: a lease of this edge's scheduler,
	// or the leader's lease of a follower's run (several edges).
	grant grant
	// epoch and leaseID stamp the run's Dispatch (several edges: the
	// leader's epoch and lease that admitted it; 0 outside a cluster).
	epoch   int64
	leaseID uint64
	long    bool   // its lease is long-context
	model   string // the requested model name: the run's queue
	// load is set when the scheduler expected the provider to load the
	// model for it (scheduler.DispatchInfo.Load); dispatched is when it
	// was admitted: the delay to its first answer is the load's cost.
	load       bool
	dispatched time.Time
	info       contract.DispatchInfo
	// inline: the body went in the Dispatch message; else body is to be
	// sent down the run stream.
	inline bool
	// warm: the Dispatch went down a warm Run stream of the node
	// (dispatchWarm), not on the control stream; set before the run is
	// shared.
	warm bool
	// awaitAck: a warm run whose node has not yet acknowledged it (RunOpen
	// naming it, or RunUp.refused): recv drops every message before, so
	// nothing of the stream's earlier run can pass for this one's. Only
	// the caller of recv touches it after the run is shared.
	awaitAck bool
	// endedClean is set by recv when the message it read ends the run
	// cleanly (a complete event, a tunnel end without provider error),
	// before it ends the run: a warm stream whose run so ended, without a
	// cancel, is reused (serveWarm).
	endedClean atomic.Bool
	body       []byte
	// bodyFrom, when set, streams the body instead (Request.BodyFrom).
	bodyFrom func(servedModel string) io.Reader
	// opened is closed when the node's Run stream is attached and its
	// RunStarted published (so that Dispatch, and the caller's Close with
	// its RunEnded, come after it); bodySent when the whole body went down
	// it (at once for an inline body); ended when the run ends.
	opened, bodySent, ended chan struct{}
	// ticket reports the run's outcome to its provider's circuit breaker.
	ticket *ticket
	// decided is set once a message said how the provider did (its first
	// decisive message, verdict); only the caller of Recv touches it.
	decided bool
	// answered is set when that message said the provider answered: the
	// ticket's outcome then waits for the answer's end (observe, finish).
	answered atomic.Bool
	// brokenAnswer is set by Fail, and by Close with
	// OutcomeUpstreamError: the HTTP API found the provider's answer
	// broken (an error object in its 200 stream, an answer it cannot
	// decode) before a terminal message said so, and ended the run;
	// finish then reports a failure.
	brokenAnswer atomic.Bool

	mu           sync.Mutex // guards the fields below
	ahead        readAhead  // read by Dispatch, to be returned by Recv first
	state        runState
	stream       nodev1.NodeGateway_RunServer // set when opened
	endErr       error                        // why the run failed; nil for a clean end
	cancelNode   bool                         // ended before the node finished it
	cancelReason EndReason                    // why the run ended (the RunEnded reason)
	cancelDetail string                       // the HTTP API's words for EndClosed, for the node and the log
	// settled is set once the run's owner reported how its request ended
	// (Close) or Dispatch dropped it: RunEnded is published then, once.
	settled bool
}

// Info returns where the run was dispatched.
func (r *Run) Info() contract.DispatchInfo { return r.info }

// Recv returns the next message the node sent on this run, decoded
// (contract.Message): a normalized run's events; a tunnel run's head,
// data, end or failure. When it returns a message that ends the run
// (Message.Ends: a complete, error or cancelled event, a tunnel end or
// failure) the lease is already released, and later calls return io.EOF;
// so do calls after Close. When the node connection or the run stream fails
// first, it returns an error wrapping ErrNodeGone (the lease is released).
// Messages Dispatch read to decide whether to admit the request again come
// first, as they came.
func (r *Run) Recv() (contract.Message, error) {
	m, err := r.recv()
	return m.msg, err
}

// recv is Recv with what the edge reads of the message. Each message is
// decoded once (decodeRunUp), here, and it is here alone that the run's end
// is detected and its lease released.
func (r *Run) recv() (runMsg, error) {
	r.mu.Lock()
	if m, ok := r.ahead.pop(); ok {
		r.mu.Unlock()
		return m, nil
	}
	state, stream := r.state, r.stream
	r.mu.Unlock()
	if state == runEnded || stream == nil {
		return runMsg{}, r.endResult()
	}
	for {
		raw, err := stream.Recv()
		if err != nil {
			cause := err
			if err == io.EOF {
				cause = errRunAborted
			}
			r.finish(EndRunStreamFailed, fmt.Errorf("%w: node %q run %q: %w", ErrNodeGone, r.info.NodeID, r.info.RunID, cause), false)
			return runMsg{}, r.endResult()
		}
		if r.awaitAck {
			if ref := raw.GetRefused(); ref != nil && ref.GetRunId() == r.info.RunID {
				// The node refused the Dispatch it got on its warm stream, as
				// it would have on the control stream (handleNodeMessage).
				r.finish(EndDispatchRefused, r.s.refusal(r.conn, ref), false)
				return runMsg{}, r.endResult()
			}
			if open := raw.GetOpen(); open != nil && open.GetRunId() == r.info.RunID {
				r.awaitAck = false
			}
			continue // the acknowledgement, or a late message of the stream's earlier run
		}
		m, ok := decodeRunUp(raw)
		if !ok {
			continue // a repeated RunOpen or an empty message: nothing for the caller
		}
		r.observe(m)
		if m.msg.Ends {
			r.endedClean.Store(m.reason == EndComplete || m.reason == EndTunnelEnd)
			if !r.finish(m.reason, nil, false) {
				return runMsg{}, r.endResult() // ended by Close or a failure meanwhile
			}
			return m, nil
		}
		r.mu.Lock()
		ended := r.state == runEnded
		r.mu.Unlock()
		if ended {
			return runMsg{}, r.endResult()
		}
		return m, nil
	}
}

// classifyRunUp says whether m is for the caller of Recv and whether it ends
// the run, with the release reason.
func classifyRunUp(m *nodev1.RunUp) (reason EndReason, terminal, ok bool) {
	switch msg := m.GetMsg().(type) {
	case *nodev1.RunUp_Events:
		for _, e := range msg.Events.GetEvents() {
			switch e.GetType() {
			case nodev1.RunEvent_TYPE_COMPLETE:
				return EndComplete, true, true
			case nodev1.RunEvent_TYPE_ERROR:
				return EndError, true, true
			case nodev1.RunEvent_TYPE_CANCELLED:
				return EndCancelled, true, true
			}
		}
		return "", false, true
	case *nodev1.RunUp_TunnelEnd:
		if msg.TunnelEnd.GetProviderError() != "" {
			return EndTunnelProviderError, true, true
		}
		return EndTunnelEnd, true, true
	case *nodev1.RunUp_TunnelError:
		return EndTunnelError, true, true
	case *nodev1.RunUp_TunnelHead:
		if msg.TunnelHead.GetEnd() { // the whole answer: as a TunnelEnd without provider_error
			return EndTunnelEnd, true, true
		}
		return "", false, true
	case *nodev1.RunUp_TunnelData:
		return "", false, true
	default:
		return "", false, false
	}
}

// observe reports the provider's outcome to its circuit breaker. A
// failure before the provider answered is reported at the first message
// that tells it; an answer that began is reported at its terminal message:
// outcomeFailed when that ends it with a provider failure (lateFailure),
// else outcomeOK (and by finish as outcomeOK when the run ends otherwise,
// e.g. its client left). So a provider whose answers keep breaking off
// with an error object is taken out of rotation like one that fails at
// once, and each clean answer resets its count.
func (r *Run) observe(m runMsg) {
	if !r.decided {
		if !m.decisive {
			return
		}
		r.decided = true
		if m.outcome != outcomeOK {
			if r.ticket.done(m.outcome) {
				r.s.circuitOpened(providerKey{r.info.NodeID, r.info.ProviderID})
			}
			return
		}
		if r.load {
			r.s.sched.ObserveLoad(r.info.NodeID, r.info.ProviderID, r.info.ServedModel, r.s.clock.Now().Sub(r.dispatched))
		}
		r.answered.Store(true)
	}
	if !r.answered.Load() {
		return
	}
	if m.msg.Ends {
		o := outcomeOK
		if m.late {
			o = outcomeFailed
		}
		if r.ticket.done(o) {
			r.s.circuitOpened(providerKey{r.info.NodeID, r.info.ProviderID})
		}
	}
}

// lateFailure reports whether m, a message after the provider's answer
// began, ends it with a failure of the provider: an ERROR event or a
// TunnelError of status 429 or 500 and above (or none: the node's own 502)
// that is not the served model's alone (model_failure), or a TunnelEnd whose body carried the provider's error object
// (provider_error). A cancel (CANCELLED, a TunnelError of status 0) and a
// client error (another 4xx) are none.
func lateFailure(m *nodev1.RunUp) bool {
	failed := func(status int) bool {
		return status == 0 || status == http.StatusTooManyRequests || status >= 500
	}
	switch msg := m.GetMsg().(type) {
	case *nodev1.RunUp_Events:
		for _, e := range msg.Events.GetEvents() {
			if e.GetType() == nodev1.RunEvent_TYPE_ERROR {
				return failed(int(e.GetStatus()))
			}
		}
	case *nodev1.RunUp_TunnelError:
		return msg.TunnelError.GetStatus() != 0 && !msg.TunnelError.GetModelFailure() && failed(int(msg.TunnelError.GetStatus()))
	case *nodev1.RunUp_TunnelEnd:
		return msg.TunnelEnd.GetProviderError() != ""
	}
	return false
}

// verdict says what m, the first message of a run that is not a bare
// RunOpen, tells of its provider, whether it is the first that tells it
// (decisive), and, for a failure before any byte of the answer that another
// candidate may serve instead, the retry reason: "status 429", "status
// 502" (also unreachable: the node's status for a provider it could not
// reach) or "status 503". A run event ERROR without a status counts as
// 502, as the HTTP layer answers it.
func verdict(m *nodev1.RunUp) (o outcome, decisive bool, retry string) {
	switch msg := m.GetMsg().(type) {
	case *nodev1.RunUp_Events:
		for _, e := range msg.Events.GetEvents() {
			switch e.GetType() {
			case nodev1.RunEvent_TYPE_STARTED, nodev1.RunEvent_TYPE_DELTA, nodev1.RunEvent_TYPE_USAGE, nodev1.RunEvent_TYPE_COMPLETE:
				return outcomeOK, true, ""
			case nodev1.RunEvent_TYPE_CANCELLED:
				return outcomeNeutral, true, ""
			case nodev1.RunEvent_TYPE_ERROR:
				status := int(e.GetStatus())
				if status == 0 {
					status = http.StatusBadGateway
				}
				o, retry := statusOutcome(status)
				return o, true, retry
			}
		}
		return outcomeNeutral, false, ""
	case *nodev1.RunUp_TunnelHead:
		o, retry := statusOutcome(int(msg.TunnelHead.GetStatus()))
		return o, true, retry
	case *nodev1.RunUp_TunnelError:
		if msg.TunnelError.GetStatus() == 0 { // the run was cancelled
			return outcomeNeutral, true, ""
		}
		o, retry := statusOutcome(int(msg.TunnelError.GetStatus()))
		if msg.TunnelError.GetModelFailure() {
			// The served model's server failed, not the provider: another
			// candidate may serve the model, but no circuit counts it.
			o = outcomeNeutral
		}
		return o, true, retry
	case *nodev1.RunUp_TunnelData, *nodev1.RunUp_TunnelEnd:
		return outcomeNeutral, true, "" // out of order: the HTTP layer answers it
	default:
		return outcomeNeutral, false, ""
	}
}

// statusOutcome classifies an HTTP status a provider answered (or its node
// reported) before the first byte: 429 and 500 and above are failures, 429,
// 502 and 503 worth another candidate (RFC 9110 15.6.3, 15.6.4: a gateway
// could not get an answer, the server is overloaded; RFC 6585 4: too many
// requests), other 4xx the client's own, anything below 400 an answer.
func statusOutcome(status int) (outcome, string) {
	switch {
	case status == http.StatusTooManyRequests, status == http.StatusBadGateway, status == http.StatusServiceUnavailable:
		return outcomeFailed, fmt.Sprintf("status %d", status)
	case status >= 500:
		return outcomeFailed, ""
	case status >= 400:
		return outcomeNeutral, ""
	default:
		return outcomeOK, ""
	}
}

// endResult is what Recv returns once the run ended: its failure, or io.EOF.
func (r *Run) endResult() error {
	<-r.ended // the run ended: wait until its slot is free (finishIf)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.endErr != nil {
		return r.endErr
	}
	return io.EOF
}

// Cancel ends the run if it has not ended: it sends Cancel{run_id} on the
// node's control stream and on the run stream, releases the lease and lets
// the node's Run handler return; a blocked Recv returns. The run ends
// EndClosed; detail says why in words, for the node and the logs. It is
// idempotent and safe from any goroutine. Messages Dispatch read ahead and
// Recv has not returned yet are dropped. It publishes nothing: the run's
// RunEnded event waits for Close.
func (r *Run) Cancel(detail string) {
	r.end(EndClosed, detail)
}

// end ends the run for reason (detail in words, may be empty) as Cancel
// does, telling the node.
func (r *Run) end(reason EndReason, detail string) {
	r.finishIf(func(runState) bool { return true }, reason, detail, nil, true)
	r.mu.Lock()
	r.ahead.reset()
	r.mu.Unlock()
}

// Fail ends the run as Cancel does, as its provider's failure: the HTTP
// API found the provider's answer broken (an error object inside its 2xx
// stream, an answer it cannot decode, one that breaks the protocol)
// before a terminal message told the edge so. If no message of the run
// decided its circuit breaker's outcome yet, the run counts as the
// provider's failure (finish), as a terminal failure message would (the
// translated routes stop reading a tunnel at the provider's error object,
// and such failures must open an OpenAI-compatible provider's circuit,
// not reset its failure count).
func (r *Run) Fail(reason string) {
	r.brokenAnswer.Store(true)
	r.Cancel(reason)
}

// Close ends the run as Cancel(outcome) does if it has not ended, and
// reports how the request it served ended: outcome is the HTTP API's
// outcome of that request ("completed", "client_gone", ...; see package
// edge/api), decided once by its caller. The run's RunEnded event is
// published now, once, with outcome and the reason the run ended for. The
// caller that got the run from Dispatch calls Close exactly once, after
// its answer was finished; later calls do nothing more than Cancel.
// OutcomeUpstreamError says the provider's answer was broken: if no
// terminal message told the circuit breaker already, Close counts it as
// the provider's failure.
func (r *Run) Close(outcome contract.Outcome) {
	if outcome == contract.OutcomeUpstreamError {
		r.brokenAnswer.Store(true)
	}
	r.Cancel(string(outcome))
	r.settle(string(outcome))
}

// drop settles a run Dispatch does not hand to its caller (an attempt
// that failed, was admitted again, or whose caller left): it ends it if
// needed and publishes its RunEnded without an outcome (it is not the end
// of a request).
func (r *Run) drop(reason EndReason) {
	r.end(reason, "")
	r.settle("")
}

// settle publishes the ended run's RunEnded event with outcome, once.
func (r *Run) settle(outcome string) {
	r.mu.Lock()
	if r.settled || r.state != runEnded {
		r.mu.Unlock()
		return
	}
	r.settled = true
	reason := r.cancelReason
	r.mu.Unlock()
	r.s.emitRunEnded(r, string(reason), outcome)
}

// finish ends the run with endErr (nil = clean) if it has not ended, and
// reports whether this call ended it. It releases the lease, forgets the
// run, and, with cancelNode, sends Cancel on the control stream; the Run
// handler sends the run stream's Cancel.
//
// It is the one place a run ends, whichever comes first: Recv seeing a
// terminal message or a stream error, Cancel or Close, the dispatch
// timeout, a refusal (DispatchRefused, RunUp.refused), the caller's
// context while dispatching, the end of its connection or Run stream, the
// edge stopping. Run.mu decides the winner; then, with no lock held, the
// breaker hears the outcome, the lease is released and Run.ended closes,
// so whoever waits for the end finds the slot free.
func (r *Run) finish(reason EndReason, endErr error, cancelNode bool) bool {
	return r.finishIf(func(runState) bool { return true }, reason, "", endErr, cancelNode)
}

// finishIf is finish when cond holds for the run's state; detail (may be
// empty) says the reason in words, for the node and the log.
func (r *Run) finishIf(cond func(runState) bool, reason EndReason, detail string, endErr error, cancelNode bool) bool {
	r.mu.Lock()
	if r.state == runEnded || !cond(r.state) {
		r.mu.Unlock()
		return false
	}
	r.state = runEnded
	r.endErr = endErr
	r.cancelNode = cancelNode
	r.cancelReason, r.cancelDetail = reason, detail
	r.mu.Unlock()

	// A run that ends before its provider said anything tells nothing of
	// it, unless its node never opened or refused it.
	// A refusal by a draining node, of a busy provider or of a deposed
	// leader's epoch says nothing of its provider either.
	// One whose provider answered and that ended without a terminal
	// message (its client left, its node was lost) did well as far as it
	// went (observe reports the others), unless the HTTP API found its
	// answer broken: the translated routes (Ollama, Responses, Messages)
	// stop reading a tunnel at the provider's error object, before the
	// TunnelEnd that would say so, and such failures must still count
	// against an OpenAI-compatible provider's circuit.
	o := outcomeNeutral
	if r.answered.Load() {
		o = outcomeOK
		if r.brokenAnswer.Load() {
			o = outcomeFailed
		}
	}
	if (errors.Is(endErr, ErrDispatchTimeout) || errors.Is(endErr, ErrDispatchRefused)) && !errors.Is(endErr, errNodeDraining) && !errors.Is(endErr, ErrProviderBusy) && !errors.Is(endErr, errStaleEpoch) {
		o = outcomeFailed
	}
	// The breaker hears the outcome before the slot is free: when it opens
	// the circuit, circuitOpened re-resolves the queued requests first, so
	// the freed slot does not go to a waiter that still lists a provider
	// this very outcome took out of rotation (TestOpenCircuitOfTools-
	// ProviderIsUnavailable hung when it did).
	if r.ticket.done(o) {
		r.s.circuitOpened(providerKey{r.info.NodeID, r.info.ProviderID})
	}
	// Released before anyone can see the run ended (r.ended; Recv and
	// outcome wait for it): whoever observes the end finds the slot free.
	// The lease is released with no lock held.
	r.grant.release(reason)
	close(r.ended)
	r.s.forget(r)
	if cancelNode {
		r.conn.enqueue(&nodev1.EdgeMessage{Msg: &nodev1.EdgeMessage_Cancel{Cancel: &nodev1.Cancel{RunId: r.info.RunID, Reason: cancelText(reason, detail)}}})
	}
	r.s.log.Debug("run ended", "run", r.info.RunID, "node", r.info.NodeID, "provider", r.info.ProviderID, "reason", string(reason), "detail", detail, "err", endErr)
	return true
}

// attach hands the node's Run stream to the run if it is pending. The
// caller that attached it then publishes RunStarted and closes r.opened.
func (r *Run) attach(stream nodev1.NodeGateway_RunServer) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.state != runPending {
		return false
	}
	r.state = runOpen
	r.stream = stream
	return true
}

// reusable reports whether the ended run's stream may carry another run:
// the run ended at its node's clean terminal message (endedClean), read by
// recv, and nothing else ended it first (no cancel, no failure).
func (r *Run) reusable() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.state == runEnded && r.endedClean.Load() && !r.cancelNode && r.endErr == nil
}

// cancelled reports whether the run ended before the node finished it,
// and why in the words of the node's Cancel.
func (r *Run) cancelled() (bool, string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cancelNode, cancelText(r.cancelReason, r.cancelDetail)
}

// cancelText is a Cancel's reason for the node: the end reason, and its
// detail when there is one ("closed: the response was deleted").
func cancelText(reason EndReason, detail string) string {
	if detail == "" {
		return string(reason)
	}
	return string(reason) + ": " + detail
}

// outcome reports whether the run ended, and its failure (nil for a clean end).
func (r *Run) outcome() (ended bool, err error) {
	r.mu.Lock()
	ended = r.state == runEnded
	r.mu.Unlock()
	if !ended {
		return false, nil
	}
	<-r.ended // its slot is free (finishIf)
	r.mu.Lock()
	defer r.mu.Unlock()
	return true, r.endErr
}
