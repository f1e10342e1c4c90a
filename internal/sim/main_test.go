package sim

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"iop/internal/clock"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// fakeClock is a clock.Fake that records every wait the server asks for.
// With hold set, each wait is announced on waiting and elapses only when
// the test calls Advance; otherwise it elapses at once.
type fakeClock struct {
	*clock.Fake
	hold    bool
	waiting chan time.Duration // announces held waits; buffered

	mu    sync.Mutex // guards waits
	waits []time.Duration
}

func newFakeClock(hold bool) *fakeClock {
	return &fakeClock{
		Fake:    clock.NewFake(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)),
		hold:    hold,
		waiting: make(chan time.Duration, 100),
	}
}

func (c *fakeClock) AfterFunc(d time.Duration, f func()) clock.Timer {
	t := c.Fake.AfterFunc(d, f)
	c.mu.Lock()
	c.waits = append(c.waits, d)
	c.mu.Unlock()
	if c.hold {
		c.waiting <- d
	} else {
		c.Advance(d)
	}
	return t
}

func (c *fakeClock) waited() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]time.Duration(nil), c.waits...)
}

// startSim starts a simulator for cfg on a free local port, stopped when
// the test ends. Its trace events are delivered on the returned channel.
func startSim(t *testing.T, cfg Config) (s *Server, url string, events <-chan string) {
	t.Helper()
	s, err := New(cfg, nil)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	ev := make(chan string, 1000)
	s.trace = func(e string) { ev <- e }
	url, stop, err := s.Start("")
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(stop)
	return s, url, ev
}

// waitEvent blocks until the server traces want.
func waitEvent(t *testing.T, events <-chan string, want string) {
	t.Helper()
	for e := range events {
		if e == want {
			return
		}
	}
}

// newClient returns an HTTP client whose idle connections are closed when
// the test ends, so goleak sees no stray goroutines.
func newClient(t *testing.T) *http.Client {
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

// post sends body (marshalled to JSON unless already []byte) to url.
func post(ctx context.Context, t *testing.T, c *http.Client, url string, body any, header ...string) (*http.Response, error) {
	t.Helper()
	raw, ok := body.([]byte)
	if !ok {
		var err error
		if raw, err = json.Marshal(body); err != nil {
			t.Fatal(err)
		}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	return c.Do(req)
}

// mustPost is post that fails the test on a transport error.
func mustPost(t *testing.T, c *http.Client, url string, body any, header ...string) *http.Response {
	t.Helper()
	resp, err := post(context.Background(), t, c, url, body, header...)
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// readSSE returns the data payloads of a Server-Sent Events body, and the
// read error that ended it (nil at a clean EOF).
func readSSE(body io.Reader) (data []string, err error) {
	sc := bufio.NewScanner(body)
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		payload, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			return data, &shapeError{"SSE line without data: " + line}
		}
		data = append(data, payload)
	}
	return data, sc.Err()
}

// readNDJSON returns the lines of an NDJSON body and the read error that
// ended it (nil at a clean EOF).
func readNDJSON(body io.Reader) (lines []string, err error) {
	sc := bufio.NewScanner(body)
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	return lines, sc.Err()
}

type shapeError struct{ msg string }

func (e *shapeError) Error() string { return e.msg }

// result is what a test reads back from one generation, in any protocol.
type result struct {
	text             string
	chunks           int    // token chunks of a stream
	finish           string // finish_reason / done_reason
	complete         bool   // saw the end of the answer (done:true or [DONE])
	promptTokens     int
	completionTokens int
	readErr          error
}

// endpoint drives one generation route of one protocol.
type endpoint struct {
	name     string
	protocol Protocol
	path     string
	// body builds a request; limit 0 means none.
	body func(model, prompt string, stream bool, limit int) map[string]any
	// read parses a 200 response, reporting shape violations on t.
	read func(t *testing.T, resp *http.Response, stream bool) result
}

var endpoints = []endpoint{
	{
		name: "ollama chat", protocol: ProtocolOllama, path: "/api/chat",
		body: func(model, prompt string, stream bool, limit int) map[string]any {
			b := map[string]any{"model": model, "stream": stream,
				"messages": []map[string]any{{"role": "user", "content": prompt}}}
			if limit > 0 {
				b["options"] = map[string]any{"num_predict": limit, "temperature": 0.2}
			}
			return b
		},
		read: func(t *testing.T, resp *http.Response, stream bool) result { return readOllama(t, resp, stream, true) },
	},
	{
		name: "ollama generate", protocol: ProtocolOllama, path: "/api/generate",
		body: func(model, prompt string, stream bool, limit int) map[string]any {
			b := map[string]any{"model": model, "stream": stream, "prompt": prompt}
			if limit > 0 {
				b["options"] = map[string]any{"num_predict": limit}
			}
			return b
		},
		read: func(t *testing.T, resp *http.Response, stream bool) result { return readOllama(t, resp, stream, false) },
	},
	{
		name: "openai chat", protocol: ProtocolOpenAI, path: "/v1/chat/completions",
		body: func(model, prompt string, stream bool, limit int) map[string]any {
			b := map[string]any{"model": model, "stream": stream,
				"messages": []map[string]any{{"role": "system", "content": nil}, {"role": "user", "content": prompt}}}
			if stream {
				b["stream_options"] = map[string]any{"include_usage": true}
			}
			if limit > 0 {
				b["max_completion_tokens"] = limit
			}
			return b
		},
		read: func(t *testing.T, resp *http.Response, stream bool) result { return readOpenAI(t, resp, stream, true) },
	},
	{
		name: "openai completions", protocol: ProtocolOpenAI, path: "/completions",
		body: func(model, prompt string, stream bool, limit int) map[string]any {
			b := map[string]any{"model": model, "stream": stream, "prompt": prompt}
			if stream {
				b["stream_options"] = map[string]any{"include_usage": true}
			}
			if limit > 0 {
				b["max_tokens"] = limit
			}
			return b
		},
		read: func(t *testing.T, resp *http.Response, stream bool) result { return readOpenAI(t, resp, stream, false) },
	},
}

// ollamaLine is one NDJSON line or whole answer of /api/chat, /api/generate.
type ollamaLine struct {
	Model     string `json:"model"`
	CreatedAt string `json:"created_at"`
	Message   *struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	} `json:"message"`
	Response        *string `json:"response"`
	Done            bool    `json:"done"`
	DoneReason      string  `json:"done_reason"`
	TotalDuration   int64   `json:"total_duration"`
	PromptEvalCount int     `json:"prompt_eval_count"`
	EvalCount       int     `json:"eval_count"`
	EvalDuration    int64   `json:"eval_duration"`
}

