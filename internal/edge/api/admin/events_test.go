package admin

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"iop/internal/edge/api"
	"iop/internal/edge/lifecycle"
	"iop/internal/sse"
)

// readEvents reads events from sc until n were read, returning them.
func readEvents(t *testing.T, sc *sse.Scanner, n int) []lifecycle.Event {
	t.Helper()
	var out []lifecycle.Event
	for len(out) < n {
		ev, err := sc.Next()
		if err != nil {
			t.Fatalf("stream ended after %d events: %v", len(out), err)
		}
		var e lifecycle.Event
		if err := json.Unmarshal(ev.Data, &e); err != nil {
			t.Fatalf("event %q: %v", ev.Data, err)
		}
		out = append(out, e)
	}
	return out
}

func TestEventsStream(t *testing.T) {
	t.Parallel()
	hub := lifecycle.NewHub(nil)
	env := newEnv(t, api.Config{}, Config{Events: hub})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, env.srv.URL+"/admin/v1/events", nil)
	resp, err := env.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("%d %v", resp.StatusCode, resp.Header)
	}
	br := bufio.NewReader(resp.Body)
	if line, err := br.ReadString('\n'); line != "retry: 1000\n" {
		t.Fatalf("first line %q, %v", line, err)
	}
	sc := sse.NewScanner(br)
	// The handler subscribed before its first line was sent.
	hub.Publish(lifecycle.Event{Type: lifecycle.NodeConnected, NodeID: "n1", Generation: 3})
	hub.Publish(lifecycle.Event{Type: lifecycle.RunAdmitted, RunID: "r1", Model: "m", QueueWait: 2 * time.Second,
		Load: &lifecycle.Load{InFlight: 0, Capacity: 4}})
	evs := readEvents(t, sc, 2)
	if evs[0].Type != lifecycle.NodeConnected || evs[0].NodeID != "n1" || evs[0].Generation != 3 {
		t.Errorf("first event %+v", evs[0])
	}
	if e := evs[1]; e.RunID != "r1" || e.QueueWaitSeconds != 2 || e.Load == nil || e.Load.Capacity != 4 {
		t.Errorf("second event %+v", e)
	}
	// The edge shutting down ends the stream.
	hub.Close()
	for {
		if _, err := sc.Next(); err != nil {
			break
		}
	}
	cancel()
}

func TestEventsStreamRawShape(t *testing.T) {
	t.Parallel()
	hub := lifecycle.NewHub(func() time.Time { return time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC) })
	h := api.New(api.Config{Routes: Routes(Config{Events: hub})}, noGateway{}, nil)
	w := newBlockingWriter()
	r := httptest.NewRequest(http.MethodGet, "/admin/v1/events", nil)
	done := make(chan struct{})
	go func() {
		defer close(done)
		h.ServeHTTP(w, r)
	}()
	<-w.blocked // the handler is subscribed and stuck writing its first line
	hub.Publish(lifecycle.Event{Type: lifecycle.RunEnded, RunID: "r", Reason: "complete", Load: &lifecycle.Load{}})
	// A subscriber 256 events behind is dropped.
	for range eventsBuffer {
		hub.Publish(lifecycle.Event{Type: lifecycle.RunQueued, Model: "m"})
	}
	close(w.release)
	<-done
	body := w.body.String()
	want := "data: {\"type\":\"run_ended\",\"time\":\"2025-01-02T03:04:05Z\",\"run_id\":\"r\",\"reason\":\"complete\",\"load\":{\"in_flight\":0,\"capacity\":0,\"queued\":0,\"model_queued\":0}}\n\n"
	if !strings.Contains(body, want) {
		t.Errorf("body lacks %q:\n%.400s", want, body)
	}
	if n := strings.Count(body, "data: {\"type\":\"run_queued\""); n != eventsBuffer-1 {
		t.Errorf("%d run_queued events relayed, want the %d the buffer held", n, eventsBuffer-1)
	}
	if !strings.HasSuffix(body, "event: dropped\ndata: {\"reason\":\"slow subscriber\"}\n\n") {
		t.Errorf("stream does not end with the dropped event: ...%q", body[max(0, len(body)-120):])
	}
	if hub.Active() {
		t.Error("the dropped subscription is still active")
	}
}

// blockingWriter is a ResponseWriter whose first Write blocks until
// release is closed, signalling blocked when it starts waiting.
type blockingWriter struct {
	*httptest.ResponseRecorder
	body             *strings.Builder
	blocked, release chan struct{}
	first            bool
}

func newBlockingWriter() *blockingWriter {
	return &blockingWriter{ResponseRecorder: httptest.NewRecorder(), body: &strings.Builder{},
		blocked: make(chan struct{}), release: make(chan struct{}), first: true}
}

func (w *blockingWriter) Write(p []byte) (int, error) {
	if w.first {
		w.first = false
		close(w.blocked)
		<-w.release
	}
	w.body.Write(p)
	return len(p), nil
}
