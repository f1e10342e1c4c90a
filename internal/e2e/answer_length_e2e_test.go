package e2e

// End-to-end tests of the framing of a non-streamed tunnel answer:
// a small answer travels from the node as one message and reaches the
// client with its Content-Length (RFC 9110 section 8.6), a large one still
// arrives whole, a body cut short of its declared length never looks
// complete, and a 2xx error object is still the provider's failure. A real
// edge (HTTP on loopback TCP, its node endpoint over gRPC), a real node
// agent, `iop sim` and fake OpenAI-compatible servers.

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"iop/internal/e2e/harness"
	"iop/internal/node"
	"iop/internal/process"
	"iop/internal/sim"
)

// lengthRig is an edge (usage ledger in a file) with one node driving a
// simulator ("sim-model"), a fake OpenAI-compatible server ("fake-model")
// and another fake that has an API key ("keyed-model"), all on the tunnel
// path.
type lengthRig struct {
	e           *process.Process
	db          string
	fake, keyed *fakeProvider
	client      *http.Client
}

// lengthKey is the keyed fake's API key.
const lengthKey = "sk-length-test-0123456789"

func startLengthRig(t *testing.T, breakerFailures int) *lengthRig {
	t.Helper()
	keyEnv := harness.Env(t, lengthKey)
	rig := &lengthRig{
		db:    filepath.Join(t.TempDir(), "edge.db"),
		fake:  startFakeProvider(t, respond(200, "application/json", "")),
		keyed: startFakeProvider(t, respond(200, "application/json", "")),
	}
	_, simURL := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOpenAI, Models: []string{"sim-model"}, Seed: 18})
	ctx, cancel := context.WithCancel(context.Background())
	cfg := process.DefaultEdgeFile()
	cfg.Listen, cfg.NodeListen, cfg.Database = "127.0.0.1:0", "127.0.0.1:0", rig.db
	cfg.CircuitBreaker.Failures = breakerFailures
	retries := 0
	cfg.MaxRetries = &retries
	e, err := process.Start(ctx, process.Config{Mode: process.ModeEdge, Edge: cfg}, process.Deps{Logger: harness.Logger(t, "edge")})
	if err != nil {
		t.Fatal(err)
	}
	rig.e = e
	harness.StopAtCleanup(t, cancel, e)
	harness.Node(t, ctx, node.Config{
		NodeID: "gpu-1",
		Edge:   e.NodeAddr,
		Providers: []node.ProviderConfig{
			{ID: "sim", Type: "vllm", BaseURL: simURL + "/v1", Models: []string{"sim-model"}, Capacity: 4, Capabilities: []string{"embeddings"}},
			{ID: "fake", Type: "vllm", BaseURL: rig.fake.URL + "/v1", Models: []string{"fake-model"}, Capacity: 4},
			{ID: "keyed", Type: "openai", BaseURL: rig.keyed.URL + "/v1", Models: []string{"keyed-model"}, Capacity: 4, APIKeyEnv: keyEnv},
		},
	})
	transport := &http.Transport{}
	t.Cleanup(transport.CloseIdleConnections)
	rig.client = &http.Client{Transport: transport}
	return rig
}

// exchange is one client request's response: its status, headers, length
// as the client saw it (-1: chunked), body, and the error reading the
// body ended with (nil when it was complete).
type exchange struct {
	status  int
	header  http.Header
	length  int64
	chunked bool
	body    []byte
	readErr error
}

