package adapter

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"

	"iop/internal/jsonscan"
	"iop/internal/translate"
	"iop/internal/wire/nodev1"
)

// tunnelChunk is the size of the buffer a tunnel reads the provider's body
// into; each Read's bytes are relayed at once, however few.
const tunnelChunk = 32 << 10

var chunkPool = sync.Pool{New: func() any { b := make([]byte, tunnelChunk); return &b }}

// maxHeaderValue is the longest response header value a tunnel relays; a
// longer value is dropped (a provider's 200 KB header would otherwise reach
// clients whose header limits are far smaller).
const maxHeaderValue = 8 << 10

// maxFallbackMessage bounds the message of an error object the tunnel builds
// from a non-OpenAI error body (see [OpenAI.Tunnel]).
const maxFallbackMessage = 1 << 10

// relayedHeaders are the response headers a tunnel relays, by canonical
// name; relayedPrefixes the header families it relays. Everything else is
// dropped: Set-Cookie and Location (the provider's session and internal
// addresses), Server and Via (its software), the other Openai-* headers
// (they name the operator's provider account: Openai-Organization,
// Openai-Project, Openai-Org-Id, ...), hop-by-hop headers and
// Content-Length (they describe the provider's connection, not the edge's;
// the body's length goes as TunnelHead.ContentLength when it is known),
// and any header a client has no use for. Content-Encoding stays (a gzip
// or deflate body is decoded and loses it first: decodeBody).
var (
	relayedHeaders = map[string]bool{
		"Content-Type": true, "Content-Encoding": true, "Cache-Control": true, "Retry-After": true,
		"X-Request-Id": true, "Openai-Processing-Ms": true, "Openai-Version": true, "Openai-Model": true,
	}
	relayedPrefixes = []string{"X-Ratelimit-"}
)

// hopByHop are the headers that describe one HTTP connection, not the
// message (RFC 9110 section 7.6.1), plus Content-Length, which the edge
// recomputes; a tunnel forwards none of them to the provider.
var hopByHop = []string{
	"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade",
	"Content-Length",
}

// notForwarded are client headers a tunnel never forwards: the adapter sets
// them itself, or they would carry the client's credentials to the provider.
var notForwarded = map[string]bool{
	"Authorization": true, "Content-Type": true, "Host": true, "Cookie": true,
	"Accept-Encoding": true, "User-Agent": true, "Expect": true,
}

// OpenAI answers on the tunnel path by relaying to an OpenAI-compatible
// server (OpenAI, vLLM, llama.cpp server, LM Studio, SGLang, TGI). It is
// safe for concurrent use.
type OpenAI struct {
	p *httpProvider

	mu sync.Mutex
	// noEffort holds the served models that refused a reasoning effort
	// as a think level (thinkLevelRetry); their requests go without one.
	noEffort map[string]bool
}

var _ Tunneler = (*OpenAI)(nil)

// NewOpenAI returns the adapter for the OpenAI-compatible server whose API
// root is cfg.BaseURL (e.g. "http://127.0.0.1:8000/v1"). Errors wrap
// ErrInvalidConfig.
func NewOpenAI(cfg Config) (*OpenAI, error) {
	p, err := newHTTPProvider(cfg)
	if err != nil {
		return nil, err
	}
	return &OpenAI{p: p}, nil
}

// Path is EXECUTION_PATH_TUNNEL.
func (o *OpenAI) Path() nodev1.ExecutionPath { return nodev1.ExecutionPath_EXECUTION_PATH_TUNNEL }

// Close drops idle connections to the server.
func (o *OpenAI) Close() { o.p.Close() }

