package api

import (
	"context"
	"log/slog"
	"net/http"
	"time"

	"iop/internal/edge/api/httpconn"
	"iop/internal/edge/contract"
)

// serveRun dispatches req and answers with its run: a tunnel-path run is
// relayed (Answer.tunnel), a normalized-path run is rendered by
// normalized, which returns the reason the rendering ended for. A failed
// dispatch is answered with classify's status and error body. The run is
// closed exactly once before serveRun returns, with the request's outcome
// (observation.ended), also when the client goes away first; a response
// cut short after its status line aborts the connection
// (http.ErrAbortHandler) after that Close.
func (h *handler) serveRun(w http.ResponseWriter, r *http.Request, req *contract.Request,
	normalized func(rr *Answer, info contract.DispatchInfo) string) {
	h.serveRunWith(w, r, req, runRenderer{
		writeError: h.writeError,
		tunnel:     func(rr *Answer, _ contract.DispatchInfo) string { return rr.tunnel() },
		normalized: normalized,
	})
}

// runRenderer says how a route answers a run: with which error shape, and
// how each execution path's run becomes its response (each returns the
// rendering's reason).
type runRenderer struct {
	writeError         func(w http.ResponseWriter, r *http.Request, err error, req *contract.Request)
	tunnel, normalized func(rr *Answer, info contract.DispatchInfo) string
	// quiet, when set, is called on the request goroutine each
	// quietInterval that Dispatch blocks (the request queued, or the
	// edge reading ahead to the provider's first message, which may come
	// with its first token), with the response, which has no run yet;
	// an error stops the calls (dispatchQuiet). It may start the response
	// (the Messages stream's message_start and ping); a Dispatch failure
	// after that is then ended by failed, as a started answer's failure,
	// not with an error status.
	quiet         func(rr *Answer) error
	quietInterval time.Duration
	failed        func(rr *Answer, err error) string
}

// serveRunWith is serveRun with the route's own error shape and tunnel
// rendering (the Ollama routes translate a tunnel's answer rather than
// relay it).
func (h *handler) serveRunWith(w http.ResponseWriter, r *http.Request, req *contract.Request, render runRenderer) {
	obs := obsOf(r)
	obs.request(req)
	if err := h.assignFlow(r.Context(), r.Header, req, obs); err != nil {
		render.writeError(w, r, err, req)
		return
	}
	queued := h.cfg.Now()
	obs.get().Dispatching(queued)
	rr := &Answer{h: h, w: w, r: r, req: req, obs: obs, writeError: render.writeError}
	var run Run
	var err error
	if render.quiet != nil {
		run, err = dispatchQuiet(func() (Run, error) { return h.dispatch(r.Context(), req) },
			render.quietInterval, func() error { return render.quiet(rr) })
	} else {
		run, err = h.dispatch(r.Context(), req)
	}
	if err != nil {
		if waitedBeforeRefusal(err) {
			// It may have waited in its queue before the refusal (its
			// whole queue timeout, or held for its providers' reconnect
			// grace): the record says how long.
			obs.get().QueueWaited(h.cfg.Now().Sub(queued))
		}
		if !rr.started {
			render.writeError(w, r, err, req)
			return
		}
		// quiet started the answer while the request waited: it ends as a
		// started answer does, and its outcome is the failure's, not the
		// 200 the client got.
		obs.get().Failed(err, nil, httpconn.ClientGone(r))
		reason := render.failed(rr, err)
		if obs != nil {
			obs.get().Decide(Classify(err, req).Status())
		}
		h.logger.Debug("dispatch failed after the answer began", "path", Clip(r.URL.Path), "reason", reason, "err", errorText(err, req))
		if rr.abort {
			panic(http.ErrAbortHandler)
		}
		return
	}
	rr.run = run
	obs.get().Dispatched(run.Info())

	// A client that goes away ends the run at once (a blocked Recv returns);
	// the outcome is still decided here, on the request goroutine, from how
	// the rendering ended.
	stop := context.AfterFunc(r.Context(), func() { run.Cancel(ReasonClientGone) })
	reason := "" // a renderer that panics ends the request "error"
	defer func() {
		stop()
		run.Close(obs.ended(reason))
	}()

	info := run.Info()
	switch info.Path {
	case contract.PathTunnel:
		reason = render.tunnel(rr, info)
	case contract.PathNormalized:
		reason = render.normalized(rr, info)
	default:
		reason = rr.fail(errUnknownPath)
	}
	if reason != ReasonCompleted && h.stopping() {
		reason = ReasonEdgeStopped // its run was ended by the edge's stop
	}
	h.logRunEnded(r.Context(), info, req, reason, rr.abort)
	if rr.abort {
		// After the deferred Close, with the outcome of reason; net/http
		// then drops the connection instead of ending the body cleanly.
		panic(http.ErrAbortHandler)
	}
}