func readOllama(t *testing.T, resp *http.Response, stream, chat bool) result {
	t.Helper()
	var lines []string
	var res result
	if stream {
		if ct := resp.Header.Get("Content-Type"); ct != "application/x-ndjson" {
			t.Errorf("Content-Type = %q, want application/x-ndjson", ct)
		}
		lines, res.readErr = readNDJSON(resp.Body)
	} else {
		b, err := io.ReadAll(resp.Body)
		res.readErr = err
		lines = []string{string(b)}
	}
	for i, raw := range lines {
		var l ollamaLine
		if err := json.Unmarshal([]byte(raw), &l); err != nil {
			t.Fatalf("line %d %q: %v", i, raw, err)
		}
		if l.Model == "" || l.CreatedAt == "" {
			t.Errorf("line %d lacks model or created_at: %s", i, raw)
		}
		if _, err := time.Parse(time.RFC3339Nano, l.CreatedAt); err != nil {
			t.Errorf("line %d created_at: %v", i, err)
		}
		var content string
		switch {
		case chat && l.Message != nil:
			content = l.Message.Content
			if l.Message.Role != "assistant" {
				t.Errorf("line %d role = %q", i, l.Message.Role)
			}
		case !chat && l.Response != nil:
			content = *l.Response
		default:
			t.Errorf("line %d lacks message/response: %s", i, raw)
		}
		res.text += content
		if res.complete {
			t.Errorf("line %d after done:true", i)
		}
		if !l.Done {
			res.chunks++
			continue
		}
		res.complete = true
		res.finish = l.DoneReason
		res.promptTokens, res.completionTokens = l.PromptEvalCount, l.EvalCount
		if l.TotalDuration <= 0 || l.EvalDuration <= 0 {
			t.Errorf("final line lacks durations: %s", raw)
		}
		if stream && content != "" {
			t.Errorf("final stream line has content %q", content)
		}
	}
	return res
}

// openaiObject is a chat.completion(.chunk) or text_completion object.
type openaiObject struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	Model   string `json:"model"`
	Choices []struct {
		Index   int `json:"index"`
		Message *struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"message"`
		Delta *struct {
			Role    string  `json:"role"`
			Content *string `json:"content"`
		} `json:"delta"`
		Text         *string `json:"text"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *openaiUsage `json:"usage"`
}

