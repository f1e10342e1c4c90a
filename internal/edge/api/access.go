package api

import (
	"context"
	"errors"
	"net/http"

	"iop/internal/auth"
	"iop/internal/edge/api/access"
	"iop/internal/edge/contract"
	"iop/internal/ledger"
	"iop/internal/modelname"
)

// Ledger is what the API needs of the usage ledger (package ledger): a
// place to record each finished run.
type Ledger interface {
	// Record keeps one entry; it may block briefly, never on the database.
	Record(e ledger.Entry)
}

// isAdminPath reports whether p lies under one of the admin prefixes
// (access.AdminPath).
func (h *handler) isAdminPath(p string) bool { return access.AdminPath(h.cfg.AdminPrefixes, p) }

// admit checks a request's key before it is routed (DESIGN.md; OpenAI API
// reference, "Authentication": Authorization: Bearer). With no key of
// either class configured every request passes. Public paths always pass.
// Admin paths need an admin key. Every other path needs a client key when
// client keys are configured; the caller then rides in the request's
// context (auth.FromContext), and a POST that runs a model takes one of
// the key's request slots first (429 with Retry-After when over a limit,
// before anything is queued or dispatched; recorded as a refused request
// of the route's operation). ok false means the request was answered;
// otherwise release, to call when the request ends, gives the slot back
// if the answer did not already (access.AnswerFinished), unless a background run
// kept it (access.KeepPermit).
func (h *handler) admit(w http.ResponseWriter, r *http.Request) (_ *http.Request, release func(), ok bool) {
	release = func() {}
	if h.cfg.Keys.Len() == 0 && h.cfg.AdminKeys.Len() == 0 || access.Public(r.URL.Path) {
		return r, release, true
	}
	writeError := h.errorWriterFor(r.URL.Path)
	secret := auth.Credential(r.Header)
	refuse := func(err error) (*http.Request, func(), bool) {
		if errors.Is(err, access.ErrMissingKey) || errors.Is(err, access.ErrWrongKey) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="iop"`)
			if h.isAdminPath(r.URL.Path) {
				// A browser opening the dashboard prompts for the admin
				// key (as the password) and sends it with every request
				// of the page, its events stream included.
				w.Header().Add("WWW-Authenticate", `Basic realm="iop admin", charset="UTF-8"`)
			}
		}
		writeError(w, r, err, nil)
		return nil, release, false
	}
	var internal *auth.Caller
	if ic := internalOf(r.Context()); ic != nil {
		internal = ic.caller
	}
	caller, err := access.Authenticate(h.cfg.Keys, h.cfg.AdminKeys, h.isAdminPath(r.URL.Path), secret, internal)
	if err != nil {
		return refuse(err)
	}
	if caller == nil {
		return r, release, true
	}
	ctx := auth.NewContext(r.Context(), caller)
	obsOf(r).get().Key(caller.Name())
	op := h.routes[r.URL.Path].Operation // "": the route runs no model
	if r.Method != http.MethodPost || op == "" {
		h.rateLimitHeaders(w.Header(), r.URL.Path, caller)
		return r.WithContext(ctx), release, true
	}
	// The quota first (quota.go): a reservation refused later is
	// cancelled, counting nothing, while a request slot taken spends the
	// minute's allowance.
	reserved, err := h.reserveQuota(w, r.WithContext(ctx), caller)
	if err != nil {
		h.logger.Debug("key over its quota", "key", caller.Name(), "path", Clip(r.URL.Path), "err", err)
		obsOf(r).get().Begin(op)
		h.rateLimitHeaders(w.Header(), r.URL.Path, caller)
		return refuse(err)
	}
	r = reserved
	// The key's admission and the request's share one bound on waiting
	// for a scheduler leader (several edges).
	ctx = contract.WithLeaderBound(r.Context())
	permit, err := h.admitKey(ctx, caller)
	if err != nil {
		h.logger.Debug("key over its limit", "key", caller.Name(), "path", Clip(r.URL.Path), "err", err)
		obsOf(r).get().Begin(op)
		obsOf(r).get().CancelQuota()
		h.rateLimitHeaders(w.Header(), r.URL.Path, caller)
		return refuse(err)
	}
	h.rateLimitHeaders(w.Header(), r.URL.Path, caller)
	ctx, release = access.WithPermit(ctx, permit)
	return r.WithContext(ctx), release, true
}

// admitKey takes one request slot of caller (access.Admit): at the
// scheduler leader when Config.KeyAdmit says so (several edges), else
// from the caller itself; a batch line leaves one of its key's slots to
// the key's own requests.
func (h *handler) admitKey(ctx context.Context, caller *auth.Caller) (access.Releaser, error) {
	leave := 0
	if ic := internalOf(ctx); ic != nil && ic.priority == contract.PriorityBatch {
		leave = 1
	}
	return access.Admit(ctx, caller, h.cfg.KeyAdmit, leave)
}

// resolveModel is the one resolution of a client's model name for the
// routes that answer of a model without dispatching it (count_tokens,
// GET /v1/models/{model}): it takes what Dispatch takes. It returns the
// name as the model listings show it: name itself, or its other spelling
// ("x" and "x:latest" are one model, modelname.Known); a name the Gateway
// knows (Config.Known: an alias, or a served name no node serves right
// now) is itself. Errors: access.ErrModelNotAllowed (403) for a model the
// request's key may not use, ErrUnknownModel (404) for any other name.
func (h *handler) resolveModel(r *http.Request, name string) (string, error) {
	if err := access.CheckModel(r.Context(), name); err != nil {
		return "", err
	}
	if listed, ok := modelname.Known(h.models(r), name); ok {
		return listed, nil
	}
	if h.cfg.Known != nil && h.cfg.Known(name) {
		return name, nil
	}
	return "", ErrUnknownModel
}

// models is Gateway.Models narrowed to what the request's key may use.
func (h *handler) models(r *http.Request) []string { return access.Models(r.Context(), h.gw.Models()) }

// dispatch is Gateway.Dispatch for a handler: it refuses a model the
// request's key may not use (access.ErrModelNotAllowed, before anything is
// queued), then dispatches. serveRun (and so Frame.Serve) calls it; the runs
// API reaches it through serveRun.
func (h *handler) dispatch(ctx context.Context, req *contract.Request) (Run, error) {
	if err := access.CheckModel(ctx, req.Model); err != nil {
		return nil, err
	}
	if o, _ := ctx.Value(observationKey{}).(*observation); o != nil {
		ctx = o.req.TraceContext(ctx)
	}
	return h.gw.Dispatch(ctx, *req)
}
