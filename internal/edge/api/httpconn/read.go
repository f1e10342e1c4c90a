package httpconn

import (
	"errors"
	"io"
	"mime"
	"net/http"
	"os"
	"strings"
	"sync"

	"iop/internal/edge/api/bodycoding"
	"iop/internal/edge/api/request"
)

// The outcomes of reading a request body, for the frame's Classify.
var (
	ErrBodyTooLarge     = errors.New("request body too large")                  // 413
	ErrBodyTimeout      = errors.New("the request body did not arrive in time") // 408
	ErrUnsupportedMedia = errors.New("unsupported content type")                // 415
)

// ReadBody reads a request body whole (a Body caps it at its limit, and
// decodes its Content-Encoding).
// Errors: ErrBodyTooLarge, ErrBodyTimeout, an *EncodingError, or a
// *request.FieldError (also for a body not valid in its coding).
func ReadBody(r *http.Request) ([]byte, error) {
	body, err := readAll(r.Body)
	if err != nil {
		if encErr, ok := errors.AsType[*EncodingError](err); ok {
			return nil, encErr
		}
		if errors.Is(err, bodycoding.ErrCorrupt) {
			return nil, &request.FieldError{Message: bodycoding.ErrCorrupt.Error()}
		}
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			return nil, ErrBodyTooLarge
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return nil, ErrBodyTimeout // the edge API's Config.BodyReadTimeout
		}
		// Usually a client that went away mid-upload; then nothing is written.
		return nil, &request.FieldError{Message: "reading the request body failed"}
	}
	return body, nil
}

// ReadJSONBody is ReadBody for a JSON body: ErrUnsupportedMedia (415) for
// a Content-Type that is not JSON (none is JSON), before anything is read.
func ReadJSONBody(r *http.Request) ([]byte, error) {
	if !IsJSONContentType(r.Header.Get("Content-Type")) {
		return nil, ErrUnsupportedMedia
	}
	return ReadBody(r)
}

// BodyError is err, an error reading a request's body, as ReadBody
// reports it: ErrBodyTooLarge (413), ErrBodyTimeout (408), an
// *EncodingError (415), else a *request.FieldError (400).
func BodyError(err error) error {
	if err == nil {
		return nil
	}
	_, err = ReadBody(&http.Request{Body: errBody{err}})
	return err
}

// errBody is a request body whose Read fails with err.
type errBody struct{ err error }

func (e errBody) Read([]byte) (int, error) { return 0, e.err }
func (e errBody) Close() error             { return nil }

// IsJSONContentType reports whether a request's Content-Type allows a JSON
// body: absent, application/json, or any type with a "+json" suffix.
func IsJSONContentType(header string) bool {
	if header == "" {
		return true
	}
	mediaType, _, err := mime.ParseMediaType(header)
	if err != nil {
		return false
	}
	return mediaType == "application/json" || strings.HasSuffix(mediaType, "+json")
}

// readChunk is the size of the pooled pieces readAll reads into.
const readChunk = 16 << 10

var readChunks = sync.Pool{New: func() any { return new([readChunk]byte) }}

// readAll is io.ReadAll whose result is allocated once, at the body's
// exact length: the bytes are read into pooled pieces of readChunk bytes
// first, then copied into it. io.ReadAll grows its buffer by doubling, so
// it allocates about twice a large body's size (a 100 KB agent request:
// 205 KB) and the garbage collector's target with it. Memory held still
// grows only with the bytes received, never with what a Content-Length
// announces. On an error it returns nil and the error.
func readAll(r io.Reader) ([]byte, error) {
	var (
		held   [8]*[readChunk]byte
		chunks = held[:0]
		last   int // bytes in the last piece
	)
	defer func() {
		for _, c := range chunks {
			readChunks.Put(c)
		}
	}()
	for err := error(nil); err != io.EOF; {
		c := readChunks.Get().(*[readChunk]byte)
		chunks = append(chunks, c)
		for last = 0; last < readChunk && err == nil; {
			var n int
			n, err = r.Read(c[last:])
			last += n
		}
		if err != nil && err != io.EOF {
			return nil, err
		}
	}
	body := make([]byte, 0, (len(chunks)-1)*readChunk+last)
	for _, c := range chunks[:len(chunks)-1] {
		body = append(body, c[:]...)
	}
	return append(body, chunks[len(chunks)-1][:last]...), nil
}
