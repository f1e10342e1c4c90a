package api

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"strconv"

	"iop/internal/auth"
	"iop/internal/edge/api/access"
	"iop/internal/edge/api/apierror"
	"iop/internal/edge/api/httpconn"
	"iop/internal/edge/api/request"
	"iop/internal/quota"
)

// reserveQuota takes the quota reservation of a request that runs a model,
// for a key with a quota (Config.Quota), before anything is queued: the
// body is read (and given back to the route as it was, or with the cap a
// clamp wrote), its worst case reserved (access.Reserve), and a refusal
// returned (*quota.Refusal, 429 with Retry-After; a *request.FieldError 400 for
// an uncapped request of a key whose quota says uncapped: refuse). The
// reservation rides on the request's observation and is settled when the
// request is finished (observe.Request.Finish). A body that cannot be read, or of a
// Content-Type the route refuses, reserves nothing: the route answers it
// and runs nothing.
func (h *handler) reserveQuota(w http.ResponseWriter, r *http.Request, caller *auth.Caller) (*http.Request, error) {
	q := h.cfg.Quota
	if q == nil || !q.Limited(caller.Name()) {
		return r, nil
	}
	if !h.routes[r.URL.Path].AnyContentType && !httpconn.IsJSONContentType(r.Header.Get("Content-Type")) {
		return r, nil
	}
	orig := r.Body
	body, readErr := io.ReadAll(orig)
	replay := func(b []byte, err error) {
		var rd io.Reader = bytes.NewReader(b)
		if err != nil {
			rd = io.MultiReader(rd, errReader{err})
		}
		r.Body = httpconn.ReadCloser{Reader: rd, Closer: orig}
	}
	if readErr != nil {
		replay(body, readErr)
		return r, nil
	}
	res, body, clamp, err := access.Reserve(q, caller, r.URL.Path, body)
	if be := (*access.BodyError)(nil); errors.As(err, &be) {
		return nil, &request.FieldError{Field: be.Param, Message: be.Message}
	}
	if err != nil {
		return nil, err
	}
	if clamp > 0 {
		w.Header().Set(access.ClampedHeader, strconv.FormatInt(clamp, 10))
	}
	replay(body, nil)
	if o := obsOf(r); o != nil {
		o.req.SetQuota(res)
	} else {
		res.Cancel()
	}
	return r, nil
}

// errReader fails every Read with err.
type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }

// rateLimitHeaders sets the rate-limit headers of an answer to a key with
// limits (access.RateLimitHeaders), Anthropic's on its routes.
func (h *handler) rateLimitHeaders(hdr http.Header, path string, caller *auth.Caller) {
	access.RateLimitHeaders(hdr, h.cfg.Now(), caller, h.cfg.Quota, isAnthropicPath(path))
}

// quotaError is classify's answer to a refused reservation: 429
// rate_limit_error "quota_exceeded" (access.QuotaMessage), with a
// Retry-After of the seconds until the window holds the request (none
// when it never can: the ask is larger than the limit).
func quotaError(ref *quota.Refusal) *apierror.Error {
	e := apierror.New(http.StatusTooManyRequests, "rate_limit_error", "", "quota_exceeded", access.QuotaMessage(ref))
	if !ref.Never {
		e.WithRetryAfter(access.RetryAfterSeconds(ref.RetryAfter))
	}
	return e
}
