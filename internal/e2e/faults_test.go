package e2e

// Fault tests: real edge, real node agents over gRPC,
// `iop sim` backends with fault injection, raw HTTP servers standing in for
// misbehaving providers, and a child `iop node` process that is stopped and
// killed.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"iop/internal/clock"
	"iop/internal/e2e/harness"
	"iop/internal/edge"
	"iop/internal/edge/contract"
	"iop/internal/node"
	"iop/internal/process"
	"iop/internal/sim"
	"iop/internal/sse"
	"iop/internal/testenv"
)

// startFaultEdge starts an edge for cfg on ephemeral loopback ports (or
// cfg.NodeListen, if set) with in-memory run records, stopped at the end
// of the test; ctx ends then too.
func startFaultEdge(t *testing.T, cfg process.EdgeFile) (*process.Process, context.Context) {
	t.Helper()
	cfg.Listen = "127.0.0.1:0"
	if cfg.NodeListen == process.DefaultNodeListen || cfg.NodeListen == "" {
		cfg.NodeListen = "127.0.0.1:0"
	}
	cfg.Database = ":memory:"
	ctx, cancel := context.WithCancel(context.Background())
	e, err := process.Start(ctx, process.Config{Mode: process.ModeEdge, Edge: cfg}, process.Deps{Logger: harness.Logger(t, "edge")})
	if err != nil {
		t.Fatal(err)
	}
	harness.StopAtCleanup(t, cancel, e)
	harness.RememberEdge(t, e)
	return e, ctx
}

// post sends a JSON body to the edge and returns the status, headers and
// whole body.
func post(t *testing.T, e *process.Process, path, body string) (int, http.Header, []byte) {
	t.Helper()
	resp, err := http.Post("http://"+e.HTTPAddr+path, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("POST %s: reading the body: %v", path, err)
	}
	return resp.StatusCode, resp.Header, data
}

// chatBody is a chat request for model.
func chatBody(model string, stream bool, maxTokens int) string {
	return fmt.Sprintf(`{"model":%q,"stream":%v,"max_tokens":%d,"messages":[{"role":"user","content":"hello there"}]}`, model, stream, maxTokens)
}

// openAIError decodes an OpenAI error body, failing the test unless it has
// that shape: {"error":{"message","type","param","code"}} with a message
// and a type (a provider's own error may have a null code).
func openAIError(t *testing.T, header http.Header, body []byte) (message, typ, code string) {
	t.Helper()
	if ct := header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Fatalf("Content-Type %q, want application/json (body %s)", ct, body)
	}
	var doc struct {
		Error map[string]json.RawMessage `json:"error"`
	}
	if err := json.Unmarshal(body, &doc); err != nil || doc.Error == nil {
		t.Fatalf("body %s is not an OpenAI error: %v", body, err)
	}
	for _, k := range []string{"message", "type", "param", "code"} {
		if _, ok := doc.Error[k]; !ok {
			t.Fatalf("error %s lacks %q", body, k)
		}
	}
	_ = json.Unmarshal(doc.Error["message"], &message)
	_ = json.Unmarshal(doc.Error["type"], &typ)
	_ = json.Unmarshal(doc.Error["code"], &code)
	if message == "" || typ == "" {
		t.Fatalf("error %s: empty message or type", body)
	}
	return message, typ, code
}

// sseData returns the data of each SSE event of body, in order.
func sseData(body []byte) []string {
	var out []string
	_ = sse.ReadAll(bytes.NewReader(body), func(e sse.Event) error {
		out = append(out, string(e.Data))
		return nil
	})
	return out
}

// checkStreamFailed checks an SSE body that started and then failed: at
// least one content chunk, then a last event {"error":{...}}, and no
// [DONE].
func checkStreamFailed(t *testing.T, body []byte) {
	t.Helper()
	events := sseData(body)
	if len(events) < 2 {
		t.Fatalf("stream %q: want chunks then an error event", body)
	}
	for _, ev := range events {
		if ev == "[DONE]" {
			t.Fatalf("a failed stream ended with [DONE]: %q", body)
		}
	}
	if !strings.Contains(events[0], `"choices"`) {
		t.Fatalf("first event %s is no chunk", events[0])
	}
	var last struct {
		Error *struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal([]byte(events[len(events)-1]), &last); err != nil || last.Error == nil || last.Error.Message == "" {
		t.Fatalf("last event %s is not an error", events[len(events)-1])
	}
}

// providerInFlight is the in-flight count of one provider in the edge's
// snapshot (0 when unknown).
func providerInFlight(e *process.Process, providerID string) int {
	for _, p := range e.Service.Snapshot().Providers {
		if p.ProviderID == providerID {
			return p.InFlight
		}
	}
	return 0
}

// closedURL is an http URL on a loopback port nothing listens on: a
// provider there refuses connections. The port is held by a socket bound
// to it but not listening (a connect to it is answered RST), until the
// test ends: a port merely found free and closed again could be taken by
// another test's server in between (TestRegression_ClosedPortTakenByAnotherServer:
// the refused provider answered another simulator's 404 under a parallel load).
func closedURL(t *testing.T) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("http://127.0.0.1:%d", sa.(*syscall.SockaddrInet4).Port)
}

