package node

import (
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"iop/internal/node/adapter"
	"iop/internal/wire/nodev1"
)

const (
	normalized = nodev1.ExecutionPath_EXECUTION_PATH_NORMALIZED
	tunnel     = nodev1.ExecutionPath_EXECUTION_PATH_TUNNEL
	opChat     = nodev1.Operation_OPERATION_CHAT
	hour       = time.Hour
)

func testConfig(edge string, providers ...ProviderConfig) Config {
	return Config{NodeID: "node-1", Label: "test node", Edge: edge, Token: "tok", Version: "v-test",
		ReconnectMin: 3 * time.Second, ReconnectMax: 12 * time.Second, Providers: providers}
}

func dispatchMsg(runID, providerID string, path nodev1.ExecutionPath) *nodev1.EdgeMessage {
	return &nodev1.EdgeMessage{Msg: &nodev1.EdgeMessage_Dispatch{Dispatch: &nodev1.Dispatch{
		RunId: runID, ProviderId: providerID, ServedModel: "served-model", ExecutionPath: path,
		Operation: opChat, Stream: true, Headers: map[string]string{"Accept": "text/event-stream"}}}}
}

func cancelMsg(runID string) *nodev1.EdgeMessage {
	return &nodev1.EdgeMessage{Msg: &nodev1.EdgeMessage_Cancel{Cancel: &nodev1.Cancel{RunId: runID, Reason: "client gone"}}}
}

// connect waits for the agent's next connection and welcomes it.
func connect(t testing.TB, e *fakeEdge, gen uint64, interval time.Duration) *edgeConn {
	t.Helper()
	c := recv(t, e.conns, "connection")
	c.welcome(t, gen, interval)
	return c
}

func TestAgentHelloAndWelcome(t *testing.T) {
	e, addr := startEdge(t)
	cfg := testConfig(addr,
		ProviderConfig{ID: "ollama", Type: "ollama", BaseURL: "http://127.0.0.1:11434", Models: []string{"llama3.2:3b", "nomic-embed-text"},
			Capabilities: []string{"embeddings", "stream"}},
		ProviderConfig{ID: "vllm", Type: "vllm", BaseURL: "http://127.0.0.1:8000/v1", Models: []string{"qwen"}, Capacity: 8, LongCapacity: 2,
			Capabilities: []string{"tools"}},
		ProviderConfig{ID: "oai", Type: "openai", BaseURL: "https://api.example.com/v1", Models: []string{"gpt"}, Capacity: 3},
		ProviderConfig{ID: "sim", Type: "sim", BaseURL: "http://127.0.0.1:9", Models: []string{"sim-model"}},
	)
	cfg.RuntimeConcurrency = 4
	a := startAgent(t, cfg, newTestClock(), nil)

	c := recv(t, e.conns, "connection")
	want := &nodev1.Hello{NodeId: "node-1", Label: "test node", Token: "tok", RuntimeConcurrency: 4, Version: "v-test",
		Providers: []*nodev1.Provider{
			{Id: "ollama", Type: "ollama", Models: []string{"llama3.2:3b", "nomic-embed-text"}, Capacity: 4, LongCapacity: 4,
				Capabilities: []string{"stream", "embeddings"}, ExecutionPath: normalized, Healthy: true},
			{Id: "vllm", Type: "vllm", Models: []string{"qwen"}, Capacity: 8, LongCapacity: 2,
				Capabilities: []string{"stream", "tools"}, ExecutionPath: tunnel, Healthy: true},
			{Id: "oai", Type: "openai", Models: []string{"gpt"}, Capacity: 3, LongCapacity: 3,
				Capabilities: []string{"stream"}, ExecutionPath: tunnel, Healthy: true},
			{Id: "sim", Type: "sim", Models: []string{"sim-model"}, Capacity: 4, LongCapacity: 4,
				Capabilities: []string{"stream"}, ExecutionPath: normalized, Healthy: true},
		}}
	// The instance is the agent's own random id, the same on every
	// connection.
	if len(c.hello.GetInstance()) != 16 || c.hello.GetInstance() != a.instance {
		t.Errorf("instance %q, want the agent's %q", c.hello.GetInstance(), a.instance)
	}
	want.Instance = c.hello.GetInstance()
	if !proto.Equal(c.hello, want) {
		t.Errorf("hello\n got %v\nwant %v", c.hello, want)
	}
	select {
	case <-a.Ready():
		t.Fatal("ready before welcome")
	default:
	}
	if g := a.Generation(); g != 0 {
		t.Errorf("generation %d before welcome", g)
	}
	c.welcome(t, 7, hour)
	recv(t, a.Ready(), "ready")
	if g := a.Generation(); g != 7 {
		t.Errorf("generation %d, want 7", g)
	}
}

