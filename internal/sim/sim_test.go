package sim

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

const prompt = "tell me a story about a gateway"

// TestGenerateShapes checks every generation route, streamed and not,
// against its protocol's documented shape and token accounting.
func TestGenerateShapes(t *testing.T) {
	for _, ep := range endpoints {
		for _, stream := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/stream=%v", ep.name, stream), func(t *testing.T) {
				_, url, _ := startSim(t, Config{Protocol: ep.protocol, Seed: 7})
				resp := mustPost(t, newClient(t), url+ep.path, ep.body(DefaultModel, prompt, stream, 0))
				if resp.StatusCode != http.StatusOK {
					t.Fatalf("status %d", resp.StatusCode)
				}
				got := ep.read(t, resp, stream)
				if got.readErr != nil {
					t.Fatalf("read: %v", got.readErr)
				}
				if !got.complete || got.finish != "stop" {
					t.Errorf("complete=%v finish=%q, want complete with stop", got.complete, got.finish)
				}
				if n := len(strings.Fields(got.text)); n != DefaultMaxTokens {
					t.Errorf("got %d words, want %d: %q", n, DefaultMaxTokens, got.text)
				}
				if !strings.HasPrefix(got.text, " ") {
					t.Errorf("text %q: tokens should have a leading space", got.text)
				}
				if stream && got.chunks != DefaultMaxTokens {
					t.Errorf("got %d token chunks, want %d", got.chunks, DefaultMaxTokens)
				}
				if got.promptTokens != countWords(prompt) || got.completionTokens != DefaultMaxTokens {
					t.Errorf("usage prompt=%d completion=%d, want %d and %d",
						got.promptTokens, got.completionTokens, countWords(prompt), DefaultMaxTokens)
				}
			})
		}
	}
}

func TestMaxTokens(t *testing.T) {
	tests := []struct {
		name       string
		limit      int
		wantTokens int
		wantFinish string
	}{
		{"no limit", 0, 16, "stop"},
		{"limit cuts", 3, 3, "length"},
		{"limit above natural length", 100, 16, "stop"},
		{"limit equal to natural length", 16, 16, "stop"},
	}
	for _, ep := range endpoints {
		_, url, _ := startSim(t, Config{Protocol: ep.protocol})
		c := newClient(t)
		for _, tt := range tests {
			for _, stream := range []bool{false, true} {
				t.Run(fmt.Sprintf("%s/%s/stream=%v", ep.name, tt.name, stream), func(t *testing.T) {
					got := ep.read(t, mustPost(t, c, url+ep.path, ep.body(DefaultModel, prompt, stream, tt.limit)), stream)
					if n := len(strings.Fields(got.text)); n != tt.wantTokens || got.finish != tt.wantFinish {
						t.Errorf("got %d tokens, finish %q; want %d, %q", n, got.finish, tt.wantTokens, tt.wantFinish)
					}
				})
			}
		}
	}
}

func TestOllamaNumPredictZeroAndNegative(t *testing.T) {
	_, url, _ := startSim(t, Config{Protocol: ProtocolOllama})
	c := newClient(t)
	for _, tt := range []struct {
		numPredict int
		wantTokens int
		wantFinish string
	}{{0, 0, "length"}, {-1, 16, "stop"}, {-2, 16, "stop"}} {
		body := map[string]any{"model": DefaultModel, "prompt": "hi", "stream": false, "options": map[string]any{"num_predict": tt.numPredict}}
		got := readOllama(t, mustPost(t, c, url+"/api/generate", body), false, false)
		if n := len(strings.Fields(got.text)); n != tt.wantTokens || got.finish != tt.wantFinish {
			t.Errorf("num_predict %d: got %d tokens, %q; want %d, %q", tt.numPredict, n, got.finish, tt.wantTokens, tt.wantFinish)
		}
	}
}

func TestOllamaLoadOnly(t *testing.T) {
	_, url, _ := startSim(t, Config{Protocol: ProtocolOllama})
	c := newClient(t)
	for path, body := range map[string]any{
		"/api/chat":     map[string]any{"model": DefaultModel, "messages": []any{}},
		"/api/generate": map[string]any{"model": DefaultModel},
	} {
		var got ollamaLine
		if err := json.NewDecoder(mustPost(t, c, url+path, body).Body).Decode(&got); err != nil {
			t.Fatal(err)
		}
		if !got.Done || got.DoneReason != "load" {
			t.Errorf("%s: done=%v done_reason=%q, want true, load", path, got.Done, got.DoneReason)
		}
	}
}

