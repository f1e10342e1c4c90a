package api

import (
	"net/http"
	"slices"
	"testing"

	"iop/internal/edge/contract"
)

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
