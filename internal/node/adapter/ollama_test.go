package adapter

import (
	"context"
	"errors"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"iop/internal/wire/nodev1"
)

const (
	tStarted  = nodev1.RunEvent_TYPE_STARTED
	tDelta    = nodev1.RunEvent_TYPE_DELTA
	tUsage    = nodev1.RunEvent_TYPE_USAGE
	tComplete = nodev1.RunEvent_TYPE_COMPLETE
)

func newOllama(t *testing.T, cfg Config) *Ollama {
	t.Helper()
	o, err := NewOllama(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(o.Close)
	return o
}

// ollamaChat answers /api/chat with the given NDJSON lines.
func ollamaLines(lines ...string) func(http.ResponseWriter, *http.Request) {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		flushLines(w, lines...)
	}
}

func chatReq(body string) Request {
	return Request{Op: nodev1.Operation_OPERATION_CHAT, Stream: true, ServedModel: "llama3.2:3b", Body: []byte(body)}
}

func TestOllamaChatTranslatesRequest(t *testing.T) {
	up := newUpstream(t, ollamaLines(
		`{"model":"llama3.2:3b","message":{"role":"assistant","content":"Hel"},"done":false}`,
		`{"model":"llama3.2:3b","message":{"role":"assistant","content":"lo"},"done":false}`,
		`{"model":"llama3.2:3b","message":{"role":"assistant","content":""},"done":true,"done_reason":"stop","prompt_eval_count":12,"eval_count":2}`,
	))
	o := newOllama(t, Config{BaseURL: up.URL + "/", APIKey: "sk-ollama"})
	body := `{"model":"alias","stream":true,
		"messages":[
			{"role":"system","content":"be brief"},
			{"role":"user","content":[{"type":"text","text":"what is"},{"type":"text","text":"this?"},
				{"type":"image_url","image_url":{"url":"data:image/png;base64,iVBORw0KGgo="}},
				{"type":"image_url","image_url":"data:image/jpeg;base64,/9j/4AAQ"}]},
			{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},
			{"role":"tool","tool_call_id":"call_1","content":"sunny"}],
		"max_tokens":50,"max_completion_tokens":40,"temperature":0,"top_p":0.9,"stop":"\n\n","seed":7,
		"frequency_penalty":0.5,"presence_penalty":0.25,
		"response_format":{"type":"json_object"},
		"tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}}]}`
	rec := &eventRec{}
	if err := o.Normalize(context.Background(), chatReq(body), rec); err != nil {
		t.Fatalf("Normalize: %v", err)
	}

	path, header, sent := up.request()
	if path != "/api/chat" {
		t.Errorf("path %q, want /api/chat", path)
	}
	if got := header.Get("Authorization"); got != "Bearer sk-ollama" {
		t.Errorf("Authorization %q", got)
	}
	if got := header.Get("Content-Type"); got != "application/json" {
		t.Errorf("Content-Type %q", got)
	}
	jsonEqual(t, sent, `{"model":"llama3.2:3b","stream":true,
		"messages":[
			{"role":"system","content":"be brief"},
			{"role":"user","content":"what is\nthis?","images":["iVBORw0KGgo=","/9j/4AAQ"]},
			{"role":"assistant","content":"","tool_calls":[{"function":{"name":"get_weather","arguments":{"city":"Paris"}}}]},
			{"role":"tool","content":"sunny","tool_name":"get_weather"}],
		"options":{"num_predict":40,"temperature":0,"top_p":0.9,"seed":7,"frequency_penalty":0.5,"presence_penalty":0.25},
		"format":"json",
		"tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}}]}`)

	if got, want := rec.types(), []nodev1.RunEvent_Type{tStarted, tDelta, tDelta, tUsage, tComplete}; !slices.Equal(got, want) {
		t.Fatalf("events %v, want %v", got, want)
	}
	if rec.text() != "Hello" {
		t.Errorf("text %q", rec.text())
	}
	if u := rec.last(tUsage); u.PromptTokens != 12 || u.CompletionTokens != 2 {
		t.Errorf("usage %v", u)
	}
	if c := rec.last(tComplete); c.FinishReason != "stop" {
		t.Errorf("finish %q", c.FinishReason)
	}
}