func TestDeterminism(t *testing.T) {
	for _, ep := range endpoints {
		t.Run(ep.name, func(t *testing.T) {
			_, url, _ := startSim(t, Config{Protocol: ep.protocol, Seed: 1})
			_, otherSeedURL, _ := startSim(t, Config{Protocol: ep.protocol, Seed: 2})
			c := newClient(t)
			text := func(url, prompt string, stream bool) string {
				return ep.read(t, mustPost(t, c, url+ep.path, ep.body(DefaultModel, prompt, stream, 0)), stream).text
			}
			first := text(url, prompt, false)
			if again := text(url, prompt, true); again != first {
				t.Errorf("same prompt and seed gave %q then %q", first, again)
			}
			if other := text(url, prompt+" please", false); other == first {
				t.Errorf("different prompts gave the same text %q", other)
			}
			if other := text(otherSeedURL, prompt, false); other == first {
				t.Errorf("different seeds gave the same text %q", other)
			}
		})
	}
}

// TestRequestErrors checks the status and error shape of bad requests.
func TestRequestErrors(t *testing.T) {
	const key = "secret"
	auth := []string{"Authorization", "Bearer " + key}
	tests := []struct {
		name     string
		protocol Protocol
		method   string
		path     string
		body     string
		header   []string
		want     int
	}{
		{"ollama bad json", ProtocolOllama, "POST", "/api/chat", `{"model":`, auth, 400},
		{"ollama wrong type", ProtocolOllama, "POST", "/api/chat", `{"model":"sim-model","stream":"yes"}`, auth, 400},
		{"ollama missing model", ProtocolOllama, "POST", "/api/generate", `{"prompt":"hi"}`, auth, 400},
		{"ollama unknown model", ProtocolOllama, "POST", "/api/chat", `{"model":"llama3","messages":[{"role":"user","content":"hi"}]}`, auth, 404},
		{"ollama unknown model embed", ProtocolOllama, "POST", "/api/embed", `{"model":"llama3","input":"hi"}`, auth, 404},
		{"ollama unknown model show", ProtocolOllama, "POST", "/api/show", `{"model":"llama3"}`, auth, 404},
		{"ollama no key", ProtocolOllama, "POST", "/api/generate", `{"model":"sim-model","prompt":"hi"}`, nil, 401},
		{"ollama wrong key", ProtocolOllama, "GET", "/api/tags", ``, []string{"Authorization", "Bearer nope"}, 401},
		{"ollama unknown route", ProtocolOllama, "GET", "/api/nope", ``, auth, 404},
		{"openai bad json", ProtocolOpenAI, "POST", "/v1/chat/completions", `not json`, auth, 400},
		{"openai missing model", ProtocolOpenAI, "POST", "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}]}`, auth, 400},
		{"openai no messages", ProtocolOpenAI, "POST", "/v1/chat/completions", `{"model":"sim-model","messages":[]}`, auth, 400},
		{"openai max_tokens 0", ProtocolOpenAI, "POST", "/v1/chat/completions", `{"model":"sim-model","messages":[{"role":"user","content":"hi"}],"max_tokens":0}`, auth, 400},
		{"openai bad content", ProtocolOpenAI, "POST", "/v1/chat/completions", `{"model":"sim-model","messages":[{"role":"user","content":7}]}`, auth, 400},
		{"openai no prompt", ProtocolOpenAI, "POST", "/v1/completions", `{"model":"sim-model"}`, auth, 400},
		{"ollama token ids embed", ProtocolOllama, "POST", "/api/embed", `{"model":"sim-model","input":[1,2,3]}`, auth, 400},
		{"ollama token id arrays embed", ProtocolOllama, "POST", "/api/embed", `{"model":"sim-model","input":[[1],[2]]}`, auth, 400},
		{"openai empty embedding input", ProtocolOpenAI, "POST", "/v1/embeddings", `{"model":"sim-model","input":[]}`, auth, 400},
		{"openai bad encoding format", ProtocolOpenAI, "POST", "/v1/embeddings", `{"model":"sim-model","input":"a","encoding_format":"hex"}`, auth, 400},
		{"openai unknown model", ProtocolOpenAI, "POST", "/v1/completions", `{"model":"gpt-4o","prompt":"hi"}`, auth, 404},
		{"openai unknown model get", ProtocolOpenAI, "GET", "/v1/models/gpt-4o", ``, auth, 404},
		{"openai no key", ProtocolOpenAI, "POST", "/v1/chat/completions", `{"model":"sim-model","messages":[{"role":"user","content":"hi"}]}`, nil, 401},
		{"openai wrong key", ProtocolOpenAI, "GET", "/v1/models", ``, []string{"Authorization", "Bearer nope"}, 401},
		{"openai unknown route", ProtocolOpenAI, "POST", "/v1/responses", `{}`, auth, 404},
	}
	servers := map[Protocol]string{}
	for _, p := range []Protocol{ProtocolOllama, ProtocolOpenAI} {
		_, servers[p], _ = startSim(t, Config{Protocol: p, APIKey: key})
	}
	c := newClient(t)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, err := http.NewRequest(tt.method, servers[tt.protocol]+tt.path, strings.NewReader(tt.body))
			if err != nil {
				t.Fatal(err)
			}
			for i := 0; i+1 < len(tt.header); i += 2 {
				req.Header.Set(tt.header[i], tt.header[i+1])
			}
			resp, err := c.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			checkErrorBody(t, tt.protocol, resp, tt.want)
		})
	}
}

