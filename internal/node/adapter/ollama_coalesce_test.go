package adapter

import (
	"context"
	"io"
	"net/http"
	"slices"
	"testing"

	"iop/internal/wire/nodev1"
)

// Lines that reach the node together go up in one Send; a line that is all
// the node has is sent at once, not held back for more. The provider here
// writes its third line only after the node has sent the first two (in one
// message, after STARTED: the answer starts with its first line): an
// adapter that waited for more lines would never get it.
func TestOllamaStreamCoalescesBufferedLinesOnly(t *testing.T) {
	sentFirst := make(chan struct{})
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		io.WriteString(w, `{"message":{"role":"assistant","content":"a"},"done":false}`+"\n"+
			`{"message":{"role":"assistant","content":"b"},"done":false}`+"\n")
		w.(http.Flusher).Flush()
		select {
		case <-sentFirst:
		case <-r.Context().Done():
			return
		}
		flushLines(w, `{"message":{"role":"assistant","content":"c"},"done":true,"done_reason":"stop","prompt_eval_count":3,"eval_count":3}`)
	})
	o := newOllama(t, Config{BaseURL: up.URL})
	var batches [][]nodev1.RunEvent_Type
	rec := &eventRec{onSend: func(events []*nodev1.RunEvent) error {
		var types []nodev1.RunEvent_Type
		for _, e := range events {
			types = append(types, e.Type)
		}
		batches = append(batches, types)
		if len(batches) == 1 {
			close(sentFirst)
		}
		return nil
	}}
	if err := o.Normalize(context.Background(), chatReq(`{"messages":[{"role":"user","content":"x"}]}`), rec); err != nil {
		t.Fatal(err)
	}
	want := [][]nodev1.RunEvent_Type{{tStarted, tDelta, tDelta}, {tDelta, tUsage, tComplete}}
	if !slices.EqualFunc(batches, want, slices.Equal) {
		t.Errorf("sends %v, want %v", batches, want)
	}
	var text string
	for _, e := range rec.events {
		text += e.Text
	}
	if text != "abc" {
		t.Errorf("text %q, want %q", text, "abc")
	}
}

// An answer whose lines all reached the node at once (a short answer of a
// fast server, as a non-streamed request's often is) goes up as one
// message: STARTED, the deltas, USAGE and COMPLETE in one Send.
func TestOllamaWholeAnswerGoesUpAsOneMessage(t *testing.T) {
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		io.WriteString(w, `{"message":{"role":"assistant","content":"a"},"done":false}`+"\n"+
			`{"message":{"role":"assistant","content":"b"},"done":false}`+"\n"+
			`{"message":{"role":"assistant","content":""},"done":true,"done_reason":"stop","prompt_eval_count":3,"eval_count":2}`+"\n")
	})
	o := newOllama(t, Config{BaseURL: up.URL})
	var batches [][]nodev1.RunEvent_Type
	rec := &eventRec{onSend: func(events []*nodev1.RunEvent) error {
		var types []nodev1.RunEvent_Type
		for _, e := range events {
			types = append(types, e.Type)
		}
		batches = append(batches, types)
		return nil
	}}
	if err := o.Normalize(context.Background(), chatReq(`{"messages":[{"role":"user","content":"x"}]}`), rec); err != nil {
		t.Fatal(err)
	}
	want := [][]nodev1.RunEvent_Type{{tStarted, tDelta, tDelta, tUsage, tComplete}}
	if !slices.EqualFunc(batches, want, slices.Equal) {
		t.Errorf("sends %v, want %v", batches, want)
	}
}
