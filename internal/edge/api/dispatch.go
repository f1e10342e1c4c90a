package api

import (
	"context"
	"net/http"

	"iop/internal/wire/nodev1"
)

// renderer answers one dispatched run in one API's shape. Each method
// returns the Close reason.
type renderer interface {
	// tunnel renders a tunnel-path run (the provider's OpenAI bytes).
	tunnel() string
	// normalized renders a normalized-path run (run events).
	normalized() string
	// unknownPath answers a run whose execution path is neither.
	unknownPath() string
}

// openAIRender is the OpenAI APIs' renderer: tunnel-path bytes are relayed
// as they are; normalized-path runs are rendered by render.
type openAIRender struct {
	rr     *runResponse
	render func() string
}

func (o openAIRender) tunnel() string      { return o.rr.tunnel() }
func (o openAIRender) normalized() string  { return o.render() }
func (o openAIRender) unknownPath() string { return o.rr.fail(errUnknownPath) }

// serveRun is serveWith for the OpenAI routes: errors in OpenAI's shape,
// tunnel-path answers relayed, normalized ones rendered by normalized.
func (h *handler) serveRun(w http.ResponseWriter, r *http.Request, req *Request,
	normalized func(rr *runResponse, info DispatchInfo) string) {
	h.serveWith(w, r, req, h.writeError, func(rr *runResponse, info DispatchInfo) renderer {
		return openAIRender{rr, func() string { return normalized(rr, info) }}
	})
}

// serveWith dispatches req and answers with its run, rendered by the
// renderer newRenderer makes for it; a failed dispatch is answered by
// writeErr. The run is closed exactly once before serveWith returns, also
// when the client goes away first; a response cut short after its status
// line aborts the connection (http.ErrAbortHandler) after that Close.
func (h *handler) serveWith(w http.ResponseWriter, r *http.Request, req *Request,
	writeErr func(http.ResponseWriter, *http.Request, error, *Request),
	newRenderer func(rr *runResponse, info DispatchInfo) renderer) {
	obs := obsOf(r)
	obs.request(req)
	run, err := h.dispatch(r.Context(), req)
	if err != nil {
		writeErr(w, r, err, req)
		return
	}
	obs.dispatched(run.Info())

	closer := &runCloser{run: run}
	stop := context.AfterFunc(r.Context(), func() { closer.close(reasonClientGone) })
	reason := reasonCompleted
	defer func() {
		stop()
		closer.close(reason)
	}()

	info := run.Info()
	logger := h.logger.With("run_id", info.RunID, "model", clip(req.Model), "node_id", info.NodeID,
		"provider_id", info.ProviderID, "path", info.Path.String(), "operation", req.Operation.String())
	rr := &runResponse{h: h, w: w, r: r, run: run, req: req, obs: obs}
	rd := newRenderer(rr, info)
	switch info.Path {
	case nodev1.ExecutionPath_EXECUTION_PATH_TUNNEL:
		reason = rd.tunnel()
	case nodev1.ExecutionPath_EXECUTION_PATH_NORMALIZED:
		reason = rd.normalized()
	default:
		reason = rd.unknownPath()
	}
	logger.Debug("run ended", "reason", reason, "queue_wait", info.QueueWait, "aborted", rr.abort)
	obs.ended(reason)
	if rr.abort {
		// After the deferred Close, with the reason above; net/http then
		// drops the connection instead of ending the body cleanly.
		panic(http.ErrAbortHandler)
	}
}
