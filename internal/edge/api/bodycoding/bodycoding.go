package bodycoding

import (
	"bufio"
	"compress/flate"
	"compress/gzip"
	"compress/zlib"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// ErrCorrupt is a body that is not valid in its declared Content-Encoding
// (a corrupt gzip stream).
var ErrCorrupt = errors.New("the request body is not valid in its Content-Encoding")

// Parse returns the content codings of a request's body, in the order
// they were applied (RFC 9110 section 8.4: the header lists them in that
// order, and they are undone in reverse), "identity" and empty members
// left out. Supported: gzip (also x-gzip) and deflate (the zlib format,
// RFC 9110 section 8.4.1.2; a raw DEFLATE stream, as some clients send, is
// taken too). Another coding is returned as unsupported (lower-cased,
// trimmed), with no codings.
func Parse(h http.Header) (codings []string, unsupported string) {
	for _, v := range h.Values("Content-Encoding") {
		for c := range strings.SplitSeq(v, ",") {
			c = strings.ToLower(strings.TrimSpace(c))
			switch c {
			case "", "identity":
			case "gzip", "x-gzip", "deflate":
				codings = append(codings, c)
			default:
				return nil, c
			}
		}
	}
	return codings, ""
}

// NewReader returns a reader of raw, the body as net/http gives it, with
// codings (Parse's) undone, lazily: nothing is read from raw before the
// first Read (so a client waiting for a 100 Continue is asked for the body
// only when a handler reads it). A corrupt stream fails Read with an error
// wrapping ErrCorrupt; raw's own errors (its limit, *http.MaxBytesError,
// as is; its deadline, a client gone) are not.
func NewReader(raw io.Reader, codings []string) io.Reader {
	return &decodedBody{raw: rawReader{raw}, codings: codings}
}

// decodedBody is NewReader's reader.
type decodedBody struct {
	raw     io.Reader
	codings []string
	r       io.Reader // nil until the first Read
	err     error
}

func (d *decodedBody) Read(p []byte) (int, error) {
	if d.r == nil && d.err == nil {
		d.r = d.raw
		for i := len(d.codings) - 1; i >= 0 && d.err == nil; i-- {
			d.r, d.err = decoder(d.codings[i], d.r)
		}
	}
	if d.err != nil {
		return 0, d.err
	}
	n, err := d.r.Read(p)
	if err != nil && err != io.EOF && !isTransportError(err) {
		d.err = fmt.Errorf("%w: %w", ErrCorrupt, err)
		return n, d.err
	}
	return n, err
}

// isTransportError reports whether err came from reading the connection
// (its limit, its deadline, a client gone) rather than from decoding.
func isTransportError(err error) bool {
	_, tooLarge := errors.AsType[*http.MaxBytesError](err)
	return tooLarge || errors.Is(err, errReadRaw)
}

// errReadRaw marks an error of the undecoded body's reader.
var errReadRaw = errors.New("reading the request body")

// rawReader marks the errors of the body as net/http gives it, so that
// decodedBody tells them from a decoder's.
type rawReader struct{ r io.Reader }

func (r rawReader) Read(p []byte) (int, error) {
	n, err := r.r.Read(p)
	if err != nil && err != io.EOF {
		if _, ok := errors.AsType[*http.MaxBytesError](err); !ok {
			err = fmt.Errorf("%w: %w", errReadRaw, err)
		}
	}
	return n, err
}

// decoder returns a reader undoing coding on r.
func decoder(coding string, r io.Reader) (io.Reader, error) {
	switch coding {
	case "gzip", "x-gzip":
		zr, err := gzip.NewReader(r)
		if err != nil {
			if isTransportError(err) {
				return nil, err
			}
			return nil, fmt.Errorf("%w: %w", ErrCorrupt, err)
		}
		return zr, nil
	default: // deflate
		br := bufio.NewReader(r)
		head, err := br.Peek(2)
		if err != nil && isTransportError(err) {
			return nil, err
		}
		if len(head) == 2 && head[0]&0x0f == 8 && (uint16(head[0])<<8|uint16(head[1]))%31 == 0 {
			zr, err := zlib.NewReader(br)
			if err != nil {
				if isTransportError(err) {
					return nil, err
				}
				return nil, fmt.Errorf("%w: %w", ErrCorrupt, err)
			}
			return zr, nil
		}
		return flate.NewReader(br), nil
	}
}
