package adapter

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.opentelemetry.io/otel/propagation"

	"iop/internal/tracing"
	"iop/internal/translate"
	"iop/internal/wire/nodev1"
)

// DefaultTimeout bounds a whole provider request (head and body) when
// Config.Timeout is zero.
const DefaultTimeout = 10 * time.Minute

// dialTimeout bounds one TCP connect to a provider.
const dialTimeout = 10 * time.Second

// idleConnTimeout is how long a pooled connection to a provider may sit
// idle before the node closes it: under the 5 s keep-alive of the servers
// models run behind (uvicorn's timeout_keep_alive for vLLM, cpp-httplib's
// for llama.cpp, Node's keepAliveTimeout), so the node never sends a
// request on a connection the server is closing — net/http does not
// retry a POST it has written, and the run would end 502 "provider
// unreachable: connection closed".
const idleConnTimeout = 4 * time.Second

// errorBodyLimit caps how much of a non-2xx answer is read for its message.
const errorBodyLimit = 64 << 10

// Request is one dispatched run as an adapter sees it.
type Request struct {
	// Op says which OpenAI endpoint's body Body is.
	Op nodev1.Operation
	// Stream is the client's stream flag (informational: a Normalizer always
	// streams from its provider, a Tunneler relays whatever the body asks).
	Stream bool
	// ServedModel is the provider's model name; it replaces the body's model.
	ServedModel string
	// Body is the client's OpenAI-shaped JSON request body: chat
	// completions, completions or embeddings.
	Body []byte
	// OllamaFields is the Dispatch's ollama_fields: a JSON object of Ollama
	// request fields OpenAI's API has no name for (translate.OllamaFields),
	// or empty. Only the Ollama adapter reads it; no adapter reads such
	// fields from Body.
	OllamaFields []byte
	// BodyReader, when set, is the body as it comes from the edge (a
	// streamed multipart upload); Body is then nil. The adapter reads it
	// once, as it sends it to the provider.
	BodyReader io.Reader
	// Headers are client request headers the edge selected for the provider
	// (e.g. Accept), canonical or not. Tunnelers forward them, except
	// hop-by-hop headers and those the adapter sets itself.
	Headers map[string]string
}

// EventSink receives the run events of a normalized answer, in order. Send
// is called with one or more events that belong in one message.
type EventSink interface {
	Send(events ...*nodev1.RunEvent) error
}

// EventSinkFunc adapts a function to EventSink.
type EventSinkFunc func(events ...*nodev1.RunEvent) error

// Send calls f(events...).
func (f EventSinkFunc) Send(events ...*nodev1.RunEvent) error { return f(events...) }

// TunnelSink receives a tunneled answer: Head once, then Data for each chunk
// in the order it arrived from the provider; or, for an answer whose body
// the adapter had whole at once, Head alone with End set.
type TunnelSink interface {
	// Head receives the status, the headers to relay and the start of the
	// body, or all of it (see [TunnelHead]).
	Head(h TunnelHead) error
	// Data receives the next chunk of the body. p is only valid during the
	// call: the adapter reuses it.
	Data(p []byte) error
}

// TunnelHead is the start of a tunneled answer, as a TunnelSink's Head
// gets it.
type TunnelHead struct {
	// Status is the provider's HTTP status.
	Status int
	// Header holds the headers to relay: only the allowlisted ones (see
	// [OpenAI.Tunnel]), never hop-by-hop headers or Content-Length (which
	// is ContentLength).
	Header http.Header
	// Body is the start of the body, bytes that would otherwise be the
	// first Data (nil when none came with the head), or, with End, the
	// whole body. It is only valid during the call.
	Body []byte
	// End says Body is the whole body: the answer is complete with this
	// call, no Data follows, and the Tunnel call returns nil right after it
	// (the caller then sends no TunnelEnd: the head carried the end).
	End bool
	// ContentLength is the length in bytes of the whole body as relayed
	// (Body and every Data after it) when it is known before the body
	// ends: the provider's Content-Length, for a body the adapter relays
	// unchanged in length; -1 when it is not known. With End it is
	// len(Body).
	ContentLength int64
}