func TestAPIKeyAccepted(t *testing.T) {
	for _, ep := range endpoints {
		t.Run(ep.name, func(t *testing.T) {
			s, url, _ := startSim(t, Config{Protocol: ep.protocol, APIKey: "k1"})
			resp := mustPost(t, newClient(t), url+ep.path, ep.body(DefaultModel, prompt, false, 2), "Authorization", "Bearer k1")
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d", resp.StatusCode)
			}
			if got := s.Stats().LastAuthorization; got != "Bearer k1" {
				t.Errorf("LastAuthorization = %q", got)
			}
		})
	}
}

// TestCapacity holds requests on the clock (TTFT) to make them concurrent,
// then checks admission, 429s and the in-flight accounting.
func TestCapacity(t *testing.T) {
	tests := []struct {
		name          string
		maxConcurrent int
		held          int // requests held in flight at once
	}{
		{"limited", 2, 2},
		{"unlimited", 0, 5},
	}
	for _, ep := range endpoints {
		for _, tt := range tests {
			t.Run(ep.name+"/"+tt.name, func(t *testing.T) {
				clock := newFakeClock(true)
				s, url, _ := startSim(t, Config{Protocol: ep.protocol, MaxConcurrent: tt.maxConcurrent, TTFT: time.Second, Clock: clock})
				c := newClient(t)
				var wg sync.WaitGroup
				statuses := make(chan int, tt.held)
				for range tt.held {
					wg.Go(func() {
						resp, err := post(context.Background(), t, c, url+ep.path, ep.body(DefaultModel, prompt, true, 0))
						if err != nil {
							t.Error(err)
							statuses <- 0
							return
						}
						io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
						statuses <- resp.StatusCode
					})
				}
				for range tt.held {
					<-clock.waiting // each held request is now waiting for its first token
				}
				if st := s.Stats(); st.InFlight != tt.held || st.MaxInFlight != tt.held {
					t.Errorf("while held: InFlight=%d MaxInFlight=%d, want %d", st.InFlight, st.MaxInFlight, tt.held)
				}
				if tt.maxConcurrent > 0 {
					resp := mustPost(t, c, url+ep.path, ep.body(DefaultModel, prompt, true, 0))
					checkErrorBody(t, ep.protocol, resp, http.StatusTooManyRequests)
				}
				clock.Advance(time.Second) // the TTFT of every held request elapses
				wg.Wait()
				close(statuses)
				for st := range statuses {
					if st != http.StatusOK {
						t.Errorf("held request got status %d", st)
					}
				}
				st := s.Stats()
				wantRejected := int64(0)
				if tt.maxConcurrent > 0 {
					wantRejected = 1
				}
				if st.InFlight != 0 || st.MaxInFlight != tt.held || st.Rejected != wantRejected {
					t.Errorf("after: %+v, want InFlight 0, MaxInFlight %d, Rejected %d", st, tt.held, wantRejected)
				}
			})
		}
	}
}

// TestPacing checks the waits the server asks the clock for: TTFT, then
// 1/TokensPerSecond before each later token.
func TestPacing(t *testing.T) {
	for _, ep := range endpoints {
		for _, stream := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/stream=%v", ep.name, stream), func(t *testing.T) {
				clock := newFakeClock(false)
				_, url, _ := startSim(t, Config{Protocol: ep.protocol, TTFT: 2 * time.Second, TokensPerSecond: 4, Clock: clock})
				got := ep.read(t, mustPost(t, newClient(t), url+ep.path, ep.body(DefaultModel, prompt, stream, 4)), stream)
				if !got.complete {
					t.Fatal("incomplete answer")
				}
				want := []time.Duration{2 * time.Second, 250 * time.Millisecond, 250 * time.Millisecond, 250 * time.Millisecond}
				if w := clock.waited(); !slices.Equal(w, want) {
					t.Errorf("waited %v, want %v", w, want)
				}
			})
		}
	}
}

