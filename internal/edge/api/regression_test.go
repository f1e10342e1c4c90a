package api

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"iop/internal/edge/api/request"
	"iop/internal/edge/contract"
	"iop/internal/wire/nodev1"
)

// Regression tests for bugs reported against POST /v1/chat/completions,
// each with the input that broke it.

// badChat is one request the API must answer 400 before dispatching.
type badChat struct {
	name      string
	body      string
	wantParam string
	wantMsg   string // the error body's message contains it
}

// checkRejected posts each body, non-streamed and streamed, and checks that
// both are answered the same 400 naming the param, with nothing dispatched.
func checkRejected(t *testing.T, tests []badChat) {
	t.Helper()
	for _, tt := range tests {
		for _, stream := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/stream=%v", tt.name, stream), func(t *testing.T) {
				env := newEnv(t, Config{}, failWith(fmt.Errorf("must not dispatch")))
				body := tt.body
				if stream {
					body = strings.Replace(body, `{`, `{"stream":true,`, 1)
				}
				resp := env.post(t, "/v1/chat/completions", "application/json", body)
				if resp.status != http.StatusBadRequest {
					t.Fatalf("status = %d, want 400 (%s)", resp.status, resp.body)
				}
				msg, typ, param, _ := openAIError(t, resp.body)
				if str(param) != tt.wantParam || typ != "invalid_request_error" {
					t.Errorf("param %s type %q, want param %s (message %q)", str(param), typ, tt.wantParam, msg)
				}
				if !strings.Contains(msg, tt.wantMsg) {
					t.Errorf("message %q does not contain %q", msg, tt.wantMsg)
				}
				if n := len(env.gw.requests()); n != 0 {
					t.Errorf("dispatched %d requests, want none", n)
				}
			})
		}
	}
}

// checkAccepted posts each body and checks that it is dispatched.
func checkAccepted(t *testing.T, bodies map[string]string) {
	t.Helper()
	for name, body := range bodies {
		t.Run(name, func(t *testing.T) {
			env := newEnv(t, Config{}, runWith(scriptedRun(normalized, events(complete("stop")))))
			if resp := env.post(t, "/v1/chat/completions", "application/json", body); resp.status != http.StatusOK {
				t.Fatalf("status = %d, want 200 (%s)", resp.status, resp.body)
			}
			if n := len(env.gw.requests()); n != 1 {
				t.Errorf("dispatched %d requests, want 1", n)
			}
		})
	}
}

// chatWith is a valid chat request with extra top-level fields.
func chatWith(fields string) string {
	return `{"model":"m",` + fields + `,"messages":[{"role":"user","content":"x"}]}`
}

// "n":2 used to get one choice back silently and "n":0 was accepted. n is
// now checked as an integer in [1, 128]: the tunnel path passes it to the
// provider, and the normalized path refuses n > 1 naming it (see the
// adapter's TestOllamaRefusesFieldsItCannotHonour).
func TestRegression_NGreaterThanOneRejected(t *testing.T) {
	const want = "n: must be an integer between 1 and 128"
	checkRejected(t, []badChat{
		{"n=0", chatWith(`"n": 0`), "n", want},
		{"n=-1", chatWith(`"n": -1`), "n", want},
		{"n=1.5", chatWith(`"n": 1.5`), "n", want},
		{"n=129", chatWith(`"n": 129`), "n", want},
		{"n huge", chatWith(`"n": 100000000000000000000`), "n", want},
		{"n=2.0", chatWith(`"n": 2.0`), "n", "n: must be an integer written without a fraction or exponent"},
		{"n a string", chatWith(`"n": "1"`), "n", "n: expected an integer, got a string"},
	})
	checkAccepted(t, map[string]string{
		"n=1":      chatWith(`"n": 1`),
		"n=2":      chatWith(`"n": 2`),
		"n=128":    chatWith(`"n": 128`),
		"n null":   chatWith(`"n": null`),
		"n absent": simpleChat,
	})
}