// Adapter is what every provider adapter has; a value is also exactly one of
// Normalizer or Tunneler, as Path says.
type Adapter interface {
	// Path is the execution path the adapter answers on.
	Path() nodev1.ExecutionPath
	// Close drops the provider's idle connections. Calls in flight are
	// unaffected and the adapter stays usable.
	Close()
}

// Normalizer answers on the normalized path.
type Normalizer interface {
	Adapter
	// Normalize runs req against the provider and sends run events to sink:
	// STARTED once the provider answered 2xx, DELTAs, then USAGE and
	// COMPLETE together. The outcome is reported as described in the package
	// doc; failure events (ERROR, CANCELLED) are the caller's to send.
	Normalize(ctx context.Context, req Request, sink EventSink) error
}

// Tunneler answers on the tunnel path.
type Tunneler interface {
	Adapter
	// Tunnel runs req against the provider and relays its answer to sink.
	// The outcome is reported as described in the package doc.
	Tunnel(ctx context.Context, req Request, sink TunnelSink) error
}

// Config describes how to reach one provider.
type Config struct {
	// BaseURL is the provider's root: "http://127.0.0.1:11434" for Ollama,
	// the URL that ends before "/chat/completions" for an OpenAI-compatible
	// server (e.g. "http://127.0.0.1:8000/v1"). Required, http or https.
	BaseURL string
	// APIKey, when set, is sent as "Authorization: Bearer <APIKey>".
	APIKey string
	// Timeout bounds a whole request, head and body; 0 means DefaultTimeout.
	Timeout time.Duration
	// MaxConns is the most requests the provider gets at once (its
	// capacity, or long capacity if larger); the connection pool keeps that
	// many idle connections. 0 means 1.
	MaxConns int
}

// httpProvider is the HTTP plumbing both adapters share.
type httpProvider struct {
	baseURL   string // without a trailing slash
	apiKey    string
	timeout   time.Duration
	client    *http.Client
	transport *http.Transport
	redactor  *strings.Replacer // hides baseURL, its origin, its host, its password and apiKey
	// needles are the host, the password and apiKey (those set): every
	// secret the redactor hides contains one of them, so a string holding
	// none is returned as it is, without the Replacer's copy.
	needles []string
}

func newHTTPProvider(cfg Config) (*httpProvider, error) {
	u, err := url.Parse(cfg.BaseURL)
	switch {
	case err != nil:
		return nil, fmt.Errorf("%w: base url does not parse", ErrInvalidConfig)
	case u.Scheme != "http" && u.Scheme != "https":
		return nil, fmt.Errorf("%w: base url scheme %q: want http or https", ErrInvalidConfig, u.Scheme)
	case u.Host == "":
		return nil, fmt.Errorf("%w: base url has no host", ErrInvalidConfig)
	case cfg.Timeout < 0:
		return nil, fmt.Errorf("%w: timeout %v is negative", ErrInvalidConfig, cfg.Timeout)
	case cfg.MaxConns < 0:
		return nil, fmt.Errorf("%w: max conns %d is negative", ErrInvalidConfig, cfg.MaxConns)
	}
	timeout := cfg.Timeout
	if timeout == 0 {
		timeout = DefaultTimeout
	}
	conns := max(cfg.MaxConns, 1)
	transport := &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           dialCopyConn(&net.Dialer{Timeout: dialTimeout, KeepAlive: 30 * time.Second}),
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          max(100, conns),
		MaxIdleConnsPerHost:   conns,
		IdleConnTimeout:       idleConnTimeout,
		TLSHandshakeTimeout:   10 * time.Second,
		ExpectContinueTimeout: time.Second,
		// The tunnel relays few headers; refuse a provider's oversized ones.
		MaxResponseHeaderBytes: 1 << 20,
		// No transparent gzip: post asks for identity itself, and decodes
		// (decodeBody) what a provider compresses anyway, on both paths.
		DisableCompression: true,
	}
	base := strings.TrimRight(cfg.BaseURL, "/")
	// Longest first: at any one position a Replacer tries its patterns in
	// argument order, so the full URL wins over its origin, the origin over
	// the bare host.
	secrets := []string{base, "[provider]", u.Scheme + "://" + u.Host, "[provider]", u.Host, "[provider]"}
	needles := []string{u.Host}
	if pw, ok := u.User.Password(); ok && pw != "" {
		secrets = append(secrets, pw, "[redacted]")
		needles = append(needles, pw)
	}
	if cfg.APIKey != "" {
		secrets = append(secrets, cfg.APIKey, "[redacted]")
		needles = append(needles, cfg.APIKey)
	}
	return &httpProvider{
		baseURL: base,
		apiKey:  cfg.APIKey,
		timeout: timeout,
		client: &http.Client{
			Transport: transport,
			// A redirect is the provider's answer; never re-post a body.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
		transport: transport,
		redactor:  strings.NewReplacer(secrets...),
		needles:   needles,
	}, nil
}