// Tunnel posts req.Body, with its top-level "model" rewritten to
// req.ServedModel (a body whose model already is req.ServedModel goes as
// it came, byte for byte; req.OllamaFields are not sent), to {base_url}/chat/completions, /completions or
// /embeddings (by req.Op), with Content-Type application/json, the
// provider's API key as a bearer token, and the forwardable req.Headers.
// What it relays depends on the answer's status:
//
//   - 2xx: the status, the allowlisted headers, then each chunk of the body
//     as Read returned it, byte for byte, except that the provider's API
//     key, should the provider echo it, becomes "[redacted]"
//     (streamRedactor; a chunk's tail that may begin the key waits for the
//     next chunk). The head and the first bytes wait until the answer is
//     known not to be an error object: an SSE body's until its first
//     event, any other body's until its end or maxPeek bytes. The bytes
//     that waited go with the head (TunnelHead.Body): a body that ended
//     within maxPeek bytes goes whole, with End, in one sink call (one
//     message on the wire; its length is the body's); the head of a
//     larger one that is not an event stream carries the provider's
//     Content-Length as TunnelHead.ContentLength when the provider sent
//     one and no API key is set (a redacted key would change the length),
//     else -1 (the edge then cannot know it). A body that
//     is an error object (errorObjectText: a JSON object with an "error"
//     and no "choices" or "data") or an SSE body whose first event is an
//     error event is not relayed at all: the call returns an *Error of
//     kind ErrProviderError, status 502, with the error's message
//     (redacted, at most 1 KiB), a failure before the first byte that the
//     edge may retry elsewhere. An SSE body (text/event-stream)
//     is also watched for a later error event (`data: {"error":...}`, see
//     errorWatch): the body is still relayed in full and unchanged, but
//     the call then returns an *Error of kind ErrProviderReported with the
//     event's message, so the run is recorded as failed. An SSE body that
//     ends cleanly but without its closing `data: [DONE]` (as Ollama's /v1
//     does when its repeat limit cuts an answer) is relayed in full too,
//     and the call returns an *Error of kind ErrProviderStream (502).
//   - 4xx and 5xx (an error answer, the provider's to tell): the same
//     status, the allowlisted headers with Content-Type application/json,
//     and one OpenAI error object {"error":{"message","type","param",
//     "code"}} built from at most the first 64 KiB of the body, whole in
//     one sink call (TunnelHead.End). A body with
//     an OpenAI-shaped "error" object (one with a string "message") keeps
//     its message, type, param and code (a number becomes a string) and
//     loses every other field, which may carry the provider's raw text.
//     Any other body (HTML or text from a proxy, vLLM's {"object":"error",
//     "message",...}, TGI's {"error":"..."}, a truncated one) becomes type
//     "upstream_error" with the body's own message if it is JSON and has
//     one, or the body's text if it is not JSON (bodyText: plain text as
//     it is, an HTML page's title), at most 1 KiB, else "upstream
//     returned HTTP <status>", and code
//     the body's "code" or else the status. Every string relayed has the
//     provider's URL, host and API key (thus "Bearer <key>") redacted.
//   - anything else (a redirect, which is never followed, or a status
//     outside 200-599): nothing; it returns an *Error of kind
//     ErrProviderStatus with status 502 and a message that names only the
//     status (never Location).
//
// The allowlisted headers are Content-Type, Cache-Control, Retry-After,
// X-Request-Id, Openai-* and X-Ratelimit-*, minus those the provider's
// Connection header names and any value over 8 KiB, with the provider's URL
// and API key redacted. Everything else (Set-Cookie, Location, Server, Via,
// hop-by-hop headers, Content-Length, ...) is dropped: it describes the
// provider's connection or exposes its internals to clients (the body's
// length travels as TunnelHead.ContentLength instead, see above).
//
// Failures are reported as the package doc describes.
func (o *OpenAI) Tunnel(ctx context.Context, req Request, sink TunnelSink) error {
	var path string
	switch req.Op {
	case nodev1.Operation_OPERATION_CHAT:
		path = "/chat/completions"
	case nodev1.Operation_OPERATION_COMPLETION:
		path = "/completions"
	case nodev1.Operation_OPERATION_EMBEDDINGS:
		path = "/embeddings"
	default:
		if mediaPaths[req.Op] == "" {
			return badRequest("operation %v is not supported", req.Op)
		}
		return o.media(ctx, req, sink)
	}
	// req.OllamaFields mean nothing to an OpenAI-compatible server, but
	// for their "think": a level an Ollama client set in its own terms,
	// whose refusal goes back to it as it came (no thinkLevelRetry).
	fields, _ := translate.ParseOllamaFields(req.OllamaFields)
	effortRetry := req.Op == nodev1.Operation_OPERATION_CHAT && !fields.Has("think")
	// A large body whose model changes goes in parts, not copied
	// (rewriteModelParts); joined turns it into one slice for the rare
	// paths that rewrite it again.
	var (
		body  []byte
		parts net.Buffers
		err   error
	)
	if len(req.Body) >= spliceMinBytes {
		parts, err = rewriteModelParts(req.Body, req.ServedModel)
	} else {
		body, err = rewriteModel(req.Body, req.ServedModel)
	}
	joined := func() []byte {
		switch len(parts) {
		case 0:
		case 1:
			body = parts[0]
		default:
			body = bytes.Join(parts, nil)
		}
		parts = nil
		return body
	}
	if err != nil {
		return badRequest("%v", err)
	}
	header := make(http.Header, len(req.Headers))
	for k, v := range req.Headers {
		k = http.CanonicalHeaderKey(k)
		if !notForwarded[k] && !isHopByHop(k) {
			header.Set(k, v)
		}
	}
	if effortRetry && o.refusesEffort(req.ServedModel) {
		body, _ = translate.DropReasoningEffort(joined())
	}
	var c *call
	if parts != nil {
		c, err = o.p.postParts(ctx, path, parts, header)
	} else {
		c, err = o.p.post(ctx, path, body, header)
	}
	if err != nil {
		return err
	}
	if effortRetry && c.resp.StatusCode == http.StatusBadRequest {
		if c, err = o.thinkLevelRetry(ctx, c, path, joined(), header, req.ServedModel); err != nil {
			return err
		}
	}
	return o.relay(c, req.Stream, true, sink)
}