func TestAgentSendsHeartbeats(t *testing.T) {
	e, addr := startEdge(t)
	clk := newTestClock()
	a := startAgent(t, testConfig(addr, ProviderConfig{ID: "p", Type: "openai", BaseURL: "http://127.0.0.1:1", Models: []string{"m"}}), clk, nil)
	c := connect(t, e, 1, time.Second)
	for i := 0; i < 2; i++ {
		clk.waitArmed(t, time.Second)
		clk.Advance(time.Second)
		if hb := c.nextHeartbeat(t); hb.UnixNano != clk.Now().UnixNano() {
			t.Errorf("heartbeat %d stamped %d, want %d", i, hb.UnixNano, clk.Now().UnixNano())
		}
	}
	if g := a.Generation(); g != 1 {
		t.Errorf("generation %d after two heartbeats, want 1", g)
	}
}

// TestAgentReconnectsAfterMissedHeartbeats: three intervals without a word
// from the edge end the connection; the agent backs off and says hello again.
func TestAgentReconnectsAfterMissedHeartbeats(t *testing.T) {
	e, addr := startEdge(t)
	clk := newTestClock()
	a := startAgent(t, testConfig(addr, ProviderConfig{ID: "p", Type: "openai", BaseURL: "http://127.0.0.1:1", Models: []string{"m"}}), clk, nil)
	c1 := connect(t, e, 1, time.Second)
	for range 2 {
		clk.waitArmed(t, time.Second)
		clk.Advance(time.Second)
		c1.nextHeartbeat(t)
	}
	clk.waitArmed(t, time.Second)
	clk.Advance(time.Second) // third silent interval
	recv(t, c1.done, "first connection to end")
	waitGeneration(t, a, 0)

	clk.waitArmed(t, 3*time.Second) // backoff: ReconnectMin
	clk.Advance(3 * time.Second)
	c2 := connect(t, e, 2, hour)
	if c2.hello.NodeId != "node-1" {
		t.Errorf("second hello %v", c2.hello)
	}
	waitGeneration(t, a, 2)
}

func TestAgentReconnectsAfterStreamDrop(t *testing.T) {
	e, addr := startEdge(t)
	clk := newTestClock()
	a := startAgent(t, testConfig(addr, ProviderConfig{ID: "p", Type: "openai", BaseURL: "http://127.0.0.1:1", Models: []string{"m"}}), clk, nil)
	c1 := connect(t, e, 1, hour)
	waitGeneration(t, a, 1)
	c1.end <- status.Error(codes.Unavailable, "edge restarting")
	waitGeneration(t, a, 0)
	clk.waitArmed(t, 3*time.Second)
	clk.Advance(3 * time.Second)
	connect(t, e, 2, hour)
	waitGeneration(t, a, 2)
}

// TestAgentRetriesRefusedHello: a refused hello is logged at error level and
// retried with exponential backoff (jitter off: 3s, 6s, 12s, then the 12s cap).
func TestAgentRetriesRefusedHello(t *testing.T) {
	e, addr := startEdge(t)
	clk := newTestClock()
	logs := &logRecorder{}
	a := startAgent(t, testConfig(addr, ProviderConfig{ID: "p", Type: "openai", BaseURL: "http://127.0.0.1:1", Models: []string{"m"}}), clk, logs)
	for _, wait := range []time.Duration{3 * time.Second, 6 * time.Second, 12 * time.Second, 12 * time.Second} {
		c := recv(t, e.conns, "connection")
		c.send(t, &nodev1.EdgeMessage{Msg: &nodev1.EdgeMessage_HelloRefused{HelloRefused: &nodev1.HelloRefused{Reason: "bad token"}}})
		c.end <- nil
		clk.waitArmed(t, wait)
		if g := a.Generation(); g != 0 {
			t.Fatalf("generation %d while refused", g)
		}
		clk.Advance(wait)
	}
	if !logs.find(slog.LevelError, "bad token") {
		t.Error("refusal not logged at error level with its reason")
	}
	connect(t, e, 9, hour)
	waitGeneration(t, a, 9)
}

