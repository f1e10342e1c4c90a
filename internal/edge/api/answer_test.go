package api

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"iop/internal/auth"
	"iop/internal/edge/contract"
	"iop/internal/wire/nodev1"
)

// writeWatch is the ResponseWriter a handler writes into: it notes, at
// each Write, how many requests of the watched key hold a request slot.
type writeWatch struct {
	http.ResponseWriter
	caller *auth.Caller

	mu       sync.Mutex
	inFlight []int // at each Write
}

func (w *writeWatch) Write(p []byte) (int, error) {
	w.mu.Lock()
	w.inFlight = append(w.inFlight, w.caller.InFlight())
	w.mu.Unlock()
	return w.ResponseWriter.Write(p)
}

func (w *writeWatch) Flush() { w.ResponseWriter.(http.Flusher).Flush() }

func (w *writeWatch) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *writeWatch) writes() []int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]int(nil), w.inFlight...)
}

// TestAnswerFinishedBeforeItsLastByte: on every route
// and execution path, streamed and not, and for an error answer before or
// after the status line, the key's request slot is given back before the
// write that ends the answer, and not before the run ended: writes of a
// stream's content before the run's terminal message still hold it.
func TestAnswerFinishedBeforeItsLastByte(t *testing.T) {
	sse := map[string]string{"Content-Type": "text/event-stream"}
	jsonHead := map[string]string{"Content-Type": "application/json"}
	const chunk = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\n"
	vectors := func() *nodev1.RunUp {
		return events(&nodev1.RunEvent{Type: nodev1.RunEvent_TYPE_DELTA, Embeddings: []*nodev1.Embedding{{Values: []float32{1, 0}}}})
	}
	// Streamed runs send content in one message and end in the next, so
	// the content's writes come before the terminal message.
	normStream := func() []*nodev1.RunUp {
		return []*nodev1.RunUp{events(started(), delta("hi")), events(delta(" there")), events(usageEvent(1, 2), complete("stop"))}
	}
	tunStream := func() []*nodev1.RunUp {
		return []*nodev1.RunUp{tunnelHead(200, sse), tunnelData(chunk), tunnelData(chunk + "data: [DONE]\n\n"), tunnelEnd()}
	}
	tunJSON := func(body string) []*nodev1.RunUp {
		return []*nodev1.RunUp{tunnelHead(200, jsonHead), tunnelData(body[:10]), tunnelData(body[10:]), tunnelEnd()}
	}
	const completionJSON = `{"id":"c","object":"text_completion","choices":[{"text":"hi","index":0,"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1}}`
	const embeddingsJSON = `{"object":"list","data":[{"object":"embedding","index":0,"embedding":[1,0]}],"model":"m","usage":{"prompt_tokens":1,"total_tokens":1}}`
	chat := `{"model":"m","messages":[{"role":"user","content":"x"}]}`
	chatStream := `{"model":"m","stream":true,"messages":[{"role":"user","content":"x"}]}`
	completion, completionStream := `{"model":"m","prompt":"x"}`, `{"model":"m","prompt":"x","stream":true}`
	for _, tc := range []struct {
		name, path, body string
		path_            contract.Path
		msgs             []*nodev1.RunUp
		dispatchErr      error
		streamed         bool // content is written before the terminal message
	}{
		{"chat stream normalized", "/v1/chat/completions", chatStream, normalized, normStream(), nil, true},
		{"chat stream tunnel", "/v1/chat/completions", chatStream, tunnel, tunStream(), nil, true},
		{"chat normalized", "/v1/chat/completions", chat, normalized, normStream(), nil, false},
		{"chat tunnel", "/v1/chat/completions", chat, tunnel, tunJSON(tunnelJSON), nil, true},
		{"completions stream normalized", "/v1/completions", completionStream, normalized, normStream(), nil, true},
		{"completions stream tunnel", "/v1/completions", completionStream, tunnel, tunStream(), nil, true},
		{"completions normalized", "/v1/completions", completion, normalized, normStream(), nil, false},
		{"completions tunnel", "/v1/completions", completion, tunnel, tunJSON(completionJSON), nil, true},
		{"embeddings normalized", "/v1/embeddings", `{"model":"m","input":"x"}`, normalized,
			[]*nodev1.RunUp{vectors(), events(usageEvent(1, 0), complete(""))}, nil, false},
		{"embeddings tunnel", "/v1/embeddings", `{"model":"m","input":"x"}`, tunnel, tunJSON(embeddingsJSON), nil, true},
		{"refused before dispatch", "/v1/chat/completions", chatStream, normalized, nil, ErrQueueFull, false},
		{"stream failing after its status line", "/v1/chat/completions", chatStream, normalized,
			[]*nodev1.RunUp{events(started(), delta("hi")), events(errorEvent(500, "boom"))}, nil, true},
		{"tunnel failing after its status line", "/v1/chat/completions", chatStream, tunnel,
			[]*nodev1.RunUp{tunnelHead(200, sse), tunnelData(chunk), tunnelError(502, "reset")}, nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newKeys(t, auth.Key{MaxConcurrent: 1})
			alice := f.keys.Authenticate(f.alice)
			var run *fakeRun
			gw := &fakeGateway{models: []string{"m"}, dispatch: func(context.Context, contract.Request) (Run, error) {
				if tc.dispatchErr != nil {
					return nil, tc.dispatchErr
				}
				run = scriptedRun(tc.path_, tc.msgs...)
				return run, nil
			}}
			h := New(withOpenAI(Config{Keys: f.keys}), gw, nil)
			watch := &writeWatch{caller: alice}
			var handlers sync.WaitGroup
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				handlers.Add(1)
				defer handlers.Done()
				watch.ResponseWriter = w
				h.ServeHTTP(watch, r)
			}))
			defer srv.Close()
			req, _ := http.NewRequest(http.MethodPost, srv.URL+tc.path, strings.NewReader(tc.body))
			req.Header.Set("Authorization", "Bearer "+f.alice)
			resp, err := srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			handlers.Wait()
			writes := watch.writes()
			if len(writes) == 0 {
				t.Fatalf("nothing written: %d %s", resp.StatusCode, body)
			}
			if last := writes[len(writes)-1]; last != 0 {
				t.Errorf("the key held %d slot(s) at the write that ended the answer; writes saw %v\n%s", last, writes, body)
			}
			if tc.streamed && writes[0] != 1 {
				t.Errorf("the slot was free (%v) while the run still streamed its content\n%s", writes, body)
			}
			if alice.InFlight() != 0 {
				t.Errorf("the key holds %d slots after the request", alice.InFlight())
			}
		})
	}
}
