package adapter

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"

	"iop/internal/wire/nodev1"
)

// A 2xx answer that is an error object (an error on every path and every
// status, 200 included) is a failure before the first byte on
// the tunnel: nothing is relayed, and the call fails with
// ErrProviderError, status 502 and the provider's message, scrubbed of
// its address and key. So is a stream whose first event is an error
// event. An answer that merely has "error": null, a stream whose error
// comes after its first event, and a large answer are relayed as they
// are.
func TestTunnelErrorObjectIn2xx(t *testing.T) {
	const key = "sk-provider-secret"
	for _, tc := range []struct {
		name, ctype, body string
		kind              error  // nil: relayed in full, no error
		message           string // of the *Error
	}{
		{name: "OpenAI-shaped error object", ctype: "application/json",
			body: `{"error":{"message":"upstream quota exceeded for ` + key + ` at BASE","type":"insufficient_quota","code":429}}`,
			kind: ErrProviderError, message: "upstream quota exceeded for [redacted] at [provider]"},
		{name: "error object whose name is escaped", ctype: "application/json",
			body: `{"\u0065rror":{"message":"escaped name"}}`, kind: ErrProviderError, message: "escaped name"},
		{name: "error string", ctype: "application/json; charset=utf-8",
			body: `{"error":"model is overloaded"}`, kind: ErrProviderError, message: "model is overloaded"},
		{name: "error object without a content type", body: "  {\"error\": {\"message\": \"bad things\"}}\n",
			kind: ErrProviderError, message: "bad things"},
		{name: "SSE whose first event is an error", ctype: "text/event-stream",
			body: ": processing\n\ndata: {\"error\":{\"message\":\"no capacity\",\"code\":503}}\n\n",
			kind: ErrProviderError, message: "no capacity"},
		{name: "SSE that sends only an error and no blank line after it", ctype: "text/event-stream",
			body: "event: error\ndata: {\"error\":\"stream failed\"}\n\n", kind: ErrProviderError, message: "stream failed"},
		{name: "answer with error null", ctype: "application/json",
			body: `{"id":"c1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"}}],"error":null}`},
		{name: "answer with choices and an error member", ctype: "application/json",
			body: `{"choices":[],"error":{"message":"partial"}}`},
		{name: "embeddings answer", ctype: "application/json",
			body: `{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.5]}]}`},
		{name: "large answer", ctype: "application/json",
			body: `{"choices":[{"text":"` + strings.Repeat("w", 3*maxPeek) + `"}]}`},
		{name: "SSE that errs after its first event", ctype: "text/event-stream",
			body: "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: {\"error\":{\"message\":\"died\"}}\n\n",
			kind: ErrProviderReported, message: "died"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var base string
			up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
				if tc.ctype != "" {
					w.Header().Set("Content-Type", tc.ctype)
				}
				// In pieces, so a hold must span reads.
				body := strings.ReplaceAll(tc.body, "BASE", base)
				for len(body) > 0 {
					n := min(len(body), 7)
					io.WriteString(w, body[:n])
					w.(http.Flusher).Flush()
					body = body[n:]
				}
			})
			base = up.URL
			o := newOpenAI(t, Config{BaseURL: up.URL, APIKey: key})
			rec := &tunnelRec{}
			err := o.Tunnel(context.Background(), Request{Op: nodev1.Operation_OPERATION_CHAT, ServedModel: "m", Body: []byte(`{}`)}, rec)
			switch {
			case tc.kind == nil:
				if err != nil || rec.status != 200 || rec.body() != tc.body {
					t.Fatalf("err %v, relayed %d %.80q; want the body relayed in full", err, rec.status, rec.body())
				}
			case errors.Is(tc.kind, ErrProviderReported):
				e := asError(t, err)
				if !errors.Is(err, tc.kind) || e.Message != tc.message || rec.body() != tc.body {
					t.Fatalf("err %+v, relayed %q; want %v %q after the body relayed", e, rec.body(), tc.kind, tc.message)
				}
			default:
				e := asError(t, err)
				if !errors.Is(err, tc.kind) || e.Status != http.StatusBadGateway || e.Message != tc.message {
					t.Fatalf("err %+v, want %v 502 %q", e, tc.kind, tc.message)
				}
				if rec.status != 0 || len(rec.chunks) != 0 {
					t.Fatalf("relayed %d %q, want nothing", rec.status, rec.body())
				}
			}
		})
	}
}

// TestRegression_StreamAnsweredWithoutAnEventStreamIsAnError: a streamed
// request whose provider answered 200 with an HTML error page (a proxy's
// "502 Bad Gateway") or a JSON object cut short was relayed to the client
// as it was and recorded completed. A 2xx answer to a
// streamed request that is not an event stream is a provider failure
// before its first byte (502, nothing relayed, retried elsewhere), naming
// the content type and, for text, what it said. An event stream without
// a Content-Type of its own name is not one either; a real event stream,
// and a non-streamed request's JSON answer, are relayed as they are.
func TestRegression_StreamAnsweredWithoutAnEventStreamIsAnError(t *testing.T) {
	sse := "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: [DONE]\n\n"
	for _, tc := range []struct {
		name, ctype, body string
		stream            bool
		message           string // "" for relayed as it is
	}{
		{"HTML error page", "text/html", "<html><body>502 Bad Gateway</body></html>", true,
			`provider answered a streamed request with Content-Type "text/html", not an event stream: 502 Bad Gateway`},
		{"truncated JSON", "application/json", `{"id":"c1","choices":[{"message":{"content":"hi`, true,
			`provider answered a streamed request with Content-Type "application/json", not an event stream`},
		{"error object", "application/json", `{"error":{"message":"overloaded"}}`, true, "overloaded"},
		{"large non-stream body", "text/plain", strings.Repeat("x", 3*maxPeek), true,
			`provider answered a streamed request with Content-Type "text/plain", not an event stream: ` + strings.Repeat("x", 10)},
		{"event stream", "text/event-stream; charset=utf-8", sse, true, ""},
		{"JSON answer to a request that did not stream", "application/json", `{"id":"c1","choices":[]}`, false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", tc.ctype)
				io.WriteString(w, tc.body)
			})
			o := newOpenAI(t, Config{BaseURL: up.URL})
			rec := &tunnelRec{}
			err := o.Tunnel(context.Background(), Request{Op: nodev1.Operation_OPERATION_CHAT, Stream: tc.stream, ServedModel: "m", Body: []byte(`{}`)}, rec)
			if tc.message == "" {
				if err != nil || rec.status != 200 || rec.body() != tc.body {
					t.Fatalf("err %v, relayed %d %.80q; want the body relayed in full", err, rec.status, rec.body())
				}
				return
			}
			e := asError(t, err)
			if !errors.Is(err, ErrProviderError) || e.Status != http.StatusBadGateway || !strings.HasPrefix(e.Message, tc.message) {
				t.Fatalf("err %+v, want ErrProviderError 502 %q", e, tc.message)
			}
			if rec.status != 0 || len(rec.chunks) != 0 {
				t.Fatalf("relayed %d %q, want nothing", rec.status, rec.body())
			}
		})
	}
}