func TestAgentRefusesDispatches(t *testing.T) {
	e, addr := startEdge(t)
	startAgent(t, testConfig(addr, ProviderConfig{ID: "p", Type: "openai", BaseURL: "http://127.0.0.1:1", Models: []string{"m"}}), newTestClock(), nil)
	c := connect(t, e, 1, hour)

	noOp := dispatchMsg("r4", "p", tunnel)
	noOp.GetDispatch().Operation = nodev1.Operation_OPERATION_UNSPECIFIED
	for _, tc := range []struct {
		msg  *nodev1.EdgeMessage
		want error
	}{
		{dispatchMsg("r1", "nope", tunnel), ErrUnknownProvider},
		{dispatchMsg("r2", "p", normalized), ErrPathMismatch},
		{dispatchMsg("", "p", tunnel), ErrMissingRunID},
		{noOp, ErrUnsupportedOperation},
	} {
		c.send(t, tc.msg)
		m := c.next(t).GetDispatchRefused()
		if m == nil || m.RunId != tc.msg.GetDispatch().RunId || !strings.Contains(m.Reason, tc.want.Error()) {
			t.Errorf("dispatch %v: got %v, want a refusal for %v", tc.msg.GetDispatch(), m, tc.want)
		}
	}
}

// ollamaServer answers /api/chat with a short NDJSON stream and records the
// served model of each request.
func ollamaServer(t *testing.T) (*httptest.Server, *atomic.Int32) {
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body struct {
			Model string `json:"model"`
		}
		json.NewDecoder(r.Body).Decode(&body)
		if r.URL.Path != "/api/chat" || body.Model != "served-model" {
			http.Error(w, `{"error":"unexpected request"}`, 400)
			return
		}
		calls.Add(1)
		for _, l := range []string{
			`{"message":{"role":"assistant","content":"Hi"},"done":false}`,
			`{"message":{"role":"assistant","content":" there"},"done":false}`,
			`{"message":{"role":"assistant","content":""},"done":true,"done_reason":"stop","prompt_eval_count":5,"eval_count":2}`,
		} {
			io.WriteString(w, l+"\n")
			w.(http.Flusher).Flush()
		}
	}))
	t.Cleanup(srv.Close)
	return srv, &calls
}

func eventsOf(msgs []*nodev1.RunUp) []*nodev1.RunEvent {
	var out []*nodev1.RunEvent
	for _, m := range msgs {
		out = append(out, m.GetEvents().GetEvents()...)
	}
	return out
}

// TestAgentRunsNormalizedDispatches: each dispatch gets its own Run stream
// opened with RunOpen{run, node, generation}; the body arrives in chunks and
// events flow back. Three runs on a provider of capacity 1 all run: capacity
// is the edge's to enforce.
func TestAgentRunsNormalizedDispatches(t *testing.T) {
	e, addr := startEdge(t)
	ollama, calls := ollamaServer(t)
	startAgent(t, testConfig(addr, ProviderConfig{ID: "ol", Type: "ollama", BaseURL: ollama.URL, Models: []string{"served-model"}, Capacity: 1}), newTestClock(), nil)
	c := connect(t, e, 3, hour)
	ids := []string{"r1", "r2", "r3"}
	for _, id := range ids {
		c.send(t, dispatchMsg(id, "ol", normalized))
	}
	var seen []string
	for range ids {
		r := recv(t, e.runs, "run stream")
		if r.open.NodeId != "node-1" || r.open.Generation != 3 {
			t.Errorf("run open %v", r.open)
		}
		seen = append(seen, r.open.RunId)
		r.sendBody(t, `{"model":"alias","messages":[{"role":"user",`, `"content":"hello"}],"stream":true}`)
		evs := eventsOf(r.rest(t))
		var types []nodev1.RunEvent_Type
		text := ""
		for _, ev := range evs {
			types = append(types, ev.Type)
			text += ev.Text
		}
		want := []nodev1.RunEvent_Type{nodev1.RunEvent_TYPE_STARTED, nodev1.RunEvent_TYPE_DELTA, nodev1.RunEvent_TYPE_DELTA,
			nodev1.RunEvent_TYPE_USAGE, nodev1.RunEvent_TYPE_COMPLETE}
		if !slices.Equal(types, want) || text != "Hi there" {
			t.Errorf("run %s: events %v text %q", r.open.RunId, types, text)
		}
		if u := evs[3]; u.PromptTokens != 5 || u.CompletionTokens != 2 {
			t.Errorf("usage %v", u)
		}
	}
	slices.Sort(seen)
	if !slices.Equal(seen, ids) {
		t.Errorf("runs opened %v, want %v", seen, ids)
	}
	if calls.Load() != 3 {
		t.Errorf("%d provider calls, want 3", calls.Load())
	}
}