// relay relays c's answer to sink (Tunnel's rules) and closes c. With
// needDone, an event stream that ends without data: [DONE] failed (the
// OpenAI routes'; llama.cpp's own routes end theirs with a last event
// whose "stop" is true instead).
func (o *OpenAI) relay(c *call, stream, needDone bool, sink TunnelSink) error {
	defer c.close()
	switch status := c.resp.StatusCode; {
	case status >= 200 && status <= 299:
	case status >= 400 && status <= 599:
		return o.relayError(c, sink)
	case status >= 300 && status <= 399:
		return &Error{Kind: ErrProviderStatus, Status: http.StatusBadGateway,
			Message: fmt.Sprintf("provider answered with a redirect (%d); redirects are not followed", status)}
	default:
		return &Error{Kind: ErrProviderStatus, Status: http.StatusBadGateway,
			Message: fmt.Sprintf("provider answered with unexpected status %d", status)}
	}
	relayed := o.relayHeader(c.resp.Header)
	var watch *errorWatch
	if isEventStream(relayed.Get("Content-Type")) {
		watch = &errorWatch{}
	}
	// A streamed request answered 2xx with anything but an event stream
	// (an HTML error page of a proxy, a truncated JSON object) is no
	// answer the client can read: a provider failure before its first
	// byte, not a stream relayed as completed.
	notAStream := stream && watch == nil
	scrub := newStreamRedactor(o.p.apiKey)
	// The body's length as relayed is known before its end when the
	// provider declared it (Content-Length), for a body that is not an
	// event stream and that the redactor cannot change in length (there is
	// no API key to scrub): the edge then answers with that Content-Length.
	length := int64(-1)
	if watch == nil && scrub.secret == nil && c.resp.ContentLength >= 0 {
		length = c.resp.ContentLength
	}
	bufp := chunkPool.Get().(*[]byte)
	defer chunkPool.Put(bufp)
	buf := *bufp
	// Until the answer is known not to be an error object, its head and
	// first bytes wait: pending holds them scrubbed, raw as read (raw is
	// pending itself when there is nothing to scrub: see rawBody). An
	// event stream is known once its first event is in (or maxPeek bytes
	// are, without one); any other body once it ended within maxPeek
	// bytes (an error object is small; the head then carries the whole
	// body, one message) or went past them.
	var (
		pending, raw []byte
		headSent     bool
	)
	rawBody := func() []byte {
		if scrub.secret == nil && !notAStream {
			return pending
		}
		return raw
	}
	notAStreamErr := func() error {
		msg := fmt.Sprintf("provider answered a streamed request with Content-Type %q, not an event stream", relayed.Get("Content-Type"))
		if text := bodyText(rawBody()); text != "" {
			msg += ": " + text
		}
		return &Error{Kind: ErrProviderError, Status: http.StatusBadGateway, Message: truncate(o.p.redact(msg), maxFallbackMessage)}
	}
	// sendHead sends the head with the bytes that waited: the whole body
	// when end is set.
	sendHead := func(end bool) error {
		headSent = true
		head := TunnelHead{Status: c.resp.StatusCode, Header: relayed, Body: pending, End: end, ContentLength: length}
		if end {
			head.ContentLength = int64(len(pending))
		}
		if err := sink.Head(head); err != nil {
			return sinkFailed(err)
		}
		pending, raw = nil, nil
		return nil
	}
	for {
		n, rerr := c.resp.Body.Read(buf)
		if n > 0 {
			out := scrub.write(buf[:n])
			if watch != nil {
				watch.write(buf[:n])
			}
			switch {
			case headSent:
				if len(out) > 0 {
					if err := sink.Data(out); err != nil {
						return sinkFailed(err)
					}
				}
			case watch != nil && watch.firstError:
				return &Error{Kind: ErrProviderError, Status: http.StatusBadGateway, Message: truncate(o.p.redact(watch.message), maxFallbackMessage)}
			case notAStream:
				if raw = append(raw, buf[:n]...); len(raw) > maxPeek {
					return notAStreamErr()
				}
			default:
				switch {
				case scrub.secret == nil && pending == nil && errors.Is(rerr, io.EOF):
					// The whole body in one read, with nothing to scrub:
					// it goes up from buf itself, without a copy (the sink
					// is done with it before buf is reused).
					pending = out
				case scrub.secret == nil:
					pending = append(pending, out...) // raw is pending (rawBody)
				default:
					pending, raw = append(pending, out...), append(raw, buf[:n]...)
				}
				if (watch != nil && watch.seen > 0) || len(rawBody()) > maxPeek {
					if err := sendHead(false); err != nil {
						return err
					}
				}
			}
		}
		switch {
		case rerr == nil:
		case errors.Is(rerr, io.EOF):
			rest := scrub.flush()
			if !headSent {
				if notAStream {
					if msg := errorObjectText(raw); msg != "" {
						return &Error{Kind: ErrProviderError, Status: http.StatusBadGateway, Message: truncate(o.p.redact(msg), maxFallbackMessage)}
					}
					return notAStreamErr()
				}
				if msg := errorObjectText(rawBody()); msg != "" {
					return &Error{Kind: ErrProviderError, Status: http.StatusBadGateway, Message: truncate(o.p.redact(msg), maxFallbackMessage)}
				}
				pending = append(pending, rest...)
				// A body that ended before its head went is whole: one
				// message, head, body and end, but for an event stream,
				// whose end may still be a failure (below).
				if err := sendHead(watch == nil); err != nil {
					return err
				}
				if watch == nil {
					return nil
				}
			} else if len(rest) > 0 {
				if err := sink.Data(rest); err != nil {
					return sinkFailed(err)
				}
			}
			if watch != nil {
				if watch.message != "" {
					return &Error{Kind: ErrProviderReported, Status: http.StatusBadGateway, Message: o.p.redact(watch.message)}
				}
				if needDone && !watch.done {
					return &Error{Kind: ErrProviderStream, Status: http.StatusBadGateway, Message: "provider closed stream before data: [DONE]"}
				}
			}
			return nil
		default:
			return c.failure(rerr, true)
		}
	}
}