// TestClientDisconnectStopsStream cancels a client mid-stream and checks
// that generation stops and the in-flight slot is released.
func TestClientDisconnectStopsStream(t *testing.T) {
	for _, ep := range endpoints {
		t.Run(ep.name, func(t *testing.T) {
			clock := newFakeClock(true)
			s, url, events := startSim(t, Config{Protocol: ep.protocol, TokensPerSecond: 10, Clock: clock})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			resp, err := post(ctx, t, newClient(t), url+ep.path, ep.body(DefaultModel, prompt, true, 0))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			<-clock.waiting // the first token was sent; the server waits for the second
			cancel()
			waitEvent(t, events, "released")
			if st := s.Stats(); st.InFlight != 0 {
				t.Errorf("InFlight = %d after disconnect", st.InFlight)
			}
			if w := clock.waited(); len(w) != 1 {
				t.Errorf("server waited %v; want one wait, generation should stop on disconnect", w)
			}
		})
	}
}

func TestFaultErrorRate(t *testing.T) {
	for _, ep := range endpoints {
		t.Run(ep.name+"/always", func(t *testing.T) {
			s, url, _ := startSim(t, Config{Protocol: ep.protocol, Faults: Faults{ErrorRate: 1, ErrorStatus: 503}})
			c := newClient(t)
			for range 3 {
				checkErrorBody(t, ep.protocol, mustPost(t, c, url+ep.path, ep.body(DefaultModel, prompt, true, 0)), 503)
			}
			if st := s.Stats(); st.InjectedErrors != 3 || st.InFlight != 0 {
				t.Errorf("stats %+v, want 3 injected errors and nothing in flight", st)
			}
		})
		t.Run(ep.name+"/half is deterministic", func(t *testing.T) {
			pattern := func() []int {
				_, url, _ := startSim(t, Config{Protocol: ep.protocol, Seed: 3, Faults: Faults{ErrorRate: 0.5}})
				c := newClient(t)
				var statuses []int
				for range 20 {
					resp := mustPost(t, c, url+ep.path, ep.body(DefaultModel, prompt, false, 1))
					io.Copy(io.Discard, resp.Body)
					statuses = append(statuses, resp.StatusCode)
				}
				return statuses
			}
			first := pattern()
			if again := pattern(); !slices.Equal(first, again) {
				t.Errorf("fault pattern differs between runs:\n%v\n%v", first, again)
			}
			if n := countOf(first, 500); n == 0 || n == len(first) {
				t.Errorf("ErrorRate 0.5 failed %d of %d requests", n, len(first))
			}
		})
	}
}

func countOf(xs []int, x int) (n int) {
	for _, v := range xs {
		if v == x {
			n++
		}
	}
	return n
}

func TestFaultDropAfter(t *testing.T) {
	for _, ep := range endpoints {
		t.Run(ep.name+"/stream", func(t *testing.T) {
			s, url, events := startSim(t, Config{Protocol: ep.protocol, Faults: Faults{DropAfter: 3}})
			resp := mustPost(t, newClient(t), url+ep.path, ep.body(DefaultModel, prompt, true, 0))
			got := ep.read(t, resp, true)
			if got.chunks != 3 || got.complete || got.finish != "" {
				t.Errorf("got %d token chunks, complete=%v, finish=%q; want 3 tokens and no end", got.chunks, got.complete, got.finish)
			}
			if got.readErr == nil {
				t.Errorf("want a read error from the dropped connection")
			}
			waitEvent(t, events, "released")
			if st := s.Stats(); st.InFlight != 0 {
				t.Errorf("InFlight = %d", st.InFlight)
			}
		})
		t.Run(ep.name+"/non-stream", func(t *testing.T) {
			_, url, _ := startSim(t, Config{Protocol: ep.protocol, Faults: Faults{DropAfter: 3}})
			resp, err := post(context.Background(), t, newClient(t), url+ep.path, ep.body(DefaultModel, prompt, false, 0))
			if err == nil {
				resp.Body.Close()
				t.Errorf("want the connection dropped, got status %d", resp.StatusCode)
			}
		})
	}
}