func TestAgentRunsTunnelDispatch(t *testing.T) {
	e, addr := startEdge(t)
	const sse = "data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\ndata: [DONE]\n\n"
	var gotBody atomic.Value
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		gotBody.Store(string(b) + " " + r.URL.Path + " " + r.Header.Get("Authorization") + " " + r.Header.Get("Accept"))
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, sse)
	}))
	t.Cleanup(up.Close)
	t.Setenv("IOP_TEST_OPENAI_KEY", "sk-test")
	startAgent(t, testConfig(addr, ProviderConfig{ID: "oai", Type: "openai", BaseURL: up.URL + "/v1", Models: []string{"served-model"},
		APIKeyEnv: "IOP_TEST_OPENAI_KEY"}), newTestClock(), nil)
	c := connect(t, e, 1, hour)
	c.send(t, dispatchMsg("t1", "oai", tunnel))
	r := recv(t, e.runs, "run stream")
	r.sendBody(t, `{"model":"alias","stream":true}`)
	msgs := r.rest(t)
	head, data, complete := tunnelAnswer(msgs)
	if head == nil || head.Status != 200 || head.Headers["Content-Type"] != "text/event-stream" {
		t.Errorf("head %v", msgs[0])
	}
	if data != sse {
		t.Errorf("data %q", data)
	}
	// A stream ends with its own TunnelEnd, whatever came with its head.
	if !complete || msgs[len(msgs)-1].GetTunnelEnd() == nil {
		t.Errorf("messages %v, want a stream ending with TunnelEnd", msgs)
	}
	if got := gotBody.Load(); got != `{"model":"served-model","stream":true} /v1/chat/completions Bearer sk-test text/event-stream` {
		t.Errorf("provider got %q", got)
	}
}

func inlineDispatchMsg(runID, providerID string, path nodev1.ExecutionPath, body string) *nodev1.EdgeMessage {
	m := dispatchMsg(runID, providerID, path)
	m.GetDispatch().Body, m.GetDispatch().BodyInline = []byte(body), true
	return m
}

// TestAgentInlineBodyCallsProviderAtOnce: a Dispatch that carries its body
// inline is run without anything coming down its run stream: the fake edge
// here never sends a Body message, and the provider gets the body (its
// model rewritten) and answers in full, on both execution paths. A node
// that waited for a Body message would never call the provider.
func TestAgentInlineBodyCallsProviderAtOnce(t *testing.T) {
	t.Run("tunnel", func(t *testing.T) {
		e, addr := startEdge(t)
		const sse = "data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\ndata: [DONE]\n\n"
		got := make(chan string, 1)
		up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			b, _ := io.ReadAll(r.Body)
			got <- string(b)
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, sse)
		}))
		t.Cleanup(up.Close)
		startAgent(t, testConfig(addr, ProviderConfig{ID: "oai", Type: "openai", BaseURL: up.URL + "/v1", Models: []string{"served-model"}}), newTestClock(), nil)
		c := connect(t, e, 1, hour)
		c.send(t, inlineDispatchMsg("t1", "oai", tunnel, `{"model":"alias","stream":true}`))
		r := recv(t, e.runs, "run stream")
		if b := recv(t, got, "provider request"); b != `{"model":"served-model","stream":true}` {
			t.Errorf("provider got %q", b)
		}
		msgs := r.rest(t)
		head, data, complete := tunnelAnswer(msgs)
		if head.GetStatus() != 200 || !complete {
			t.Fatalf("messages %v, want a complete answer", msgs)
		}
		if data != sse {
			t.Errorf("data %q", data)
		}
	})
	t.Run("normalized", func(t *testing.T) {
		e, addr := startEdge(t)
		ollama, calls := ollamaServer(t)
		startAgent(t, testConfig(addr, ProviderConfig{ID: "ol", Type: "ollama", BaseURL: ollama.URL, Models: []string{"served-model"}}), newTestClock(), nil)
		c := connect(t, e, 1, hour)
		c.send(t, inlineDispatchMsg("r1", "ol", normalized, `{"model":"alias","messages":[{"role":"user","content":"hello"}],"stream":true}`))
		r := recv(t, e.runs, "run stream")
		evs := eventsOf(r.rest(t))
		if len(evs) == 0 || evs[len(evs)-1].Type != nodev1.RunEvent_TYPE_COMPLETE {
			t.Fatalf("events %v, want a complete run", evs)
		}
		if calls.Load() != 1 {
			t.Errorf("%d provider calls, want 1", calls.Load())
		}
	})
}

