package api

import (
	"context"
	"log/slog"
	"net/http"

	"iop/internal/edge/api/observe"
	"iop/internal/edge/api/stream"
	"iop/internal/edge/contract"
)

// observation is a request's observation (package observe) as the frame
// holds it in the request's context: with the frame serving the request
// and the usage read of a relayed tunnel answer. Only the request's
// goroutine touches it. Its methods do nothing on a nil *observation.
type observation struct {
	h     *handler             // the frame serving the request (frameOf); nil for a run's
	usage *stream.UsageScanner // tunnel path only (TunnelEvent, TunnelBody)
	req   observe.Request
}

type observationKey struct{}

// observe starts the observation of r and returns r carrying it.
func (h *handler) observe(r *http.Request) (*http.Request, *observation) {
	route := ""
	if _, ok := h.routes[r.URL.Path]; ok && h.cfg.Tracer != nil {
		route = r.URL.Path
	}
	o := &observation{h: h}
	o.req = observe.Start(h.cfg.Now, r, Clip(r.Header.Get("X-Request-Id")), h.cfg.Tracer, route)
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

// get is o's observe.Request; nil for a nil o.
func (o *observation) get() *observe.Request {
	if o == nil {
		return nil
	}
	return &o.req
}

// request records the decoded request.
func (o *observation) request(req *contract.Request) {
	if o != nil {
		o.req.Decoded(req.Operation, Clip(req.Model), req.Stream)
	}
}

// ended records how the rendered run ended (its renderer's reason) and
// returns the request's outcome, decided now (observe.Request.Ended).
func (o *observation) ended(reason string) contract.Outcome {
	return o.get().Ended(reason, runOutcome(reason))
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
		o.get().Content(1)
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

// finish ends the observation of a request (observe.Request.Finish) and,
// for an API request, logs its line, hands its record to the Observer
// and, with a ledger, records it there: all three read the one
// RequestRecord, so they agree on the request's outcome.
func (h *handler) finish(ctx context.Context, o *observation, status int) {
	if o.usage != nil {
		if in, out, ok := o.usage.End(); ok {
			o.req.Tokens(in, out)
		}
	}
	rec, ok := o.req.Finish(status)
	if !ok {
		return
	}
	observe.Log(ctx, h.logger, rec)
	if h.cfg.Observer != nil {
		h.cfg.Observer.RequestDone(rec)
	}
	if h.cfg.Ledger != nil {
		e := observe.LedgerEntry(rec)
		ic := internalOf(ctx)
		e.Batch = ic != nil && ic.priority == contract.PriorityBatch // a batch line
		h.cfg.Ledger.Record(e)
	}
}
