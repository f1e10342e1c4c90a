package adapter

import (
	"bytes"
	"context"
	"mime"
	"net/http"
	"strings"

	"iop/internal/wire/nodev1"
)

// mediaPaths are the provider paths of the media operations: under the
// API root (base_url, e.g. http://host:8000/v1) for the OpenAI-shaped
// ones, under the server's root (base_url without a trailing /v1) for
// llama.cpp's own /infill and /completion, marked by rootPath.
var mediaPaths = map[nodev1.Operation]string{
	nodev1.Operation_OPERATION_RERANK:           "/rerank",
	nodev1.Operation_OPERATION_TRANSCRIPTION:    "/audio/transcriptions",
	nodev1.Operation_OPERATION_SPEECH:           "/audio/speech",
	nodev1.Operation_OPERATION_IMAGES:           "/images/generations",
	nodev1.Operation_OPERATION_INFILL:           "/infill",
	nodev1.Operation_OPERATION_LLAMA_COMPLETION: "/completion",
}

// rootPath reports whether op's path is under the server's root.
func rootPath(op nodev1.Operation) bool {
	return op == nodev1.Operation_OPERATION_INFILL || op == nodev1.Operation_OPERATION_LLAMA_COMPLETION
}

// media tunnels a media operation's request (mediaPaths) to the provider
// and relays its answer as Tunnel does, byte for byte. A JSON body has
// its top-level "model" rewritten to req.ServedModel as Tunnel's; a
// multipart body (transcription) goes as the edge streamed it
// (req.BodyReader, or Body), with the client's Content-Type (its
// boundary) from req.Headers: the edge already set its model field. An
// event stream (llama.cpp's /completion and /infill with "stream":true)
// needs no closing data: [DONE], which llama.cpp does not send.
func (o *OpenAI) media(ctx context.Context, req Request, sink TunnelSink) error {
	url := o.p.baseURL + mediaPaths[req.Op]
	if rootPath(req.Op) {
		url = strings.TrimSuffix(o.p.baseURL, "/v1") + mediaPaths[req.Op]
	}
	header := make(http.Header, len(req.Headers)+1)
	for k, v := range req.Headers {
		k = http.CanonicalHeaderKey(k)
		if !notForwarded[k] && !isHopByHop(k) {
			header.Set(k, v)
		}
	}
	var c *call
	var err error
	if req.Op == nodev1.Operation_OPERATION_TRANSCRIPTION {
		ct := headerValue(req.Headers, "Content-Type")
		if mt, _, perr := mime.ParseMediaType(ct); perr != nil || mt != "multipart/form-data" {
			return badRequest("a transcription's body must be multipart/form-data, got Content-Type %q", truncate(ct, 100))
		}
		header.Set("Content-Type", ct)
		if req.BodyReader != nil {
			c, err = o.p.postURL(ctx, url, req.BodyReader, nil, header)
		} else {
			c, err = o.p.postURL(ctx, url, bytes.NewReader(req.Body), nil, header)
		}
	} else {
		body, rerr := rewriteModel(req.Body, req.ServedModel)
		if rerr != nil {
			return badRequest("%v", rerr)
		}
		c, err = o.p.postURL(ctx, url, bytes.NewReader(body), nil, header)
	}
	if err != nil {
		return err
	}
	return o.relay(c, req.Stream, !rootPath(req.Op), sink)
}

// headerValue is the value of the header name in h, whatever the case of
// its key there.
func headerValue(h map[string]string, name string) string {
	for k, v := range h {
		if strings.EqualFold(k, name) {
			return v
		}
	}
	return ""
}
