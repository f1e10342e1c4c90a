package observe

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"math/rand/v2"
	"net/http"
	"time"

	"go.opentelemetry.io/otel/trace"

	"iop/internal/auth"
	"iop/internal/edge/api/access"
	"iop/internal/edge/contract"
	"iop/internal/quota"
	"iop/internal/tracing"
)

// Request collects the RequestRecord of one request. Only the request's
// goroutine touches it (for a run of the runs API, the run's goroutine).
// Every method does nothing on a nil *Request (a route called outside a
// frame); the zero Request reads time.Now.
type Request struct {
	rec     RequestRecord
	err     error // the failure answered, if any
	decoded bool  // the request was decoded (Decoded was called)
	gone    bool  // the client was gone when the failure was to be answered
	sent    bool  // Dispatch returned a run
	// reason is how the rendering of the run ended (a renderer's reason),
	// outcome the outcome that reason maps to (Ended).
	reason  string
	outcome contract.Outcome
	// firstToken and lastToken are when the first and latest content
	// arrived; contentEvents counts the deltas or content-carrying events.
	firstToken, lastToken time.Time
	contentEvents         int
	now                   func() time.Time
	// decided is set once rec.Outcome was decided (Decide).
	decided bool
	// clientStream is set when the route recorded the client's own
	// "stream" (ClientStreams): the dispatched request's may differ.
	clientStream bool
	// trace is the request's span (span.go); nil without a tracer.
	trace *span
	// finishReason is the normalized run's finish reason (Finished).
	finishReason string
	// dispatchStart is when the request's first dispatch began
	// (Dispatching); slotFrom when its lease was granted: dispatchStart
	// plus its queue wait, set by Dispatched.
	dispatchStart, slotFrom time.Time
	// quota is the request's quota reservation (SetQuota), settled by
	// Finish; nil for none.
	quota *quota.Reservation
}

// Start starts the observation of r, which reached the frame now: a new
// request id (NewRequestID) and clientID, the client's X-Request-Id
// already clipped. With a tracer the request gets a server span
// continuing the client's traceparent; route is its route's path, "" for
// none.
func Start(now func() time.Time, r *http.Request, clientID string, tracer trace.Tracer, route string) Request {
	o := Request{now: now}
	o.rec.Start = o.clock()
	o.rec.RequestID, o.rec.ClientRequestID = NewRequestID(), clientID
	if tracer != nil {
		o.trace = newSpan(tracer, r, route)
	}
	return o
}

// Detached starts the observation of a run with no connection (a run of
// the runs API, a background response): an API request of operation,
// named requestID, of key ("" for an open API).
func Detached(now func() time.Time, operation, requestID, key string) Request {
	o := Request{now: now}
	o.rec.Start = o.clock()
	o.rec.API, o.rec.RequestID, o.rec.Key = operation, requestID, key
	return o
}

func (o *Request) clock() time.Time {
	if o.now == nil {
		return time.Now()
	}
	return o.now()
}

// NewRequestID returns "req_" and 128 random bits in hex. The id only
// tells requests apart in records; it guards nothing, so math/rand's
// per-goroutine generator (no lock, no system call) is enough.
func NewRequestID() string {
	var b [16]byte
	binary.LittleEndian.PutUint64(b[:8], rand.Uint64())
	binary.LittleEndian.PutUint64(b[8:], rand.Uint64())
	return "req_" + hex.EncodeToString(b[:])
}

// SetQuota hands the request its quota reservation, settled by Finish.
func (o *Request) SetQuota(res *quota.Reservation) {
	if o != nil {
		o.quota = res
	}
}

// CancelQuota cancels the request's quota reservation, if any: it will
// not run.
func (o *Request) CancelQuota() {
	if o != nil && o.quota != nil {
		o.quota.Cancel()
		o.quota = nil
	}
}

// Begin marks the request as an API request of the named operation: only
// those get a RequestRecord. An operation already set stays (the runs API
// names its runs' chat requests "runs").
func (o *Request) Begin(api string) {
	if o != nil && o.rec.API == "" {
		o.rec.API = api
		if o.trace != nil {
			o.trace.begin(api, o.rec.Start)
		}
	}
}

// RequestID is the request's id ("" on a nil Request).
func (o *Request) RequestID() string {
	if o == nil {
		return ""
	}
	return o.rec.RequestID
}

// HandOff drops the request's record: another request records it (a run
// of the runs API records its submission when it ends).
func (o *Request) HandOff() {
	if o != nil {
		o.rec.API = ""
	}
}

// Key records the name of the request's API key.
func (o *Request) Key(name string) {
	if o != nil {
		o.rec.Key = name
	}
}

// Flow records the request's flow, its priority's name and whether the
// flow is its key's name.
func (o *Request) Flow(flow, priority string, fromKey bool) {
	if o != nil {
		o.rec.Flow, o.rec.Priority, o.rec.FlowFromKey = flow, priority, fromKey
	}
}

