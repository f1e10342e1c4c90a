package adapter

import (
	"compress/gzip"
	"compress/zlib"
	"io"
	"net/http"
	"strings"
)

// decodeBody makes resp's body read decoded when the provider compressed
// it although the request asked for identity (Accept-Encoding: identity;
// RFC 9110 section 12.5.3 still lets a server send a coding): gzip
// (x-gzip) and deflate (zlib) are undone as the body is read, and
// Content-Encoding and Content-Length, which described the encoded body,
// are removed, so that usage, the relayed stream and the ledger read the
// text. It returns the coding it cannot decode ("br", "zstd", ...), or "".
func decodeBody(resp *http.Response) (unsupported string) {
	coding := strings.ToLower(strings.TrimSpace(resp.Header.Get("Content-Encoding")))
	switch coding {
	case "", "identity":
		return ""
	case "gzip", "x-gzip", "deflate":
	default:
		return coding
	}
	resp.Body = &decodedBody{raw: resp.Body, coding: coding}
	resp.Header.Del("Content-Encoding")
	resp.Header.Del("Content-Length")
	resp.ContentLength = -1
	resp.Uncompressed = true
	return ""
}

// decodedBody undoes one coding of a provider's answer, starting at the
// first Read (a decoder reads its header at once, and a stream's first
// bytes may be long in coming).
type decodedBody struct {
	raw    io.ReadCloser
	coding string
	r      io.Reader
	err    error
}

func (d *decodedBody) Read(p []byte) (int, error) {
	if d.r == nil && d.err == nil {
		switch d.coding {
		case "deflate":
			var zr io.ReadCloser
			if zr, d.err = zlib.NewReader(d.raw); d.err == nil {
				d.r = zr
			}
		default:
			var zr *gzip.Reader
			if zr, d.err = gzip.NewReader(d.raw); d.err == nil {
				d.r = zr
			}
		}
		if d.err == io.EOF {
			d.err = io.ErrUnexpectedEOF
		}
	}
	if d.err != nil {
		return 0, d.err
	}
	return d.r.Read(p)
}

func (d *decodedBody) Close() error { return d.raw.Close() }