func TestOllamaCompletionAndFinishReasons(t *testing.T) {
	for _, tc := range []struct {
		doneReason, want string
	}{
		{`"length"`, "length"},
		{`"stop"`, "stop"},
		{`null`, "stop"},
		{`"load"`, "stop"},
	} {
		t.Run(tc.doneReason, func(t *testing.T) {
			up := newUpstream(t, ollamaLines(
				`{"model":"m","response":"The","done":false}`,
				``,
				`{"model":"m","response":" sky","done":false}`,
				`{"model":"m","response":"","done":true,"done_reason":`+tc.doneReason+`,"prompt_eval_count":3,"eval_count":2,"context":[1,2]}`,
			))
			o := newOllama(t, Config{BaseURL: up.URL})
			rec := &eventRec{}
			req := Request{Op: nodev1.Operation_OPERATION_COMPLETION, ServedModel: "m",
				Body: []byte(`{"model":"x","prompt":["Why is the sky blue?"],"suffix":"!","max_tokens":7,"temperature":0.5}`)}
			if err := o.Normalize(context.Background(), req, rec); err != nil {
				t.Fatal(err)
			}
			path, header, sent := up.request()
			if path != "/api/generate" {
				t.Errorf("path %q", path)
			}
			if header.Get("Authorization") != "" {
				t.Errorf("Authorization sent without a key")
			}
			jsonEqual(t, sent, `{"model":"m","prompt":"Why is the sky blue?","suffix":"!","stream":true,"options":{"num_predict":7,"temperature":0.5}}`)
			if got, want := rec.types(), []nodev1.RunEvent_Type{tStarted, tDelta, tDelta, tUsage, tComplete}; !slices.Equal(got, want) {
				t.Fatalf("events %v, want %v", got, want)
			}
			if rec.text() != "The sky" {
				t.Errorf("text %q", rec.text())
			}
			if c := rec.last(tComplete); c.FinishReason != tc.want {
				t.Errorf("finish %q, want %q", c.FinishReason, tc.want)
			}
			if u := rec.last(tUsage); u.PromptTokens != 3 || u.CompletionTokens != 2 {
				t.Errorf("usage %v", u)
			}
		})
	}
}

func TestOllamaDoneLineWithContent(t *testing.T) {
	up := newUpstream(t, ollamaLines(`{"message":{"role":"assistant","content":"all at once"},"done":true,"done_reason":"stop","prompt_eval_count":1,"eval_count":3}`))
	o := newOllama(t, Config{BaseURL: up.URL})
	rec := &eventRec{}
	if err := o.Normalize(context.Background(), chatReq(`{"messages":[{"role":"user","content":"x"}]}`), rec); err != nil {
		t.Fatal(err)
	}
	if got, want := rec.types(), []nodev1.RunEvent_Type{tStarted, tDelta, tUsage, tComplete}; !slices.Equal(got, want) {
		t.Fatalf("events %v, want %v", got, want)
	}
	if rec.text() != "all at once" {
		t.Errorf("text %q", rec.text())
	}
}

// TestOllamaThinkingStreamsAsItComes: a thinking model's lines
// (message.thinking before any content) become DELTA events with Thinking,
// each sent as its line arrives, before the answer's text starts.
func TestOllamaThinkingStreamsAsItComes(t *testing.T) {
	release := make(chan struct{})
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		flushLines(w, `{"message":{"role":"assistant","content":"","thinking":"Let me"},"done":false}`,
			`{"message":{"role":"assistant","content":"","thinking":" think."},"done":false}`)
		<-release
		flushLines(w, `{"message":{"role":"assistant","content":"Hi"},"done":false}`,
			`{"message":{"role":"assistant","content":""},"done":true,"done_reason":"stop","prompt_eval_count":1,"eval_count":3}`)
	})
	o := newOllama(t, Config{BaseURL: up.URL})
	thinking := make(chan string, 4)
	rec := &eventRec{onSend: func(events []*nodev1.RunEvent) error {
		for _, e := range events {
			if e.GetThinking() != "" {
				thinking <- e.GetThinking()
			}
		}
		return nil
	}}
	done := make(chan error, 1)
	go func() {
		done <- o.Normalize(context.Background(), chatReq(`{"messages":[{"role":"user","content":"x"}],"reasoning_effort":"high"}`), rec)
	}()
	// Both thinking deltas arrive while the provider holds back its text.
	if got := <-thinking + <-thinking; got != "Let me think." {
		t.Fatalf("thinking %q", got)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if rec.text() != "Hi" {
		t.Fatalf("text %q", rec.text())
	}
	if _, _, sent := up.request(); !strings.Contains(string(sent), `"think":"high"`) {
		t.Fatalf("the provider was sent %s, want think high", sent)
	}
}