// "max_tokens": -5 or 0 (and max_completion_tokens) gave 200 on one path
// and 400 on another; both paths now get the same 400.
func TestRegression_MaxTokensBelowOneRejected(t *testing.T) {
	const want = "must be an integer between 1 and 2147483647"
	checkRejected(t, []badChat{
		{"max_tokens -5", chatWith(`"max_tokens": -5`), "max_tokens", "max_tokens: " + want + ", got -5"},
		{"max_tokens 0", chatWith(`"max_tokens": 0`), "max_tokens", "max_tokens: " + want + ", got 0"},
		{"max_tokens -0", chatWith(`"max_tokens": -0`), "max_tokens", want},
		{"max_tokens 2^31", chatWith(`"max_tokens": 2147483648`), "max_tokens", want},
		{"max_completion_tokens -5", chatWith(`"max_completion_tokens": -5`), "max_completion_tokens", "max_completion_tokens: " + want},
		{"max_completion_tokens 0", chatWith(`"max_completion_tokens": 0`), "max_completion_tokens", "max_completion_tokens: " + want},
	})
	checkAccepted(t, map[string]string{
		"max_tokens 1":                     chatWith(`"max_tokens": 1`),
		"max_tokens 2^31-1":                chatWith(`"max_tokens": 2147483647`),
		"max_completion_tokens 16":         chatWith(`"max_completion_tokens": 16`),
		"seed negative, the int64 minimum": chatWith(`"seed": -9223372036854775808`),
	})
}

// "temperature": 1e400 was "expected a number, got a number"; "n": 1e0 and
// "max_tokens": 1e20 were "expected an integer, got a number". An integer
// written with an exponent or a fraction is rejected even when its value is
// integral (request.DecodeChat says why), with a message that says so.
func TestRegression_NumberMessagesArePrecise(t *testing.T) {
	checkRejected(t, []badChat{
		{"temperature 1e400", chatWith(`"temperature": 1e400`), "temperature", "temperature: number out of range, got 1e400"},
		{"top_p -1e400", chatWith(`"top_p": -1e400`), "top_p", "top_p: number out of range, got -1e400"},
		{"n 1e0", chatWith(`"n": 1e0`), "n", "n: must be an integer written without a fraction or exponent, got 1e0"},
		{"n 1.0", chatWith(`"n": 1.0`), "n", "n: must be an integer written without a fraction or exponent, got 1.0"},
		{"max_tokens 1e20", chatWith(`"max_tokens": 1e20`), "max_tokens", "max_tokens: must be an integer between 1 and 2147483647, got 1e20"},
		{"max_tokens 1e2", chatWith(`"max_tokens": 1e2`), "max_tokens", "max_tokens: must be an integer written without a fraction or exponent, got 1e2"},
		{"max_tokens 1.5", chatWith(`"max_tokens": 1.5`), "max_tokens", "max_tokens: must be an integer between 1 and 2147483647, got 1.5"},
		{"seed 1e400", chatWith(`"seed": 1e400`), "seed", "seed: must be an integer between -9223372036854775808 and 9223372036854775807, got 1e400"},
		{"temperature a string", chatWith(`"temperature": "hot"`), "temperature", "temperature: expected a number, got a string"},
	})
	checkAccepted(t, map[string]string{
		// Too small to represent: 0, as encoding/json (and so a Go provider) reads it.
		"temperature 1e-400": chatWith(`"temperature": 1e-400`),
		"temperature 0.7":    chatWith(`"temperature": 0.7`),
		"top_p 1E0":          chatWith(`"top_p": 1E0`),
	})
}

