package api

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"time"

	"iop/internal/auth"
	"iop/internal/edge/api/stream"
	"iop/internal/edge/contract"
	"iop/internal/ledger"
	"iop/internal/quota"
	"iop/internal/tracing"
)

// Observer is told of every finished API request, once, with its
// RequestRecord: the one hook metrics, request logs and later a usage
// ledger or a runs store share. RequestDone is called on the request's
// goroutine after the response ended (completed, failed or aborted); it
// must not block for long and must not keep rec's slices.
type Observer interface {
	RequestDone(rec RequestRecord)
}

// ObserverFunc makes a function an Observer.
type ObserverFunc func(RequestRecord)

// RequestDone calls f(rec).
func (f ObserverFunc) RequestDone(rec RequestRecord) { f(rec) }

// RequestRecord describes one finished API request. Durations are
// time.Duration (nanoseconds); zero means "did not happen" or "not known".
type RequestRecord struct {
	// API names the route's operation: "chat.completions".
	API string
	// RequestID names the request: "req_" and 32 hex digits, new for each
	// request the edge serves (the answer's X-Request-Id, or Request-Id
	// on the Anthropic routes; the log line's request_id, the usage
	// ledger's, the trace's iop.request_id). A client's own X-Request-Id
	// never replaces it (ClientRequestID).
	RequestID string
	// ClientRequestID is the X-Request-Id header the client sent, clipped
	// to 256 bytes; "" for none. It is relayed to the provider as it is and
	// logged (client_request_id), and names nothing else.
	ClientRequestID string
	// Key is the name of the request's API key; "" on an open API.
	Key string
	// Model is the model name the request asked for (clipped to 256
	// bytes); "" when the body was not decoded. It is a client's string:
	// only when Admission is neither "", unknown_model nor cancelled is it
	// known to be a configured alias or served model.
	Model  string
	Stream bool
	// Where the run went (zero when it was not dispatched).
	RunID, NodeID, ProviderID, ProviderType, ServedModel string
	Generation                                           uint64
	// Path is "tunnel" or "normalized"; "" when not dispatched.
	Path string
	// Admission is one of the Admission* values; "" when the request never
	// reached admission (refused as invalid).
	Admission contract.Admission
	// QueueWait is the time spent queued for a slot.
	QueueWait time.Duration
	// Flow is the request's flow in its model's queue and Priority its
	// band ("critical", "standard", "sheddable"); both "" when the request
	// never reached admission. FlowFromKey says the flow is its key's name
	// (a configured, bounded set) rather than a client's header or user
	// value. ShedReason is "displaced" or "expected_wait" when Admission
	// is shed.
	Flow, Priority, ShedReason string
	FlowFromKey                bool
	// Status is the HTTP status sent; 0 when nothing was (the connection
	// was aborted first). A stream that failed after it started keeps 200.
	Status int
	// Outcome is one of the Outcome* values, decided once when the request
	// ended (observation.decide); the log line, the metrics, the usage
	// ledger, the run's RunEnded event and a runs API record all carry it.
	Outcome contract.Outcome
	// ErrorCode is the OpenAI error code answered ("queue_full", ...), if any.
	ErrorCode string
	// Start is when the request reached the handler; Duration from then to
	// the end of the response.
	Start    time.Time
	Duration time.Duration
	// SlotTime is from when the request's lease was granted (its first
	// dispatch's start plus its queue wait) to the end of the response:
	// how long it held a provider slot; 0 when not dispatched.
	SlotTime time.Duration
	// CostWeight is the provider's cost_weight (0: 1; not dispatched).
	CostWeight float64
	// TimeToFirstToken is from Start to the first generated text reaching
	// the edge (a non-empty delta; on the tunnel path an SSE event carrying
	// content); 0 when none did or it cannot be seen (a tunnel JSON body).
	TimeToFirstToken time.Duration
	// InterTokenLatency is the mean time between output tokens, from the
	// first to the last, when at least two were seen.
	InterTokenLatency time.Duration
	// InputTokens and OutputTokens are the run's usage when TokensKnown: the
	// node's usage event (normalized path), or the usage object in the
	// provider's answer (tunnel path; a stream carries it only when the
	// client asked for stream_options.include_usage).
	InputTokens, OutputTokens int
	TokensKnown               bool
	// TraceID is the request's trace id (32 hex digits) when its trace is
	// sampled (Config.Tracer); "" otherwise. The log line's trace_id and
	// the latency histograms' exemplars carry it.
	TraceID string
}

