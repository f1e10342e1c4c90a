package api

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"path"
	"strings"
	"sync"
	"time"

	"iop/internal/auth"
	"iop/internal/edge/api/access"
	"iop/internal/edge/contract"
	"iop/internal/ledger"
)

// DefaultAdminPrefixes are the path roots Config.AdminPrefixes defaults
// to: the admin API, the Prometheus metrics, the dashboard and Go's
// profiler. A path is admin when it is a root or lies under one.
var DefaultAdminPrefixes = []string{"/admin", "/metrics", "/ui", "/debug"}

// publicPaths need no key: liveness and readiness probes.
var publicPaths = map[string]bool{"/healthz": true, "/readyz": true}

// Ledger is what the API needs of the usage ledger (package ledger): a
// place to record each finished run.
type Ledger interface {
	// Record keeps one entry; it may block briefly, never on the database.
	Record(e ledger.Entry)
}

// Access refusals, mapped by classify: 401 (with WWW-Authenticate: Bearer)
// for a missing or unknown key, 403 for a key of the wrong class or a
// model the key may not use, 429 for a key over its limits
// (*auth.LimitError).
var (
	errMissingKey    = errors.New("missing API key")
	errWrongKey      = errors.New("incorrect API key")
	errNotAdminKey   = errors.New("this API key may not use the admin API")
	errAdminKeyOnAPI = errors.New("an admin key cannot call the model API; use a client key")
)