// syncBuffer is a bytes.Buffer safe for the handler's goroutines.
type syncBuffer struct {
	mu  sync.Mutex // guards buf
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// A 1 MB unknown model name made a 1 MB 404 body and log line. Client
// values quoted in messages and logs are now clipped to 256 bytes of valid
// UTF-8 ending in "…".
func TestRegression_LongModelNameClipped(t *testing.T) {
	tests := []struct {
		name  string
		model string
	}{
		{"1 MB ASCII", strings.Repeat("a", 1<<20)},
		{"1 MB of 2-byte runes", strings.Repeat("é", 1<<19)},
		{"3-byte runes cut mid-rune", "x" + strings.Repeat("日", 200)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var logs syncBuffer
			logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
			// As the real gateway reports it: the model quoted in the error.
			env := newEnvLogging(t, Config{}, logger, func(_ context.Context, req contract.Request) (Run, error) {
				return nil, fmt.Errorf("%w: unknown model %q", ErrUnknownModel, req.Model)
			})
			resp := env.post(t, "/v1/chat/completions", "application/json",
				`{"model":"`+tt.model+`","messages":[{"role":"user","content":"x"}]}`)
			if resp.status != http.StatusNotFound {
				t.Fatalf("status = %d, want 404", resp.status)
			}
			msg, _, _, code := openAIError(t, resp.body)
			if str(code) != "model_not_found" {
				t.Errorf("code = %s", str(code))
			}
			want := fmt.Sprintf("The model %q does not exist", Clip(tt.model))
			if msg != want {
				t.Errorf("message = %q, want %q", msg, want)
			}
			if len(resp.body) > 1024 {
				t.Errorf("404 body is %d bytes", len(resp.body))
			}
			env.waitHandlers()
			for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
				if len(line) > 2*maxErrorTextBytes {
					t.Errorf("log line of %d bytes: %.300s…", len(line), line)
				}
				if !utf8.ValidString(line) {
					t.Errorf("log line is not valid UTF-8: %.300q", line)
				}
			}
			if !strings.Contains(logs.String(), "…") {
				t.Errorf("the log does not show a clipped model:\n%.2000s", logs.String())
			}
		})
	}

	t.Run("GET /v1/models/{model}", func(t *testing.T) {
		env := newEnv(t, Config{}, failWith(fmt.Errorf("unused")))
		resp := env.get(t, "/v1/models/"+strings.Repeat("b", 300<<10))
		if resp.status != http.StatusNotFound || len(resp.body) > 1024 {
			t.Fatalf("status %d, %d-byte body, want 404 and a short body", resp.status, len(resp.body))
		}
		if msg, _, _, _ := openAIError(t, resp.body); !strings.HasSuffix(msg, `…" does not exist`) {
			t.Errorf("message = %q", msg)
		}
	})

	// Other client values quoted in a 400: a number literal, a part type.
	checkRejected(t, []badChat{
		{"1 MB max_tokens literal", chatWith(`"max_tokens": 1` + strings.Repeat("0", 1<<20)), "max_tokens",
			", got 1" + strings.Repeat("0", request.MaxQuotedBytes-len("…")-1) + "…"},
		{"1 MB part type", `{"model":"m","messages":[{"role":"user","content":[{"type":"` + strings.Repeat("t", 1<<20) + `"}]}]}`,
			"messages[0].content[0].type", `"` + strings.Repeat("t", request.MaxQuotedBytes-len("…")) + `…" is not supported`},
	})
}

// Values a provider rejects only after the request waited in a queue (the
// node then answered 400 upstream_rejected with param null) are checked at
// the API, the same on every path.
func TestRegression_ProviderRejectedValuesCaughtAtAPI(t *testing.T) {
	msg := func(m string) string { return `,"messages":[` + m + `]}` }
	checkRejected(t, []badChat{
		{"stop a number", chatWith(`"stop": 5`), "stop", "stop: expected a string or an array of at most 4 strings, got a number"},
		{"stop five strings", chatWith(`"stop": ["a","b","c","d","e"]`), "stop", "at most 4 stop sequences are allowed, got 5"},
		{"stop array of numbers", chatWith(`"stop": ["a", 1]`), "stop[1]", "stop[1]: expected a string, got a number"},
		{"stop array with null", chatWith(`"stop": [null]`), "stop[0]", "expected a string, got null"},
		{"response_format a string", chatWith(`"response_format": "json"`), "response_format", "response_format: expected an object, got a string"},
		{"response_format unknown type", chatWith(`"response_format": {"type": "xml"}`), "response_format.type",
			`response_format.type: must be one of text, json_object, json_schema, got "xml"`},
		{"response_format no type", chatWith(`"response_format": {}`), "response_format.type", "must have a type"},
		{"response_format type a number", chatWith(`"response_format": {"type": 1}`), "response_format.type", "expected a string, got a number"},
		{"json_schema not an object", chatWith(`"response_format": {"type": "json_schema", "json_schema": "s"}`), "response_format.json_schema", "expected an object"},
		{"name a number", `{"model":"m"` + msg(`{"role":"user","name":5,"content":"x"}`), "messages[0].name", "messages[0].name: expected a string, got a number"},
		{"tool_calls a string", `{"model":"m"` + msg(`{"role":"user","content":"x"},{"role":"assistant","content":null,"tool_calls":"x"}`),
			"messages[1].tool_calls", "messages[1].tool_calls: expected an array, got a string"},
		{"tool_calls of strings", `{"model":"m"` + msg(`{"role":"assistant","tool_calls":["x"]}`), "messages[0].tool_calls[0]", "expected an object, got a string"},
		{"input_audio part", `{"model":"m"` + msg(`{"role":"user","content":[{"type":"text","text":"hi"},{"type":"input_audio","input_audio":{"data":"AAAA","format":"wav"}}]}`),
			"messages[0].content[1].type", `messages[0].content[1].type: content part type "input_audio" is not supported; use text or image_url`},
	})
	checkAccepted(t, map[string]string{
		"stop a string":      chatWith(`"stop": "\n"`),
		"stop four strings":  chatWith(`"stop": ["a","b","c","d"]`),
		"stop empty":         chatWith(`"stop": []`),
		"response_format":    chatWith(`"response_format": {"type": "json_object"}`),
		"json_schema":        chatWith(`"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}`),
		"text format":        chatWith(`"response_format": {"type": "text"}`),
		"name and tool_call": `{"model":"m"` + msg(`{"role":"user","name":"bob","content":"x"},{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}]},{"role":"tool","tool_call_id":"c1","content":"42"}`),
		"text and image":     `{"model":"m"` + msg(`{"role":"user","content":[{"type":"text","text":"what"},{"type":"image_url","image_url":{"url":"x"}}]}`),
	})
}