// maxPeek is how much of a 2xx answer a tunnel reads, at most, before it
// relays the head, to tell an error object from an answer.
const maxPeek = errorBodyLimit

// errorObjectText is the message of a 2xx body that is an error object
// instead of an answer: a JSON object with an "error" member (an object
// with a message, or a string; errorText), and no "choices" or "data" (an
// answer's). It is "" for anything else.
//
// An answer is told without decoding it (jsonscan.Object, no allocation): only a
// body that is a JSON object without "choices" or "data" is decoded.
func errorObjectText(body []byte) string {
	answer := false
	_, _, ok := jsonscan.Object(body, func(key []byte, keyFlags int, _, _ int) {
		if !answer && (jsonscan.KeyIs(key, keyFlags, "choices") || jsonscan.KeyIs(key, keyFlags, "data")) {
			answer = true
		}
	})
	if !ok || answer {
		return ""
	}
	// A member named "error" is spelled `"error"` or with a \u escape
	// (JSON has no other escape for a letter): a body with neither has
	// none, and is not decoded (every answer passes here).
	if !bytes.Contains(body, errorKey) && !bytes.Contains(body, unicodeEscape) {
		return ""
	}
	var doc map[string]json.RawMessage
	if json.Unmarshal(body, &doc) != nil {
		return ""
	}
	if _, ok := doc["choices"]; ok {
		return ""
	}
	if _, ok := doc["data"]; ok {
		return ""
	}
	return errorText(doc["error"])
}