// observation collects the RequestRecord of one request. Only the request's
// goroutine touches it (for a run of the runs API, the run's goroutine).
type observation struct {
	h       *handler // the frame serving the request (frameOf); nil for a run's
	rec     RequestRecord
	err     error // the failure answered, if any
	decoded bool  // the request was decoded (request was called)
	gone    bool  // the client was gone when the failure was to be answered
	sent    bool  // Dispatch returned a run
	// reason is how the rendering of the run ended (a reason* value).
	reason string
	// firstToken and lastToken are when the first and latest content
	// arrived; contentEvents counts the deltas or content-carrying events.
	firstToken, lastToken time.Time
	contentEvents         int
	usage                 *stream.UsageScanner // tunnel path only (TunnelEvent, TunnelBody)
	now                   func() time.Time
	// decided is set once rec.Outcome was decided (decide).
	decided bool
	// clientStream is set when the route recorded the client's own
	// "stream" (clientStreams): the dispatched request's may differ.
	clientStream bool
	// trace is the request's span (tracing.go); nil without Config.Tracer.
	trace *requestSpan
	// finishReason is the normalized run's finish reason (finished).
	finishReason string
	// dispatchStart is when the request's first dispatch began
	// (dispatching); slotFrom when its lease was granted: dispatchStart
	// plus its queue wait, set by dispatched.
	dispatchStart, slotFrom time.Time
	// quota is the request's quota reservation (quota.go), settled by
	// finish; nil for none.
	quota *quota.Reservation
}

// cancelQuota cancels the request's quota reservation, if any: it will
// not run.
func (o *observation) cancelQuota() {
	if o != nil && o.quota != nil {
		o.quota.Cancel()
		o.quota = nil
	}
}

type observationKey struct{}

// observe starts the observation of r and returns r carrying it.
func (h *handler) observe(r *http.Request) (*http.Request, *observation) {
	o := &observation{h: h, now: h.cfg.Now}
	o.rec.Start = o.now()
	o.rec.RequestID, o.rec.ClientRequestID = newRequestID(), Clip(r.Header.Get("X-Request-Id"))
	if h.cfg.Tracer != nil {
		o.trace = newRequestSpan(h, r)
	}
	return r.WithContext(context.WithValue(r.Context(), observationKey{}, o)), o
}

// frameOf returns the frame serving r; outside one (a test calling a
// route directly), a frame that logs nothing.
func frameOf(r *http.Request) *handler {
	if o := obsOf(r); o != nil && o.h != nil {
		return o.h
	}
	return &handler{logger: slog.New(slog.DiscardHandler)}
}

// obsOf returns r's observation; nil (whose methods do nothing) if none.
func obsOf(r *http.Request) *observation {
	o, _ := r.Context().Value(observationKey{}).(*observation)
	return o
}

// begin marks the request as an API request of the named operation: only
// those get a RequestRecord. An operation already set stays (the runs API
// names its runs' chat requests "runs").
func (o *observation) begin(api string) {
	if o != nil && o.rec.API == "" {
		o.rec.API = api
		if o.trace != nil {
			o.trace.begin(api, o.rec.Start)
		}
	}
}

// requestID is the request's id ("" without an observation).
func (o *observation) requestID() string {
	if o == nil {
		return ""
	}
	return o.rec.RequestID
}

// handOff drops the request's record: another request records it (a run
// of the runs API records its submission when it ends).
func (o *observation) handOff() {
	if o != nil {
		o.rec.API = ""
	}
}

// key records the name of the request's API key.
func (o *observation) key(name string) {
	if o != nil {
		o.rec.Key = name
	}
}

