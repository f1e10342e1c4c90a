package bodycoding

import (
	"bytes"
	"compress/flate"
	"compress/gzip"
	"compress/zlib"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		values      []string
		codings     []string
		unsupported string
	}{
		{nil, nil, ""},
		{[]string{"identity"}, nil, ""},
		{[]string{"GZIP, identity", " deflate"}, []string{"gzip", "deflate"}, ""},
		{[]string{"x-gzip,,"}, []string{"x-gzip"}, ""},
		{[]string{"gzip", "BR"}, nil, "br"},
	} {
		h := http.Header{"Content-Encoding": tc.values}
		codings, unsupported := Parse(h)
		if !slices.Equal(codings, tc.codings) || unsupported != tc.unsupported {
			t.Errorf("%q: %q %q, want %q %q", tc.values, codings, unsupported, tc.codings, tc.unsupported)
		}
	}
}

// TestNewReaderUndoesEachCoding: gzip, zlib-wrapped and raw deflate, and
// two codings applied in turn, read back as the body that was encoded.
func TestNewReaderUndoesEachCoding(t *testing.T) {
	t.Parallel()
	body := strings.Repeat(`{"model":"m"}`, 1000)
	gz := func(p []byte) []byte {
		var b bytes.Buffer
		w := gzip.NewWriter(&b)
		_, _ = w.Write(p)
		_ = w.Close()
		return b.Bytes()
	}
	zl := func(p []byte) []byte {
		var b bytes.Buffer
		w := zlib.NewWriter(&b)
		_, _ = w.Write(p)
		_ = w.Close()
		return b.Bytes()
	}
	raw := func(p []byte) []byte {
		var b bytes.Buffer
		w, _ := flate.NewWriter(&b, flate.DefaultCompression)
		_, _ = w.Write(p)
		_ = w.Close()
		return b.Bytes()
	}
	for name, tc := range map[string]struct {
		data    []byte
		codings []string
	}{
		"gzip":         {gz([]byte(body)), []string{"gzip"}},
		"deflate zlib": {zl([]byte(body)), []string{"deflate"}},
		"deflate raw":  {raw([]byte(body)), []string{"deflate"}},
		"deflate gzip": {gz(zl([]byte(body))), []string{"deflate", "gzip"}},
	} {
		got, err := io.ReadAll(NewReader(bytes.NewReader(tc.data), tc.codings))
		if err != nil || string(got) != body {
			t.Errorf("%s: %d bytes, %v; want the body", name, len(got), err)
		}
	}
}

// TestNewReaderTellsCorruptFromTransport: a corrupt stream fails with
// ErrCorrupt; the connection's limit fails with *http.MaxBytesError, not
// ErrCorrupt; nothing is read before the first Read.
func TestNewReaderTellsCorruptFromTransport(t *testing.T) {
	t.Parallel()
	if _, err := io.ReadAll(NewReader(strings.NewReader("not gzip at all"), []string{"gzip"})); !errors.Is(err, ErrCorrupt) {
		t.Errorf("corrupt gzip: %v, want ErrCorrupt", err)
	}
	var b bytes.Buffer
	w := gzip.NewWriter(&b)
	_, _ = w.Write(bytes.Repeat([]byte("x"), 1<<16))
	_ = w.Close()
	limited := http.MaxBytesReader(httptest.NewRecorder(), io.NopCloser(bytes.NewReader(b.Bytes())), 20)
	_, err := io.ReadAll(NewReader(limited, []string{"gzip"}))
	if _, ok := errors.AsType[*http.MaxBytesError](err); !ok || errors.Is(err, ErrCorrupt) {
		t.Errorf("over the limit: %v, want *http.MaxBytesError and not ErrCorrupt", err)
	}
	src := &countingReader{r: bytes.NewReader(b.Bytes())}
	r := NewReader(src, []string{"gzip"})
	if src.n != 0 {
		t.Fatalf("NewReader read %d bytes before the first Read", src.n)
	}
	if _, err := io.ReadAll(r); err != nil || src.n == 0 {
		t.Fatalf("read %d bytes, %v", src.n, err)
	}
}

type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}