func TestOllamaEmbeddings(t *testing.T) {
	for _, tc := range []struct {
		name, input, sentInput string
		vectors                string
		n                      int
	}{
		{"string", `"hello"`, `["hello"]`, `[[0.5,-1]]`, 1},
		{"array", `["a","b"]`, `["a","b"]`, `[[1,2],[3,4]]`, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
				io.WriteString(w, `{"model":"e","embeddings":`+tc.vectors+`,"total_duration":1,"prompt_eval_count":4}`)
			})
			o := newOllama(t, Config{BaseURL: up.URL})
			rec := &eventRec{}
			req := Request{Op: nodev1.Operation_OPERATION_EMBEDDINGS, ServedModel: "nomic-embed-text",
				Body: []byte(`{"model":"x","input":` + tc.input + `,"dimensions":2,"encoding_format":"float"}`)}
			if err := o.Normalize(context.Background(), req, rec); err != nil {
				t.Fatal(err)
			}
			path, _, sent := up.request()
			if path != "/api/embed" {
				t.Errorf("path %q", path)
			}
			jsonEqual(t, sent, `{"model":"nomic-embed-text","input":`+tc.sentInput+`,"dimensions":2}`)
			if got, want := rec.types(), []nodev1.RunEvent_Type{tStarted, tDelta, tUsage, tComplete}; !slices.Equal(got, want) {
				t.Fatalf("events %v, want %v", got, want)
			}
			d := rec.last(tDelta)
			if len(d.Embeddings) != tc.n || len(d.Embeddings[0].Values) != 2 {
				t.Fatalf("embeddings %v", d.Embeddings)
			}
			if rec.last(tUsage).PromptTokens != 4 || rec.last(tComplete).FinishReason != "stop" {
				t.Errorf("usage/complete %v %v", rec.last(tUsage), rec.last(tComplete))
			}
		})
	}
}

func TestOllamaEmbeddingsSplitIntoBoundedDeltas(t *testing.T) {
	const vec = "[0.1,0.2,0.3]"
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `{"embeddings":[`+vec+`,`+vec+`,`+vec+`],"prompt_eval_count":3}`)
	})
	o := newOllama(t, Config{BaseURL: up.URL})
	o.deltaFloats = 6 // two vectors per DELTA
	rec := &eventRec{}
	req := Request{Op: nodev1.Operation_OPERATION_EMBEDDINGS, ServedModel: "e", Body: []byte(`{"input":["a","b","c"]}`)}
	if err := o.Normalize(context.Background(), req, rec); err != nil {
		t.Fatal(err)
	}
	if got, want := rec.types(), []nodev1.RunEvent_Type{tStarted, tDelta, tDelta, tUsage, tComplete}; !slices.Equal(got, want) {
		t.Fatalf("events %v, want %v", got, want)
	}
	total := 0
	for _, e := range rec.events {
		total += len(e.Embeddings)
	}
	if total != 3 {
		t.Errorf("%d vectors, want 3", total)
	}
}

// testMaxLine is the stream line limit TestOllamaErrors sets.
const testMaxLine = 4096