var (
	errorKey      = []byte(`"error"`)
	unicodeEscape = []byte(`\u`)
)

// isEventStream reports whether a Content-Type is text/event-stream.
func isEventStream(contentType string) bool {
	mediaType, _, err := mime.ParseMediaType(contentType)
	return err == nil && mediaType == "text/event-stream"
}

func isHopByHop(k string) bool {
	for _, h := range hopByHop {
		if k == h {
			return true
		}
	}
	return false
}

// relayHeader is the part of h a tunnel relays: the allowlisted headers
// (see Tunnel) not named by h's Connection header, each value at most
// maxHeaderValue bytes and redacted.
func (o *OpenAI) relayHeader(h http.Header) http.Header {
	hop := map[string]bool{}
	for _, v := range h.Values("Connection") {
		for _, name := range strings.Split(v, ",") {
			hop[http.CanonicalHeaderKey(strings.TrimSpace(name))] = true
		}
	}
	out := make(http.Header, len(relayedHeaders))
	for k, vs := range h {
		k = http.CanonicalHeaderKey(k)
		if hop[k] || !relayedHeader(k) {
			continue
		}
		for _, v := range vs {
			if len(v) <= maxHeaderValue {
				out[k] = append(out[k], o.p.redact(v))
			}
		}
	}
	return out
}

// relayedHeader reports whether the canonical header name k is allowlisted.
func relayedHeader(k string) bool {
	if relayedHeaders[k] {
		return true
	}
	for _, p := range relayedPrefixes {
		if strings.HasPrefix(k, p) && len(k) > len(p) {
			return true
		}
	}
	return false
}

// openAIError is the error object of an OpenAI error answer.
type openAIError struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

// thinkLevelRetry handles c, a 400 to a chat body: when it is Ollama's
// refusal of a reasoning effort as a think level (its OpenAI-compatible
// API maps reasoning_effort to one, which models other than gpt-oss
// refuse in Ollama v0.17.4: translate.IsThinkLevelRefusal), the model is
// remembered and body goes once more without the effort
// (translate.DropReasoningEffort), and that call is returned. Any other
// 400 is returned unread, to be relayed as it is. Later requests for the
// model go without the effort at once (refusesEffort). Tunnel calls it
// only for an effort an OpenAI client sent: a "think" in the Dispatch's
// Ollama fields is an Ollama client's own level, whose refusal goes back
// as Ollama gives it.
func (o *OpenAI) thinkLevelRetry(ctx context.Context, c *call, path string, body []byte, header http.Header, model string) (*call, error) {
	data, err := io.ReadAll(io.LimitReader(c.resp.Body, errorBodyLimit))
	if err != nil && c.parent.Err() != nil {
		c.close()
		return nil, c.failure(err, true)
	}
	c.resp.Body.Close()
	c.resp.Body = io.NopCloser(bytes.NewReader(data))
	var answer struct {
		Error struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	if json.Unmarshal(data, &answer) != nil || !translate.IsThinkLevelRefusal(answer.Error.Message) {
		return c, nil
	}
	retry, ok := translate.DropReasoningEffort(body)
	if !ok {
		return c, nil
	}
	c.close()
	o.mu.Lock()
	if o.noEffort == nil {
		o.noEffort = make(map[string]bool)
	}
	o.noEffort[model] = true
	o.mu.Unlock()
	return o.p.post(ctx, path, retry, header)
}

// refusesEffort reports whether model refused a reasoning effort before.
func (o *OpenAI) refusesEffort(model string) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.noEffort[model]
}

