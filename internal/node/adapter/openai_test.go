package adapter

import (
	"context"
	"errors"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"iop/internal/wire/nodev1"
)

func newOpenAI(t *testing.T, cfg Config) *OpenAI {
	t.Helper()
	o, err := NewOpenAI(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(o.Close)
	return o
}

func TestOpenAITunnelRequest(t *testing.T) {
	// Odd spacing, escapes, a nested "model", a huge number: only the
	// top-level model value may change.
	const body = "{ \"messages\" : [{\"role\":\"user\",\"content\":\"caf\\u00e9 \\\"model\\\"\",\"model\":\"inner\"}],\n" +
		"  \"model\" :\t\"alias\" , \"n\": 1e400, \"extra\": {\"model\": 1} }"
	const want = "{ \"messages\" : [{\"role\":\"user\",\"content\":\"caf\\u00e9 \\\"model\\\"\",\"model\":\"inner\"}],\n" +
		"  \"model\" :\t\"Qwen/Qwen2.5-7B\" , \"n\": 1e400, \"extra\": {\"model\": 1} }"
	for _, tc := range []struct {
		op   nodev1.Operation
		path string
	}{
		{nodev1.Operation_OPERATION_CHAT, "/v1/chat/completions"},
		{nodev1.Operation_OPERATION_COMPLETION, "/v1/completions"},
		{nodev1.Operation_OPERATION_EMBEDDINGS, "/v1/embeddings"},
	} {
		t.Run(tc.path, func(t *testing.T) {
			up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, `{}`) })
			o := newOpenAI(t, Config{BaseURL: up.URL + "/v1/", APIKey: "sk-provider"})
			req := Request{Op: tc.op, ServedModel: "Qwen/Qwen2.5-7B", Body: []byte(body), Headers: map[string]string{
				"accept":          "text/event-stream",
				"Authorization":   "Bearer client-key-for-the-edge",
				"Connection":      "close",
				"Accept-Encoding": "gzip",
				"OpenAI-Beta":     "assistants=v2",
			}}
			if err := o.Tunnel(context.Background(), req, &tunnelRec{}); err != nil {
				t.Fatal(err)
			}
			path, header, sent := up.request()
			if path != tc.path {
				t.Errorf("path %q, want %q", path, tc.path)
			}
			if string(sent) != want {
				t.Errorf("body\n got %q\nwant %q", sent, want)
			}
			for k, v := range map[string]string{
				"Authorization":   "Bearer sk-provider",
				"Content-Type":    "application/json",
				"Accept":          "text/event-stream",
				"Openai-Beta":     "assistants=v2",
				"Accept-Encoding": "identity",
			} {
				if got := header.Get(k); got != v {
					t.Errorf("header %s = %q, want %q", k, got, v)
				}
			}
		})
	}
}

func TestOpenAITunnelWithoutKeySendsNoAuthorization(t *testing.T) {
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {})
	o := newOpenAI(t, Config{BaseURL: up.URL})
	req := Request{Op: nodev1.Operation_OPERATION_CHAT, ServedModel: "m", Body: []byte(`{}`),
		Headers: map[string]string{"Authorization": "Bearer client"}}
	if err := o.Tunnel(context.Background(), req, &tunnelRec{}); err != nil {
		t.Fatal(err)
	}
	_, header, sent := up.request()
	if header.Get("Authorization") != "" {
		t.Errorf("Authorization %q sent", header.Get("Authorization"))
	}
	if string(sent) != `{"model":"m"}` {
		t.Errorf("body %q", sent)
	}
}