func TestOllamaErrors(t *testing.T) {
	for _, tc := range []struct {
		name       string
		handler    func(w http.ResponseWriter, r *http.Request)
		kind       error
		status     int
		message    string
		wantEvents []nodev1.RunEvent_Type
	}{
		{
			name: "500 with JSON error",
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(500)
				io.WriteString(w, `{"error":"llama runner process has terminated"}`)
			},
			kind: ErrProviderStatus, status: 500, message: "llama runner process has terminated",
		},
		{
			name: "404 unknown model",
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(404)
				io.WriteString(w, `{"error":"model \"llama3.2:3b\" not found, try pulling it first"}`)
			},
			kind: ErrProviderStatus, status: 404, message: `model "llama3.2:3b" not found, try pulling it first`,
		},
		{
			name: "502 without a JSON body",
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(502)
				io.WriteString(w, `<html>bad gateway</html>`)
			},
			kind: ErrProviderStatus, status: 502, message: "bad gateway",
		},
		{
			name: "503 with a plain-text body",
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/plain")
				w.WriteHeader(503)
				io.WriteString(w, "upstream connect error or disconnect/reset before headers\n")
			},
			kind: ErrProviderStatus, status: 503, message: "upstream connect error or disconnect/reset before headers",
		},
		{
			name: "500 with a long plain-text body, clipped",
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(500)
				io.WriteString(w, strings.Repeat("é", 2000))
			},
			kind: ErrProviderStatus, status: 500, message: strings.Repeat("é", (maxFallbackMessage-len("…"))/2) + "…",
		},
		{
			name: "500 with an empty body",
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(500)
			},
			kind: ErrProviderStatus, status: 500, message: "provider answered 500 Internal Server Error",
		},
		{
			name: "200 whose first line is an error object",
			handler: ollamaLines(
				`{"error":"llama runner process has terminated: exit status 2"}`),
			kind: ErrProviderError, status: 502, message: "llama runner process has terminated: exit status 2",
		},
		{
			name: "200 whose whole JSON body is an error object",
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				io.WriteString(w, `{"error":{"message":"no healthy upstream","code":503}}`)
			},
			kind: ErrProviderError, status: 502, message: "no healthy upstream",
		},
		{
			name: "error line mid-stream",
			handler: ollamaLines(
				`{"message":{"role":"assistant","content":"a"},"done":false}`,
				`{"error":"an error was encountered while running the model: out of memory"}`),
			kind: ErrProviderStream, status: 502, message: "an error was encountered while running the model: out of memory",
			wantEvents: []nodev1.RunEvent_Type{tStarted, tDelta},
		},
		{
			name:    "stream ends before done",
			handler: ollamaLines(`{"message":{"role":"assistant","content":"a"},"done":false}`),
			kind:    ErrProviderStream, status: 502, message: "provider closed stream before done",
			wantEvents: []nodev1.RunEvent_Type{tStarted, tDelta},
		},
		{
			name: "connection dropped mid-stream",
			handler: func(w http.ResponseWriter, r *http.Request) {
				flushLines(w, `{"message":{"role":"assistant","content":"a"},"done":false}`)
				panic(http.ErrAbortHandler)
			},
			kind: ErrProviderStream, status: 502, message: "provider stream broken: connection closed",
			wantEvents: []nodev1.RunEvent_Type{tStarted, tDelta},
		},
		{
			name:    "malformed line",
			handler: ollamaLines(`not json`),
			kind:    ErrProviderStream, status: 502, message: "provider sent a malformed stream line",
		},
		{
			name:    "line over the limit",
			handler: ollamaLines(`{"response":"` + strings.Repeat("x", testMaxLine) + `"}`),
			kind:    ErrProviderStream, status: 502, message: "provider sent a stream line over 4096 bytes",
		},
		{
			name:    "200 that ends before any line",
			handler: ollamaLines(),
			kind:    ErrProviderStream, status: 502, message: "provider closed stream before done",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := newUpstream(t, tc.handler)
			o := newOllama(t, Config{BaseURL: up.URL})
			o.maxLine = testMaxLine
			rec := &eventRec{}
			err := o.Normalize(context.Background(), chatReq(`{"messages":[{"role":"user","content":"x"}]}`), rec)
			e := asError(t, err)
			if !errors.Is(err, tc.kind) || e.Status != tc.status || e.Message != tc.message {
				t.Errorf("got %+v, want kind %v status %d message %q", e, tc.kind, tc.status, tc.message)
			}
			if got := rec.types(); !slices.Equal(got, tc.wantEvents) {
				t.Errorf("events %v, want %v", got, tc.wantEvents)
			}
		})
	}
}