// TestRegression_ClosedPortTakenByAnotherServer: the port of closedURL
// stays refused while the test runs; no listener can take it.
func TestRegression_ClosedPortTakenByAnotherServer(t *testing.T) {
	harness.Parallel(t)
	u := closedURL(t)
	if ln, err := net.Listen("tcp", strings.TrimPrefix(u, "http://")); err == nil {
		ln.Close()
		t.Fatalf("a server could listen on %s, closedURL's port", u)
	}
	if resp, err := http.Get(u); err == nil {
		resp.Body.Close()
		t.Fatalf("GET %s answered %d; want the connection refused", u, resp.StatusCode)
	} else if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("GET %s: %v; want connection refused", u, err)
	}
}

// TestFaultFailingProviderAnswersAtOnce: a provider that refuses
// connections, answers 500, 502 or 504, or hangs past its request timeout
// gets its client a clear OpenAI-shaped error (502 for a refused
// connection, the provider's own status for its answers, 504 for the
// timeout), on both execution paths; its slot is free before the client
// has the answer, so the next request to it is admitted at once (its queue
// timeout is 1 ms: a request that had to wait would get 503
// queue_timeout), and a healthy provider keeps serving.
func TestFaultFailingProviderAnswersAtOnce(t *testing.T) {
	harness.Parallel(t)
	type failing struct {
		model, provider string
		status          int
		code            string
	}
	var cases []failing
	var providers []node.ProviderConfig
	models := map[string]edge.ModelConfig{}
	add := func(protocol sim.Protocol, name, baseURL string, timeout time.Duration, status int, code string) {
		typ, path := node.TypeOllama, ""
		if protocol == sim.ProtocolOpenAI {
			typ, path = "openai", "/v1"
		}
		model := name + "-" + string(protocol)
		providers = append(providers, node.ProviderConfig{ID: "p-" + model, Type: typ, BaseURL: baseURL + path, Models: []string{model}, Capacity: 1, Timeout: timeout})
		// The alias has a 1 ms queue timeout: a request that cannot be
		// admitted at once fails 503 queue_timeout.
		models["q-"+model] = edge.ModelConfig{Targets: []string{model}, QueueTimeout: time.Millisecond}
		cases = append(cases, failing{model, "p-" + model, status, code})
	}
	for _, protocol := range []sim.Protocol{sim.ProtocolOllama, sim.ProtocolOpenAI} {
		add(protocol, "refused", closedURL(t), 0, http.StatusBadGateway, "upstream_error")
		for _, status := range []int{500, 502, 504} {
			name := fmt.Sprintf("status%d", status)
			_, u := harness.Sim(t, sim.Config{Protocol: protocol, Models: []string{name + "-" + string(protocol)}, Faults: sim.Faults{ErrorRate: 1, ErrorStatus: status}})
			// The provider's own answer: its status, its error's code.
			add(protocol, name, u, 0, status, "")
		}
		_, u := harness.Sim(t, sim.Config{Protocol: protocol, Models: []string{"hang-" + string(protocol)}, Faults: sim.Faults{Hang: true}})
		add(protocol, "hang", u, 300*time.Millisecond, http.StatusGatewayTimeout, "upstream_timeout")
	}
	healthySim, healthyURL := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOllama, Models: []string{"healthy"}})
	providers = append(providers, node.ProviderConfig{ID: "p-healthy", Type: node.TypeOllama, BaseURL: healthyURL, Models: []string{"healthy"}, Capacity: 1})

	cfg := process.DefaultEdgeFile()
	cfg.Models = models
	// Each provider fails 4 times in a row here; its circuit opening is
	// TestFaultRetryAndCircuitBreaker's.
	cfg.CircuitBreaker.Failures = -1
	e, ctx := startFaultEdge(t, cfg)
	harness.Node(t, ctx, node.Config{NodeID: "gpu-1", Edge: e.NodeAddr, Providers: providers})

	for _, c := range cases {
		t.Run(c.model, func(t *testing.T) {
			for i, model := range []string{c.model, "q-" + c.model} {
				for _, stream := range []bool{true, false} {
					status, header, body := post(t, e, "/v1/chat/completions", chatBody(model, stream, 5))
					if status != c.status {
						t.Fatalf("request %d (stream %v): %d %s, want %d", i, stream, status, body, c.status)
					}
					if _, _, code := openAIError(t, header, body); c.code != "" && code != c.code {
						t.Errorf("code %q, want %q (%s)", code, c.code, body)
					}
					// Released before the answer was complete.
					if n := providerInFlight(e, c.provider); n != 0 {
						t.Fatalf("in flight %d after the answer, want 0", n)
					}
				}
			}
			before := healthySim.Stats().Requests
			if status, _, body := post(t, e, "/v1/chat/completions", chatBody("healthy", false, 3)); status != http.StatusOK {
				t.Fatalf("healthy provider: %d %s", status, body)
			}
			if healthySim.Stats().Requests != before+1 {
				t.Fatal("the healthy provider did not serve the request")
			}
		})
	}

	t.Run("ollama route", func(t *testing.T) {
		status, header, body := post(t, e, "/api/chat", `{"model":"refused-ollama","messages":[{"role":"user","content":"hi"}]}`)
		var doc struct{ Error string }
		if status != http.StatusBadGateway || !strings.HasPrefix(header.Get("Content-Type"), "application/json") ||
			json.Unmarshal(body, &doc) != nil || doc.Error == "" {
			t.Fatalf("%d %s %s, want 502 with an Ollama error", status, header.Get("Content-Type"), body)
		}
	})
	waitIdle(t, e)
}

