package api

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"go.opentelemetry.io/otel/trace"

	"iop/internal/auth"
	"iop/internal/edge/api/access"
	"iop/internal/edge/api/observe"
)

// DefaultMaxBodyBytes is the request body limit when Config.MaxBodyBytes is 0.
const DefaultMaxBodyBytes int64 = 32 << 20 // 32 MiB

// DefaultBodyReadTimeout is Config.BodyReadTimeout when it is 0.
const DefaultBodyReadTimeout = 60 * time.Second

// DefaultMaxAnswerBytes is Config.MaxAnswerBytes when it is 0: the same
// bound a node puts on a provider answer it reads whole (an Ollama stream
// line, an embeddings answer; adapter.MaxAnswerBytes).
const DefaultMaxAnswerBytes int64 = 256 << 20 // 256 MiB

// DefaultWriteTimeout is Config.WriteTimeout when it is 0.
const DefaultWriteTimeout = 60 * time.Second

// Config configures the HTTP API. The zero value is valid and means the
// documented defaults.
type Config struct {
	// MaxBodyBytes caps a request body, in bytes; a larger body is answered
	// 413. 0 means DefaultMaxBodyBytes (32 MiB); negative is invalid.
	MaxBodyBytes int64
	// MaxAnswerBytes caps a provider answer the edge reads whole to
	// translate it (a tunnel-path provider's non-streamed answer rendered
	// for an Ollama or Anthropic client, or its error body), in bytes; a
	// larger one fails the request with 502. An answer relayed as it comes
	// (OpenAI routes on the tunnel path) has no cap. 0 means
	// DefaultMaxAnswerBytes (256 MiB); negative is invalid.
	MaxAnswerBytes int64
	// WriteTimeout bounds each write to a client: a write (or flush) that
	// makes no progress for this long fails, and the run it belongs to is
	// cancelled, so a client that stays connected but stops reading cannot
	// hold a provider slot. Each write, and each 16 KiB of a larger one,
	// gets a fresh deadline, so a long stream is never cut while the client
	// reads (at least 16 KiB per timeout). 0 means
	// DefaultWriteTimeout (60 s); negative is invalid.
	WriteTimeout time.Duration
	// BodyReadTimeout bounds reading a request's body: a body not read to
	// its end this long after its headers is answered 408 and its
	// connection closed, so a client that sends a few bytes of a body and
	// then nothing does not hold a connection and a goroutine for ever. The
	// deadline is lifted once the body is in, so an answer of any length
	// is not affected. 0 means DefaultBodyReadTimeout (60 s); negative is
	// invalid.
	BodyReadTimeout time.Duration
	// Ready reports whether the edge can serve traffic, for GET /readyz
	// (200 when true, 503 when false). nil means always ready. It is called
	// once per probe and must not block.
	Ready func() bool
	// Stopping, when set, is closed when the edge ends the requests still
	// in flight at the end of its drain (edge.Service.Shutdown): a request
	// that then ends without completing has the outcome OutcomeEdgeStopped,
	// not the client_gone or upstream_error its rendering saw.
	Stopping <-chan struct{}
	// Now stamps "created" fields (Unix seconds) and times requests; nil
	// means time.Now.
	Now func() time.Time
	// Known, when set, reports whether Dispatch would resolve a model name
	// rather than refuse it as unknown, also while no node serves it (and
	// the listing leaves it out). Nil: only listed names are known, so a
	// name no node serves now is 404 rather than 503 where that differs.
	Known func(model string) bool
	// Observer gets a RequestRecord for every finished API request; nil
	// means none (each request is still logged).
	Observer observe.Observer
	// Metrics, if set, serves GET /metrics (the Prometheus exposition).
	Metrics http.Handler
	// Routes are the routes of the API packages (package admin's, ...),
	// by exact path (a path ending in "/" also serves the paths under it
	// that no other route serves), served beside the frame's own; nil: none. They
	// share the frame's body limits, keys and admission, observation and
	// error shapes (WriteError).
	Routes map[string]Route
	// BodyLimits replace MaxBodyBytes and BodyReadTimeout for the
	// requests of their exact paths (a Config.Routes upload route's).
	BodyLimits map[string]BodyLimit
	// APIs are the client API packages served on the frame, each making
	// its routes with the Frame (anthropic.Routes, ...); their routes are
	// merged with Routes. Nil: none.
	APIs []API
	// Keys are the client API keys; with at least one, every route but
	// /healthz, /readyz and the admin routes needs one of them
	// (access.go). Nil or empty: the client API is open.
	Keys *auth.Keyring
	// KeyAdmit, when set (several edges), takes a key's request slot
	// where its limits are counted: local true says here (the caller's own
	// Admit), else release gives back the slot it took elsewhere (the
	// scheduler leader). Its errors answer the request as Admit's do
	// (*auth.LimitError 429, contract.ErrNoLeader 503).
	KeyAdmit func(ctx context.Context, caller *auth.Caller) (release func(), local bool, err error)
	// AdminKeys are the admin API keys the routes under AdminPrefixes
	// need whenever Keys or AdminKeys hold a key.
	AdminKeys *auth.Keyring
	// AdminPrefixes are the path roots of the admin routes; nil means
	// access.DefaultAdminPrefixes.
	AdminPrefixes []string
	// Flow names what makes a request's flow in its model's queue (docs/scheduling.md,
	// "Fair sharing"): access.FlowKey ("key", also ""), its key's name; access.FlowUser
	// ("user"), the OpenAI body's "user" field; access.FlowHeaderPrefix+Name
	// ("header:X-Iop-Flow"), that header's value. The latter two fall back
	// to the key's name where the request has no value.
	Flow string
	// Ledger, when set, records every finished API request.
	Ledger Ledger
	// Quota, when set, holds the quotas of keys and teams: a request of a
	// key with one reserves its worst case before it is queued and settles
	// when it is finished (quota.go).
	Quota access.Quota
	// Tracer, when set, traces every API request (package observe): a server
	// span that continues the client's traceparent, whose context goes to
	// the node with the run. Nil: no tracing, at no cost per request.
	Tracer trace.Tracer
}