// newRequestID returns "req_" and 128 random bits in hex. The id only
// tells requests apart in records; it guards nothing, so math/rand's
// per-goroutine generator (no lock, no system call) is enough.
func newRequestID() string {
	var b [16]byte
	binary.LittleEndian.PutUint64(b[:8], rand.Uint64())
	binary.LittleEndian.PutUint64(b[8:], rand.Uint64())
	return "req_" + hex.EncodeToString(b[:])
}

// request records the decoded request.
func (o *observation) request(req *contract.Request) {
	if o != nil {
		o.rec.Model, o.decoded = Clip(req.Model), true
		if o.trace != nil {
			o.trace.request(req.Operation, o.rec.Model)
		}
		if !o.clientStream {
			o.rec.Stream = req.Stream
		}
	}
}

// clientStreams records the client's own "stream" flag, for a route whose
// dispatched request streams whatever the client asked (the Ollama routes:
// their canonical body always streams).
func (o *observation) clientStreams(stream bool) {
	if o != nil {
		o.rec.Stream, o.clientStream = stream, true
	}
}

// queueWaited records how long a request that got no run waited in its
// queue.
func (o *observation) queueWaited(d time.Duration) {
	if o != nil {
		o.rec.QueueWait = d
	}
}

// dispatching records that the request's dispatch (admission, then the
// send) began at at; its slot time counts from at plus its queue wait.
func (o *observation) dispatching(at time.Time) {
	if o != nil && o.dispatchStart.IsZero() {
		o.dispatchStart = at
	}
}

