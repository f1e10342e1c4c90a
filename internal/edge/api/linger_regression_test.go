package api

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"testing"
	"time"
)

// dialEnv opens a TCP connection to env's server, closed at the test's
// end, with a deadline of a minute: far past the lingering's 5 s, so a
// read still blocked then is a hang.
func dialEnv(t *testing.T, env *testEnv) (net.Conn, *bufio.Reader) {
	t.Helper()
	conn, err := net.Dial("tcp", env.srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if err := conn.SetDeadline(time.Now().Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	return conn, bufio.NewReader(conn)
}

// sendPartial sends a POST to path that announces a 1,000-byte body and
// sends only its first bytes, then reads the whole answer.
func sendPartial(t *testing.T, conn net.Conn, br *bufio.Reader, path string) *http.Response {
	t.Helper()
	req := "POST " + path + " HTTP/1.1\r\nHost: iop\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n" + `{"model":"m","messages":`
	if _, err := io.WriteString(conn, req); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("%s: no answer: %v", path, err)
	}
	if _, err := io.ReadAll(resp.Body); err != nil {
		t.Fatalf("%s: answer %d cut short: %v", path, resp.StatusCode, err)
	}
	return resp
}

// TestRegression_UnreadBodyLeavesNoConnectionOpen: after an answer given
// before the body was in (a 408 when the body did not arrive in time, an
// early 404), a client that sent nothing more kept its connection, and
// the handler's goroutine, for as long as it liked (helper-78: over 260
// s; a graceful stop then waited its whole drain): lingering lifted the
// read deadline, then net/http read up to 256 KiB of the rest of the body
// with none. The connection now closes once the lingering ends.
func TestRegression_UnreadBodyLeavesNoConnectionOpen(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, path string
		status     int
	}{
		{"408, the body late", "/v1/chat/completions", http.StatusRequestTimeout},
		{"404, the body still coming", "/v1/no-such-route", http.StatusNotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			env := newEnv(t, Config{BodyReadTimeout: 200 * time.Millisecond}, okRun)
			conn, br := dialEnv(t, env)
			if resp := sendPartial(t, conn, br, tc.path); resp.StatusCode != tc.status {
				t.Fatalf("answer %d, want %d", resp.StatusCode, tc.status)
			}
			n, err := br.Read(make([]byte, 1))
			switch {
			case errors.Is(err, os.ErrDeadlineExceeded):
				t.Fatal("the connection was still open a minute after the answer")
			case err == nil:
				t.Fatalf("read %d more bytes after the answer; want the connection closed", n)
			}
		})
	}
}

// TestLingerKeepsAConnectionWhoseBodyCameWhole: an early answer whose body
// the client sends whole leaves the connection open for the next request.
func TestLingerKeepsAConnectionWhoseBodyCameWhole(t *testing.T) {
	t.Parallel()
	env := newEnv(t, Config{}, okRun)
	conn, br := dialEnv(t, env)
	body := `{"model":"m","messages":[{"role":"user","content":"x"}]}`
	req := "POST /v1/no-such-route HTTP/1.1\r\nHost: iop\r\nContent-Type: application/json\r\nContent-Length: " +
		strconv.Itoa(len(body)) + "\r\n\r\n" + body
	for i := range 2 {
		if _, err := io.WriteString(conn, req); err != nil {
			t.Fatalf("request %d: %v", i+1, err)
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("request %d on one connection: %v", i+1, err)
		}
		io.Copy(io.Discard, resp.Body)
		if resp.StatusCode != http.StatusNotFound {
			t.Fatalf("request %d: %d, want 404", i+1, resp.StatusCode)
		}
	}
}
