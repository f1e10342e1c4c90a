package adapter

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"reflect"
	"sync"
	"testing"

	"iop/internal/wire/nodev1"
)

// eventRec is an EventSink that records events; onSend, when set, sees each
// batch after it was recorded and may fail it.
type eventRec struct {
	mu     sync.Mutex
	events []*nodev1.RunEvent
	onSend func(events []*nodev1.RunEvent) error
}

func (r *eventRec) Send(events ...*nodev1.RunEvent) error {
	r.mu.Lock()
	r.events = append(r.events, events...)
	r.mu.Unlock()
	if r.onSend != nil {
		return r.onSend(events)
	}
	return nil
}

func (r *eventRec) types() []nodev1.RunEvent_Type {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []nodev1.RunEvent_Type
	for _, e := range r.events {
		out = append(out, e.Type)
	}
	return out
}

func (r *eventRec) text() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := ""
	for _, e := range r.events {
		s += e.Text
	}
	return s
}

func (r *eventRec) last(typ nodev1.RunEvent_Type) *nodev1.RunEvent {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := len(r.events) - 1; i >= 0; i-- {
		if r.events[i].Type == typ {
			return r.events[i]
		}
	}
	return nil
}

// tunnelRec is a TunnelSink that records the head and every chunk
// (copied; the body bytes a head carried are the first chunk), and
// whether the head carried the whole body (end) and the length it said.
type tunnelRec struct {
	status int
	header http.Header
	chunks [][]byte
	onData func(p []byte) error
	heads  int
	end    bool
	length int64
}

func (r *tunnelRec) Head(h TunnelHead) error {
	r.heads++
	r.status, r.header, r.end, r.length = h.Status, h.Header, h.End, h.ContentLength
	if len(h.Body) > 0 {
		r.chunks = append(r.chunks, append([]byte(nil), h.Body...))
		if r.onData != nil {
			return r.onData(h.Body)
		}
	}
	return nil
}

func (r *tunnelRec) Data(p []byte) error {
	r.chunks = append(r.chunks, append([]byte(nil), p...))
	if r.onData != nil {
		return r.onData(p)
	}
	return nil
}

func (r *tunnelRec) body() string {
	s := ""
	for _, c := range r.chunks {
		s += string(c)
	}
	return s
}

// upstream is an httptest server that records the last request it got.
type upstream struct {
	*httptest.Server
	mu     sync.Mutex
	path   string
	header http.Header
	body   []byte
}

func newUpstream(t *testing.T, h func(w http.ResponseWriter, r *http.Request)) *upstream {
	t.Helper()
	u := &upstream{}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		u.mu.Lock()
		u.path, u.header, u.body = r.URL.Path, r.Header.Clone(), body
		u.mu.Unlock()
		h(w, r)
	}))
	t.Cleanup(u.Close)
	return u
}

func (u *upstream) request() (string, http.Header, []byte) {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.path, u.header, u.body
}

// refusedURL is the URL of a port nothing listens on.
func refusedURL(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return "http://" + addr
}

// flushLines writes each line followed by a newline and flushes it.
func flushLines(w http.ResponseWriter, lines ...string) {
	for _, l := range lines {
		io.WriteString(w, l+"\n")
		w.(http.Flusher).Flush()
	}
}

// jsonEqual reports whether two JSON texts hold the same value.
func jsonEqual(t *testing.T, got []byte, want string) {
	t.Helper()
	var g, w any
	if err := json.Unmarshal(got, &g); err != nil {
		t.Fatalf("got invalid JSON %q: %v", got, err)
	}
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		t.Fatalf("want invalid JSON %q: %v", want, err)
	}
	if !reflect.DeepEqual(g, w) {
		t.Errorf("JSON mismatch\n got: %s\nwant: %s", got, want)
	}
}

// asError returns err as an *Error or fails the test.
func asError(t *testing.T, err error) *Error {
	t.Helper()
	e, ok := err.(*Error)
	if !ok {
		t.Fatalf("error %v (%T): want *Error", err, err)
	}
	return e
}