// hangingUpstream answers with one chunk in the shape of path and then
// waits for the request to be aborted, which closes gone.
func hangingUpstream(t *testing.T, path nodev1.ExecutionPath) (*httptest.Server, chan struct{}) {
	gone := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if path == normalized {
			io.WriteString(w, `{"message":{"role":"assistant","content":"a"},"done":false}`+"\n")
		} else {
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, "data: {}\n\n")
		}
		w.(http.Flusher).Flush()
		<-r.Context().Done()
		close(gone)
	}))
	t.Cleanup(srv.Close)
	return srv, gone
}

func hangingProvider(t *testing.T, path nodev1.ExecutionPath) (ProviderConfig, chan struct{}) {
	srv, gone := hangingUpstream(t, path)
	if path == normalized {
		return ProviderConfig{ID: "p", Type: "ollama", BaseURL: srv.URL, Models: []string{"served-model"}}, gone
	}
	return ProviderConfig{ID: "p", Type: "vllm", BaseURL: srv.URL, Models: []string{"served-model"}}, gone
}

// TestAgentCancelStopsRun: a Cancel, on the control stream or on the run's
// own stream, aborts the provider request and ends the run with CANCELLED
// (normalized) or TunnelError (tunnel), whether its body came in Body
// messages or inline.
func TestAgentCancelStopsRun(t *testing.T) {
	const body = `{"messages":[{"role":"user","content":"x"}]}`
	for _, path := range []nodev1.ExecutionPath{normalized, tunnel} {
		for _, via := range []string{"control", "run", "control/inline", "run/inline"} {
			t.Run(path.String()+"/"+via, func(t *testing.T) {
				e, addr := startEdge(t)
				pc, gone := hangingProvider(t, path)
				startAgent(t, testConfig(addr, pc), newTestClock(), nil)
				c := connect(t, e, 1, hour)
				inline := strings.HasSuffix(via, "/inline")
				via = strings.TrimSuffix(via, "/inline")
				if inline {
					c.send(t, inlineDispatchMsg("r1", "p", path, body))
				} else {
					c.send(t, dispatchMsg("r1", "p", path))
				}
				r := recv(t, e.runs, "run stream")
				if !inline {
					r.sendBody(t, body)
				}
				if path == normalized {
					// STARTED comes with the first part of the answer.
					if ev := r.next(t).GetEvents().GetEvents(); len(ev) != 2 || ev[0].Type != nodev1.RunEvent_TYPE_STARTED || ev[1].Type != nodev1.RunEvent_TYPE_DELTA {
						t.Fatalf("want STARTED and a delta, got %v", ev)
					}
				} else if len(r.next(t).GetTunnelHead().GetData()) == 0 {
					// The head goes with the stream's first event.
					t.Fatal("want the head with the first data")
				}
				if via == "control" {
					c.send(t, cancelMsg("r1"))
				} else if err := r.stream.Send(&nodev1.RunDown{Msg: &nodev1.RunDown_Cancel{Cancel: &nodev1.Cancel{RunId: "r1"}}}); err != nil {
					t.Fatal(err)
				}
				recv(t, gone, "provider request to be aborted")
				rest := r.rest(t)
				if len(rest) != 1 {
					t.Fatalf("after cancel: %v", rest)
				}
				if path == normalized {
					if ev := rest[0].GetEvents().GetEvents(); len(ev) != 1 || ev[0].Type != nodev1.RunEvent_TYPE_CANCELLED {
						t.Errorf("last %v, want CANCELLED", rest[0])
					}
				} else if rest[0].GetTunnelError() == nil {
					t.Errorf("last %v, want TunnelError", rest[0])
				}
			})
		}
	}
}

