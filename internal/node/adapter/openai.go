package adapter

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"

	"iop/internal/wire/nodev1"
)

// tunnelChunk is the size of the buffer a tunnel reads the provider's body
// into; each Read's bytes are relayed at once, however few.
const tunnelChunk = 32 << 10

var chunkPool = sync.Pool{New: func() any { b := make([]byte, tunnelChunk); return &b }}

// hopByHop are the headers that describe one HTTP connection, not the
// message (RFC 9110 section 7.6.1), plus Content-Length, which the edge
// recomputes; none of them is relayed either way.
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
// req.ServedModel, to {base_url}/chat/completions, /completions or
// /embeddings (by req.Op), with Content-Type application/json, the
// provider's API key as a bearer token, and the forwardable req.Headers.
// It relays the answer's status and headers (any status: an error answer
// is the provider's to tell) and then each chunk of the body as Read
// returned it. Failures are reported as the package doc describes.
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
		return badRequest("operation %v is not supported", req.Op)
	}
	body, err := rewriteModel(req.Body, req.ServedModel)
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
	c, err := o.p.post(ctx, path, body, header)
	if err != nil {
		return err
	}
	defer c.close()
	if err := sink.Head(c.resp.StatusCode, relayHeader(c.resp.Header)); err != nil {
		return sinkFailed(err)
	}
	bufp := chunkPool.Get().(*[]byte)
	defer chunkPool.Put(bufp)
	buf := *bufp
	for {
		n, rerr := c.resp.Body.Read(buf)
		if n > 0 {
			if err := sink.Data(buf[:n]); err != nil {
				return sinkFailed(err)
			}
		}
		switch {
		case rerr == nil:
		case errors.Is(rerr, io.EOF):
			return nil
		default:
			return c.failure(rerr, true)
		}
	}
}

func isHopByHop(k string) bool {
	for _, h := range hopByHop {
		if k == h {
			return true
		}
	}
	return false
}

// relayHeader is h without hop-by-hop headers, those h's Connection header
// names, and Content-Length.
func relayHeader(h http.Header) http.Header {
	out := h.Clone()
	for _, v := range h.Values("Connection") {
		for _, name := range strings.Split(v, ",") {
			out.Del(strings.TrimSpace(name))
		}
	}
	for _, k := range hopByHop {
		out.Del(k)
	}
	return out
}