// Decoded records the decoded request: its operation, its model (clipped
// by the caller) and whether it streams.
func (o *Request) Decoded(op contract.Operation, model string, stream bool) {
	if o != nil {
		o.rec.Model, o.decoded = model, true
		if o.trace != nil {
			o.trace.request(op, o.rec.Model)
		}
		if !o.clientStream {
			o.rec.Stream = stream
		}
	}
}

// ClientStreams records the client's own "stream" flag, for a route whose
// dispatched request streams whatever the client asked (the Ollama routes:
// their canonical body always streams).
func (o *Request) ClientStreams(stream bool) {
	if o != nil {
		o.rec.Stream, o.clientStream = stream, true
	}
}

// QueueWaited records how long a request that got no run waited in its
// queue.
func (o *Request) QueueWaited(d time.Duration) {
	if o != nil {
		o.rec.QueueWait = d
	}
}

// Dispatching records that the request's dispatch (admission, then the
// send) began at at; its slot time counts from at plus its queue wait.
func (o *Request) Dispatching(at time.Time) {
	if o != nil && o.dispatchStart.IsZero() {
		o.dispatchStart = at
	}
}

// Dispatched records where the run went.
func (o *Request) Dispatched(info contract.DispatchInfo) {
	if o == nil {
		return
	}
	o.sent = true
	if o.slotFrom.IsZero() {
		o.slotFrom = o.clock()
		if !o.dispatchStart.IsZero() {
			o.slotFrom = o.dispatchStart.Add(info.QueueWait)
		}
	}
	o.rec.RunID, o.rec.NodeID, o.rec.ProviderID, o.rec.ProviderType = info.RunID, info.NodeID, info.ProviderID, info.ProviderType
	o.rec.ServedModel, o.rec.Generation, o.rec.QueueWait = info.ServedModel, info.Generation, info.QueueWait
	o.rec.CostWeight = info.CostWeight
	o.rec.Admission = contract.AdmissionImmediate
	if info.QueueReason == contract.AdmissionQueued {
		o.rec.Admission = contract.AdmissionQueued
	}
	o.rec.Path = info.Path.String()
}

// Failed records the failure answered with code, or not answered because
// the client was gone.
func (o *Request) Failed(err error, code *string, gone bool) {
	if o == nil {
		return
	}
	o.err, o.gone = err, gone
	if code != nil {
		o.rec.ErrorCode = *code
	}
}

// ErrorCode records the error code of a failure that ended an answer
// already started (its last event, or line, said it).
func (o *Request) ErrorCode(code *string) {
	if o != nil && code != nil {
		o.rec.ErrorCode = *code
	}
}

// Ended records how the rendered run ended (its renderer's reason) and
// the outcome that reason maps to, and returns the request's outcome,
// decided now (Decide); outcome itself on a nil Request.
func (o *Request) Ended(reason string, outcome contract.Outcome) contract.Outcome {
	if o == nil {
		return outcome
	}
	o.reason, o.outcome = reason, outcome
	if o.trace != nil {
		o.trace.event(tracing.EventStreamEnd, o.clock(), tracing.Reason.String(reason))
	}
	return o.Decide(0)
}

// Content records n content-carrying events arriving now.
func (o *Request) Content(n int) {
	if o == nil || n == 0 {
		return
	}
	now := o.clock()
	if o.contentEvents == 0 {
		o.firstToken = now
		if o.trace != nil {
			o.trace.event(tracing.EventFirstToken, now)
		}
	}
	o.lastToken = now
	o.contentEvents += n
}

// Finished records the finish reason of a normalized run ("stop",
// "length", "tool_calls", ...), for the trace.
func (o *Request) Finished(reason string) {
	if o != nil {
		o.finishReason = reason
	}
}

// Tokens records the run's usage.
func (o *Request) Tokens(in, out int) {
	if o != nil {
		o.rec.InputTokens, o.rec.OutputTokens, o.rec.TokensKnown = in, out, true
	}
}

// TraceContext returns ctx carrying the request's span, for Dispatch (its
// events, and the trace context it sends to the node); ctx itself
// without one.
func (o *Request) TraceContext(ctx context.Context) context.Context {
	if o == nil || o.trace == nil {
		return ctx
	}
	return o.trace.context(ctx)
}

// keyRefusal reports whether err is a refusal by the request's key: over
// one of its limits (*auth.LimitError) or quotas (*quota.Refusal), or a
// model it may not use.
func keyRefusal(err error) bool {
	var limit *auth.LimitError
	return errors.As(err, &limit) || errors.Is(err, access.ErrModelNotAllowed) || errors.Is(err, quota.ErrOverQuota)
}

