package api

import (
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"iop/internal/edge/contract"
	"iop/internal/wire/nodev1"
)

// wholeAnswer is a tunnel answer in one message, as a node sends a body it
// had whole (node.proto TunnelHead.data and end).
func wholeAnswer(status int32, headers map[string]string, body string) *nodev1.RunUp {
	m := tunnelHead(status, headers)
	m.GetTunnelHead().Data, m.GetTunnelHead().End = []byte(body), true
	return m
}

// declaredHead is a tunnel head that declares the whole body's length
// (node.proto TunnelHead.content_length) and carries its first bytes.
func declaredHead(length int64, first string) *nodev1.RunUp {
	m := tunnelHead(200, map[string]string{"Content-Type": "application/json"})
	m.GetTunnelHead().ContentLength, m.GetTunnelHead().Data = length, []byte(first)
	return m
}

// postRaw posts a chat request and returns the response with its body
// read, and the error reading it ended with (nil for a complete body).
func postRaw(t *testing.T, env *testEnv, path, body string) (*http.Response, string, error) {
	t.Helper()
	resp, err := env.srv.Client().Post(env.srv.URL+path, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp, string(b), err
}

// A non-streamed tunnel answer reaches the client with a Content-Length
// (RFC 9110 section 8.6) whenever the edge knows the body's length before
// it writes it: the whole body came in one message, or the head declared
// it; else it is chunked. The bytes are the provider's, unchanged.
func TestTunnelAnswerContentLength(t *testing.T) {
	half := len(tunnelJSON) / 2
	for _, c := range []struct {
		name       string
		msgs       []*nodev1.RunUp
		wantLength bool
	}{
		{"one message", []*nodev1.RunUp{wholeAnswer(200, map[string]string{"Content-Type": "application/json"}, tunnelJSON)}, true},
		{"declared length", []*nodev1.RunUp{declaredHead(int64(len(tunnelJSON)), tunnelJSON[:half]), tunnelData(tunnelJSON[half:]), tunnelEnd()}, true},
		{"old node: head, data, end", []*nodev1.RunUp{tunnelHead(200, map[string]string{"Content-Type": "application/json", "Content-Length": "9999"}),
			tunnelData(tunnelJSON[:half]), tunnelData(tunnelJSON[half:]), tunnelEnd()}, false},
		{"error answer in one message", []*nodev1.RunUp{wholeAnswer(429, map[string]string{"Content-Type": "application/json"}, `{"error":{"message":"slow down","type":"rate_limit","param":null,"code":"429"}}`)}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			env := newEnv(t, Config{}, runWith(scriptedRun(tunnel, c.msgs...)))
			resp, body, err := postRaw(t, env, "/v1/chat/completions", simpleChat)
			if err != nil {
				t.Fatalf("reading the body: %v", err)
			}
			want := tunnelJSON
			if resp.StatusCode != 200 {
				want = `{"error":{"message":"slow down","type":"rate_limit","param":null,"code":"429"}}`
			}
			if body != want {
				t.Errorf("body %q, want the provider's %q", body, want)
			}
			chunked := len(resp.TransferEncoding) > 0 && resp.TransferEncoding[0] == "chunked"
			if c.wantLength && (resp.ContentLength != int64(len(want)) || chunked) {
				t.Errorf("Content-Length %d (transfer encoding %v), want %d", resp.ContentLength, resp.TransferEncoding, len(want))
			}
			if !c.wantLength && (resp.ContentLength != -1 || !chunked) {
				t.Errorf("Content-Length %d (transfer encoding %v), want a chunked body: the edge cannot know its length", resp.ContentLength, resp.TransferEncoding)
			}
			env.waitHandlers()
			wantOutcome := contract.OutcomeCompleted
			if resp.StatusCode != 200 {
				wantOutcome = contract.OutcomeUpstreamError
			}
			if _, outcomes := env.gw.allRuns()[0].closeCalls(); len(outcomes) != 1 || outcomes[0] != wantOutcome {
				t.Errorf("run closed with %v, want %v", outcomes, wantOutcome)
			}
		})
	}
}

