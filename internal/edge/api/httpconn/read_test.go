package httpconn

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"runtime"
	"testing"
	"testing/iotest"
)

// readAll reads what io.ReadAll reads, however the reader cuts it, and
// fails where io.ReadAll fails (a truncated body's io.ErrUnexpectedEOF
// from net/http is an error, not an end).
func TestReadAllIsIOReadAll(t *testing.T) {
	t.Parallel()
	readers := map[string]func([]byte) io.Reader{
		"whole":       func(b []byte) io.Reader { return bytes.NewReader(b) },
		"one byte":    func(b []byte) io.Reader { return iotest.OneByteReader(bytes.NewReader(b)) },
		"half":        func(b []byte) io.Reader { return iotest.HalfReader(bytes.NewReader(b)) },
		"data is EOF": func(b []byte) io.Reader { return iotest.DataErrReader(bytes.NewReader(b)) },
	}
	for _, size := range []int{0, 1, 240, readChunk - 1, readChunk, readChunk + 1, 100 << 10, 8 * readChunk, 9*readChunk + 7} {
		body := make([]byte, size)
		for i := range body {
			body[i] = byte(i * 7)
		}
		for name, reader := range readers {
			got, err := readAll(reader(body))
			if err != nil || !bytes.Equal(got, body) || got == nil {
				t.Fatalf("%s, %d bytes: read %d bytes (nil: %v), err %v", name, size, len(got), got == nil, err)
			}
			if cap(got) != len(got) {
				t.Errorf("%s, %d bytes: capacity %d, want the body's length", name, size, cap(got))
			}
		}
		for _, fail := range []error{io.ErrUnexpectedEOF, errors.New("connection reset")} {
			r := io.MultiReader(bytes.NewReader(body), iotest.ErrReader(fail))
			if got, err := readAll(r); !errors.Is(err, fail) || got != nil {
				t.Fatalf("%d bytes then %v: read %d bytes, err %v", size, fail, len(got), err)
			}
		}
	}
}

// TestRegression_AgentBodyReadInOneAllocation: a 100 KB request body is
// read into one allocation of its own size; io.ReadAll allocated 205 KB
// for it (78 % of an in-process edge's allocation under 100 KB requests).
// The bound leaves room for the pieces the race detector's sync.Pool
// drops on purpose.
func TestRegression_AgentBodyReadInOneAllocation(t *testing.T) {
	body := bytes.Repeat([]byte("x"), 100<<10)
	r := bytes.NewReader(body)
	readAll(r) // the pool's first pieces
	const runs = 50
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range runs {
		r.Reset(body)
		if got, err := readAll(r); err != nil || len(got) != len(body) {
			t.Fatalf("read %d bytes, err %v", len(got), err)
		}
	}
	runtime.ReadMemStats(&after)
	if per := (after.TotalAlloc - before.TotalAlloc) / runs; per > uint64(len(body))*3/2 {
		t.Errorf("reading a %d-byte body allocates %d bytes; want at most 1.5 times its size", len(body), per)
	}
}

func BenchmarkReadBody(b *testing.B) {
	for _, size := range []int{240, 100 << 10} {
		body := bytes.Repeat([]byte("x"), size)
		b.Run(fmt.Sprintf("%dB", size), func(b *testing.B) {
			for _, read := range []struct {
				name string
				f    func(io.Reader) ([]byte, error)
			}{{"io.ReadAll", io.ReadAll}, {"readAll", readAll}} {
				b.Run(read.name, func(b *testing.B) {
					b.ReportAllocs()
					b.SetBytes(int64(size))
					r := bytes.NewReader(body)
					for b.Loop() {
						r.Reset(body)
						read.f(iotest.HalfReader(r))
					}
				})
			}
		})
	}
}