// TestOpenAITunnelStreamsChunkByChunk: the server sends its second SSE
// chunk only after the sink has seen the first, so a tunnel that waited for
// more data (a full buffer, the end) would never finish.
func TestOpenAITunnelStreamsChunkByChunk(t *testing.T) {
	const (
		chunk1 = "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hel\"}}]}\n\n"
		chunk2 = "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"lo\"},\"finish_reason\":\"stop\"}]}\n\n"
		done   = "data: [DONE]\n\n"
	)
	seen1 := make(chan struct{})
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("X-Request-Id", "req-1")
		w.Header().Set("Keep-Alive", "timeout=5")
		io.WriteString(w, chunk1)
		w.(http.Flusher).Flush()
		select {
		case <-seen1:
		case <-r.Context().Done():
			return
		}
		io.WriteString(w, chunk2)
		io.WriteString(w, done)
	})
	o := newOpenAI(t, Config{BaseURL: up.URL})
	got := ""
	rec := &tunnelRec{}
	rec.onData = func(p []byte) error {
		got += string(p)
		if got == chunk1 {
			close(seen1)
		}
		return nil
	}
	req := Request{Op: nodev1.Operation_OPERATION_CHAT, Stream: true, ServedModel: "m", Body: []byte(`{"model":"x","stream":true}`)}
	if err := o.Tunnel(context.Background(), req, rec); err != nil {
		t.Fatal(err)
	}
	if rec.body() != chunk1+chunk2+done {
		t.Errorf("body %q", rec.body())
	}
	if rec.status != 200 || rec.header.Get("Content-Type") != "text/event-stream" || rec.header.Get("X-Request-Id") != "req-1" {
		t.Errorf("head %d %v", rec.status, rec.header)
	}
	for _, h := range []string{"Keep-Alive", "Transfer-Encoding", "Content-Length", "Connection"} {
		if _, ok := rec.header[h]; ok {
			t.Errorf("hop-by-hop header %s relayed", h)
		}
	}
}

func TestOpenAITunnelRelaysErrorAnswers(t *testing.T) {
	const errBody = `{"error":{"message":"The model does not exist.","type":"invalid_request_error","param":null,"code":"model_not_found"}}`
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", strconv.Itoa(len(errBody)))
		w.Header().Set("Connection", "X-Private")
		w.Header().Set("X-Private", "1")
		w.WriteHeader(404)
		io.WriteString(w, errBody)
	})
	o := newOpenAI(t, Config{BaseURL: up.URL})
	rec := &tunnelRec{}
	if err := o.Tunnel(context.Background(), Request{Op: nodev1.Operation_OPERATION_CHAT, ServedModel: "m", Body: []byte(`{}`)}, rec); err != nil {
		t.Fatal(err)
	}
	if rec.status != 404 || rec.body() != errBody {
		t.Errorf("got %d %q", rec.status, rec.body())
	}
	if rec.header.Get("Content-Length") != "" || rec.header.Get("X-Private") != "" {
		t.Errorf("relayed %v", rec.header)
	}
}

func TestOpenAITunnelFailures(t *testing.T) {
	for _, tc := range []struct {
		name    string
		handler func(w http.ResponseWriter, r *http.Request)
		timeout time.Duration
		kind    error
		status  int
		head    bool
	}{
		{
			name:    "timeout before head",
			handler: func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() },
			timeout: 20 * time.Millisecond,
			kind:    ErrProviderTimeout, status: 504,
		},
		{
			name: "timeout mid-stream",
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/event-stream")
				io.WriteString(w, "data: {}\n\n")
				w.(http.Flusher).Flush()
				<-r.Context().Done()
			},
			timeout: 500 * time.Millisecond, // room for the head to arrive first on a loaded machine
			kind:    ErrProviderTimeout, status: 504, head: true,
		},
		{
			name: "dropped mid-stream",
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/event-stream")
				io.WriteString(w, "data: {}\n\n")
				w.(http.Flusher).Flush()
				panic(http.ErrAbortHandler)
			},
			kind: ErrProviderStream, status: 502, head: true,
		},
		{
			// A JSON answer is held until it is known not to be an error
			// object: one that breaks within its first 64 KiB relayed
			// nothing, a failure before the first byte.
			name: "JSON answer dropped mid-body",
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				io.WriteString(w, `{"id":"x","choices":[`)
				w.(http.Flusher).Flush()
				panic(http.ErrAbortHandler)
			},
			kind: ErrProviderStream, status: 502,
		},
		{
			name: "stream dropped before its first event",
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/event-stream")
				io.WriteString(w, ": keep-alive\n\ndata: {\"id\"")
				w.(http.Flusher).Flush()
				panic(http.ErrAbortHandler)
			},
			kind: ErrProviderStream, status: 502,
		},
		{
			name: "dropped before head",
			handler: func(w http.ResponseWriter, r *http.Request) {
				panic(http.ErrAbortHandler)
			},
			kind: ErrProviderUnreachable, status: 502,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := newUpstream(t, tc.handler)
			o := newOpenAI(t, Config{BaseURL: up.URL, Timeout: tc.timeout, APIKey: "sk-provider"})
			rec := &tunnelRec{}
			err := o.Tunnel(context.Background(), Request{Op: nodev1.Operation_OPERATION_CHAT, ServedModel: "m", Body: []byte(`{}`)}, rec)
			e := asError(t, err)
			if !errors.Is(err, tc.kind) || e.Status != tc.status {
				t.Errorf("got %+v, want %v %d", e, tc.kind, tc.status)
			}
			if (rec.status != 0) != tc.head {
				t.Errorf("head sent: %v, want %v", rec.status != 0, tc.head)
			}
			if strings.Contains(e.Error(), up.Listener.Addr().String()) || strings.Contains(e.Error(), "sk-provider") {
				t.Errorf("error leaks a secret: %v", e)
			}
		})
	}
}