func TestFaultHang(t *testing.T) {
	for _, ep := range endpoints {
		t.Run(ep.name, func(t *testing.T) {
			s, url, events := startSim(t, Config{Protocol: ep.protocol, Faults: Faults{Hang: true}})
			ctx, cancel := context.WithCancel(context.Background())
			errc := make(chan error, 1)
			go func() {
				resp, err := post(ctx, t, newClient(t), url+ep.path, ep.body(DefaultModel, prompt, true, 0))
				if err == nil {
					resp.Body.Close()
				}
				errc <- err
			}()
			waitEvent(t, events, "admitted")
			select {
			case err := <-errc:
				t.Fatalf("hung request answered: %v", err)
			default:
			}
			if st := s.Stats(); st.InFlight != 1 {
				t.Errorf("InFlight = %d while hung", st.InFlight)
			}
			cancel()
			if err := <-errc; !errors.Is(err, context.Canceled) {
				t.Errorf("client error = %v, want context.Canceled", err)
			}
			waitEvent(t, events, "released")
			if st := s.Stats(); st.InFlight != 0 {
				t.Errorf("InFlight = %d after the client left", st.InFlight)
			}
		})
	}
}

// TestClientAbortIsCounted checks that a client going away before the
// first token is seen and counted in Stats.Cancelled.
func TestClientAbortIsCounted(t *testing.T) {
	for _, ep := range endpoints {
		t.Run(ep.name, func(t *testing.T) {
			s, url, events := startSim(t, Config{Protocol: ep.protocol, TTFT: time.Hour})
			ctx, cancel := context.WithCancel(context.Background())
			errc := make(chan error, 1)
			go func() {
				resp, err := post(ctx, t, newClient(t), url+ep.path, ep.body(DefaultModel, prompt, true, 0))
				if err == nil {
					resp.Body.Close()
				}
				errc <- err
			}()
			waitEvent(t, events, "admitted")
			cancel()
			<-errc
			waitEvent(t, events, "released")
			if st := s.Stats(); st.Cancelled != 1 || st.InFlight != 0 {
				t.Errorf("Cancelled = %d, InFlight = %d; want 1, 0", st.Cancelled, st.InFlight)
			}
		})
	}
}

// TestStopEndsHungRequests checks that stopping the server releases a
// request the Hang fault holds, instead of waiting for the client.
func TestStopEndsHungRequests(t *testing.T) {
	s, err := New(Config{Protocol: ProtocolOpenAI, Faults: Faults{Hang: true}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	admitted := make(chan struct{}, 1)
	s.trace = func(e string) {
		if e == "admitted" {
			admitted <- struct{}{}
		}
	}
	url, stop, err := s.Start("")
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		resp, err := post(context.Background(), t, newClient(t), url+"/v1/completions", map[string]any{"model": DefaultModel, "prompt": "x"})
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	<-admitted
	stop()
	if err := <-errc; err == nil {
		t.Errorf("want the hung request to fail when the server stops")
	}
	if st := s.Stats(); st.InFlight != 0 {
		t.Errorf("InFlight = %d after stop", st.InFlight)
	}
}

// embedRoute drives the embedding route of one protocol.
type embedRoute struct {
	protocol Protocol
	path     string
	body     func(input any, extra map[string]any) map[string]any
	vectors  func(t *testing.T, resp *http.Response) [][]float32
}

var embedRoutes = []embedRoute{
	{
		protocol: ProtocolOllama, path: "/api/embed",
		body: func(input any, extra map[string]any) map[string]any {
			b := map[string]any{"model": DefaultModel, "input": input}
			for k, v := range extra {
				b[k] = v
			}
			return b
		},
		vectors: func(t *testing.T, resp *http.Response) [][]float32 {
			var out struct {
				Model           string      `json:"model"`
				Embeddings      [][]float32 `json:"embeddings"`
				PromptEvalCount int         `json:"prompt_eval_count"`
			}
			if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
				t.Fatal(err)
			}
			if out.Model != DefaultModel || out.PromptEvalCount == 0 {
				t.Errorf("bad model/prompt_eval_count: %+v", out)
			}
			return out.Embeddings
		},
	},
	{
		protocol: ProtocolOpenAI, path: "/v1/embeddings",
		body: func(input any, extra map[string]any) map[string]any {
			b := map[string]any{"model": DefaultModel, "input": input}
			for k, v := range extra {
				b[k] = v
			}
			return b
		},
		vectors: func(t *testing.T, resp *http.Response) [][]float32 {
			var out struct {
				Object string `json:"object"`
				Data   []struct {
					Object    string          `json:"object"`
					Index     int             `json:"index"`
					Embedding json.RawMessage `json:"embedding"`
				} `json:"data"`
				Model string      `json:"model"`
				Usage openaiUsage `json:"usage"`
			}
			if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
				t.Fatal(err)
			}
			if out.Object != "list" || out.Model != DefaultModel || out.Usage.PromptTokens == 0 || out.Usage.TotalTokens != out.Usage.PromptTokens {
				t.Errorf("bad list/model/usage: %+v", out)
			}
			vs := make([][]float32, len(out.Data))
			for i, d := range out.Data {
				if d.Object != "embedding" || d.Index != i {
					t.Errorf("data[%d]: object %q index %d", i, d.Object, d.Index)
				}
				var b64 string
				if json.Unmarshal(d.Embedding, &b64) == nil {
					vs[i] = decodeFloat32s(t, b64)
				} else if err := json.Unmarshal(d.Embedding, &vs[i]); err != nil {
					t.Fatal(err)
				}
			}
			return vs
		},
	},
}