// relayError relays a 4xx or 5xx answer as one OpenAI error object (see
// Tunnel), built from at most errorBodyLimit bytes of its body, in one
// sink call.
func (o *OpenAI) relayError(c *call, sink TunnelSink) error {
	data, err := io.ReadAll(io.LimitReader(c.resp.Body, errorBodyLimit))
	if err != nil && c.parent.Err() != nil {
		return c.failure(err, true)
	}
	// A read that failed otherwise leaves a truncated body, which gets the
	// generic message: the status is still the provider's answer.
	// Marshal cannot fail on strings and string pointers.
	body, _ := json.Marshal(struct {
		Error openAIError `json:"error"`
	}{o.errorObject(c.resp.StatusCode, data)})
	h := o.relayHeader(c.resp.Header)
	h.Set("Content-Type", "application/json")
	// The whole answer in one message (TunnelHead.End).
	if err := sink.Head(TunnelHead{Status: c.resp.StatusCode, Header: h, Body: body, End: true, ContentLength: int64(len(body))}); err != nil {
		return sinkFailed(err)
	}
	return nil
}

// errorObject is the redacted OpenAI error object for an error answer with
// the given status and (possibly truncated) body.
func (o *OpenAI) errorObject(status int, data []byte) openAIError {
	e := openAIError{Type: "upstream_error"}
	var doc map[string]json.RawMessage
	if json.Unmarshal(data, &doc) != nil { // not JSON, or not an object
		doc = nil
	}
	var obj struct {
		Message *string         `json:"message"`
		Type    *string         `json:"type"`
		Param   json.RawMessage `json:"param"`
		Code    json.RawMessage `json:"code"`
	}
	if raw, ok := doc["error"]; ok && json.Unmarshal(raw, &obj) == nil && obj.Message != nil {
		// OpenAI-shaped: keep its four fields, drop the rest.
		e.Message = o.p.redact(*obj.Message)
		if obj.Type != nil && *obj.Type != "" {
			e.Type = o.p.redact(*obj.Type)
		}
		e.Param = o.scalarText(obj.Param)
		e.Code = o.scalarText(obj.Code)
	} else {
		// vLLM/SGLang {"object":"error","message"}, TGI {"error":"..."},
		// FastAPI {"detail":"..."}; anything else has no message to keep.
		for _, k := range []string{"message", "error", "detail"} {
			var s string
			if json.Unmarshal(doc[k], &s) == nil && strings.TrimSpace(s) != "" {
				// Redact before cutting, so no secret is cut in half.
				e.Message = truncate(o.p.redact(s), maxFallbackMessage)
				break
			}
		}
		if e.Message == "" && doc == nil {
			// Not JSON: a proxy's page or plain text keeps its own text.
			e.Message = truncate(o.p.redact(bodyText(data)), maxFallbackMessage)
		}
		e.Code = o.scalarText(doc["code"])
		if e.Code == nil {
			code := strconv.Itoa(status)
			e.Code = &code
		}
	}
	if e.Message == "" {
		e.Message = fmt.Sprintf("upstream returned HTTP %d", status)
	}
	return e
}

// scalarText is raw as redacted text if it is a JSON string or number, else
// nil (null, absent, or a value an OpenAI client does not expect).
func (o *OpenAI) scalarText(raw json.RawMessage) *string {
	if isNull(raw) {
		return nil
	}
	var s string
	if json.Unmarshal(raw, &s) != nil {
		var n json.Number
		if json.Unmarshal(raw, &n) != nil {
			return nil
		}
		s = n.String()
	}
	s = o.p.redact(s)
	return &s
}

// truncate cuts s to at most n bytes on a rune boundary, marking the cut.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n - len("…")
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}