// isAdminPath reports whether p, or p with its dot segments resolved
// (path.Clean: a proxy in front might resolve them), lies under one of the
// admin prefixes.
func (h *handler) isAdminPath(p string) bool {
	for _, candidate := range []string{p, path.Clean(p)} {
		for _, prefix := range h.cfg.AdminPrefixes {
			if candidate == prefix || strings.HasPrefix(candidate, strings.TrimSuffix(prefix, "/")+"/") {
				return true
			}
		}
	}
	return false
}

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
// if the answer did not already (answerFinished), unless a background run
// kept it (keepPermit).
func (h *handler) admit(w http.ResponseWriter, r *http.Request) (_ *http.Request, release func(), ok bool) {
	release = func() {}
	if h.cfg.Keys.Len() == 0 && h.cfg.AdminKeys.Len() == 0 || publicPaths[r.URL.Path] {
		return r, release, true
	}
	writeError := h.errorWriterFor(r.URL.Path)
	secret := auth.Credential(r.Header)
	refuse := func(err error) (*http.Request, func(), bool) {
		if errors.Is(err, errMissingKey) || errors.Is(err, errWrongKey) {
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
	if h.isAdminPath(r.URL.Path) {
		switch {
		case h.cfg.AdminKeys.Authenticate(secret) != nil:
			return r, release, true
		case secret == "":
			return refuse(errMissingKey)
		case h.cfg.Keys.Authenticate(secret) != nil:
			return refuse(errNotAdminKey)
		default:
			return refuse(errWrongKey)
		}
	}
	if h.cfg.Keys.Len() == 0 {
		return r, release, true
	}
	caller := h.cfg.Keys.Authenticate(secret)
	if ic := internalOf(r.Context()); ic != nil && ic.caller != nil {
		caller = ic.caller
	}
	switch {
	case caller != nil:
	case secret == "":
		return refuse(errMissingKey)
	case h.cfg.AdminKeys.Authenticate(secret) != nil:
		return refuse(errAdminKeyOnAPI)
	default:
		return refuse(errWrongKey)
	}
	ctx := auth.NewContext(r.Context(), caller)
	obsOf(r).key(caller.Name())
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
		obsOf(r).begin(op)
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
		obsOf(r).begin(op)
		obsOf(r).cancelQuota()
		h.rateLimitHeaders(w.Header(), r.URL.Path, caller)
		return refuse(err)
	}
	h.rateLimitHeaders(w.Header(), r.URL.Path, caller)
	held := &heldPermit{permit: permit}
	return r.WithContext(context.WithValue(ctx, permitKey{}, held)), func() {
		if !held.kept {
			permit.Release()
		}
	}, true
}

// admitKey takes one request slot of caller: at the scheduler leader when
// Config.KeyAdmit says so (several edges), else from the caller itself.
func (h *handler) admitKey(ctx context.Context, caller *auth.Caller) (releaser, error) {
	if h.cfg.KeyAdmit != nil {
		release, local, err := h.cfg.KeyAdmit(ctx, caller)
		if err != nil {
			return nil, err
		}
		if !local {
			return &remotePermit{release: release}, nil
		}
	}
	leave := 0
	if ic := internalOf(ctx); ic != nil && ic.priority == contract.PriorityBatch {
		leave = 1 // a batch leaves one of its key's slots to the key's own requests
	}
	p, err := caller.AdmitLeaving(leave)
	if err != nil {
		return nil, err
	}
	return p, nil
}

// releaser gives a request slot back, once however often it is called.
type releaser interface{ Release() }

// remotePermit is a request slot the scheduler leader holds.
type remotePermit struct {
	once    sync.Once
	release func()
}

func (p *remotePermit) Release() {
	p.once.Do(func() {
		if p.release != nil {
			p.release()
		}
	})
}

// heldPermit is the request slot a request took; kept is set (on the
// request goroutine) when a run outliving the request took it over.
type heldPermit struct {
	permit releaser
	kept   bool
}

type permitKey struct{}

// answerFinished gives back the request slot of the request whose context
// is ctx, if it holds one: its answer is finished, so the key's next
// request may start. It is called before the answer's last byte is
// written (its final bytes, an error answer, the end of a run recorded
// by the runs API), once the request occupies no provider any more: its
// run has ended at the edge (the terminal message arrived, or the run was
// cancelled; either way its lease is released) or it was never
// dispatched. The slot is given back once, however often this is called
// (auth.Permit.Release), also for a run that took it over (keepPermit).
func answerFinished(ctx context.Context) {
	if held, _ := ctx.Value(permitKey{}).(*heldPermit); held != nil {
		held.permit.Release()
	}
}

// keepPermit takes over the request slot of the request whose context is
// ctx, for a run that goes on after the request ends (a background run):
// the slot is then given back by calling the returned func (once), or
// when the run's answer is finished (answerFinished), not when the
// request ends. Without a slot it returns a no-op.
func keepPermit(ctx context.Context) func() {
	held, _ := ctx.Value(permitKey{}).(*heldPermit)
	if held == nil {
		return func() {}
	}
	held.kept = true
	return held.permit.Release
}

// checkModel refuses a model the request's key may not use
// (access.ErrModelNotAllowed, 403); nil for an open API.
func checkModel(ctx context.Context, model string) error {
	if c := auth.FromContext(ctx); c != nil && !c.Allows(model) {
		return fmt.Errorf("%w: %q", access.ErrModelNotAllowed, model)
	}
	return nil
}

// resolveModel is the one resolution of a client's model name for the
// routes that answer of a model without dispatching it (count_tokens,
// GET /v1/models/{model}): it takes what Dispatch takes. It returns the
// name as the model listings show it: name itself, or its other spelling
// ("x" and "x:latest" are one model, knownModel); a name the Gateway
// knows (Config.Known: an alias, or a served name no node serves right
// now) is itself. Errors: access.ErrModelNotAllowed (403) for a model the
// request's key may not use, ErrUnknownModel (404) for any other name.
func (h *handler) resolveModel(r *http.Request, name string) (string, error) {
	if err := checkModel(r.Context(), name); err != nil {
		return "", err
	}
	if listed, ok := knownModel(h.models(r), name); ok {
		return listed, nil
	}
	if h.cfg.Known != nil && h.cfg.Known(name) {
		return name, nil
	}
	return "", ErrUnknownModel
}

// models is Gateway.Models narrowed to what the request's key may use.
func (h *handler) models(r *http.Request) []string {
	names := h.gw.Models()
	if c := auth.FromContext(r.Context()); c != nil {
		return c.Filter(names)
	}
	return names
}

// allowed reports whether the request's key may use model (true for an
// open API).
func allowed(r *http.Request, model string) bool {
	return checkModel(r.Context(), model) == nil
}

// retryAfterSeconds renders d as a Retry-After value: whole seconds,
// rounded up, at least 1 (RFC 9110 §10.2.3).
func retryAfterSeconds(d time.Duration) string {
	return fmt.Sprint(max(1, int64(math.Ceil(d.Seconds()))))
}

// keyName is the name of the request's key, "" for an open API.
func keyName(ctx context.Context) string {
	if c := auth.FromContext(ctx); c != nil {
		return c.Name()
	}
	return ""
}

// dispatch is Gateway.Dispatch for a handler: it refuses a model the
// request's key may not use (access.ErrModelNotAllowed, before anything is
// queued), then dispatches. serveRun (and so Frame.Serve) calls it; the runs
// API reaches it through serveRun.
func (h *handler) dispatch(ctx context.Context, req *contract.Request) (Run, error) {
	if err := checkModel(ctx, req.Model); err != nil {
		return nil, err
	}
	if o, _ := ctx.Value(observationKey{}).(*observation); o != nil {
		ctx = o.req.TraceContext(ctx)
	}
	return h.gw.Dispatch(ctx, *req)
}