func TestOpenAITunnelConnectionRefused(t *testing.T) {
	base := refusedURL(t)
	o := newOpenAI(t, Config{BaseURL: base, APIKey: "sk-provider"})
	rec := &tunnelRec{}
	err := o.Tunnel(context.Background(), Request{Op: nodev1.Operation_OPERATION_CHAT, ServedModel: "m", Body: []byte(`{}`)}, rec)
	e := asError(t, err)
	if !errors.Is(err, ErrProviderUnreachable) || e.Status != 502 || e.Message != "provider unreachable: connection refused" {
		t.Errorf("got %+v", e)
	}
	if strings.Contains(e.Error(), strings.TrimPrefix(base, "http://")) {
		t.Errorf("error leaks the provider address: %v", e)
	}
	if rec.status != 0 {
		t.Error("head sent")
	}
}

func TestOpenAITunnelCancelAbortsUpstream(t *testing.T) {
	gone := make(chan struct{})
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: {}\n\n")
		w.(http.Flusher).Flush()
		<-r.Context().Done()
		close(gone)
	})
	o := newOpenAI(t, Config{BaseURL: up.URL})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	rec := &tunnelRec{onData: func([]byte) error { cancel(); return nil }}
	err := o.Tunnel(ctx, Request{Op: nodev1.Operation_OPERATION_CHAT, ServedModel: "m", Body: []byte(`{}`)}, rec)
	if !errors.Is(err, ErrCancelled) {
		t.Fatalf("err %v, want ErrCancelled", err)
	}
	<-gone
}

func TestOpenAITunnelSinkFailure(t *testing.T) {
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "data: {}\n\n") })
	o := newOpenAI(t, Config{BaseURL: up.URL})
	broken := errors.New("gone")
	rec := &tunnelRec{onData: func([]byte) error { return broken }}
	err := o.Tunnel(context.Background(), Request{Op: nodev1.Operation_OPERATION_CHAT, ServedModel: "m", Body: []byte(`{}`)}, rec)
	if !errors.Is(err, ErrSink) || !errors.Is(err, broken) {
		t.Fatalf("err %v", err)
	}
}

