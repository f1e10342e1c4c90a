package sse

import (
	"encoding/json"
	"io"
)

// done is the data of the event that ends an OpenAI stream.
var done = []byte("[DONE]")

// AppendEvent appends one event to dst and returns the extended slice: an
// "event: <name>" line when name is not "", one "data: " line per line of
// data (data is split at CRLF, LF or CR, so a Reader gets it back whole with
// LF line ends), and the empty line that dispatches it. name must hold no
// line end; empty data is one empty data line.
func AppendEvent(dst []byte, name string, data []byte) []byte {
	if name != "" {
		dst = append(dst, "event: "...)
		dst = append(dst, name...)
		dst = append(dst, '\n')
	}
	for {
		n := lineEnd(data)
		if n < 0 {
			dst = append(dst, "data: "...)
			dst = append(dst, data...)
			dst = append(dst, '\n')
			break
		}
		dst = append(dst, "data: "...)
		dst = append(dst, data[:n]...)
		dst = append(dst, '\n')
		if data[n] == '\r' && n+1 < len(data) && data[n+1] == '\n' {
			n++
		}
		data = data[n+1:]
	}
	return append(dst, '\n')
}

// AppendDone appends the `data: [DONE]` event that ends an OpenAI stream.
func AppendDone(dst []byte) []byte { return AppendEvent(dst, "", done) }

// Writer writes a text/event-stream body to an io.Writer: each event,
// comment or field is one Write of whole lines. The zero value is not
// usable; make one with NewWriter. A Writer is used by one goroutine at a
// time and keeps one buffer, reused between writes (io.Writer must not
// retain what it is given).
type Writer struct {
	w   io.Writer
	buf []byte
}

// NewWriter returns a Writer writing to w.
func NewWriter(w io.Writer) *Writer { return &Writer{w: w} }

// Event writes one event (AppendEvent); it returns w's error.
func (w *Writer) Event(name string, data []byte) error {
	w.buf = AppendEvent(w.buf[:0], name, data)
	return w.flush()
}

// JSON writes v, encoded as JSON, as the data of one event named name (""
// for an unnamed one). It returns the encoding's error, without writing,
// or w's.
func (w *Writer) JSON(name string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return w.Event(name, b)
}

// Done writes the `data: [DONE]` event that ends an OpenAI stream.
func (w *Writer) Done() error { return w.Event("", done) }

// Comment writes a comment line (": text") and an empty line, which a
// reader ignores: a keep-alive. text must hold no line end.
func (w *Writer) Comment(text string) error {
	w.buf = append(append(append(w.buf[:0], ": "...), text...), "\n\n"...)
	return w.flush()
}

func (w *Writer) flush() error {
	_, err := w.w.Write(w.buf)
	return err
}
