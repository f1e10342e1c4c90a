package api

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"iop/internal/edge/contract"
)

// TestRegression_SlowBodyIsAnsweredRequestTimeout: a client that sent its
// headers and a few bytes of a body and then nothing held its connection
// and a goroutine for as long as it liked (3,000 such
// clients, none answered after 60 s). A body not in within
// BodyReadTimeout is answered 408 and the connection closed; a body that
// is in lifts the deadline, so a request answered long after it (a
// queue wait, a long stream) is not cut.
func TestRegression_SlowBodyIsAnsweredRequestTimeout(t *testing.T) {
	const timeout = 100 * time.Millisecond
	// The second request is held past the body's deadline: its answer must
	// still come whole (a read deadline that outlived the body, or a
	// server-wide ReadTimeout, would cut it). Network deadlines run on the
	// real clock, so this waits real time; a cancelled request context
	// ends the wait at once and fails the test.
	var held atomic.Bool
	env := newEnv(t, Config{BodyReadTimeout: timeout}, func(ctx context.Context, _ contract.Request) (Run, error) {
		if held.Load() {
			select {
			case <-ctx.Done():
				return nil, context.Cause(ctx)
			case <-time.After(3 * timeout):
			}
		}
		return scriptedRun(normalized, events(started(), delta("late")), events(complete("stop"))), nil
	})
	conn, err := net.Dial("tcp", env.srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"model\":")
	_ = conn.SetReadDeadline(time.Now().Add(30 * time.Second)) // the test's own bound, not the rule's
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("no answer to a body that stopped: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusRequestTimeout || !strings.Contains(string(b), "request_timeout") || !resp.Close {
		t.Fatalf("%d close=%v %s, want 408 request_timeout and the connection closed", resp.StatusCode, resp.Close, b)
	}

	// A body that is in: the answer comes after the deadline would have
	// passed, whole.
	held.Store(true)
	got := env.post(t, "/v1/chat/completions", "application/json", simpleChat)
	if got.status != http.StatusOK || !strings.Contains(got.body, "late") {
		t.Fatalf("an answer after the body was in: %d %s", got.status, got.body)
	}
}