// Close drops idle connections.
func (p *httpProvider) Close() { p.transport.CloseIdleConnections() }

// redact removes the provider's URL (in full, its scheme and host, its host
// alone), any password in it, and its API key from s; "Bearer <key>" thus
// becomes "Bearer [redacted]".
func (p *httpProvider) redact(s string) string {
	for _, n := range p.needles {
		if strings.Contains(s, n) {
			return p.redactor.Replace(s)
		}
	}
	return s
}

// call is one provider request in flight.
type call struct {
	p      *httpProvider
	parent context.Context // the caller's context
	ctx    context.Context // parent plus the provider timeout
	cancel context.CancelFunc
	resp   *http.Response
}

// post sends body to p.baseURL+path. On success the caller owns c and must
// call c.close. On failure the error is an *Error or wraps ErrCancelled.
func (p *httpProvider) post(ctx context.Context, path string, body []byte, header http.Header) (*call, error) {
	return p.postReader(ctx, path, bytes.NewReader(body), nil, header)
}

// postParts is post of the body made of parts, sent one after the other
// without being joined (rewriteModelParts).
func (p *httpProvider) postParts(ctx context.Context, path string, parts net.Buffers, header http.Header) (*call, error) {
	if len(parts) == 1 {
		return p.post(ctx, path, parts[0], header)
	}
	return p.postReader(ctx, path, partsReader(parts), parts, header)
}

// postReader is post of the body rd reads: a bytes.Reader, or parts'
// partsReader.
func (p *httpProvider) postReader(ctx context.Context, path string, rd io.Reader, parts net.Buffers, header http.Header) (*call, error) {
	return p.postURL(ctx, p.baseURL+path, rd, parts, header)
}

// postURL is postReader to url.
func (p *httpProvider) postURL(ctx context.Context, url string, rd io.Reader, parts net.Buffers, header http.Header) (*call, error) {
	rctx, cancel := context.WithTimeoutCause(ctx, p.timeout, ErrProviderTimeout)
	req, err := http.NewRequestWithContext(rctx, http.MethodPost, url, rd)
	if err != nil {
		cancel()
		return nil, &Error{Kind: ErrBadRequest, Status: http.StatusBadRequest, Message: "cannot build provider request"}
	}
	if parts != nil {
		// What NewRequest sets for a bytes.Reader: the length, and a
		// fresh reader for a retry on a new connection.
		for _, b := range parts {
			req.ContentLength += int64(len(b))
		}
		req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(partsReader(parts)), nil }
		if req.ContentLength == 0 {
			req.Body, req.GetBody = http.NoBody, nil
		}
	}
	for k, vs := range header {
		req.Header[k] = vs
	}
	if req.Header.Get("Content-Type") == "" { // only the media routes set their own
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("User-Agent", "iop-node")
	// Without Accept-Encoding a server may use any coding (RFC 9110
	// section 12.5.3): ask for the bytes as they are.
	req.Header.Set("Accept-Encoding", "identity")
	if p.apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+p.apiKey)
	}
	// The provider call's trace context, when the run is traced (a span
	// in ctx): the provider (vLLM, ...) continues the trace.
	tracing.Propagator.Inject(ctx, propagation.HeaderCarrier(req.Header))
	c := &call{p: p, parent: ctx, ctx: rctx, cancel: cancel}
	resp, err := p.client.Do(req)
	if err != nil {
		defer cancel()
		return nil, c.failure(err, false)
	}
	c.resp = resp
	if coding := decodeBody(resp); coding != "" {
		c.close()
		return nil, &Error{Kind: ErrProviderStream, Status: http.StatusBadGateway,
			Message: fmt.Sprintf("provider answered in Content-Encoding %q although asked for identity", truncate(coding, 32))}
	}
	return c, nil
}