func decodeFloat32s(t *testing.T, b64 string) []float32 {
	raw, err := base64.StdEncoding.DecodeString(b64)
	if err != nil || len(raw)%4 != 0 {
		t.Fatalf("bad base64 embedding %q: %v", b64, err)
	}
	v := make([]float32, len(raw)/4)
	for i := range v {
		v[i] = math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:]))
	}
	return v
}

func TestEmbeddings(t *testing.T) {
	for _, rt := range embedRoutes {
		t.Run(string(rt.protocol), func(t *testing.T) {
			_, url, _ := startSim(t, Config{Protocol: rt.protocol, Seed: 5})
			c := newClient(t)
			get := func(input any, extra map[string]any) [][]float32 {
				resp := mustPost(t, c, url+rt.path, rt.body(input, extra))
				if resp.StatusCode != http.StatusOK {
					t.Fatalf("status %d", resp.StatusCode)
				}
				return rt.vectors(t, resp)
			}
			batch := get([]string{"alpha beta", "gamma", "alpha beta"}, nil)
			if len(batch) != 3 {
				t.Fatalf("got %d vectors for 3 inputs", len(batch))
			}
			for i, v := range batch {
				if len(v) != embedDims {
					t.Errorf("vector %d has %d dims, want %d", i, len(v), embedDims)
				}
				var norm float64
				for _, x := range v {
					norm += float64(x) * float64(x)
				}
				if math.Abs(norm-1) > 1e-4 {
					t.Errorf("vector %d has squared norm %v, want 1", i, norm)
				}
			}
			if !slices.Equal(batch[0], batch[2]) {
				t.Errorf("same input gave different vectors")
			}
			if slices.Equal(batch[0], batch[1]) {
				t.Errorf("different inputs gave the same vector")
			}
			if single := get("alpha beta", nil); len(single) != 1 || !slices.Equal(single[0], batch[0]) {
				t.Errorf("single input vector %v differs from batched %v", single, batch[0])
			}
			if wide := get("alpha beta", map[string]any{"dimensions": 32}); len(wide) != 1 || len(wide[0]) != 32 {
				t.Errorf("dimensions 32 gave %v", wide)
			}
			if rt.protocol == ProtocolOpenAI {
				b64 := get("alpha beta", map[string]any{"encoding_format": "base64"})
				if len(b64) != 1 || !slices.Equal(b64[0], batch[0]) {
					t.Errorf("base64 vector %v differs from float vector %v", b64, batch[0])
				}
			}
		})
	}
}

func TestOllamaLegacyEmbeddings(t *testing.T) {
	_, url, _ := startSim(t, Config{Protocol: ProtocolOllama})
	var out struct {
		Embedding []float32 `json:"embedding"`
	}
	resp := mustPost(t, newClient(t), url+"/api/embeddings", map[string]any{"model": DefaultModel, "prompt": "hello"})
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	if len(out.Embedding) != embedDims {
		t.Errorf("got %d dims", len(out.Embedding))
	}
}