func TestOpenAITunnelBadRequests(t *testing.T) {
	for _, tc := range []struct {
		name string
		op   nodev1.Operation
		body string
	}{
		{"array body", nodev1.Operation_OPERATION_CHAT, `[1]`},
		{"truncated", nodev1.Operation_OPERATION_CHAT, `{"model":"x"`},
		{"trailing data", nodev1.Operation_OPERATION_CHAT, `{"model":"x"} {}`},
		{"no operation", nodev1.Operation_OPERATION_UNSPECIFIED, `{}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := newOpenAI(t, Config{BaseURL: refusedURL(t)})
			err := o.Tunnel(context.Background(), Request{Op: tc.op, ServedModel: "m", Body: []byte(tc.body)}, &tunnelRec{})
			if e := asError(t, err); !errors.Is(err, ErrBadRequest) || e.Status != 400 {
				t.Errorf("got %+v", e)
			}
		})
	}
}

// TestRegression_TunnelStreamEndsWithoutDone: Ollama's /v1 ends a stream
// that its repeat limit cut (30 equal tokens in a row) with neither a
// finish_reason nor `data: [DONE]`, and a clean end of the body. The tunnel
// relayed it and returned nil, so the client's answer was cut short with no
// error and the run was recorded as complete. Now it relays the body and
// returns ErrProviderStream (502).
func TestRegression_TunnelStreamEndsWithoutDone(t *testing.T) {
	const chunk = `data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":" of"},"finish_reason":null}]}` + "\n\n"
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, chunk+chunk)
	})
	o := newOpenAI(t, Config{BaseURL: up.URL})
	rec := &tunnelRec{}
	req := Request{Op: nodev1.Operation_OPERATION_CHAT, Stream: true, ServedModel: "m", Body: []byte(`{"model":"x","stream":true}`)}
	err := o.Tunnel(context.Background(), req, rec)
	if e := asError(t, err); !errors.Is(err, ErrProviderStream) || e.Status != http.StatusBadGateway {
		t.Errorf("err %v: want ErrProviderStream, 502", err)
	}
	if rec.status != 200 || rec.body() != chunk+chunk {
		t.Errorf("relayed %d %q, want the head and the whole body", rec.status, rec.body())
	}

	// A JSON (not streamed) answer has no [DONE] and is complete.
	up2 := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"choices":[]}`)
	})
	req.Stream, req.Body = false, []byte(`{"model":"x"}`)
	if err := newOpenAI(t, Config{BaseURL: up2.URL}).Tunnel(context.Background(), req, &tunnelRec{}); err != nil {
		t.Errorf("JSON answer: %v", err)
	}
}

// A 2xx answer the tunnel had whole within its first 64 KiB goes to the
// sink as one Head with the whole body and End (one message on the wire),
// whether it came in one read or in pieces, with or without an API key to
// scrub, and an error answer (4xx, 5xx) too; a 2xx error object still
// relays nothing. A stream's head carries its first event and no End (its
// end comes after it). A larger body's head carries its first bytes and
// the provider's Content-Length when there is no key to scrub, else -1.
func TestOpenAITunnelWholeAnswerInOneHead(t *testing.T) {
	answer := `{"id":"c1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"}}]}`
	large := `{"choices":[{"text":"` + strings.Repeat("w", 2*maxPeek) + `"}]}`
	for _, tc := range []struct {
		name, ctype, body string
		status            int
		key               string
		pieces            bool
		wantEnd           bool
		wantLength        int64 // of a head without End
		wantHeads         int
		wantErr           error
	}{
		{name: "one read", ctype: "application/json", body: answer, status: 200, wantEnd: true},
		{name: "one read, api key", ctype: "application/json", body: answer, status: 200, key: "sk-some-secret-key", wantEnd: true},
		{name: "in pieces", ctype: "application/json", body: answer, status: 200, pieces: true, wantEnd: true},
		{name: "in pieces, api key", ctype: "application/json", body: answer, status: 200, key: "sk-some-secret-key", pieces: true, wantEnd: true},
		{name: "error answer", ctype: "application/json", body: `{"error":{"message":"no"}}`, status: 400, wantEnd: true},
		{name: "2xx error object", ctype: "application/json", body: `{"error":{"message":"no"}}`, status: 200, wantHeads: -1, wantErr: ErrProviderError},
		{name: "stream", ctype: "text/event-stream", body: "data: {\"choices\":[]}\n\ndata: [DONE]\n\n", status: 200, wantLength: -1},
		{name: "large, declared", ctype: "application/json", body: large, status: 200, wantLength: int64(len(large))},
		{name: "large, declared, api key", ctype: "application/json", body: large, status: 200, key: "sk-some-secret-key", wantLength: -1},
		{name: "large, chunked", ctype: "application/json", body: large, status: 200, pieces: true, wantLength: -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", tc.ctype)
				if !tc.pieces {
					w.Header().Set("Content-Length", strconv.Itoa(len(tc.body)))
				}
				w.WriteHeader(tc.status)
				for body := tc.body; len(body) > 0; {
					n := len(body)
					if tc.pieces {
						n = min(n, 40)
					}
					io.WriteString(w, body[:n])
					w.(http.Flusher).Flush()
					body = body[n:]
				}
			})
			o := newOpenAI(t, Config{BaseURL: up.URL, APIKey: tc.key})
			rec := &tunnelRec{}
			err := o.Tunnel(context.Background(), Request{Op: nodev1.Operation_OPERATION_CHAT, ServedModel: "m", Body: []byte(`{}`)}, rec)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) || rec.heads != 0 {
					t.Fatalf("err %v, %d heads; want %v and nothing relayed", err, rec.heads, tc.wantErr)
				}
				return
			}
			if err != nil || rec.heads != 1 || rec.status != tc.status {
				t.Fatalf("err %v, %d heads, status %d", err, rec.heads, rec.status)
			}
			if tc.status < 400 && rec.body() != tc.body {
				t.Errorf("relayed %.80q, want the provider's body", rec.body())
			}
			if rec.end != tc.wantEnd {
				t.Errorf("end %v, want %v", rec.end, tc.wantEnd)
			}
			switch {
			case tc.wantEnd:
				if len(rec.chunks) != 1 || rec.length != int64(len(rec.chunks[0])) {
					t.Errorf("%d chunks, length %d; want the whole body with the head", len(rec.chunks), rec.length)
				}
			default:
				if len(rec.chunks) == 0 || rec.length != tc.wantLength {
					t.Errorf("head with %d chunks, length %d; want its first bytes and length %d", len(rec.chunks), rec.length, tc.wantLength)
				}
			}
		})
	}
}

// TestRegression_ReasoningEffortOnOllamasOpenAIAPI: Ollama's
// OpenAI-compatible API turns reasoning_effort into a think level and
// refuses it from a model that takes booleans (400 think value "low" is
// not supported for this model). The tunnel sends the request once more
// without the effort, and later requests for that model go without it at
// once; another 400 is relayed as it came.
func TestRegression_ReasoningEffortOnOllamasOpenAIAPI(t *testing.T) {
	const refusal = `{"error":{"message":"think value \"low\" is not supported for this model","type":"invalid_request_error","param":null}}`
	var (
		mu     sync.Mutex
		bodies []string
	)
	var up *upstream
	up = newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		_, _, b := up.request()
		mu.Lock()
		bodies = append(bodies, string(b))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		switch {
		case strings.Contains(string(b), `"bad-model"`):
			w.WriteHeader(400)
			io.WriteString(w, `{"error":{"message":"model is required","type":"invalid_request_error","param":null}}`)
		case strings.Contains(string(b), "reasoning_effort"):
			w.WriteHeader(400)
			io.WriteString(w, refusal)
		default:
			io.WriteString(w, `{"choices":[]}`)
		}
	})
	o := newOpenAI(t, Config{BaseURL: up.URL})
	body := `{"model":"x","reasoning_effort":"low","messages":[{"role":"user","content":"hi"}]}`
	for i := range 2 {
		rec := &tunnelRec{}
		if err := o.Tunnel(context.Background(), Request{Op: nodev1.Operation_OPERATION_CHAT, ServedModel: "qwen3", Body: []byte(body)}, rec); err != nil {
			t.Fatal(err)
		}
		if rec.status != 200 || rec.body() != `{"choices":[]}` {
			t.Errorf("request %d: got %d %q", i, rec.status, rec.body())
		}
	}
	mu.Lock()
	got := slices.Clone(bodies)
	mu.Unlock()
	if len(got) != 3 || !strings.Contains(got[0], "reasoning_effort") || strings.Contains(got[1], "reasoning_effort") || strings.Contains(got[2], "reasoning_effort") {
		t.Errorf("sent %q: want the effort once, then the request without it twice", got)
	}
	rec := &tunnelRec{}
	if err := o.Tunnel(context.Background(), Request{Op: nodev1.Operation_OPERATION_CHAT, ServedModel: "bad-model", Body: []byte(body)}, rec); err != nil {
		t.Fatal(err)
	}
	if rec.status != 400 || !strings.Contains(rec.body(), "model is required") {
		t.Errorf("another 400: got %d %q", rec.status, rec.body())
	}
	// An Ollama client's own think level (in the Dispatch's Ollama
	// fields) gets Ollama's refusal, as Ollama itself answers it, even for
	// a model that refused an effort before.
	for _, model := range []string{"qwen3", "fresh"} {
		rec = &tunnelRec{}
		req := Request{Op: nodev1.Operation_OPERATION_CHAT, ServedModel: model, Body: []byte(body), OllamaFields: []byte(`{"think":"low"}`)}
		if err := o.Tunnel(context.Background(), req, rec); err != nil {
			t.Fatal(err)
		}
		if rec.status != 400 || !strings.Contains(rec.body(), `think value \"low\" is not supported`) {
			t.Errorf("%s, the client's own think level: got %d %q, want Ollama's 400", model, rec.status, rec.body())
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if n := len(bodies); n != 6 {
		t.Errorf("%d requests upstream, want 6: the client's own levels go once each", n)
	}
}