// rawExchange sends a chat request over a raw TCP connection. After the
// request, and after reading until the response holds readUntil (if not
// ""), it half-closes the connection (shutdown(SHUT_WR)); then it reads
// until the server closes it. It returns everything read.
func rawExchange(t *testing.T, env *testEnv, body, readUntil string, afterRequest func()) string {
	t.Helper()
	conn, err := net.Dial("tcp", env.srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
	req := fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: iop\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	if _, err := io.WriteString(conn, req); err != nil {
		t.Fatal(err)
	}
	afterRequest()
	var got []byte
	if readUntil != "" {
		r := bufio.NewReader(conn)
		for !bytes.Contains(got, []byte(readUntil)) {
			b, err := r.ReadByte()
			if err != nil {
				t.Fatalf("read %q, then %v; want it to contain %q", got, err, readUntil)
			}
			got = append(got, b)
		}
		if r.Buffered() > 0 {
			rest, _ := r.Peek(r.Buffered())
			got = append(got, rest...)
		}
	}
	if err := conn.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	rest, err := io.ReadAll(conn)
	if err != nil && !isConnReset(err) {
		t.Fatalf("reading after the half-close: %v (read %q)", err, got)
	}
	return string(append(got, rest...))
}

func isConnReset(err error) bool {
	return strings.Contains(err.Error(), "connection reset")
}

// A client that sent its request and half-closed its connection got
// "200 OK" with an empty body: net/http cancels the request's context when
// a read sees EOF, the handler wrote nothing, and net/http finished the
// exchange as a 200. Such a handler now aborts the connection, and a
// response cut short by the client's leaving is never ended cleanly.
func TestRegression_HalfCloseGetsNoEmpty200(t *testing.T) {
	const chat = `{"model":"m","messages":[{"role":"user","content":"x"}]}`
	const streamChat = `{"model":"m","stream":true,"messages":[{"role":"user","content":"x"}]}`

	t.Run("while queued", func(t *testing.T) {
		queued := make(chan struct{})
		env := newEnv(t, Config{}, func(ctx context.Context, _ contract.Request) (Run, error) {
			close(queued)
			<-ctx.Done()
			return nil, fmt.Errorf("%w: %w", ErrQueueTimeout, ctx.Err())
		})
		got := rawExchange(t, env, chat, "", func() { <-queued })
		if got != "" {
			t.Errorf("got %q, want the connection closed with nothing written", got)
		}
	})

	for _, tt := range []struct {
		name string
		path contract.Path
		body string
	}{
		{"dispatched, normalized", normalized, chat},
		{"dispatched, normalized stream", normalized, streamChat},
		{"dispatched, tunnel", tunnel, chat},
	} {
		t.Run(tt.name, func(t *testing.T) {
			run := liveRun(tt.path, 0)
			dispatched := make(chan struct{})
			env := newEnv(t, Config{}, func(context.Context, contract.Request) (Run, error) {
				close(dispatched)
				return run, nil
			})
			got := rawExchange(t, env, tt.body, "", func() { <-dispatched })
			if got != "" {
				t.Errorf("got %q, want the connection closed with nothing written", got)
			}
			env.waitHandlers()
			if n, reasons := run.closeCalls(); n != 1 || reasons[0] != contract.OutcomeClientGone {
				t.Errorf("Close called %d times with %q, want once with %q", n, reasons, contract.OutcomeClientGone)
			}
		})
	}

	// After the status line, a client that half-closes must not see the
	// chunked body end cleanly ("0\r\n\r\n").
	for _, tt := range []struct {
		name  string
		path  contract.Path
		body  string
		send  []*nodev1.RunUp
		until string
	}{
		{"tunnel JSON started", tunnel, chat,
			// The last byte waits for the end of the answer (finalHold).
			[]*nodev1.RunUp{tunnelHead(200, map[string]string{"Content-Type": "application/json"}), tunnelData(`{"id":"part`)}, `{"id":"par`},
		{"normalized stream started", normalized, streamChat,
			[]*nodev1.RunUp{events(delta("Hi"))}, `"content":"Hi"`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			run := liveRun(tt.path, len(tt.send))
			env := newEnv(t, Config{}, runWith(run))
			got := rawExchange(t, env, tt.body, tt.until, func() {
				for _, m := range tt.send {
					run.up <- m
				}
			})
			if !strings.HasPrefix(got, "HTTP/1.1 200 OK\r\n") {
				t.Fatalf("got %q, want a started 200", got)
			}
			if strings.HasSuffix(got, "\r\n0\r\n\r\n") || strings.Contains(got, "[DONE]") {
				t.Errorf("a response cut short by the client ended cleanly:\n%q", got)
			}
			env.waitHandlers()
			if n, reasons := run.closeCalls(); n != 1 || reasons[0] != contract.OutcomeClientGone {
				t.Errorf("Close called %d times with %q, want once with %q", n, reasons, contract.OutcomeClientGone)
			}
		})
	}

	// A request the API rejects before dispatch may be answered or not,
	// depending on whether the handler sees the half-close first; never
	// with an empty 200.
	t.Run("bad request", func(t *testing.T) {
		env := newEnv(t, Config{}, failWith(fmt.Errorf("must not dispatch")))
		got := rawExchange(t, env, `{"model":"m","n":0,"messages":[{"role":"user","content":"x"}]}`, "", func() {})
		if got != "" && !strings.HasPrefix(got, "HTTP/1.1 400 ") {
			t.Errorf("got %q, want nothing or a 400", got)
		}
	})
}

