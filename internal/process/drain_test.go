package process

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
)

// TestRegression_AnswerWhileDrainingClosesTheConnection: an answer whose
// header is written once the edge drains says "Connection: close", so the
// client does not send its next request on a connection the server is
// about to close (in TestRegression_SIGTERMDuringBurstAnswersEveryRequest
// one request in about eighty got EOF so: a 200 written during the lame
// duck kept the connection alive, and the client's next request met
// Shutdown closing it). An answer started before the drain is left alone,
// and flushing (a stream's first event) counts as writing the header.
func TestRegression_AnswerWhileDrainingClosesTheConnection(t *testing.T) {
	var draining atomic.Bool
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w = &closeWhenDraining{ResponseWriter: w, draining: &draining}
		if r.URL.Path == "/held" {
			<-release
		}
		if r.URL.Path == "/stream" {
			http.NewResponseController(w).Flush()
		}
		io.WriteString(w, "ok")
	}))
	defer srv.Close()
	get := func(path string) *http.Response {
		t.Helper()
		resp, err := srv.Client().Post(srv.URL+path, "application/json", strings.NewReader("{}"))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp
	}
	if resp := get("/"); resp.Close {
		t.Fatal("before the drain: Connection: close, want keep-alive")
	}
	held := make(chan *http.Response)
	go func() {
		resp, err := srv.Client().Post(srv.URL+"/held", "application/json", strings.NewReader("{}"))
		if err != nil {
			t.Error(err)
			close(held)
			return
		}
		resp.Body.Close()
		held <- resp
	}()
	draining.Store(true)
	close(release)
	if resp := <-held; resp == nil || !resp.Close {
		t.Fatalf("an answer written once the edge drains keeps the connection alive: %+v", resp)
	}
	for _, path := range []string{"/", "/stream"} {
		if resp := get(path); !resp.Close {
			t.Fatalf("%s while draining: keep-alive, want Connection: close", path)
		}
	}
}