// Decide decides the request's outcome, once: later calls return the
// first decision. status is the HTTP status sent (0: none); it matters
// only for a request that was not dispatched. A dispatched request's
// outcome is the one its renderer's reason maps to (Ended; error when it
// did not end), decided on the request goroutine when the rendering
// ended, so nothing that happens after (the client closing its
// connection once it has read the answer, which ends the request's
// context) can change it. A request that failed before dispatch is
// refused (admission failures, a key's limits), client_gone (the client
// left first), error (a 5xx) or invalid_request; one answered 2xx without
// a run (an Ollama "load") completed.
func (o *Request) Decide(status int) contract.Outcome {
	if o.decided {
		return o.rec.Outcome
	}
	o.decided = true
	rec := &o.rec
	switch {
	case o.sent:
		rec.Outcome = o.outcome
		if rec.Outcome == "" {
			rec.Outcome = contract.OutcomeError
		}
	case o.err != nil && (o.gone || contract.AdmissionOf(o.err) == contract.AdmissionCancelled):
		rec.Outcome = contract.OutcomeClientGone
		if o.decoded {
			rec.Admission = contract.AdmissionCancelled
		}
	case o.err != nil && keyRefusal(o.err):
		rec.Outcome = contract.OutcomeRefused
	case o.err != nil && errors.Is(o.err, contract.ErrShuttingDown):
		rec.Outcome = contract.OutcomeEdgeStopped
		if o.decoded {
			rec.Admission = contract.AdmissionOf(o.err)
		}
	case o.err != nil && o.decoded && contract.AdmissionOf(o.err) != "":
		rec.Admission, rec.Outcome = contract.AdmissionOf(o.err), contract.OutcomeRefused
		rec.ShedReason = contract.ShedReason(o.err)
	case status == 0:
		rec.Outcome = contract.OutcomeClientGone
	case status < 300:
		rec.Outcome = contract.OutcomeCompleted // answered without a run: an Ollama "load"
	case status >= 500:
		rec.Outcome = contract.OutcomeError
	default:
		rec.Outcome = contract.OutcomeInvalidRequest
	}
	return rec.Outcome
}

// Record completes the RequestRecord once the response ended with status
// (0: nothing sent), deciding its outcome if it was not yet.
func (o *Request) Record(status int) RequestRecord {
	o.Decide(status)
	rec := o.rec
	rec.Status = status
	end := o.clock()
	rec.Duration = end.Sub(rec.Start)
	if !o.slotFrom.IsZero() {
		rec.SlotTime = max(0, end.Sub(o.slotFrom))
	}
	if o.contentEvents > 0 {
		rec.TimeToFirstToken = o.firstToken.Sub(rec.Start)
		n := o.contentEvents
		if rec.TokensKnown && rec.OutputTokens > 0 {
			n = rec.OutputTokens
		}
		if n > 1 {
			rec.InterTokenLatency = o.lastToken.Sub(o.firstToken) / time.Duration(n-1)
		}
	}
	return rec
}

// Finish ends the observation once the response ended with status (0:
// nothing sent): it settles the request's quota reservation (settleQuota)
// and ends its span. ok is false when the request is no API request (no
// Begin, or HandOff): it has no record. Otherwise rec is its record,
// with the trace id of a sampled span, for the log line (Log), the
// Observer and the usage ledger (LedgerEntry), so they agree on its
// outcome.
func (o *Request) Finish(status int) (rec RequestRecord, ok bool) {
	if o.rec.API == "" {
		if o.quota != nil {
			settleQuota(o.quota, o.Record(status), o.sent)
		}
		if o.trace != nil {
			o.trace.drop()
		}
		return RequestRecord{}, false
	}
	rec = o.Record(status)
	if o.quota != nil {
		settleQuota(o.quota, rec, o.sent)
	}
	if o.trace != nil {
		rec.TraceID = o.trace.end(&rec, o.finishReason)
	}
	return rec, true
}

// settleQuota settles a request's reservation from its record: cancelled
// when it was never dispatched and its answer is a failure or none (sent
// false: Dispatch returned no run to this request; status 0 or ≥ 400);
// else its reported usage, or, when no usage was reported (a tunnel
// stream without include_usage, a run of the runs API or a background
// response, dispatched by a request of its own), what it reserved; its
// slot time is its time from the end of its queue wait to the end of the
// answer, weighted by its provider's cost_weight.
func settleQuota(res *quota.Reservation, rec RequestRecord, sent bool) {
	if !sent && (rec.Status == 0 || rec.Status >= 400) {
		res.Cancel()
		return
	}
	used := res.Ask()
	if rec.TokensKnown {
		used.InputTokens, used.OutputTokens = int64(rec.InputTokens), int64(rec.OutputTokens)
	}
	used.SlotTime = max(0, rec.Duration-rec.QueueWait)
	used.CostWeight = rec.CostWeight
	res.Settle(used)
}

// Outcome is the request's outcome once decided (Decide), else "".
func (o *Request) Outcome() contract.Outcome {
	if o == nil {
		return ""
	}
	return o.rec.Outcome
}

// ContentEvents is how many content-carrying events were recorded
// (Content).
func (o *Request) ContentEvents() int {
	if o == nil {
		return 0
	}
	return o.contentEvents
}
