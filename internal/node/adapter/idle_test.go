package adapter

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"iop/internal/wire/nodev1"
)

// TestRegression_IdleConnectionClosedBeforeTheProviderClosesIt: a provider
// behind uvicorn (vLLM) closes a keep-alive connection idle for 5 s; the
// node kept its idle connections 90 s, so a request sent as the server
// closed one ended 502 "provider unreachable: connection closed" (seen in
// TestFinishedAnswerFreesItsCallerConcurrent against the simulator's 10 s).
// A connection idle past idleConnTimeout, still under the server's
// keep-alive, is not reused: the next run dials a new one and succeeds.
func TestRegression_IdleConnectionClosedBeforeTheProviderClosesIt(t *testing.T) {
	t.Parallel()
	if idleConnTimeout >= 5*time.Second {
		t.Fatalf("idleConnTimeout %v: not under uvicorn's 5 s keep-alive", idleConnTimeout)
	}
	var dials atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}]}`))
	}))
	srv.Config.IdleTimeout = 5 * time.Second
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			dials.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	o := newOpenAI(t, Config{BaseURL: srv.URL + "/v1"})
	run := func() {
		t.Helper()
		rec := &tunnelRec{}
		if err := o.Tunnel(context.Background(), Request{Op: nodev1.Operation_OPERATION_CHAT, ServedModel: "m", Body: []byte(`{"model":"x"}`)}, rec); err != nil || rec.status != 200 {
			t.Fatalf("Tunnel: status %d, %v", rec.status, err)
		}
	}
	run()
	run()
	if n := dials.Load(); n != 1 {
		t.Fatalf("two runs back to back dialed %d connections, want 1 (kept alive)", n)
	}
	time.Sleep(idleConnTimeout + 500*time.Millisecond)
	run()
	if n := dials.Load(); n != 2 {
		t.Fatalf("after %v idle the run dialed %d connections in all, want 2: the idle one was reused", idleConnTimeout+500*time.Millisecond, n)
	}
}