func TestListings(t *testing.T) {
	models := []string{"m1", "org/m2:7b"}
	tests := []struct {
		protocol Protocol
		method   string
		path     string
		body     string
		want     string // substring of the body
	}{
		{ProtocolOllama, "GET", "/", "", "Ollama is running"},
		{ProtocolOllama, "GET", "/api/version", "", `"version":"` + OllamaVersion + `"`},
		{ProtocolOllama, "GET", "/api/tags", "", `"name":"org/m2:7b","model":"org/m2:7b","modified_at":`},
		{ProtocolOllama, "GET", "/api/ps", "", `"size_vram":`},
		{ProtocolOllama, "POST", "/api/show", `{"model":"m1"}`, `"capabilities":["completion","tools","vision","embedding"]`},
		{ProtocolOpenAI, "GET", "/v1/models", "", `{"object":"list","data":[{"id":"m1","object":"model"`},
		{ProtocolOpenAI, "GET", "/models", "", `"id":"org/m2:7b"`},
		{ProtocolOpenAI, "GET", "/v1/models/org/m2:7b", "", `"id":"org/m2:7b","object":"model"`},
	}
	servers := map[Protocol]string{}
	for _, p := range []Protocol{ProtocolOllama, ProtocolOpenAI} {
		_, servers[p], _ = startSim(t, Config{Protocol: p, Models: models})
	}
	c := newClient(t)
	for _, tt := range tests {
		t.Run(string(tt.protocol)+tt.path, func(t *testing.T) {
			req, _ := http.NewRequest(tt.method, servers[tt.protocol]+tt.path, strings.NewReader(tt.body))
			resp, err := c.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), tt.want) {
				t.Errorf("status %d body %s; want 200 containing %s", resp.StatusCode, b, tt.want)
			}
		})
	}
}

// TestSeen checks the record of received requests: model and
// Authorization per request, bounded to the last 1000.
func TestSeen(t *testing.T) {
	s, err := New(Config{Protocol: ProtocolOpenAI, Models: []string{"a", "b"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	h := s.Handler()
	do := func(path, body, auth string) {
		req := httptest.NewRequest(http.MethodPost, path, strings.NewReader(body))
		if body == "" {
			req.Method = http.MethodGet
		}
		req.Header.Set("Authorization", auth)
		h.ServeHTTP(httptest.NewRecorder(), req)
	}
	do("/v1/chat/completions", `{"model":"a","messages":[{"role":"user","content":"x"}]}`, "Bearer one")
	do("/v1/embeddings", `{"model":"b","input":"x"}`, "Bearer two")
	do("/v1/embeddings", `{bad`, "")
	want := []SeenRequest{
		{Method: "POST", Path: "/v1/chat/completions", Model: "a", Authorization: "Bearer one"},
		{Method: "POST", Path: "/v1/embeddings", Model: "b", Authorization: "Bearer two"},
		{Method: "POST", Path: "/v1/embeddings"},
	}
	if got := s.Seen(); !slices.Equal(got, want) {
		t.Errorf("Seen() = %+v, want %+v", got, want)
	}
	if st := s.Stats(); st.LastModel != "" || st.Requests != 3 {
		t.Errorf("stats %+v", st)
	}
	for i := range maxSeen {
		do("/v1/models", "", fmt.Sprint(i))
	}
	got := s.Seen()
	if len(got) != maxSeen || got[0].Authorization != "0" || got[maxSeen-1].Authorization != fmt.Sprint(maxSeen-1) {
		t.Errorf("after %d more requests: len %d, first %+v, last %+v", maxSeen, len(got), got[0], got[len(got)-1])
	}
	if st := s.Stats(); st.Requests != maxSeen+3 {
		t.Errorf("Requests = %d", st.Requests)
	}
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		ok   bool
	}{
		{"minimal ollama", Config{Protocol: ProtocolOllama}, true},
		{"minimal openai", Config{Protocol: ProtocolOpenAI}, true},
		{"full", Config{Protocol: ProtocolOpenAI, Models: []string{"a", "b"}, TTFT: time.Second, TokensPerSecond: 30,
			MaxConcurrent: 4, DefaultMaxTokens: 8, APIKey: "k", Faults: Faults{ErrorRate: 0.1, ErrorStatus: 503, DropAfter: 2}}, true},
		{"no protocol", Config{}, false},
		{"unknown protocol", Config{Protocol: "grpc"}, false},
		{"empty model", Config{Protocol: ProtocolOllama, Models: []string{""}}, false},
		{"duplicate model", Config{Protocol: ProtocolOllama, Models: []string{"a", "a"}}, false},
		{"negative ttft", Config{Protocol: ProtocolOllama, TTFT: -1}, false},
		{"negative tps", Config{Protocol: ProtocolOllama, TokensPerSecond: -1}, false},
		{"infinite tps", Config{Protocol: ProtocolOllama, TokensPerSecond: math.Inf(1)}, false},
		{"negative concurrency", Config{Protocol: ProtocolOllama, MaxConcurrent: -1}, false},
		{"negative max tokens", Config{Protocol: ProtocolOllama, DefaultMaxTokens: -1}, false},
		{"error rate above 1", Config{Protocol: ProtocolOllama, Faults: Faults{ErrorRate: 1.5}}, false},
		{"error rate NaN", Config{Protocol: ProtocolOllama, Faults: Faults{ErrorRate: math.NaN()}}, false},
		{"error status 200", Config{Protocol: ProtocolOllama, Faults: Faults{ErrorStatus: 200}}, false},
		{"negative drop", Config{Protocol: ProtocolOllama, Faults: Faults{DropAfter: -1}}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			if (err == nil) != tt.ok {
				t.Fatalf("Validate() = %v, want ok=%v", err, tt.ok)
			}
			if err != nil && !errors.Is(err, ErrInvalidConfig) {
				t.Errorf("error %v does not wrap ErrInvalidConfig", err)
			}
			if _, err := New(tt.cfg, nil); (err == nil) != tt.ok {
				t.Errorf("New() = %v, want ok=%v", err, tt.ok)
			}
		})
	}
}

func TestOpenAIContentParts(t *testing.T) {
	_, url, _ := startSim(t, Config{Protocol: ProtocolOpenAI})
	body := `{"model":"sim-model","messages":[{"role":"user","content":[{"type":"text","text":"one two"},{"type":"image_url","image_url":{"url":"data:"}},{"type":"text","text":"three"}]}]}`
	got := readOpenAI(t, mustPost(t, newClient(t), url+"/v1/chat/completions", []byte(body)), false, true)
	if got.promptTokens != 3 {
		t.Errorf("prompt tokens = %d, want 3 (text parts only)", got.promptTokens)
	}
}

func TestBodyTooLarge(t *testing.T) {
	for _, tt := range []struct {
		protocol Protocol
		path     string
	}{{ProtocolOllama, "/api/chat"}, {ProtocolOpenAI, "/v1/chat/completions"}} {
		s, err := New(Config{Protocol: tt.protocol}, nil)
		if err != nil {
			t.Fatal(err)
		}
		body := `{"model":"sim-model","pad":"` + strings.Repeat("x", maxBodyBytes) + `"}`
		rec := httptest.NewRecorder()
		s.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodPost, tt.path, strings.NewReader(body)))
		checkErrorBody(t, tt.protocol, rec.Result(), http.StatusRequestEntityTooLarge)
	}
}