// TestAgentCancelBeforeBody: a run cancelled while its body is still
// arriving never reaches the provider.
func TestAgentCancelBeforeBody(t *testing.T) {
	e, addr := startEdge(t)
	pc, _ := hangingProvider(t, normalized)
	startAgent(t, testConfig(addr, pc), newTestClock(), nil)
	c := connect(t, e, 1, hour)
	c.send(t, dispatchMsg("r1", "p", normalized))
	r := recv(t, e.runs, "run stream")
	if err := r.stream.Send(&nodev1.RunDown{Msg: &nodev1.RunDown_Body{Body: &nodev1.Body{Data: []byte(`{"messa`)}}}); err != nil {
		t.Fatal(err)
	}
	c.send(t, cancelMsg("r1"))
	rest := r.rest(t)
	if len(rest) != 1 || rest[0].GetEvents().GetEvents()[0].Type != nodev1.RunEvent_TYPE_CANCELLED {
		t.Errorf("got %v, want CANCELLED", rest)
	}
}

// TestAgentConnectionLossCancelsRuns: when the Connect stream breaks, every
// run of that generation is cancelled and its provider request aborted.
func TestAgentConnectionLossCancelsRuns(t *testing.T) {
	e, addr := startEdge(t)
	pc, gone := hangingProvider(t, tunnel)
	a := startAgent(t, testConfig(addr, pc), newTestClock(), nil)
	c := connect(t, e, 1, hour)
	c.send(t, dispatchMsg("r1", "p", tunnel))
	r := recv(t, e.runs, "run stream")
	r.sendBody(t, `{}`)
	r.next(t) // head, with the first data
	c.end <- status.Error(codes.Unavailable, "edge going away")
	recv(t, gone, "provider request to be aborted")
	waitGeneration(t, a, 0)
	for m := r.next(t); m != nil; m = r.next(t) { // the run stream ends too
	}
}

// TestAgentSlowRunDoesNotBlockOthers: a run whose reader has stopped reading
// (its stream backpressured by HTTP/2 flow control) does not hold up another
// run on the same node.
func TestAgentSlowRunDoesNotBlockOthers(t *testing.T) {
	e, addr := startEdge(t)
	const mib = 1 << 20
	bigWritten := make(chan struct{})
	var once atomic.Bool
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if !strings.Contains(string(b), "big") {
			io.WriteString(w, "small answer")
			return
		}
		chunk := []byte(strings.Repeat("x", mib))
		for n := 0; ; n++ {
			if _, err := w.Write(chunk); err != nil {
				return
			}
			w.(http.Flusher).Flush()
			if n == 2 && once.CompareAndSwap(false, true) {
				close(bigWritten)
			}
		}
	}))
	t.Cleanup(up.Close)
	startAgent(t, testConfig(addr, ProviderConfig{ID: "p", Type: "openai", BaseURL: up.URL, Models: []string{"served-model"}, Capacity: 2}), newTestClock(), nil)
	c := connect(t, e, 1, hour)

	// Not streamed: the upstream answers plain bytes, which a streamed
	// request would refuse as no event stream.
	plain := func(runID string) *nodev1.EdgeMessage {
		m := dispatchMsg(runID, "p", tunnel)
		m.GetDispatch().Stream = false
		return m
	}
	c.send(t, plain("big"))
	big := recv(t, e.runs, "big run")
	big.sendBody(t, `{"note":"big"}`)
	big.next(t) // head; then stop reading
	recv(t, bigWritten, "3 MiB of the big answer written")

	c.send(t, plain("small"))
	small := recv(t, e.runs, "small run")
	small.sendBody(t, `{"note":"small"}`)
	msgs := small.rest(t)
	// A small whole answer goes up as one message: head, body and end.
	if _, body, complete := tunnelAnswer(msgs); len(msgs) != 1 || body != "small answer" || !complete {
		t.Errorf("small run: %v", msgs)
	}

	c.send(t, cancelMsg("big"))
	rest := big.rest(t)
	if len(rest) == 0 || rest[len(rest)-1].GetTunnelError() == nil {
		t.Errorf("big run did not end with TunnelError")
	}
}