// dispatched records where the run went.
func (o *observation) dispatched(info contract.DispatchInfo) {
	if o == nil {
		return
	}
	o.sent = true
	if o.slotFrom.IsZero() {
		o.slotFrom = o.now()
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

// failed records the failure answered with code, or not answered because
// the client was gone.
func (o *observation) failed(err error, code *string, gone bool) {
	if o == nil {
		return
	}
	o.err, o.gone = err, gone
	if code != nil {
		o.rec.ErrorCode = *code
	}
}

// errorCode records the error code of a failure that ended an answer
// already started (its last event, or line, said it).
func (o *observation) errorCode(code *string) {
	if o != nil && code != nil {
		o.rec.ErrorCode = *code
	}
}

// ended records how the rendered run ended (its renderer's reason) and
// returns the request's outcome, decided now (decide).
func (o *observation) ended(reason string) contract.Outcome {
	if o == nil {
		return runOutcome(reason)
	}
	o.reason = reason
	if o.trace != nil {
		o.trace.event(tracing.EventStreamEnd, o.now(), tracing.Reason.String(reason))
	}
	return o.decide(0)
}

// content records n content-carrying events arriving now.
func (o *observation) content(n int) {
	if o == nil || n == 0 {
		return
	}
	now := o.now()
	if o.contentEvents == 0 {
		o.firstToken = now
		if o.trace != nil {
			o.trace.event(tracing.EventFirstToken, now)
		}
	}
	o.lastToken = now
	o.contentEvents += n
}

// finished records the finish reason of a normalized run ("stop",
// "length", "tool_calls", ...), for the trace.
func (o *observation) finished(reason string) {
	if o != nil {
		o.finishReason = reason
	}
}

// tokens records the run's usage.
func (o *observation) tokens(in, out int) {
	if o != nil {
		o.rec.InputTokens, o.rec.OutputTokens, o.rec.TokensKnown = in, out, true
	}
}

// TunnelEvent records one event of a relayed tunnel stream, as its one
// reader (stream.FinalHold) read it: content arriving now, and its usage.
func (o *observation) TunnelEvent(ev *stream.Event) {
	if o == nil {
		return
	}
	if o.usage == nil {
		o.usage = &stream.UsageScanner{}
	}
	o.usage.Event(ev)
	if ev.Content {
		o.content(1)
	}
}

// TunnelBody keeps the next bytes of a relayed tunnel answer that is not
// an event stream, for its usage (stream.UsageScanner.End).
func (o *observation) TunnelBody(p []byte) {
	if o == nil {
		return
	}
	if o.usage == nil {
		o.usage = &stream.UsageScanner{}
	}
	o.usage.Body(p)
}

// admissionOf is the admission of a failed Dispatch (contract.AdmissionOf).
func admissionOf(err error) contract.Admission { return contract.AdmissionOf(err) }

// runOutcome is the outcome of a request whose run was dispatched and
// rendered, from the renderer's reason.
func runOutcome(reason string) contract.Outcome {
	switch reason {
	case ReasonCompleted:
		return contract.OutcomeCompleted
	case ReasonClientGone:
		return contract.OutcomeClientGone
	case ReasonWriteFailed:
		return contract.OutcomeWriteFailed
	case ReasonUpstreamError:
		return contract.OutcomeUpstreamError
	case ReasonEdgeStopped:
		return contract.OutcomeEdgeStopped
	case ReasonInvalidRequest:
		return contract.OutcomeInvalidRequest
	default:
		return contract.OutcomeError
	}
}

// keyRefusal reports whether err is a refusal by the request's key: over
// one of its limits (*auth.LimitError) or quotas (*quota.Refusal), or a
// model it may not use.
func keyRefusal(err error) bool {
	var limit *auth.LimitError
	return errors.As(err, &limit) || errors.Is(err, ErrModelNotAllowed) || errors.Is(err, quota.ErrOverQuota)
}

// decide decides the request's outcome, once: later calls return the
// first decision. status is the HTTP status sent (0: none); it matters
// only for a request that was not dispatched. A dispatched request's
// outcome is its renderer's reason (runOutcome), decided on the request
// goroutine when the rendering ended, so nothing that happens after (the
// client closing its connection once it has read the answer, which ends
// the request's context) can change it. A request that failed before
// dispatch is refused (admission failures, a key's limits), client_gone
// (the client left first), error (a 5xx) or invalid_request; one answered
// 2xx without a run (an Ollama "load") completed.
func (o *observation) decide(status int) contract.Outcome {
	if o.decided {
		return o.rec.Outcome
	}
	o.decided = true
	rec := &o.rec
	switch {
	case o.sent:
		rec.Outcome = runOutcome(o.reason)
	case o.err != nil && (o.gone || admissionOf(o.err) == contract.AdmissionCancelled):
		rec.Outcome = contract.OutcomeClientGone
		if o.decoded {
			rec.Admission = contract.AdmissionCancelled
		}
	case o.err != nil && keyRefusal(o.err):
		rec.Outcome = contract.OutcomeRefused
	case o.err != nil && errors.Is(o.err, ErrShuttingDown):
		rec.Outcome = contract.OutcomeEdgeStopped
		if o.decoded {
			rec.Admission = admissionOf(o.err)
		}
	case o.err != nil && o.decoded && admissionOf(o.err) != "":
		rec.Admission, rec.Outcome = admissionOf(o.err), contract.OutcomeRefused
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

// record completes the RequestRecord once the response ended with status
// (0: nothing sent), deciding its outcome if it was not yet.
func (o *observation) record(status int) RequestRecord {
	o.decide(status)
	rec := o.rec
	rec.Status = status
	end := o.now()
	rec.Duration = end.Sub(rec.Start)
	if !o.slotFrom.IsZero() {
		rec.SlotTime = max(0, end.Sub(o.slotFrom))
	}
	if o.usage != nil {
		if in, out, ok := o.usage.End(); ok {
			rec.InputTokens, rec.OutputTokens, rec.TokensKnown = in, out, true
		}
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

// finish ends the observation of an API request: it logs the request
// line, hands the record to the Observer and, with a ledger, records it
// there. All three read the one RequestRecord, so they agree on the
// request's outcome.
func (h *handler) finish(ctx context.Context, o *observation, status int) {
	if o.rec.API == "" {
		if o.quota != nil {
			settleQuota(o.quota, o.record(status), o.sent)
		}
		if o.trace != nil {
			o.trace.drop()
		}
		return
	}
	rec := o.record(status)
	if o.quota != nil {
		settleQuota(o.quota, rec, o.sent)
	}
	if o.trace != nil {
		rec.TraceID = o.trace.end(&rec, o.finishReason)
	}
	h.logRequest(ctx, rec)
	if h.cfg.Observer != nil {
		h.cfg.Observer.RequestDone(rec)
	}
	if h.cfg.Ledger != nil {
		e := ledgerEntry(rec)
		ic := internalOf(ctx)
		e.Batch = ic != nil && ic.priority == contract.PriorityBatch // a batch line
		h.cfg.Ledger.Record(e)
	}
}

// ledgerEntry is the usage ledger's entry for a finished request.
func ledgerEntry(rec RequestRecord) ledger.Entry {
	e := ledger.Entry{
		Time: rec.Start, RequestID: rec.RequestID, Key: rec.Key, Model: rec.Model,
		RunID: rec.RunID, NodeID: rec.NodeID, ProviderID: rec.ProviderID, ServedModel: rec.ServedModel,
		Duration: rec.Duration, SlotTime: rec.SlotTime, CostWeight: rec.CostWeight, Outcome: rec.Outcome.String(), ErrorCode: rec.ErrorCode,
	}
	if rec.TokensKnown {
		e.PromptTokens, e.CompletionTokens = int64(rec.InputTokens), int64(rec.OutputTokens)
	}
	return e
}

// logRequest writes the one log line of a finished API request: info,
// or warn for a 5xx or an upstream failure. It names no header and no
// body, so no credential can appear in it.
func (h *handler) logRequest(ctx context.Context, rec RequestRecord) {
	level := slog.LevelInfo
	if rec.Status >= 500 || rec.Outcome == contract.OutcomeUpstreamError || rec.Outcome == contract.OutcomeError {
		level = slog.LevelWarn
	}
	// Built only when the line is written, in an array that holds every
	// attribute below (BenchmarkRequestLog).
	if !h.logger.Enabled(ctx, level) {
		return
	}
	var buf [24]slog.Attr
	attrs := append(buf[:0],
		slog.String("api", rec.API),
		slog.String("request_id", rec.RequestID))
	if rec.Model != "" {
		// None when the request ended before its body was read (a key
		// refused at the door: over its limits, or no scheduler leader to
		// count them): the line says no model rather than an empty one.
		attrs = append(attrs, slog.String("model", rec.Model))
	}
	attrs = append(attrs,
		slog.Int("status", rec.Status),
		slog.String("outcome", rec.Outcome.String()),
		slog.Duration("duration", rec.Duration),
	)
	if rec.Admission != "" {
		attrs = append(attrs, slog.String("queue_reason", rec.Admission.String()), slog.Duration("queue_wait", rec.QueueWait))
	}
	if rec.RunID != "" {
		attrs = append(attrs,
			slog.String("run_id", rec.RunID),
			slog.String("node_id", rec.NodeID),
			slog.Uint64("generation", rec.Generation),
			slog.String("provider_id", rec.ProviderID),
			slog.String("served_model", rec.ServedModel),
			slog.String("path", rec.Path),
			slog.Bool("stream", rec.Stream))
	}
	if rec.TimeToFirstToken > 0 {
		attrs = append(attrs, slog.Duration("time_to_first_token", rec.TimeToFirstToken))
	}
	if rec.TokensKnown {
		attrs = append(attrs, slog.Int("input_tokens", rec.InputTokens), slog.Int("output_tokens", rec.OutputTokens))
	}
	if rec.ErrorCode != "" {
		attrs = append(attrs, slog.String("error_code", rec.ErrorCode))
	}
	if rec.Key != "" {
		attrs = append(attrs, slog.String("key", rec.Key))
	}
	if rec.ClientRequestID != "" {
		attrs = append(attrs, slog.String("client_request_id", rec.ClientRequestID))
	}
	if rec.Priority != "" {
		attrs = append(attrs, slog.String("flow", rec.Flow), slog.String("priority", rec.Priority))
	}
	if rec.ShedReason != "" {
		attrs = append(attrs, slog.String("shed_reason", rec.ShedReason))
	}
	if rec.TraceID != "" {
		attrs = append(attrs, slog.String("trace_id", rec.TraceID))
	}
	h.logger.LogAttrs(ctx, level, "request", attrs...)
}