// A completions batch (more than one prompt, strings or token-id arrays)
// is answered as OpenAI and vLLM do: n choices per prompt, indexed prompt
// * n + choice, each prompt's first choice the answer that prompt alone
// gets; usage adds up the prompts.
func TestOpenAICompletionBatch(t *testing.T) {
	_, url, _ := startSim(t, Config{Protocol: ProtocolOpenAI, Seed: 3})
	type answer struct {
		Choices []struct {
			Index int    `json:"index"`
			Text  string `json:"text"`
		} `json:"choices"`
		Usage openaiUsage `json:"usage"`
	}
	complete := func(body map[string]any) answer {
		t.Helper()
		resp := mustPost(t, newClient(t), url+"/v1/completions", body)
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%v: status %d", body, resp.StatusCode)
		}
		var a answer
		if err := json.NewDecoder(resp.Body).Decode(&a); err != nil {
			t.Fatal(err)
		}
		return a
	}
	first := complete(map[string]any{"model": DefaultModel, "prompt": "one two", "max_tokens": 3})
	second := complete(map[string]any{"model": DefaultModel, "prompt": "three", "max_tokens": 3})
	batch := complete(map[string]any{"model": DefaultModel, "prompt": []string{"one two", "three"}, "max_tokens": 3, "n": 2})
	if len(batch.Choices) != 4 {
		t.Fatalf("%d choices, want 2 prompts x n 2", len(batch.Choices))
	}
	for i, c := range batch.Choices {
		if c.Index != i {
			t.Errorf("choice %d has index %d", i, c.Index)
		}
	}
	if batch.Choices[0].Text != first.Choices[0].Text || batch.Choices[2].Text != second.Choices[0].Text {
		t.Errorf("batch %+v, want prompt 0 then prompt 1 answered as alone (%q, %q)", batch.Choices, first.Choices[0].Text, second.Choices[0].Text)
	}
	if batch.Usage.PromptTokens != first.Usage.PromptTokens+second.Usage.PromptTokens {
		t.Errorf("prompt_tokens %d, want %d + %d", batch.Usage.PromptTokens, first.Usage.PromptTokens, second.Usage.PromptTokens)
	}
	ids := complete(map[string]any{"model": DefaultModel, "prompt": [][]int{{1, 2}, {3}}, "max_tokens": 2})
	if len(ids.Choices) != 2 || ids.Usage.PromptTokens != 3 {
		t.Errorf("token-id batch: %+v, want 2 choices and 3 prompt tokens", ids)
	}
}
