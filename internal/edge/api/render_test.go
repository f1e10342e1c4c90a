package api

import (
	"mime"
	"net/http"
	"slices"
	"testing"

	"pgregory.net/rapid"

	"iop/internal/edge/contract"
)

// TestIsEventStreamEqualsParse checks that isEventStream, which skips
// mime.ParseMediaType for a type that does not name event-stream, tells
// every content type as the parse does.
func TestIsEventStreamEqualsParse(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		ct := rapid.OneOf(
			rapid.SampledFrom([]string{"text/event-stream", "TEXT/Event-Stream; charset=utf-8", "application/json; charset=utf-8",
				"text/event-stream;", " text/event-stream ", "text/event-streamx", "text/plain; x=event-stream", "", "text/EVENT-STREAM"}),
			rapid.StringMatching(`[ a-zA-Z/;=\-"\t]{0,24}(event-stream|EVENT-STREAM|Event-Stream)?[ a-z;=\-"]{0,8}`),
		).Draw(t, "content type")
		mediaType, _, err := mime.ParseMediaType(ct)
		if want := err == nil && mediaType == "text/event-stream"; isEventStream(ct) != want {
			t.Fatalf("isEventStream(%q) = %v, want %v", ct, !want, want)
		}
	})
}

// TestTunnelHeadValuesStandAlone checks that the relayed head's header
// values, which share one allocation, stay apart: a value added to one
// header after the head does not change another, and each is the
// provider's (the Content-Length the edge's).
func TestTunnelHeadValuesStandAlone(t *testing.T) {
	body := `{"ok":true}`
	rr, w := benchResponse(&listRun{msgs: []*contract.Message{decoded(wholeAnswer(200,
		map[string]string{"Content-Type": "application/json", "x-one": "1", "X-Two": "2", "Connection": "close"}, body))}})
	if reason := rr.tunnel(); reason != ReasonCompleted || w.n != int64(len(body)) {
		t.Fatalf("tunnel ended %q after %d bytes", reason, w.n)
	}
	h := w.Header()
	for _, name := range []string{"Content-Type", "X-One", "X-Two", "Content-Length"} {
		h.Add(name, "added")
	}
	want := http.Header{"Content-Type": {"application/json", "added"}, "X-One": {"1", "added"}, "X-Two": {"2", "added"},
		"Content-Length": {"11", "added"}}
	for name, v := range want {
		if !slices.Equal(h[name], v) {
			t.Errorf("%s: %q, want %q", name, h[name], v)
		}
	}
	if _, ok := h["Connection"]; ok {
		t.Error("the provider's Connection was relayed")
	}
}