// close aborts the request if it is still running and releases it.
func (c *call) close() {
	c.cancel()
	c.resp.Body.Close()
}

// failure classifies err, which ended the call before (afterHead false) or
// after the response head arrived.
func (c *call) failure(err error, afterHead bool) error {
	if c.parent.Err() != nil {
		return fmt.Errorf("%w: %w", ErrCancelled, context.Cause(c.parent))
	}
	var nerr net.Error
	if errors.Is(context.Cause(c.ctx), ErrProviderTimeout) || (errors.As(err, &nerr) && nerr.Timeout()) {
		return &Error{Kind: ErrProviderTimeout, Status: http.StatusGatewayTimeout, Message: "provider timed out"}
	}
	if afterHead {
		return &Error{Kind: ErrProviderStream, Status: http.StatusBadGateway, Message: "provider stream broken: " + cause(err)}
	}
	return &Error{Kind: ErrProviderUnreachable, Status: http.StatusBadGateway, Message: "provider unreachable: " + cause(err)}
}

// cause names a transport error without any part of its text that could hold
// a URL or host.
func cause(err error) string {
	var dnsErr *net.DNSError
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused"
	case errors.Is(err, syscall.ECONNRESET):
		return "connection reset"
	case errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH):
		return "no route to host"
	case errors.As(err, &dnsErr):
		return "name resolution failed"
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "connection closed"
	default:
		return "transport error"
	}
}

// sinkFailed wraps a sink's error.
func sinkFailed(err error) error { return fmt.Errorf("%w: %w", ErrSink, err) }

// badRequest is an *Error of kind ErrBadRequest.
func badRequest(format string, args ...any) *Error {
	return &Error{Kind: ErrBadRequest, Status: http.StatusBadRequest, Message: fmt.Sprintf(format, args...)}
}

// fieldBadRequest is an *Error of kind ErrBadRequest naming the request
// field param: its message is "<param>: <what>".
func fieldBadRequest(param, format string, args ...any) *Error {
	e := badRequest(format, args...)
	if param != "" {
		e.Param, e.Message = param, param+": "+e.Message
	}
	return e
}

// translateFailed is the *Error of kind ErrBadRequest for err, an error
// of package translate: a *translate.FieldError names its field (Param),
// anything else names none.
func translateFailed(err error) *Error {
	var fe *translate.FieldError
	if errors.As(err, &fe) {
		return fieldBadRequest(fe.Field, "%s", fe.Message)
	}
	return badRequest("%v", err)
}

// isNull reports whether raw is absent or JSON null.
func isNull(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) == 0 || string(raw) == "null"
}

// partsReader returns a reader of parts that leaves parts as they are
// (net.Buffers' own Read consumes its slice).
func partsReader(parts net.Buffers) *net.Buffers {
	b := slices.Clone(parts)
	return &b
}

// dialCopyConn dials as d does and hands net/http a copyConn.
func dialCopyConn(d *net.Dialer) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return copyConn{c}, nil
	}
}

// copyConn is a connection to a provider whose ReadFrom copies through a
// pooled buffer. net/http sends a request body of known length as an
// io.LimitedReader, which has no WriteTo, so a body longer than what fits
// in its 4 KiB write buffer reached net.TCPConn.ReadFrom, which allocated
// a fresh 32 KiB buffer for each one (a fifth of a node's allocation under
// 100 KB agent requests). A TLS connection wraps it and copies its own way.
type copyConn struct{ net.Conn }

var copyBuffers = sync.Pool{New: func() any { return new([32 << 10]byte) }}

func (c copyConn) ReadFrom(r io.Reader) (int64, error) {
	buf := copyBuffers.Get().(*[32 << 10]byte)
	defer copyBuffers.Put(buf)
	return io.CopyBuffer(struct{ io.Writer }{c.Conn}, r, buf[:])
}
