package sse

import (
	"mime"
	"testing"

	"pgregory.net/rapid"
)

// TestIsEventStreamEqualsParse checks that IsEventStream, which skips
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
		if want := err == nil && mediaType == "text/event-stream"; IsEventStream(ct) != want {
			t.Fatalf("IsEventStream(%q) = %v, want %v", ct, !want, want)
		}
	})
}