// TestRegression_NodeBehindAnOldEdgeSendsTheAnswerApart: an edge older
// than TunnelHead's data/end (no tunnel_head_body in its Welcome) ignores
// those fields, so a node that sent a whole small answer as one head lost
// the body there (the node was upgraded before its edge). Such an edge
// gets the head, the body as TunnelData and a TunnelEnd, as before the
// one-message form; today's edge gets one message.
func TestRegression_NodeBehindAnOldEdgeSendsTheAnswerApart(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"answer":"small"}`)
	}))
	t.Cleanup(up.Close)
	for _, tc := range []struct {
		name     string
		features []string
		want     int // messages
	}{
		{"old edge", nil, 3},
		{"current edge", []string{nodev1.FeatureTunnelHeadBody}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, addr := startEdge(t)
			startAgent(t, testConfig(addr, ProviderConfig{ID: "p", Type: "openai", BaseURL: up.URL, Models: []string{"served-model"}}), newTestClock(), nil)
			c := recv(t, e.conns, "connection")
			c.welcomeWith(t, 1, hour, tc.features...)
			m := dispatchMsg("r1", "p", tunnel)
			m.GetDispatch().Stream = false
			c.send(t, m)
			run := recv(t, e.runs, "run")
			run.sendBody(t, `{"model":"served-model"}`)
			msgs := run.rest(t)
			head, body, complete := tunnelAnswer(msgs)
			if len(msgs) != tc.want || body != `{"answer":"small"}` || !complete {
				t.Fatalf("%d messages %v, body %q, complete %v; want %d messages with the whole body", len(msgs), msgs, body, complete, tc.want)
			}
			if tc.features == nil && (len(head.GetData()) > 0 || head.GetEnd() || head.GetContentLength() != 0) {
				t.Errorf("head to an old edge carries data/end/content_length: %v", head)
			}
		})
	}
}

func TestAgentRunTwice(t *testing.T) {
	e, addr := startEdge(t)
	a := startAgent(t, testConfig(addr, ProviderConfig{ID: "p", Type: "openai", BaseURL: "http://127.0.0.1:1", Models: []string{"m"}}), newTestClock(), nil)
	recv(t, e.conns, "connection") // Run is active
	if err := a.Run(t.Context()); !errors.Is(err, ErrAlreadyRunning) {
		t.Errorf("second Run = %v, want ErrAlreadyRunning", err)
	}
}

func TestTerminal(t *testing.T) {
	provErr := &adapter.Error{Kind: adapter.ErrProviderStatus, Status: 500, Message: "boom"}
	badReq := &adapter.Error{Kind: adapter.ErrBadRequest, Status: 400, Message: "echo: not supported", Param: "echo"}
	for _, tc := range []struct {
		name string
		path nodev1.ExecutionPath
		err  error
		want *nodev1.RunUp
	}{
		{"normalized ok", normalized, nil, nil},
		{"tunnel ok", tunnel, nil, &nodev1.RunUp{Msg: &nodev1.RunUp_TunnelEnd{TunnelEnd: &nodev1.TunnelEnd{}}}},
		{"sink", normalized, adapter.ErrSink, nil},
		{"tunnel sink", tunnel, adapter.ErrSink, nil},
		{"normalized cancel", normalized, adapter.ErrCancelled, runEvents(&nodev1.RunEvent{Type: nodev1.RunEvent_TYPE_CANCELLED})},
		{"tunnel cancel", tunnel, adapter.ErrCancelled, &nodev1.RunUp{Msg: &nodev1.RunUp_TunnelError{TunnelError: &nodev1.TunnelError{Message: "run cancelled"}}}},
		{"normalized provider", normalized, provErr, runEvents(&nodev1.RunEvent{Type: nodev1.RunEvent_TYPE_ERROR, Error: "boom", Status: 500})},
		{"tunnel provider", tunnel, provErr, &nodev1.RunUp{Msg: &nodev1.RunUp_TunnelError{TunnelError: &nodev1.TunnelError{Message: "boom", Status: 500}}}},
		{"normalized bad request", normalized, badReq, runEvents(&nodev1.RunEvent{Type: nodev1.RunEvent_TYPE_ERROR, Error: "echo: not supported", Status: 400, InvalidRequest: true, Param: "echo"})},
		{"tunnel bad request", tunnel, badReq, &nodev1.RunUp{Msg: &nodev1.RunUp_TunnelError{TunnelError: &nodev1.TunnelError{Message: "echo: not supported", Status: 400}}}},
		{"other", normalized, errors.New("x"), runEvents(&nodev1.RunEvent{Type: nodev1.RunEvent_TYPE_ERROR, Error: "node failed to run the request", Status: 502})},
	} {
		if got := terminal(tc.path, tc.err); !proto.Equal(got, tc.want) {
			t.Errorf("%s: got %v, want %v", tc.name, got, tc.want)
		}
	}
}

func runEvents(evs ...*nodev1.RunEvent) *nodev1.RunUp {
	return &nodev1.RunUp{Msg: &nodev1.RunUp_Events{Events: &nodev1.RunEvents{Events: evs}}}
}

// TestAgentHelloTimeout: an edge that never answers Hello is given up on
// after the hello timeout, on a fresh client connection.
func TestAgentHelloTimeout(t *testing.T) {
	e, addr := startEdge(t)
	clk := newTestClock()
	a := startAgent(t, testConfig(addr, ProviderConfig{ID: "p", Type: "openai", BaseURL: "http://127.0.0.1:1", Models: []string{"m"}}), clk, nil)
	c1 := recv(t, e.conns, "connection")
	clk.waitArmed(t, helloTimeout)
	clk.Advance(helloTimeout)
	recv(t, c1.done, "silent connection to end")
	clk.waitArmed(t, 3*time.Second)
	clk.Advance(3 * time.Second)
	connect(t, e, 2, hour)
	waitGeneration(t, a, 2)
}

// TestRegression_ReplacedAtOnceBacksOff: two nodes sharing a node_id made the
// edge replace each one's connection right after its Welcome; the backoff
// reset on every Welcome, so both reconnected about every 100 ms forever.
// A connection that did not last keeps growing the backoff, and the
// replacement is logged at error level naming the node_id.
func TestRegression_ReplacedAtOnceBacksOff(t *testing.T) {
	e, addr := startEdge(t)
	clk := newTestClock()
	logs := &logRecorder{}
	a := startAgent(t, testConfig(addr, ProviderConfig{ID: "p", Type: "openai", BaseURL: "http://127.0.0.1:1", Models: []string{"m"}}), clk, logs)
	gen := uint64(1)
	for _, wait := range []time.Duration{3 * time.Second, 6 * time.Second, 12 * time.Second} {
		c := connect(t, e, gen, hour)
		waitGeneration(t, a, gen)
		c.end <- status.Error(codes.FailedPrecondition, "connection superseded by a newer one of the same node")
		waitGeneration(t, a, 0)
		clk.waitArmed(t, wait)
		clk.Advance(wait)
		gen++
	}
	if !logs.find(slog.LevelError, "superseded") {
		t.Error("replacement not logged at error level")
	}
	connect(t, e, gen, hour)
	waitGeneration(t, a, gen)
}

// TestBackoffJitter: every reconnect wait is drawn uniformly in [0, its
// ceiling] (ReconnectMin doubling up to ReconnectMax); agents with their own
// random sources wait different times, so nodes that lose one edge do not
// all dial it again at the same instant, and one source replays the same
// waits.
func TestBackoffJitter(t *testing.T) {
	cfg := testConfig("127.0.0.1:1", ProviderConfig{ID: "p", Type: "openai", BaseURL: "http://127.0.0.1:1", Models: []string{"m"}})
	cfg.ReconnectMin, cfg.ReconnectMax = time.Second, 8*time.Second
	ceilings := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 8 * time.Second}
	waits := func(seed uint64) []time.Duration {
		a, err := New(cfg, nil, WithRand(rand.New(rand.NewPCG(seed, 42))))
		if err != nil {
			t.Fatal(err)
		}
		defer a.closeAdapters()
		var out []time.Duration
		for attempt, ceiling := range ceilings {
			d := a.backoff(attempt)
			if d < 0 || d > ceiling {
				t.Fatalf("seed %d attempt %d: wait %s outside [0, %s]", seed, attempt, d, ceiling)
			}
			out = append(out, d)
		}
		return out
	}
	const nodes = 8
	firsts := make(map[time.Duration]bool)
	for seed := range uint64(nodes) {
		w := waits(seed)
		firsts[w[0]] = true
		if again := waits(seed); !slices.Equal(w, again) {
			t.Fatalf("seed %d: waits %v then %v from one source", seed, w, again)
		}
	}
	if len(firsts) < nodes {
		t.Fatalf("%d nodes drew only %d distinct first waits: %v", nodes, len(firsts), firsts)
	}
	// The default source: two agents' first waits differ too.
	a1, _ := New(cfg, nil)
	a2, _ := New(cfg, nil)
	defer a1.closeAdapters()
	defer a2.closeAdapters()
	same := 0
	for range 16 {
		if a1.backoff(3) == a2.backoff(3) {
			same++
		}
	}
	if same == 16 {
		t.Fatal("two agents with the default source drew the same 16 waits")
	}
}