// "response_format": {"type": "json_schema"} without a usable json_schema
// was queued, then answered 400 upstream_rejected on the normalized path
// and 200 on the tunnel path.
func TestRegression_JSONSchemaWithoutSchemaRejected(t *testing.T) {
	checkRejected(t, []badChat{
		{"json_schema absent", chatWith(`"response_format":{"type":"json_schema"}`),
			"response_format.json_schema", "response_format.json_schema: required when the response format type is json_schema"},
		{"json_schema empty", chatWith(`"response_format":{"type":"json_schema","json_schema":{}}`),
			"response_format.json_schema.name", "response_format.json_schema.name: a json_schema response format must have a name"},
		{"name a number", chatWith(`"response_format":{"type":"json_schema","json_schema":{"name":1}}`),
			"response_format.json_schema.name", "expected a string, got a number"},
		{"schema a string", chatWith(`"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":"s"}}`),
			"response_format.json_schema.schema", "response_format.json_schema.schema: expected an object, got a string"},
	})
	checkAccepted(t, map[string]string{
		"name only":        chatWith(`"response_format":{"type":"json_schema","json_schema":{"name":"x"}}`),
		"name and schema":  chatWith(`"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{"type":"object"},"strict":true}}`),
		"json_object bare": chatWith(`"response_format":{"type":"json_object"}`),
	})
}