func (rig *lengthRig) post(t *testing.T, path, body string) exchange {
	t.Helper()
	resp, err := rig.client.Post("http://"+rig.e.HTTPAddr+path, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	return exchange{status: resp.StatusCode, header: resp.Header, length: resp.ContentLength,
		chunked: len(resp.TransferEncoding) > 0 && resp.TransferEncoding[0] == "chunked", body: data, readErr: err}
}

// outcomes is the usage ledger's outcome of every request, by model.
func (rig *lengthRig) outcomes(t *testing.T) map[string][]string {
	t.Helper()
	waitIdle(t, rig.e)
	rig.e.Ledger.Flush()
	db, err := sql.Open("sqlite", "file:"+rig.db+"?_pragma=busy_timeout(5000)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	rows, err := db.Query(`SELECT model, outcome FROM usage_ledger ORDER BY rowid`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string][]string{}
	for rows.Next() {
		var model, outcome string
		if err := rows.Scan(&model, &outcome); err != nil {
			t.Fatal(err)
		}
		out[model] = append(out[model], outcome)
	}
	return out
}

// withLength is an answer of status 200 and a JSON body that declares its
// length, as most servers send a non-streamed answer.
func withLength(body string) func(w http.ResponseWriter, url string) {
	return func(w http.ResponseWriter, _ string) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		io.WriteString(w, body)
	}
}

// chunkedAnswer is an answer of status 200 whose JSON body goes out in
// flushed pieces of at most 16 KiB, so it is chunked: no length declared.
func chunkedAnswer(body string) func(w http.ResponseWriter, url string) {
	return func(w http.ResponseWriter, _ string) {
		w.Header().Set("Content-Type", "application/json")
		for i := 0; i < len(body); i += 16 << 10 {
			io.WriteString(w, body[i:min(i+16<<10, len(body))])
			w.(http.Flusher).Flush()
		}
	}
}

// cutShort declares a body of declared bytes and sends only the first
// len(part) of them: the server then closes the connection.
func cutShort(declared int, part string) func(w http.ResponseWriter, url string) {
	return func(w http.ResponseWriter, _ string) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", strconv.Itoa(declared))
		io.WriteString(w, part)
	}
}

// bigAnswer is a chat completion of about size bytes.
func bigAnswer(size int, content string) string {
	return `{"id":"chatcmpl-big","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"` +
		content + strings.Repeat("x", size) + `"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`
}