// stopping reports whether the edge has ended the requests in flight
// (Config.Stopping is closed).
func (h *handler) stopping() bool {
	select {
	case <-h.cfg.Stopping:
		return true
	default:
		return false
	}
}

// logRunEnded logs a run's end at debug. Its attributes are built only when
// debug is on: a logger made with With for every request formatted them
// (the JSON handler encodes With's attributes at once) even when the line
// was then dropped (BenchmarkRunEndedLog).
// pathLogNames and operationLogNames are the names the "run ended" line
// gives a run's path and operation, as it always has (the node protocol's
// enum names), which log queries match.
var (
	pathLogNames = map[contract.Path]string{contract.PathUnknown: "EXECUTION_PATH_UNSPECIFIED",
		contract.PathTunnel: "EXECUTION_PATH_TUNNEL", contract.PathNormalized: "EXECUTION_PATH_NORMALIZED"}
	operationLogNames = map[contract.Operation]string{contract.OperationUnspecified: "OPERATION_UNSPECIFIED",
		contract.OperationChat: "OPERATION_CHAT", contract.OperationCompletion: "OPERATION_COMPLETION",
		contract.OperationEmbeddings: "OPERATION_EMBEDDINGS"}
)

func (h *handler) logRunEnded(ctx context.Context, info contract.DispatchInfo, req *contract.Request, reason string, aborted bool) {
	if !h.logger.Enabled(ctx, slog.LevelDebug) {
		return
	}
	h.logger.Debug("run ended", "run_id", info.RunID, "model", Clip(req.Model), "node_id", info.NodeID,
		"provider_id", info.ProviderID, "path", pathLogNames[info.Path], "operation", operationLogNames[req.Operation],
		"reason", reason, "queue_wait", info.QueueWait, "aborted", aborted)
}

// waitedBeforeRefusal reports whether a failed dispatch may have waited in
// its model's queue first: a queue timeout, a request held for providers
// that did not come back (or whose edge stopped, or lost its leader), a
// waiter displaced by a higher priority, or a dispatch that failed after
// its admission. A full queue, an unknown model and a rejection refuse at
// once.
func waitedBeforeRefusal(err error) bool {
	switch contract.AdmissionOf(err) {
	case contract.AdmissionQueueTimeout, contract.AdmissionUnavailable, contract.AdmissionShed, contract.AdmissionDispatchFailed:
		return true
	}
	return false
}

// dispatchQuiet calls dispatch on a goroutine of its own and returns what
// it returned; meanwhile it calls quiet, on the calling goroutine (the
// request goroutine, which stays the only writer of the response), each
// time interval passes, until quiet fails. Dispatch blocks while the
// request is queued and, with retries on, until the provider's first
// message, which a provider that sends its status line with its first
// token (the simulator, many servers reading a long prompt) sends only
// then: without this a streamed Messages answer would stay silent that
// long. It waits for dispatch to return in every case: a
// client gone ends Dispatch's context, so it returns promptly.
func dispatchQuiet(dispatch func() (Run, error), interval time.Duration, quiet func() error) (Run, error) {
	type result struct {
		run Run
		err error
	}
	done := make(chan result, 1)
	go func() {
		run, err := dispatch()
		done <- result{run, err}
	}()
	timer := time.NewTimer(interval)
	defer timer.Stop()
	for {
		select {
		case res := <-done:
			return res.run, res.err
		case <-timer.C:
			if quiet != nil && quiet() != nil {
				quiet = nil
			}
			timer.Reset(interval)
		}
	}
}