// Validate reports a configuration New cannot honour, wrapping
// ErrInvalidConfig.
func (c Config) Validate() error {
	if c.MaxAnswerBytes < 0 {
		return fmt.Errorf("%w: max answer bytes %d is negative", ErrInvalidConfig, c.MaxAnswerBytes)
	}
	if c.MaxBodyBytes < 0 {
		return fmt.Errorf("%w: max body bytes %d is negative", ErrInvalidConfig, c.MaxBodyBytes)
	}
	if c.BodyReadTimeout < 0 {
		return fmt.Errorf("%w: body read timeout %s is negative", ErrInvalidConfig, c.BodyReadTimeout)
	}
	if c.WriteTimeout < 0 {
		return fmt.Errorf("%w: write timeout %s is negative", ErrInvalidConfig, c.WriteTimeout)
	}
	if c.Flow != "" && c.Flow != access.FlowKey && c.Flow != access.FlowUser && access.FlowHeader(c.Flow) == "" {
		return fmt.Errorf("%w: flow %q is none of key, user, header:<Name>", ErrInvalidConfig, c.Flow)
	}
	return nil
}

// withDefaults returns c with every zero (or invalid) field set to its default.
func (c Config) withDefaults() Config {
	if c.MaxBodyBytes <= 0 {
		c.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if c.MaxAnswerBytes <= 0 {
		c.MaxAnswerBytes = DefaultMaxAnswerBytes
	}
	if c.BodyReadTimeout <= 0 {
		c.BodyReadTimeout = DefaultBodyReadTimeout
	}
	if c.WriteTimeout <= 0 {
		c.WriteTimeout = DefaultWriteTimeout
	}
	if c.Ready == nil {
		c.Ready = func() bool { return true }
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.AdminPrefixes == nil {
		c.AdminPrefixes = access.DefaultAdminPrefixes
	}
	return c
}

// BodyLimit is one path's request body limits (Config.BodyLimits): at
// most MaxBytes bytes (0: Config.MaxBodyBytes), read within ReadTimeout
// (0: Config.BodyReadTimeout).
type BodyLimit struct {
	MaxBytes    int64
	ReadTimeout time.Duration
}
