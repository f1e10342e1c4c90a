package access

import (
	"context"
	"fmt"
	"math"
	"path"
	"strings"
	"time"

	"iop/internal/auth"
)

// DefaultAdminPrefixes are the path roots the frame's admin prefixes
// default to: the admin API, the Prometheus metrics, the dashboard and
// Go's profiler. A path is admin when it is a root or lies under one.
var DefaultAdminPrefixes = []string{"/admin", "/metrics", "/ui", "/debug"}

// publicPaths need no key: liveness and readiness probes.
var publicPaths = map[string]bool{"/healthz": true, "/readyz": true}

// Public reports whether path needs no key (the probes).
func Public(path string) bool { return publicPaths[path] }

// AdminPath reports whether p, or p with its dot segments resolved
// (path.Clean: a proxy in front might resolve them), lies under one of
// prefixes.
func AdminPath(prefixes []string, p string) bool {
	for _, candidate := range []string{p, path.Clean(p)} {
		for _, prefix := range prefixes {
			if candidate == prefix || strings.HasPrefix(candidate, strings.TrimSuffix(prefix, "/")+"/") {
				return true
			}
		}
	}
	return false
}

// CheckModel refuses a model the key of ctx (auth.FromContext) may not
// use (ErrModelNotAllowed, 403); nil for an open API.
func CheckModel(ctx context.Context, model string) error {
	if c := auth.FromContext(ctx); c != nil && !c.Allows(model) {
		return fmt.Errorf("%w: %q", ErrModelNotAllowed, model)
	}
	return nil
}

// Allowed reports whether the key of ctx may use model (true for an
// open API).
func Allowed(ctx context.Context, model string) bool {
	return CheckModel(ctx, model) == nil
}

// Models is names narrowed to what the key of ctx may use (names itself
// for an open API).
func Models(ctx context.Context, names []string) []string {
	if c := auth.FromContext(ctx); c != nil {
		return c.Filter(names)
	}
	return names
}

// KeyName is the name of the key of ctx, "" for an open API.
func KeyName(ctx context.Context) string {
	if c := auth.FromContext(ctx); c != nil {
		return c.Name()
	}
	return ""
}

// RetryAfterSeconds renders d as a Retry-After value: whole seconds,
// rounded up, at least 1 (RFC 9110 §10.2.3).
func RetryAfterSeconds(d time.Duration) string {
	return fmt.Sprint(max(1, int64(math.Ceil(d.Seconds()))))
}

// Authenticate decides which key a request with credential secret
// presents, for an admin path (admin) or any other that is not public:
// an admin path needs one of adminKeys; any other path needs one of keys
// when keys holds any (else it passes), or internal, the caller an
// internal request runs as (a batch line), which stands in for secret.
// caller is the client key the request runs as, nil when it passes
// without one. Errors: ErrMissingKey, ErrWrongKey, ErrNotAdminKey (a
// client key on an admin path), ErrAdminKeyOnAPI (an admin key on the
// model API).
func Authenticate(keys, adminKeys *auth.Keyring, admin bool, secret string, internal *auth.Caller) (caller *auth.Caller, err error) {
	if admin {
		switch {
		case adminKeys.Authenticate(secret) != nil:
			return nil, nil
		case secret == "":
			return nil, ErrMissingKey
		case keys.Authenticate(secret) != nil:
			return nil, ErrNotAdminKey
		default:
			return nil, ErrWrongKey
		}
	}
	if keys.Len() == 0 {
		return nil, nil
	}
	caller = keys.Authenticate(secret)
	if internal != nil {
		caller = internal
	}
	switch {
	case caller != nil:
		return caller, nil
	case secret == "":
		return nil, ErrMissingKey
	case adminKeys.Authenticate(secret) != nil:
		return nil, ErrAdminKeyOnAPI
	default:
		return nil, ErrWrongKey
	}
}