// A body that ends short of the length its head declared, or runs past
// it, or whose run fails after its head, must not reach the client as a
// complete answer: the client's read fails (the connection is cut), and
// the request counts as an upstream error.
func TestTunnelAnswerNotMatchingItsLengthIsCut(t *testing.T) {
	half := len(tunnelJSON) / 2
	for _, c := range []struct {
		name string
		msgs []*nodev1.RunUp
	}{
		{"shorter", []*nodev1.RunUp{declaredHead(int64(len(tunnelJSON))+10, tunnelJSON[:half]), tunnelData(tunnelJSON[half:]), tunnelEnd()}},
		{"longer", []*nodev1.RunUp{declaredHead(int64(half), tunnelJSON[:half]), tunnelData(tunnelJSON[half:]), tunnelEnd()}},
		{"failed after the head", []*nodev1.RunUp{declaredHead(int64(len(tunnelJSON)), tunnelJSON[:half]), tunnelError(502, "provider stream broken: connection closed")}},
	} {
		t.Run(c.name, func(t *testing.T) {
			env := newEnv(t, Config{}, runWith(scriptedRun(tunnel, c.msgs...)))
			resp, body, err := postRaw(t, env, "/v1/chat/completions", simpleChat)
			if err == nil {
				t.Fatalf("got a complete %d answer of %d bytes (Content-Length %d): %q; want the read to fail", resp.StatusCode, len(body), resp.ContentLength, body)
			}
			env.waitHandlers()
			if _, outcomes := env.gw.allRuns()[0].closeCalls(); len(outcomes) != 1 || outcomes[0] != contract.OutcomeUpstreamError {
				t.Errorf("run closed with %v, want upstream_error", outcomes)
			}
		})
	}
}

// flushCounter is a ResponseWriter that keeps the body and counts the
// flushes: with net/http, each flush of a response is one write to the
// client's connection.
type flushCounter struct {
	header  http.Header
	status  int
	body    strings.Builder
	flushes int
}

func (w *flushCounter) Header() http.Header         { return w.header }
func (w *flushCounter) WriteHeader(status int)      { w.status = status }
func (w *flushCounter) Write(p []byte) (int, error) { return w.body.Write(p) }
func (w *flushCounter) Flush()                      { w.flushes++ }

// One message: the run's head, body and end reach the client with one
// flush (one write to its connection) and a Content-Length, and the run's
// end is read before it (the answer is finished, its key's slot given
// back, before the client can see its end). A stream's head goes with the
// first event that came with it, in one flush too.
func TestTunnelWholeAnswerWrittenOnce(t *testing.T) {
	for _, c := range []struct {
		name        string
		msg         *nodev1.RunUp
		wantLength  string
		wantFlushes int
	}{
		{"json", wholeAnswer(200, map[string]string{"Content-Type": "application/json"}, tunnelJSON), strconv.Itoa(len(tunnelJSON)), 1},
		{"stream head with its first event", func() *nodev1.RunUp {
			m := tunnelHead(200, map[string]string{"Content-Type": "text/event-stream"})
			m.GetTunnelHead().Data = []byte(sseChunk)
			return m
		}(), "", 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := &flushCounter{header: http.Header{}}
			msgs := []*contract.Message{decoded(c.msg)}
			if !c.msg.GetTunnelHead().GetEnd() {
				msgs = append(msgs, decoded(tunnelEnd())) // nothing left to write: no flush
			}
			rr, _ := benchResponse(&listRun{msgs: msgs})
			rr.w = w
			reason := rr.tunnel()
			if reason != ReasonCompleted || !rr.done {
				t.Fatalf("tunnel ended %q, done %v; want completed, the answer finished before it was written", reason, rr.done)
			}
			if w.status != 200 || !strings.HasPrefix(w.body.String(), string(c.msg.GetTunnelHead().GetData()[:20])) {
				t.Errorf("wrote %d %q", w.status, w.body.String())
			}
			if w.flushes != c.wantFlushes {
				t.Errorf("%d flushes, want %d", w.flushes, c.wantFlushes)
			}
			if got := w.header.Get("Content-Length"); got != c.wantLength {
				t.Errorf("Content-Length %q, want %q", got, c.wantLength)
			}
		})
	}
}