// startErrorProvider starts a server that answers every POST with status,
// Content-Type application/json and body, written as is (no trailing
// newline). It returns its base URL.
func startErrorProvider(t *testing.T, status int, body string) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = io.WriteString(w, body)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// TestFaultErrorStatusWithJSONBody: a provider that answers a streaming
// request with an error status and a JSON body without a trailing newline
// gets the client that status, application/json and the body's error
// intact; never a 200 stream.
func TestFaultErrorStatusWithJSONBody(t *testing.T) {
	harness.Parallel(t)
	const openAIBody = `{"error":{"message":"the model is overloaded","type":"server_error","param":null,"code":"model_overloaded"}}`
	const ollamaBody = `{"error":"the model crashed"}`
	statuses := []int{400, 422, 500, 503}
	var providers []node.ProviderConfig
	for _, status := range statuses {
		providers = append(providers,
			node.ProviderConfig{ID: fmt.Sprintf("t%d", status), Type: "openai", BaseURL: startErrorProvider(t, status, openAIBody) + "/v1",
				Models: []string{fmt.Sprintf("tunnel-%d", status)}, Capacity: 1},
			node.ProviderConfig{ID: fmt.Sprintf("n%d", status), Type: node.TypeOllama, BaseURL: startErrorProvider(t, status, ollamaBody),
				Models: []string{fmt.Sprintf("normalized-%d", status)}, Capacity: 1})
	}
	e, ctx := startFaultEdge(t, process.DefaultEdgeFile())
	harness.Node(t, ctx, node.Config{NodeID: "gpu-1", Edge: e.NodeAddr, Providers: providers})

	for _, status := range statuses {
		t.Run(fmt.Sprintf("tunnel %d", status), func(t *testing.T) {
			got, header, body := post(t, e, "/v1/chat/completions", chatBody(fmt.Sprintf("tunnel-%d", status), true, 5))
			if got != status {
				t.Fatalf("status %d %s, want %d", got, body, status)
			}
			message, typ, code := openAIError(t, header, body)
			if message != "the model is overloaded" || typ != "server_error" || code != "model_overloaded" {
				t.Fatalf("body %s, want the provider's error %s", body, openAIBody)
			}
		})
		t.Run(fmt.Sprintf("normalized %d", status), func(t *testing.T) {
			model := fmt.Sprintf("normalized-%d", status)
			got, header, body := post(t, e, "/v1/chat/completions", chatBody(model, true, 5))
			if got != status {
				t.Fatalf("status %d %s, want %d", got, body, status)
			}
			if message, _, _ := openAIError(t, header, body); message != "the model crashed" {
				t.Fatalf("body %s, want the provider's message", body)
			}
			got, header, body = post(t, e, "/api/chat", fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"hi"}]}`, model))
			var doc struct{ Error string }
			if got != status || !strings.HasPrefix(header.Get("Content-Type"), "application/json") || json.Unmarshal(body, &doc) != nil || doc.Error != "the model crashed" {
				t.Fatalf("Ollama route: %d %s %s", got, header.Get("Content-Type"), body)
			}
		})
	}
	waitIdle(t, e)
}

// TestFaultProviderDiesMidStream: a provider that drops its connection
// after a few tokens ends the client's stream with an error event and no
// [DONE] (SSE), or a final object with an error (NDJSON), never a
// clean-looking end; a background run of it is recorded as failed; nothing
// stays in flight.
func TestFaultProviderDiesMidStream(t *testing.T) {
	harness.Parallel(t)
	_, ollamaURL := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOllama, Models: []string{"drop-ollama"}, Faults: sim.Faults{DropAfter: 3}})
	_, openaiURL := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOpenAI, Models: []string{"drop-openai"}, Faults: sim.Faults{DropAfter: 3}})
	e, ctx := startFaultEdge(t, process.DefaultEdgeFile())
	harness.Node(t, ctx, node.Config{NodeID: "gpu-1", Edge: e.NodeAddr, Providers: []node.ProviderConfig{
		{ID: "o", Type: node.TypeOllama, BaseURL: ollamaURL, Models: []string{"drop-ollama"}, Capacity: 1},
		{ID: "v", Type: "vllm", BaseURL: openaiURL + "/v1", Models: []string{"drop-openai"}, Capacity: 1},
	}})
	for _, model := range []string{"drop-ollama", "drop-openai"} {
		t.Run(model, func(t *testing.T) {
			status, header, body := post(t, e, "/v1/chat/completions", chatBody(model, true, 20))
			if status != http.StatusOK || header.Get("Content-Type") != "text/event-stream" {
				t.Fatalf("%d %s %s", status, header.Get("Content-Type"), body)
			}
			checkStreamFailed(t, body)
			waitIdle(t, e)

			status, _, body = post(t, e, "/api/chat", fmt.Sprintf(`{"model":%q,"options":{"num_predict":20},"messages":[{"role":"user","content":"hi"}]}`, model))
			lines := bytes.Split(bytes.TrimSpace(body), []byte("\n"))
			var last struct {
				Done  bool
				Error string
			}
			if status != http.StatusOK || len(lines) < 2 || json.Unmarshal(lines[len(lines)-1], &last) != nil || last.Error == "" || last.Done {
				t.Fatalf("NDJSON %d %s: want chunks, then an error object and no done", status, body)
			}
			waitIdle(t, e)

			base := "http://" + e.HTTPAddr
			r := submit(t, base, fmt.Sprintf(`{"model":%q,"prompt":"hi","max_tokens":20,"background":true}`, model), http.StatusAccepted)
			if r := waitRun(t, base, r.ID, "error"); r.Error == nil || *r.Error == "" {
				t.Fatalf("run %+v: want a failed run with its error", r)
			}
			waitIdle(t, e)
		})
	}
}

// toggleProvider is an OpenAI-compatible provider in front of a simulator
// that can be made to fail: while failing, every request is answered
// status with an OpenAI error body. It counts the requests it received.
type toggleProvider struct {
	URL      string // base URL, with /v1
	failing  atomic.Bool
	status   int
	requests atomic.Int64
}

func startToggleProvider(t *testing.T, simURL string, status int) *toggleProvider {
	t.Helper()
	target, err := url.Parse(simURL)
	if err != nil {
		t.Fatal(err)
	}
	p := &toggleProvider{status: status}
	proxy := httputil.NewSingleHostReverseProxy(target)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/api/ps" { // the node's residency readings are no request
			p.requests.Add(1)
		}
		if p.failing.Load() {
			_, _ = io.Copy(io.Discard, r.Body)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(p.status)
			_, _ = io.WriteString(w, `{"error":{"message":"try again later","type":"server_error","param":null,"code":null}}`)
			return
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	p.URL = srv.URL + "/v1"
	return p
}

// circuit returns a provider's circuit state in the edge's snapshot.
func circuit(e *process.Process, providerID string) string {
	for _, p := range e.Service.Snapshot().Providers {
		if p.ProviderID == providerID {
			return p.Circuit
		}
	}
	return ""
}

// TestFaultRetryAndCircuitBreaker: a provider that fails before the first
// byte (503, 429, refused) loses the request to another candidate, at most
// max_retries times and never to one already tried; after 2 failures in a
// row its circuit opens and it gets no more requests while the healthy
// provider takes them all, though it is idle and wins every tie; after the
// cool-down one trial request goes to it, and its success puts it back in
// rotation.
func TestFaultRetryAndCircuitBreaker(t *testing.T) {
	harness.Parallel(t)
	goodSim, goodURL := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOpenAI, Models: []string{"m", "m2"}})
	_, backURL := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOpenAI, Models: []string{"m"}})
	flaky := startToggleProvider(t, backURL, http.StatusServiceUnavailable)
	flaky.failing.Store(true)
	limitedSim, limitedURL := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOpenAI, Models: []string{"m2"}, Faults: sim.Faults{ErrorRate: 1, ErrorStatus: http.StatusTooManyRequests}})
	soloSim, soloURL := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOllama, Models: []string{"m3"}, Faults: sim.Faults{ErrorRate: 1, ErrorStatus: http.StatusServiceUnavailable}})

	cfg := process.DefaultEdgeFile()
	const coolDown = 2 * time.Second
	cfg.CircuitBreaker = edge.BreakerConfig{Failures: 2, CoolDown: coolDown, MaxCoolDown: coolDown}
	e, ctx := startFaultEdge(t, cfg)
	harness.Node(t, ctx, node.Config{NodeID: "gpu-1", Edge: e.NodeAddr, Providers: []node.ProviderConfig{
		// Provider ids sort the failing ones first: they win every tie.
		{ID: "a-flaky", Type: "openai", BaseURL: flaky.URL, Models: []string{"m"}, Capacity: 4},
		{ID: "a-refused", Type: "openai", BaseURL: closedURL(t) + "/v1", Models: []string{"m2"}, Capacity: 4},
		{ID: "b-limited", Type: "openai", BaseURL: limitedURL + "/v1", Models: []string{"m2"}, Capacity: 4},
		{ID: "z-good", Type: "openai", BaseURL: goodURL + "/v1", Models: []string{"m", "m2"}, Capacity: 4},
		{ID: "solo", Type: node.TypeOllama, BaseURL: soloURL, Models: []string{"m3"}, Capacity: 4},
	}})
	client := newClient(e)
	ask := func(model string) error {
		resp, err := client.Chat.Completions.New(context.Background(), limitedChat(model, 3))
		if err == nil && len(strings.Fields(resp.Choices[0].Message.Content)) != 3 {
			err = fmt.Errorf("answer %+v", resp.Choices)
		}
		return err
	}

	t.Run("retry, then the circuit opens", func(t *testing.T) {
		for i := 1; i <= 2; i++ {
			if err := ask("m"); err != nil {
				t.Fatalf("request %d: %v (the retry should have reached z-good)", i, err)
			}
			if got := flaky.requests.Load(); got != int64(i) {
				t.Fatalf("flaky provider saw %d requests, want %d", got, i)
			}
		}
		if got := e.Service.Stats().Retries["status 503"]; got != 2 {
			t.Fatalf("retries %v, want 2 for status 503", e.Service.Stats().Retries)
		}
		if got := circuit(e, "a-flaky"); got != edge.CircuitOpen {
			t.Fatalf("circuit %q after 2 failures, want open", got)
		}
		var admin []struct {
			ProviderID string `json:"provider_id"`
			Circuit    string `json:"circuit"`
		}
		getJSON(t, e, "/admin/v1/providers", &admin)
		for _, p := range admin {
			if p.ProviderID == "a-flaky" && p.Circuit != edge.CircuitOpen {
				t.Fatalf("admin API shows %+v, want circuit open", p)
			}
		}
		goodBefore := goodSim.Stats().Requests
		for i := range 3 {
			if circuit(e, "a-flaky") != edge.CircuitOpen {
				break // the cool-down ended on a slow machine; the trial is tested below
			}
			if err := ask("m"); err != nil {
				t.Fatalf("request while open %d: %v", i, err)
			}
			if got := flaky.requests.Load(); got != 2 {
				t.Fatalf("the open provider received request %d (%d in all)", i, got)
			}
		}
		if goodSim.Stats().Requests == goodBefore {
			t.Fatal("the healthy provider took none of the traffic")
		}
	})

	t.Run("trial after the cool-down", func(t *testing.T) {
		flaky.failing.Store(false)
		testenv.Eventually(t, "the cool-down ends", func() bool { return circuit(e, "a-flaky") == edge.CircuitHalfOpen })
		before := flaky.requests.Load()
		if err := ask("m"); err != nil {
			t.Fatal(err)
		}
		if got := flaky.requests.Load(); got != before+1 || circuit(e, "a-flaky") != edge.CircuitClosed {
			t.Fatalf("trial: flaky saw %d more requests, circuit %q; want 1, closed", got-before, circuit(e, "a-flaky"))
		}
		if err := ask("m"); err != nil || flaky.requests.Load() != before+2 {
			t.Fatalf("back in rotation: %v, flaky saw %d more requests", err, flaky.requests.Load()-before)
		}
	})

	t.Run("at most max_retries, never the same provider twice", func(t *testing.T) {
		// a-refused (502) then b-limited (429): max_retries 1 stops there
		// and the client gets the last failure, its status and body.
		goodBefore := goodSim.Stats().Requests
		retriesBefore := e.Service.Stats().Retries["status 502"]
		for i := 1; i <= 2; i++ {
			status, header, body := post(t, e, "/v1/chat/completions", chatBody("m2", true, 3))
			if status != http.StatusTooManyRequests {
				t.Fatalf("request %d: %d %s, want b-limited's 429", i, status, body)
			}
			openAIError(t, header, body)
			if got := limitedSim.Stats().Requests; got != int64(i) {
				t.Fatalf("b-limited saw %d requests, want %d", got, i)
			}
		}
		if goodSim.Stats().Requests != goodBefore {
			t.Fatal("a third provider was tried")
		}
		if got := e.Service.Stats().Retries["status 502"]; got != retriesBefore+2 {
			t.Fatalf("retries %v", e.Service.Stats().Retries)
		}
		// Both failed twice in a row: out of rotation, z-good answers.
		if circuit(e, "a-refused") != edge.CircuitOpen || circuit(e, "b-limited") != edge.CircuitOpen {
			t.Fatalf("circuits %q %q, want open", circuit(e, "a-refused"), circuit(e, "b-limited"))
		}
		if err := ask("m2"); err != nil {
			t.Fatal(err)
		}
		if limitedSim.Stats().Requests != 2 || goodSim.Stats().Requests != goodBefore+1 {
			t.Fatal("the request did not go straight to z-good")
		}
	})

	t.Run("every provider out of rotation", func(t *testing.T) {
		// The only provider of m3 answers 503: twice as it is, then its
		// circuit is open and the edge answers 503 with Retry-After
		// without asking it.
		for i := 1; i <= 3; i++ {
			status, header, body := post(t, e, "/v1/chat/completions", chatBody("m3", false, 3))
			_, _, code := openAIError(t, header, body)
			if status != http.StatusServiceUnavailable {
				t.Fatalf("request %d: %d %s, want 503", i, status, body)
			}
			if i == 3 && (code != "provider_unavailable" || header.Get("Retry-After") == "") {
				t.Fatalf("request %d: code %q, Retry-After %q; want provider_unavailable with Retry-After", i, code, header.Get("Retry-After"))
			}
		}
		if got := soloSim.Stats().Requests; got != 2 {
			t.Fatalf("the open provider received %d requests, want 2", got)
		}
	})
	waitIdle(t, e)
}

// streamResult is the outcome of a request read to its end.
type streamResult struct {
	status int
	body   []byte
	err    error
}

// startRequest posts body to path on its own goroutine; first is closed
// when the first SSE event (or any first line) of the answer arrived, done
// gets the whole answer.
func startRequest(e *process.Process, path, body string) (first <-chan struct{}, done <-chan streamResult) {
	firstc, donec := make(chan struct{}), make(chan streamResult, 1)
	go func() {
		var once bool
		signal := func() {
			if !once {
				once = true
				close(firstc)
			}
		}
		defer signal()
		resp, err := http.Post("http://"+e.HTTPAddr+path, "application/json", strings.NewReader(body))
		if err != nil {
			donec <- streamResult{err: err}
			return
		}
		defer resp.Body.Close()
		var buf bytes.Buffer
		rd := bufio.NewReader(resp.Body)
		for {
			line, err := rd.ReadBytes('\n')
			buf.Write(line)
			if len(bytes.TrimSpace(line)) > 0 {
				signal()
			}
			if err != nil {
				if err == io.EOF {
					err = nil
				}
				donec <- streamResult{resp.StatusCode, buf.Bytes(), err}
				return
			}
		}
	}()
	return firstc, donec
}

// result waits for a request's outcome, bounded.
func result(t *testing.T, done <-chan streamResult) streamResult {
	t.Helper()
	select {
	case r := <-done:
		return r
	case <-time.After(15 * time.Second):
		t.Fatal("request did not end")
	}
	return streamResult{}
}

// nodeGeneration is the generation of node's connection, 0 if it has none.
func nodeGeneration(s contract.Snapshot, nodeID string) uint64 {
	for _, n := range s.Nodes {
		if n.NodeID == nodeID {
			return n.Generation
		}
	}
	return 0
}

// TestFaultNodeProcessStoppedAndKilled runs a node as a child `iop node`
// process next to an in-process one and makes it fail mid-run.
//
// Stopped (SIGSTOP): its connection stays open but silent, and the edge
// fences its generation within the heartbeat window (3 intervals of 1 s:
// shorter ones fenced the live nodes too on a loaded 2-core machine);
// a stream on it ends with an error event and no [DONE]; a run that had
// not yet sent a byte goes to the other node's provider and succeeds; a
// request holding its only provider of a model and one queued behind it
// both get 503 at once (no other candidate; the queued one re-resolves)
// instead of waiting for their timeouts. Resumed (SIGCONT): it reconnects
// with a new generation and its providers take work again, while what its
// old generation still sends changes nothing. Killed (SIGKILL) mid-stream
// and started again: the same, with nothing left in flight.
func TestFaultNodeProcessStoppedAndKilled(t *testing.T) {
	harness.Parallel(t)
	bin := harness.IOP(t)
	_, streamURL := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOllama, Models: []string{"stream-m"}, TokensPerSecond: 20, DefaultMaxTokens: 100_000})
	silentSim, silentURL := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOllama, Models: []string{"m"}, Faults: sim.Faults{Hang: true}})
	queueSim, queueURL := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOllama, Models: []string{"q-m"}, Faults: sim.Faults{Hang: true}})
	okSim, okURL := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOllama, Models: []string{"m"}})

	cfg := process.DefaultEdgeFile()
	cfg.HeartbeatInterval = time.Second
	e, ctx := startFaultEdge(t, cfg)
	harness.Node(t, ctx, node.Config{NodeID: "survivor", Edge: e.NodeAddr, Providers: []node.ProviderConfig{
		{ID: "z-ok", Type: node.TypeOllama, BaseURL: okURL, Models: []string{"m"}, Capacity: 2},
	}})
	configPath := filepath.Join(t.TempDir(), "node.yaml")
	nodeYAML := fmt.Sprintf(`node_id: victim
edge: %s
reconnect_min: 50ms
reconnect_max: 200ms
providers:
  - {id: a-stream, type: ollama, base_url: %q, models: [stream-m], capacity: 2}
  - {id: a-silent, type: ollama, base_url: %q, models: [m], capacity: 2}
  - {id: a-queue, type: ollama, base_url: %q, models: [q-m], capacity: 1}
`, e.NodeAddr, streamURL, silentURL, queueURL)
	if err := os.WriteFile(configPath, []byte(nodeYAML), 0o600); err != nil {
		t.Fatal(err)
	}
	victim := harness.StartProgram(t, nil, "iop node", bin, "node", "--log-level", "warn", "--config", configPath)
	gen1 := nodeGeneration(waitSnapshot(t, e, func(s contract.Snapshot) bool { return nodeGeneration(s, "victim") != 0 }), "victim")

	// A stream under way, a run waiting for its first byte (ties go to
	// a-silent), a run holding a-queue and one queued behind it.
	streamFirst, streamDone := startRequest(e, "/v1/chat/completions", chatBody("stream-m", true, 100_000))
	<-streamFirst
	_, silentDone := startRequest(e, "/v1/chat/completions", chatBody("m", false, 4))
	testenv.Eventually(t, "a-silent holds the run", func() bool { return silentSim.Stats().InFlight == 1 })
	_, holderDone := startRequest(e, "/v1/chat/completions", chatBody("q-m", false, 4))
	testenv.Eventually(t, "a-queue holds the run", func() bool { return queueSim.Stats().InFlight == 1 })
	_, queuedDone := startRequest(e, "/v1/chat/completions", chatBody("q-m", false, 4))
	waitSnapshot(t, e, func(s contract.Snapshot) bool { return s.Waiters == 1 })
	okBefore := okSim.Stats().Requests

	victim.Signal(t, syscall.SIGSTOP)
	waitSnapshot(t, e, func(s contract.Snapshot) bool { return nodeGeneration(s, "victim") == 0 })

	r := result(t, streamDone)
	if r.err != nil || r.status != http.StatusOK {
		t.Fatalf("stream: %d %v", r.status, r.err)
	}
	checkStreamFailed(t, r.body)
	if r := result(t, silentDone); r.status != http.StatusOK || okSim.Stats().Requests != okBefore+1 {
		t.Fatalf("the run without a byte: %d %s; want it served by z-ok", r.status, r.body)
	}
	for name, done := range map[string]<-chan streamResult{"holder": holderDone, "queued": queuedDone} {
		r := result(t, done)
		var doc struct{ Error struct{ Code string } }
		if r.status != http.StatusServiceUnavailable || json.Unmarshal(r.body, &doc) != nil || doc.Error.Code != "provider_unavailable" {
			t.Fatalf("%s request: %d %s, want 503 provider_unavailable", name, r.status, r.body)
		}
	}
	waitIdle(t, e)

	victim.Signal(t, syscall.SIGCONT)
	gen2 := nodeGeneration(waitSnapshot(t, e, func(s contract.Snapshot) bool { return nodeGeneration(s, "victim") > gen1 }), "victim")
	if status, _, body := post(t, e, "/v1/chat/completions", chatBody("stream-m", false, 3)); status != http.StatusOK {
		t.Fatalf("after the node came back: %d %s", status, body)
	}
	waitIdle(t, e)

	streamFirst, streamDone = startRequest(e, "/v1/chat/completions", chatBody("stream-m", true, 100_000))
	<-streamFirst
	victim.Signal(t, syscall.SIGKILL)
	r = result(t, streamDone)
	if r.err != nil || r.status != http.StatusOK {
		t.Fatalf("stream: %d %v", r.status, r.err)
	}
	checkStreamFailed(t, r.body)
	waitSnapshot(t, e, func(s contract.Snapshot) bool { return nodeGeneration(s, "victim") == 0 })
	waitIdle(t, e)

	harness.StartProgram(t, nil, "iop node", bin, "node", "--log-level", "warn", "--config", configPath)
	waitSnapshot(t, e, func(s contract.Snapshot) bool { return nodeGeneration(s, "victim") > gen2 })
	if status, _, body := post(t, e, "/v1/chat/completions", chatBody("stream-m", false, 3)); status != http.StatusOK {
		t.Fatalf("after the node was started again: %d %s", status, body)
	}
	waitIdle(t, e)
}

// backoffClock is a fake clock for one node agent that reports every
// reconnect backoff the agent arms: with the edge's heartbeats an hour
// apart and the hello timeout 10 s, every shorter timer is a backoff.
type backoffClock struct {
	*clock.Fake
	backoffs chan time.Duration
}

func (c *backoffClock) AfterFunc(d time.Duration, f func()) clock.Timer {
	t := c.Fake.AfterFunc(d, f)
	if d < 10*time.Second {
		c.backoffs <- d
	}
	return t
}

// TestFaultEdgeRestartNodesReconnectWithJitter: nodes that lose their edge
// wait a jittered backoff each before dialing it again (so they do not all
// dial a restarted edge at the same instant), then reconnect to the edge
// started again on the same node address, with new generations, and serve.
// Each agent runs on its own fake clock, so the instant it dials again is
// exactly the backoff it drew (from the default, process-wide source):
// without jitter every one would be reconnect_min.
func TestFaultEdgeRestartNodesReconnectWithJitter(t *testing.T) {
	harness.Parallel(t)
	const nodes = 4
	const reconnectMin = time.Second
	_, simURL := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOllama, Models: []string{"m"}})
	cfg := process.DefaultEdgeFile()
	cfg.NodeListen = testenv.ProcessAddr(t)
	cfg.HeartbeatInterval = time.Hour
	cfg.Listen, cfg.Database = "127.0.0.1:0", ":memory:"
	firstCtx, stopFirst := context.WithCancel(context.Background())
	first, err := process.Start(firstCtx, process.Config{Mode: process.ModeEdge, Edge: cfg}, process.Deps{Logger: harness.Logger(t, "edge")})
	if err != nil {
		t.Fatal(err)
	}

	var agents []*node.Agent
	var clocks []*backoffClock
	for i := range nodes {
		clk := &backoffClock{Fake: clock.NewFake(time.Unix(0, 0)), backoffs: make(chan time.Duration, 64)}
		a, err := node.New(node.Config{
			NodeID: fmt.Sprintf("gpu-%d", i), Edge: cfg.NodeListen,
			ReconnectMin: reconnectMin, ReconnectMax: 4 * time.Second,
			Providers: []node.ProviderConfig{{ID: "p", Type: node.TypeOllama, BaseURL: simURL, Models: []string{"m"}, Capacity: 1}},
		}, harness.Logger(t, "node"), node.WithClock(clk))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- a.Run(ctx) }()
		t.Cleanup(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("node %d: %v", i, err)
			}
		})
		<-a.Ready()
		agents, clocks = append(agents, a), append(clocks, clk)
	}

	stopFirst()
	if err := first.Wait(); err != nil {
		t.Fatal(err)
	}
	waits := make(map[time.Duration]bool)
	pending := make([]time.Duration, nodes)
	for i, clk := range clocks {
		select {
		case d := <-clk.backoffs:
			if d < 0 || d > reconnectMin {
				t.Fatalf("node %d backs off %s, want a wait in [0, %s]", i, d, reconnectMin)
			}
			waits[d], pending[i] = true, d
		case <-time.After(10 * time.Second):
			t.Fatalf("node %d armed no backoff after the edge stopped", i)
		}
	}
	if len(waits) == 1 {
		t.Fatalf("all %d nodes wait %v before dialing again: no jitter", nodes, pending)
	}
	t.Logf("backoffs after the edge stopped: %v", pending)

	e, _ := startFaultEdge(t, cfg) // on the same node address
	for i, a := range agents {
		clocks[i].Advance(pending[i])
		// A dial that finds the edge not ready yet arms a longer backoff:
		// let that one pass too.
		testenv.Eventually(t, fmt.Sprintf("node %d reconnects", i), func() bool {
			select {
			case d := <-clocks[i].backoffs:
				clocks[i].Advance(d)
			default:
			}
			return a.Generation() != 0
		})
	}
	snap := waitSnapshot(t, e, func(s contract.Snapshot) bool { return len(s.Nodes) == nodes })
	for _, p := range snap.Providers {
		if p.Status != "available" {
			t.Fatalf("provider %+v after the restart", p)
		}
	}
	client := newClient(e)
	for i := range nodes {
		if err := <-intactRun(client, "m", 3); err != nil {
			t.Fatalf("request %d after the restart: %v", i, err)
		}
	}
	waitIdle(t, e)
}