func nonStreamedChat(model string) string {
	return fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"hi"}],"max_tokens":8}`, model)
}

// TestRegression_NonStreamedPassthroughKeepsContentLength: a non-streamed
// answer on the tunnel path reaches the client with a Content-Length equal
// to its body's length, not chunked (the node dropped the provider's
// Content-Length and the edge chunked every answer): chat, completions and
// embeddings from the simulator, and a provider's answer that declared its
// length. A streamed answer stays an event stream without one.
func TestRegression_NonStreamedPassthroughKeepsContentLength(t *testing.T) {
	harness.Parallel(t)
	rig := startLengthRig(t, -1)
	small := bigAnswer(100, "small")
	rig.set(rig.fake, withLength(small))
	for _, c := range []struct{ name, path, body, wantField string }{
		{"sim chat", "/v1/chat/completions", nonStreamedChat("sim-model"), "choices"},
		{"sim completions", "/v1/completions", `{"model":"sim-model","prompt":"hi","max_tokens":8}`, "choices"},
		{"sim embeddings", "/v1/embeddings", `{"model":"sim-model","input":["a","b"]}`, "data"},
		{"provider declared length", "/v1/chat/completions", nonStreamedChat("fake-model"), "choices"},
	} {
		t.Run(c.name, func(t *testing.T) {
			x := rig.post(t, c.path, c.body)
			if x.status != 200 || x.readErr != nil {
				t.Fatalf("%d, read %v: %s", x.status, x.readErr, x.body)
			}
			if x.length != int64(len(x.body)) || x.chunked || x.header.Get("Content-Length") != strconv.Itoa(len(x.body)) {
				t.Errorf("Content-Length %d (header %q, chunked %v) for a body of %d bytes, want it equal", x.length, x.header.Get("Content-Length"), x.chunked, len(x.body))
			}
			var doc map[string]json.RawMessage
			if err := json.Unmarshal(x.body, &doc); err != nil || doc[c.wantField] == nil {
				t.Errorf("not an answer with %q: %s", c.wantField, x.body)
			}
		})
	}
	t.Run("provider declared length: bytes unchanged", func(t *testing.T) {
		if x := rig.post(t, "/v1/chat/completions", nonStreamedChat("fake-model")); string(x.body) != small {
			t.Errorf("body %q, want the provider's %q", x.body, small)
		}
	})
	t.Run("streamed", func(t *testing.T) {
		x := rig.post(t, "/v1/chat/completions", `{"model":"sim-model","stream":true,"messages":[{"role":"user","content":"hi"}],"max_tokens":8}`)
		if x.status != 200 || x.readErr != nil || x.length != -1 || !strings.HasSuffix(string(x.body), "data: [DONE]\n\n") {
			t.Errorf("stream: %d, length %d, read %v: %s", x.status, x.length, x.readErr, x.body)
		}
	})
	for model, outcomes := range rig.outcomes(t) {
		for _, o := range outcomes {
			if o != "completed" {
				t.Errorf("model %s: ledger outcome %q, want completed", model, o)
			}
		}
	}
}

// An answer larger than one message (64 KiB) arrives whole and
// byte for byte: with the provider's Content-Length when it declared one,
// chunked when it did not, and chunked when the node has an API key to
// scrub (a redacted key changes the length, so the node cannot vouch for
// the provider's).
func TestTunnelLargeAnswerArrivesWhole(t *testing.T) {
	harness.Parallel(t)
	rig := startLengthRig(t, -1)
	body := bigAnswer(200<<10, "big")
	for _, c := range []struct {
		name       string
		p          *fakeProvider
		model      string
		answer     func(w http.ResponseWriter, url string)
		want       string
		wantLength bool
	}{
		{"declared length", rig.fake, "fake-model", withLength(body), body, true},
		{"chunked", rig.fake, "fake-model", chunkedAnswer(body), body, false},
		{"api key set", rig.keyed, "keyed-model", withLength(body), body, false},
		{"api key echoed", rig.keyed, "keyed-model", withLength(bigAnswer(200<<10, lengthKey)), bigAnswer(200<<10, "[redacted]"), false},
		{"small answer, api key echoed", rig.keyed, "keyed-model", withLength(bigAnswer(10, lengthKey)), bigAnswer(10, "[redacted]"), true},
	} {
		t.Run(c.name, func(t *testing.T) {
			rig.set(c.p, c.answer)
			x := rig.post(t, "/v1/chat/completions", nonStreamedChat(c.model))
			if x.status != 200 || x.readErr != nil {
				t.Fatalf("%d, read %v", x.status, x.readErr)
			}
			if string(x.body) != c.want {
				t.Fatalf("got %d bytes, want the provider's %d (scrubbed)", len(x.body), len(c.want))
			}
			if c.wantLength && (x.length != int64(len(c.want)) || x.chunked) {
				t.Errorf("Content-Length %d (chunked %v), want %d", x.length, x.chunked, len(c.want))
			}
			if !c.wantLength && (x.length != -1 || !x.chunked) {
				t.Errorf("Content-Length %d (chunked %v), want a chunked body", x.length, x.chunked)
			}
		})
	}
}

// A provider that declares a Content-Length and closes its connection
// early never gives the client a short body that looks complete: a small
// answer (still within the node's first 64 KiB) is a 502 error answer; a
// large one, whose head and first bytes the client already has with the
// declared length, is cut off, and the client's read fails. Both count
// as upstream errors in the ledger.
func TestTunnelProviderClosingEarlyFailsTheClient(t *testing.T) {
	harness.Parallel(t)
	rig := startLengthRig(t, -1)
	t.Run("small", func(t *testing.T) {
		rig.set(rig.fake, cutShort(1000, `{"id":"chatcmpl-short","choices":[`))
		x := rig.post(t, "/v1/chat/completions", nonStreamedChat("fake-model"))
		if x.status != http.StatusBadGateway || x.readErr != nil {
			t.Fatalf("%d, read %v: %s; want a 502 error answer", x.status, x.readErr, x.body)
		}
		if e := errorOf(t, x.body); e.typ != "upstream_error" {
			t.Errorf("error %+v, want upstream_error", e)
		}
	})
	t.Run("large", func(t *testing.T) {
		body := bigAnswer(300<<10, "big")
		rig.set(rig.fake, cutShort(len(body), body[:100<<10]))
		x := rig.post(t, "/v1/chat/completions", nonStreamedChat("fake-model"))
		if x.readErr == nil {
			t.Fatalf("a complete %d answer of %d bytes (Content-Length %d), want the client's read to fail", x.status, len(x.body), x.length)
		}
		if x.length != int64(len(body)) || len(x.body) >= len(body) {
			t.Errorf("Content-Length %d, %d bytes read; want the declared %d and fewer read", x.length, len(x.body), len(body))
		}
	})
	for _, o := range rig.outcomes(t)["fake-model"] {
		if o != "upstream_error" {
			t.Errorf("ledger outcome %q, want upstream_error", o)
		}
	}
}

// set gives p its answer.
func (rig *lengthRig) set(p *fakeProvider, answer func(w http.ResponseWriter, url string)) {
	p.mu.Lock()
	p.answer = answer
	p.mu.Unlock()
}

// A small answer travels as one message; one whose body is an error
// object inside a 200 is still the provider's failure, not an answer: the
// client gets a 502, the ledger records upstream_error, and its circuit
// breaker counts it (two in a row open the circuit). So does an error
// status relayed whole (a 500 answer, also one message), and a good
// answer between them resets the count.
func TestTunnelOneMessageErrorsCountForTheBreaker(t *testing.T) {
	harness.Parallel(t)
	rig := startLengthRig(t, 2)
	good := bigAnswer(10, "good")
	errObject := `{"error":{"message":"quota exhausted","type":"server_error"}}`
	steps := []struct {
		answer      func(w http.ResponseWriter, url string)
		wantStatus  int
		wantCircuit string
	}{
		{withLength(errObject), http.StatusBadGateway, "closed"},
		{withLength(good), http.StatusOK, "closed"}, // resets the count
		{withLength(errObject), http.StatusBadGateway, "closed"},
		{respond(500, "application/json", `{"error":{"message":"engine died"}}`), http.StatusInternalServerError, "open"},
	}
	for i, s := range steps {
		rig.set(rig.fake, s.answer)
		x := rig.post(t, "/v1/chat/completions", nonStreamedChat("fake-model"))
		if x.status != s.wantStatus || x.readErr != nil {
			t.Fatalf("step %d: %d, read %v: %s; want %d", i, x.status, x.readErr, x.body, s.wantStatus)
		}
		if x.length != int64(len(x.body)) {
			t.Errorf("step %d: Content-Length %d for %d bytes", i, x.length, len(x.body))
		}
		waitIdle(t, rig.e)
		if got := circuitState(rig.e, "fake"); got != s.wantCircuit {
			t.Fatalf("step %d: circuit %s, want %s", i, got, s.wantCircuit)
		}
	}
	before := rig.fake.hits.Load()
	if x := rig.post(t, "/v1/chat/completions", nonStreamedChat("fake-model")); x.status != http.StatusServiceUnavailable {
		t.Errorf("with the circuit open: %d %s, want 503", x.status, x.body)
	}
	if rig.fake.hits.Load() != before {
		t.Error("the provider got a request with its circuit open")
	}
	want := []string{"upstream_error", "completed", "upstream_error", "upstream_error"}
	got := rig.outcomes(t)["fake-model"]
	if len(got) < len(want) || strings.Join(got[:len(want)], ",") != strings.Join(want, ",") {
		t.Errorf("ledger outcomes %v, want %v first", got, want)
	}
}