func TestOllamaErrorRedactsSecrets(t *testing.T) {
	var base string
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(401)
		io.WriteString(w, `{"error":"key sk-secret-123 rejected by `+base+`/api/chat"}`)
	})
	base = up.URL
	o := newOllama(t, Config{BaseURL: up.URL, APIKey: "sk-secret-123"})
	err := o.Normalize(context.Background(), chatReq(`{"messages":[{"role":"user","content":"x"}]}`), &eventRec{})
	e := asError(t, err)
	if strings.Contains(e.Message, "sk-secret-123") || strings.Contains(e.Message, up.Listener.Addr().String()) {
		t.Errorf("message leaks a secret: %q", e.Message)
	}
	if e.Status != 401 {
		t.Errorf("status %d", e.Status)
	}
}

func TestOllamaConnectionRefused(t *testing.T) {
	base := refusedURL(t)
	o := newOllama(t, Config{BaseURL: base})
	rec := &eventRec{}
	err := o.Normalize(context.Background(), chatReq(`{"messages":[{"role":"user","content":"x"}]}`), rec)
	e := asError(t, err)
	if !errors.Is(err, ErrProviderUnreachable) || e.Status != 502 {
		t.Errorf("got %+v", e)
	}
	if strings.Contains(err.Error(), strings.TrimPrefix(base, "http://")) {
		t.Errorf("error leaks the provider address: %v", err)
	}
	if len(rec.types()) != 0 {
		t.Errorf("events %v before the provider answered", rec.types())
	}
}

func TestOllamaTimeout(t *testing.T) {
	for _, tc := range []struct {
		name       string
		firstLine  bool
		wantEvents []nodev1.RunEvent_Type
	}{
		{"before head", false, nil},
		{"mid-stream", true, []nodev1.RunEvent_Type{tStarted, tDelta}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
				if tc.firstLine {
					flushLines(w, `{"message":{"role":"assistant","content":"a"},"done":false}`)
				}
				<-r.Context().Done()
			})
			o := newOllama(t, Config{BaseURL: up.URL, Timeout: 20 * time.Millisecond})
			rec := &eventRec{}
			err := o.Normalize(context.Background(), chatReq(`{"messages":[{"role":"user","content":"x"}]}`), rec)
			e := asError(t, err)
			if !errors.Is(err, ErrProviderTimeout) || e.Status != 504 {
				t.Errorf("got %+v", e)
			}
			if got := rec.types(); !slices.Equal(got, tc.wantEvents) {
				t.Errorf("events %v, want %v", got, tc.wantEvents)
			}
		})
	}
}

// TestOllamaCancelAbortsUpstream: cancelling the run's context ends
// Normalize with ErrCancelled and the provider sees its request end.
func TestOllamaCancelAbortsUpstream(t *testing.T) {
	gone := make(chan struct{})
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		flushLines(w, `{"message":{"role":"assistant","content":"a"},"done":false}`)
		<-r.Context().Done()
		close(gone)
	})
	o := newOllama(t, Config{BaseURL: up.URL})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	rec := &eventRec{onSend: func(events []*nodev1.RunEvent) error {
		if slices.ContainsFunc(events, func(e *nodev1.RunEvent) bool { return e.Type == tDelta }) {
			cancel()
		}
		return nil
	}}
	err := o.Normalize(ctx, chatReq(`{"messages":[{"role":"user","content":"x"}]}`), rec)
	if !errors.Is(err, ErrCancelled) {
		t.Fatalf("err %v, want ErrCancelled", err)
	}
	<-gone
}

func TestOllamaSinkFailureAbortsUpstream(t *testing.T) {
	gone := make(chan struct{})
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		flushLines(w, `{"message":{"role":"assistant","content":"a"},"done":false}`)
		<-r.Context().Done()
		close(gone)
	})
	o := newOllama(t, Config{BaseURL: up.URL})
	broken := errors.New("stream gone")
	rec := &eventRec{onSend: func(events []*nodev1.RunEvent) error {
		if slices.ContainsFunc(events, func(e *nodev1.RunEvent) bool { return e.Type == tDelta }) {
			return broken
		}
		return nil
	}}
	err := o.Normalize(context.Background(), chatReq(`{"messages":[{"role":"user","content":"x"}]}`), rec)
	if !errors.Is(err, ErrSink) || !errors.Is(err, broken) {
		t.Fatalf("err %v, want ErrSink wrapping the sink's error", err)
	}
	<-gone
}