func readOpenAI(t *testing.T, resp *http.Response, stream, chat bool) result {
	t.Helper()
	wantObject := map[[2]bool]string{
		{true, false}: "chat.completion", {true, true}: "chat.completion.chunk",
		{false, false}: "text_completion", {false, true}: "text_completion",
	}[[2]bool{chat, stream}]
	var res result
	var payloads []string
	if stream {
		if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
			t.Errorf("Content-Type = %q, want text/event-stream", ct)
		}
		payloads, res.readErr = readSSE(resp.Body)
	} else {
		b, err := io.ReadAll(resp.Body)
		res.readErr = err
		payloads = []string{string(b)}
	}
	for i, raw := range payloads {
		if res.complete {
			t.Errorf("event %d after [DONE]", i)
		}
		if raw == "[DONE]" {
			if !stream {
				t.Errorf("[DONE] in a non-streamed answer")
			}
			res.complete = true
			continue
		}
		var o openaiObject
		if err := json.Unmarshal([]byte(raw), &o); err != nil {
			t.Fatalf("event %d %q: %v", i, raw, err)
		}
		if o.ID == "" || o.Object != wantObject || o.Created == 0 || o.Model == "" {
			t.Errorf("event %d: bad id/object/created/model (want object %q): %s", i, wantObject, raw)
		}
		if o.Usage != nil {
			res.promptTokens, res.completionTokens = o.Usage.PromptTokens, o.Usage.CompletionTokens
			if o.Usage.TotalTokens != o.Usage.PromptTokens+o.Usage.CompletionTokens {
				t.Errorf("event %d: usage total mismatch: %s", i, raw)
			}
			if stream && len(o.Choices) != 0 {
				t.Errorf("usage chunk has choices: %s", raw)
			}
		}
		if len(o.Choices) == 0 {
			continue
		}
		ch := o.Choices[0]
		if len(o.Choices) != 1 || ch.Index != 0 {
			t.Errorf("event %d: want one choice with index 0: %s", i, raw)
		}
		var content string
		switch {
		case !chat && ch.Text != nil:
			content = *ch.Text
		case chat && !stream && ch.Message != nil:
			content = ch.Message.Content
			if ch.Message.Role != "assistant" {
				t.Errorf("message role = %q", ch.Message.Role)
			}
		case chat && stream && ch.Delta != nil:
			if ch.Delta.Content != nil {
				content = *ch.Delta.Content
			}
			if (i == 0) != (ch.Delta.Role == "assistant") {
				t.Errorf("event %d: delta.role = %q; want assistant on the first chunk only", i, ch.Delta.Role)
			}
		case chat && stream && ch.Delta == nil:
			t.Errorf("event %d lacks delta: %s", i, raw)
		default:
			t.Errorf("event %d lacks text/message: %s", i, raw)
		}
		res.text += content
		if ch.FinishReason != nil {
			res.finish = *ch.FinishReason
			if !stream {
				res.complete = true
			}
		} else if content != "" {
			res.chunks++
		}
	}
	return res
}

// errorBody checks that resp carries status and an error body in the
// protocol's shape.
func checkErrorBody(t *testing.T, p Protocol, resp *http.Response, status int) {
	t.Helper()
	if resp.StatusCode != status {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("status = %d, want %d (body %s)", resp.StatusCode, status, b)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Errorf("error Content-Type = %q", ct)
	}
	var body map[string]json.RawMessage
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatalf("error body: %v", err)
	}
	switch p {
	case ProtocolOllama:
		var msg string
		if err := json.Unmarshal(body["error"], &msg); err != nil || msg == "" {
			t.Errorf(`want {"error": "<message>"}, got %v`, body)
		}
	case ProtocolOpenAI:
		var e map[string]json.RawMessage
		if err := json.Unmarshal(body["error"], &e); err != nil {
			t.Fatalf(`want {"error": {...}}: %v`, err)
		}
		for _, k := range []string{"message", "type", "param", "code"} {
			if _, ok := e[k]; !ok {
				t.Errorf("error lacks %q: %s", k, body["error"])
			}
		}
		var msg string
		if json.Unmarshal(e["message"], &msg); msg == "" {
			t.Errorf("error message empty")
		}
	}
}
