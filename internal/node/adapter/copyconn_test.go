package adapter

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"testing"

	"iop/internal/wire/nodev1"
)

// TestRegression_LargeBodyCopiedThroughAPool: net/http hands a request
// body of known length to the connection's ReadFrom as an
// io.LimitedReader; net.TCPConn's ReadFrom allocated a 32 KiB buffer for
// every body over 4 KiB (64 MB in 5 s of 100 KB agent requests, a fifth
// of the node's allocation). The provider's connections copy through a
// pooled buffer, and the body still arrives whole.
func TestRegression_LargeBodyCopiedThroughAPool(t *testing.T) {
	body := bytes.Repeat([]byte("x"), 100<<10)
	body = append(append([]byte(`{"model":"m","pad":"`), body...), `"}`...)
	got := make(chan int, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		got <- int(n)
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"id":"c","object":"chat.completion","choices":[]}`))
	}))
	t.Cleanup(srv.Close)
	o := newOpenAI(t, Config{BaseURL: srv.URL + "/v1"})
	rec := &tunnelRec{}
	if err := o.Tunnel(context.Background(), Request{Op: nodev1.Operation_OPERATION_CHAT, ServedModel: "m", Body: body}, rec); err != nil || rec.status != 200 {
		t.Fatalf("Tunnel: status %d, %v", rec.status, err)
	}
	if n := <-got; n != len(body) {
		t.Fatalf("the provider read %d bytes of a %d-byte body", n, len(body))
	}
	c, err := o.p.transport.DialContext(context.Background(), "tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, ok := c.(copyConn); !ok {
		t.Fatalf("the provider's transport dials a %T, not a copyConn", c)
	}

	// ReadFrom with what net/http passes it allocates no buffer of its own
	// (on average: the race detector's sync.Pool drops some on purpose).
	client, server := net.Pipe()
	defer client.Close()
	go io.Copy(io.Discard, server)
	cc := copyConn{client}
	const runs = 50
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range runs {
		if n, err := cc.ReadFrom(io.LimitReader(bytes.NewReader(body), int64(len(body)))); err != nil || n != int64(len(body)) {
			t.Fatalf("ReadFrom: %d bytes, %v", n, err)
		}
	}
	runtime.ReadMemStats(&after)
	if per := (after.TotalAlloc - before.TotalAlloc) / runs; per > 16<<10 {
		t.Errorf("copying a %d-byte body allocates %d bytes; want no 32 KiB buffer of its own", len(body), per)
	}
}