func TestOllamaBadRequests(t *testing.T) {
	for _, tc := range []struct {
		name string
		op   nodev1.Operation
		body string
	}{
		{"not json", nodev1.Operation_OPERATION_CHAT, `{`},
		{"no messages", nodev1.Operation_OPERATION_CHAT, `{"messages":[]}`},
		{"remote image", nodev1.Operation_OPERATION_CHAT, `{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"https://example.com/a.png"}}]}]}`},
		{"audio part", nodev1.Operation_OPERATION_CHAT, `{"messages":[{"role":"user","content":[{"type":"input_audio"}]}]}`},
		{"bad tool arguments", nodev1.Operation_OPERATION_CHAT, `{"messages":[{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":"{"}}]}]}`},
		{"bad stop", nodev1.Operation_OPERATION_CHAT, `{"messages":[{"role":"user","content":"x"}],"stop":3}`},
		{"two prompts", nodev1.Operation_OPERATION_COMPLETION, `{"prompt":["a","b"]}`},
		{"token prompt", nodev1.Operation_OPERATION_COMPLETION, `{"prompt":[1,2,3]}`},
		{"token input", nodev1.Operation_OPERATION_EMBEDDINGS, `{"input":[[1,2]]}`},
		{"no operation", nodev1.Operation_OPERATION_UNSPECIFIED, `{}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var hit atomic.Bool
			up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) { hit.Store(true) })
			o := newOllama(t, Config{BaseURL: up.URL})
			err := o.Normalize(context.Background(), Request{Op: tc.op, ServedModel: "m", Body: []byte(tc.body)}, &eventRec{})
			e := asError(t, err)
			if !errors.Is(err, ErrBadRequest) || e.Status != 400 {
				t.Errorf("got %+v", e)
			}
			if hit.Load() {
				t.Error("provider was called")
			}
		})
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	for _, cfg := range []Config{
		{BaseURL: ""},
		{BaseURL: "ftp://x"},
		{BaseURL: "http://"},
		{BaseURL: "http://x", Timeout: -1},
		{BaseURL: "http://x", MaxConns: -1},
	} {
		if _, err := NewOllama(cfg); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("NewOllama(%+v) = %v, want ErrInvalidConfig", cfg, err)
		}
		if _, err := NewOpenAI(cfg); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("NewOpenAI(%+v) = %v, want ErrInvalidConfig", cfg, err)
		}
	}
}

// TestOllamaStopSequence: the request's stop sequences are not sent to
// Ollama; the node finds the first one in the text, across lines, sends
// the text before it only, ends the run COMPLETE{"stop", stop_sequence}
// with the pieces streamed as completion tokens, and aborts the request
// to Ollama, which would go on generating.
func TestOllamaStopSequence(t *testing.T) {
	aborted := make(chan struct{})
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		flushLines(w,
			`{"message":{"role":"assistant","content":"Hel"},"done":false}`,
			`{"message":{"role":"assistant","content":"lo E"},"done":false}`,
			`{"message":{"role":"assistant","content":"ND more"},"done":false}`)
		select { // a model that never ends by itself
		case <-r.Context().Done():
			close(aborted)
		case <-time.After(30 * time.Second):
		}
	})
	o := newOllama(t, Config{BaseURL: up.URL})
	rec := &eventRec{}
	body := `{"model":"m","messages":[{"role":"user","content":"hi"}],"stop":["never","END"],"temperature":0}`
	if err := o.Normalize(context.Background(), chatReq(body), rec); err != nil {
		t.Fatalf("Normalize: %v", err)
	}
	_, _, sent := up.request()
	jsonEqual(t, sent, `{"model":"llama3.2:3b","stream":true,"messages":[{"role":"user","content":"hi"}],"options":{"temperature":0}}`)
	if rec.text() != "Hello " {
		t.Errorf("text %q, want %q", rec.text(), "Hello ")
	}
	if c := rec.last(tComplete); c == nil || c.FinishReason != "stop" || c.StopSequence != "END" {
		t.Errorf("complete %v, want stop, END", c)
	}
	if u := rec.last(tUsage); u == nil || u.CompletionTokens != 3 || u.PromptTokens != 0 {
		t.Errorf("usage %v, want 3 completion tokens", u)
	}
	select {
	case <-aborted:
	case <-time.After(30 * time.Second):
		t.Fatal("the request to Ollama was not aborted")
	}
}

// TestRegression_StopSequenceReadsOllamaToItsEnd: after a stop sequence
// matched, the rest of Ollama's answer is read out, not cancelled (Ollama
// v0.17.4 left the request after a cancel unanswered once in 50), and the
// usage is Ollama's own; the client's text still ends at the stop.
func TestRegression_StopSequenceReadsOllamaToItsEnd(t *testing.T) {
	up := newUpstream(t, ollamaLines(
		`{"message":{"role":"assistant","content":"Hel"},"done":false}`,
		`{"message":{"role":"assistant","content":"lo E"},"done":false}`,
		`{"message":{"role":"assistant","content":"ND more"},"done":false}`,
		`{"message":{"role":"assistant","content":" and more"},"done":false}`,
		`{"message":{"role":"assistant","content":""},"done":true,"done_reason":"stop","prompt_eval_count":9,"eval_count":4}`))
	o := newOllama(t, Config{BaseURL: up.URL})
	rec := &eventRec{}
	body := `{"model":"m","messages":[{"role":"user","content":"hi"}],"stop":["END"]}`
	if err := o.Normalize(context.Background(), chatReq(body), rec); err != nil {
		t.Fatalf("Normalize: %v", err)
	}
	if rec.text() != "Hello " {
		t.Errorf("text %q, want %q", rec.text(), "Hello ")
	}
	if c := rec.last(tComplete); c == nil || c.FinishReason != "stop" || c.StopSequence != "END" {
		t.Errorf("complete %v, want stop, END", c)
	}
	if u := rec.last(tUsage); u == nil || u.PromptTokens != 9 || u.CompletionTokens != 4 {
		t.Errorf("usage %v, want Ollama's own 9/4", u)
	}
}

// TestOllamaStopSequenceInLastLine: a stop sequence completed by Ollama's
// last line (its own end) still ends the answer as a stop sequence, with
// Ollama's own counts; text held back as a possible start of a stop
// sequence that never completes is sent at the end.
func TestOllamaStopSequenceInLastLine(t *testing.T) {
	for _, tc := range []struct {
		last, text, seq string
		prompt          int32
	}{
		{`{"message":{"role":"assistant","content":"D!"},"done":true,"done_reason":"length","prompt_eval_count":7,"eval_count":3}`, "Hello ", "END", 7},
		{`{"message":{"role":"assistant","content":"!"},"done":true,"done_reason":"stop","prompt_eval_count":7,"eval_count":3}`, "Hello EN!", "", 7},
	} {
		up := newUpstream(t, ollamaLines(
			`{"message":{"role":"assistant","content":"Hel"},"done":false}`,
			`{"message":{"role":"assistant","content":"lo EN"},"done":false}`,
			tc.last))
		o := newOllama(t, Config{BaseURL: up.URL})
		rec := &eventRec{}
		body := `{"model":"m","messages":[{"role":"user","content":"hi"}],"stop":"END"}`
		if err := o.Normalize(context.Background(), chatReq(body), rec); err != nil {
			t.Fatalf("Normalize: %v", err)
		}
		c, u := rec.last(tComplete), rec.last(tUsage)
		if rec.text() != tc.text || c == nil || c.StopSequence != tc.seq || u == nil || u.PromptTokens != tc.prompt || u.CompletionTokens != 3 {
			t.Errorf("last line %s: text %q, complete %v, usage %v; want %q, stop sequence %q, usage %d/3", tc.last, rec.text(), c, u, tc.text, tc.seq, tc.prompt)
		}
	}
}