// A tool call whose function arguments were an object (OpenAI requires the
// JSON-encoded string) was queued and then rejected by the provider.
func TestRegression_ToolCallArgumentsObjectRejected(t *testing.T) {
	call := func(c string) string {
		return `{"model":"m","messages":[{"role":"user","content":"x"},{"role":"assistant","content":null,"tool_calls":[` + c + `]}]}`
	}
	checkRejected(t, []badChat{
		{"arguments an object", call(`{"id":"c1","type":"function","function":{"name":"f","arguments":{"a":1}}}`),
			"messages[1].tool_calls[0].function.arguments", "messages[1].tool_calls[0].function.arguments: expected a string, got an object"},
		{"type not function", call(`{"id":"c1","type":"retrieval","function":{"name":"f","arguments":"{}"}}`),
			"messages[1].tool_calls[0].type", `only function tool calls are supported, got "retrieval"`},
		{"no function", call(`{"id":"c1","type":"function"}`),
			"messages[1].tool_calls[0].function", "each tool call must have a function"},
		{"function a string", call(`{"id":"c1","type":"function","function":"f"}`),
			"messages[1].tool_calls[0].function", "expected an object, got a string"},
		{"no name", call(`{"id":"c1","type":"function","function":{"arguments":"{}"}}`),
			"messages[1].tool_calls[0].function.name", "each tool call function must have a name"},
		{"name a number", call(`{"id":"c1","type":"function","function":{"name":7,"arguments":"{}"}}`),
			"messages[1].tool_calls[0].function.name", "expected a string, got a number"},
		{"second call bad", call(`{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}},{"id":"c2","type":"function","function":{"name":"g","arguments":[]}}`),
			"messages[1].tool_calls[1].function.arguments", "expected a string, got an array"},
	})
}

// "role": "bogus" was queued and then rejected by the provider.
func TestRegression_UnknownRoleRejected(t *testing.T) {
	checkRejected(t, []badChat{
		{"bogus", `{"model":"m","messages":[{"role":"bogus","content":"x"}]}`,
			"messages[0].role", `messages[0].role: must be one of system, user, assistant, tool, developer, function, got "bogus"`},
		{"role a number", `{"model":"m","messages":[{"role":1,"content":"x"}]}`, "messages[0].role", "expected a string, got a number"},
	})
	bodies := map[string]string{}
	for _, role := range []string{"system", "user", "assistant", "tool", "developer", "function"} {
		bodies[role] = `{"model":"m","messages":[{"role":"` + role + `","name":"f","tool_call_id":"c1","content":"x"}]}`
	}
	checkAccepted(t, bodies)
}

// The input estimate counted only message content, so a long prompt carried
// in tool call arguments or tool definitions was not classified
// long-context.
func TestRegression_EstimateCountsToolCallsAndTools(t *testing.T) {
	args := strconv.Quote(`{"text":"` + strings.Repeat("a", 10_000) + `"}`)
	tests := []struct {
		name    string
		body    string
		wantMin int
	}{
		{"tool_calls arguments", `{"model":"m","messages":[{"role":"user","content":"x"},{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":` + args + `}}]},{"role":"tool","tool_call_id":"c1","content":"ok"}]}`, 2_500},
		{"tools definitions", `{"model":"m","tools":[{"type":"function","function":{"name":"f","description":"` + strings.Repeat("d", 10_000) + `"}}],"messages":[{"role":"user","content":"x"}]}`, 2_500},
		{"legacy functions", `{"model":"m","functions":[{"name":"f","description":"` + strings.Repeat("d", 10_000) + `"}],"messages":[{"role":"user","content":"x"}]}`, 2_500},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := newEnv(t, Config{}, runWith(scriptedRun(normalized, events(complete("stop")))))
			if resp := env.post(t, "/v1/chat/completions", "application/json", tt.body); resp.status != http.StatusOK {
				t.Fatalf("status = %d (%s)", resp.status, resp.body)
			}
			if est := env.gw.requests()[0].EstimatedInputTokens; est < tt.wantMin || est > len(tt.body) {
				t.Errorf("EstimatedInputTokens = %d, want at least %d (body %d bytes)", est, tt.wantMin, len(tt.body))
			}
		})
	}
}
