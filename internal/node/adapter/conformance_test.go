package adapter_test

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"math"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"iop/internal/node/adapter"
	"iop/internal/sim"
	"iop/internal/testenv"
	"iop/internal/wire/nodev1"
)

// This file is the adapter conformance suite: every adapter runs the same
// table of cases against a real simulator (internal/sim) speaking its
// provider's protocol, and a per-adapter driver reduces what the adapter
// emitted to one outcome, so each case checks the same observable result
// whatever the execution path.
//
// What each adapter does where they could differ:
//
//   - API key: both adapters send Config.APIKey as "Authorization: Bearer
//     <key>" (the shared httpProvider.post); Ollama itself ignores it, but an
//     Ollama behind an authenticating proxy (or the simulator with APIKey
//     set) needs it.
//   - Error answers: the normalized path returns an *adapter.Error carrying
//     the provider's status; the tunnel relays the provider's status with an
//     OpenAI error body (the provider's own, redacted, or one built for it)
//     and returns nil.
//   - A stream cut mid-body: the normalized path returns an *adapter.Error
//     of kind ErrProviderStream (502) and sends no COMPLETE (the ERROR event
//     is the caller's to send); the tunnel has already relayed the head (200)
//     and the partial body, then returns the same kind of *adapter.Error.

// outcome is what one adapter call produced, in terms common to both paths.
type outcome struct {
	text                           string
	finishReason                   string
	promptTokens, completionTokens int
	embeddings                     [][]float32
	// done: the answer is complete (normalized: COMPLETE was sent; tunnel:
	// the JSON body parsed, or the SSE stream reached "data: [DONE]").
	done bool
	// status is the error status: the *adapter.Error's Status, or the
	// provider's own non-2xx status relayed by the tunnel; 0 otherwise.
	status int
	// errMsg is the error's message: the *adapter.Error's, or the relayed
	// OpenAI error body's error.message.
	errMsg string
	// err is what the adapter method returned.
	err error
}

// conformanceDriver builds one kind of adapter and runs requests through it.
type conformanceDriver struct {
	name     string
	protocol sim.Protocol
	// paths are the backend paths each operation must be posted to.
	paths map[nodev1.Operation]string
	// build returns the adapter for the simulator at simURL.
	build func(simURL, apiKey string) (adapter.Adapter, error)
	// run calls the adapter and reduces its output to an outcome; t is only
	// used with Errorf, so run may be called from another goroutine.
	run func(ctx context.Context, t *testing.T, a adapter.Adapter, req adapter.Request) outcome
}

var conformanceDrivers = []conformanceDriver{
	{
		name:     "ollama",
		protocol: sim.ProtocolOllama,
		paths: map[nodev1.Operation]string{
			nodev1.Operation_OPERATION_CHAT:       "/api/chat",
			nodev1.Operation_OPERATION_COMPLETION: "/api/generate",
			nodev1.Operation_OPERATION_EMBEDDINGS: "/api/embed",
		},
		build: func(simURL, apiKey string) (adapter.Adapter, error) {
			return adapter.NewOllama(adapter.Config{BaseURL: simURL, APIKey: apiKey})
		},
		run: runNormalized,
	},
	{
		name:     "openai",
		protocol: sim.ProtocolOpenAI,
		paths: map[nodev1.Operation]string{
			nodev1.Operation_OPERATION_CHAT:       "/v1/chat/completions",
			nodev1.Operation_OPERATION_COMPLETION: "/v1/completions",
			nodev1.Operation_OPERATION_EMBEDDINGS: "/v1/embeddings",
		},
		build: func(simURL, apiKey string) (adapter.Adapter, error) {
			return adapter.NewOpenAI(adapter.Config{BaseURL: simURL + "/v1", APIKey: apiKey})
		},
		run: runTunnel,
	},
}

// conformanceCase is one request and the outcome every adapter must give.
type conformanceCase struct {
	name string
	// sim configures the simulator; the driver sets Protocol.
	sim sim.Config
	// apiKey is the adapter's Config.APIKey.
	apiKey string
	op     nodev1.Operation
	stream bool
	body   string
	// served is Request.ServedModel; "" means sim.DefaultModel.
	served string
	// cancelWhileHung runs the request on another goroutine and cancels its
	// context once the simulator has admitted it (use with Faults.Hang).
	cancelWhileHung bool
	// group names cases whose outcomes must be identical on every adapter
	// (see sameOutcome); "" for none.
	group string
	check func(t *testing.T, s *sim.Server, got outcome)
}

// Prompts and the answers the simulator gives them (DefaultMaxTokens words).
const (
	chatSystem   = "you are terse"
	chatUser     = "why is the sky blue"
	chatPrompt   = 3 + 5 // words in chatSystem and chatUser
	completion   = "once upon a time"
	completionPT = 4
	embedPT      = 2 + 3 // words in the two embedding inputs
	simKey       = "sim-secret-key"
	simSeed      = 42
)

var chatMessages = `"messages":[{"role":"system","content":"` + chatSystem + `"},{"role":"user","content":"` + chatUser + `"}]`

func conformanceCases() []conformanceCase {
	chatBody := func(model string, extra ...string) string {
		return `{"model":"` + model + `",` + chatMessages + `,"seed":7` + joinFields(extra) + `}`
	}
	streamOpts := `"stream":true,"stream_options":{"include_usage":true}`
	embedBody := `{"model":"client-alias","input":["first input","second input here"]}`
	return []conformanceCase{
		{
			name: "chat non-stream", op: nodev1.Operation_OPERATION_CHAT,
			body: chatBody("client-alias", `"stream":false`), group: "chat",
			check: func(t *testing.T, _ *sim.Server, got outcome) {
				wantAnswer(t, got, sim.DefaultMaxTokens, "stop", chatPrompt)
			},
		},
		{
			name: "chat stream", op: nodev1.Operation_OPERATION_CHAT, stream: true,
			body: chatBody("client-alias", streamOpts), group: "chat",
			check: func(t *testing.T, _ *sim.Server, got outcome) {
				wantAnswer(t, got, sim.DefaultMaxTokens, "stop", chatPrompt)
			},
		},
		{
			name: "max_tokens 3 non-stream", op: nodev1.Operation_OPERATION_CHAT,
			body: chatBody("client-alias", `"max_tokens":3`), group: "max_tokens 3",
			check: func(t *testing.T, _ *sim.Server, got outcome) {
				wantAnswer(t, got, 3, "length", chatPrompt)
			},
		},
		{
			name: "max_tokens 3 stream", op: nodev1.Operation_OPERATION_CHAT, stream: true,
			body: chatBody("client-alias", `"max_tokens":3`, streamOpts), group: "max_tokens 3",
			check: func(t *testing.T, _ *sim.Server, got outcome) {
				wantAnswer(t, got, 3, "length", chatPrompt)
			},
		},
		{
			name: "served model replaces the body's model", op: nodev1.Operation_OPERATION_CHAT,
			sim:  sim.Config{Models: []string{"served-name"}},
			body: chatBody("client-alias"), served: "served-name",
			check: func(t *testing.T, s *sim.Server, got outcome) {
				wantAnswer(t, got, sim.DefaultMaxTokens, "stop", chatPrompt)
				if m := s.Stats().LastModel; m != "served-name" {
					t.Errorf("backend saw model %q, want \"served-name\"", m)
				}
			},
		},
		{
			name: "completion non-stream", op: nodev1.Operation_OPERATION_COMPLETION,
			body:  `{"model":"client-alias","prompt":"` + completion + `"}`,
			group: "completion",
			check: func(t *testing.T, _ *sim.Server, got outcome) {
				wantAnswer(t, got, sim.DefaultMaxTokens, "stop", completionPT)
			},
		},
		{
			name: "completion stream", op: nodev1.Operation_OPERATION_COMPLETION, stream: true,
			body:  `{"model":"client-alias","prompt":"` + completion + `",` + streamOpts + `}`,
			group: "completion",
			check: func(t *testing.T, _ *sim.Server, got outcome) {
				wantAnswer(t, got, sim.DefaultMaxTokens, "stop", completionPT)
			},
		},
		{
			name: "embeddings batch of 2", op: nodev1.Operation_OPERATION_EMBEDDINGS,
			body: embedBody, group: "embeddings",
			check: wantEmbeddings,
		},
		{
			name: "embeddings batch of 2 again", op: nodev1.Operation_OPERATION_EMBEDDINGS,
			body: embedBody, group: "embeddings",
			check: wantEmbeddings,
		},
		{
			name: "embeddings dimensions", op: nodev1.Operation_OPERATION_EMBEDDINGS,
			body: `{"model":"client-alias","input":"one input","dimensions":4}`, group: "embeddings dimensions",
			check: func(t *testing.T, _ *sim.Server, got outcome) {
				if got.err != nil || got.status != 0 || !got.done {
					t.Fatalf("want a complete answer, got err %v status %d (%q)", got.err, got.status, got.errMsg)
				}
				if len(got.embeddings) != 1 || len(got.embeddings[0]) != 4 {
					t.Errorf("embeddings %v: want one vector of 4", got.embeddings)
				}
			},
		},
		{
			name: "unknown served model", op: nodev1.Operation_OPERATION_CHAT,
			body: chatBody("client-alias"), served: "no-such-model",
			check: func(t *testing.T, _ *sim.Server, got outcome) {
				wantFailure(t, got, http.StatusNotFound)
			},
		},
		{
			name: "injected 503", op: nodev1.Operation_OPERATION_CHAT, stream: true,
			sim:  sim.Config{Faults: sim.Faults{ErrorRate: 1, ErrorStatus: http.StatusServiceUnavailable}},
			body: chatBody("client-alias", streamOpts),
			check: func(t *testing.T, s *sim.Server, got outcome) {
				wantFailure(t, got, http.StatusServiceUnavailable)
				if n := s.Stats().InjectedErrors; n != 1 {
					t.Errorf("sim injected %d errors, want 1", n)
				}
			},
		},
		{
			name: "stream dropped after 2 tokens", op: nodev1.Operation_OPERATION_CHAT, stream: true,
			sim:  sim.Config{Faults: sim.Faults{DropAfter: 2}},
			body: chatBody("client-alias", streamOpts), group: "dropped",
			check: func(t *testing.T, _ *sim.Server, got outcome) {
				wantFailure(t, got, http.StatusBadGateway)
				if !errors.Is(got.err, adapter.ErrProviderStream) {
					t.Errorf("err %v: want ErrProviderStream", got.err)
				}
				// Both paths relay what arrived before the cut.
				if n := len(strings.Fields(got.text)); n != 2 {
					t.Errorf("partial text %q has %d words, want 2", got.text, n)
				}
			},
		},
		{
			// The tunnel gets no head at all (the simulator drops a
			// non-streamed answer before writing it); Ollama's adapter
			// always streams from Ollama, so it sees the stream cut.
			name: "non-stream dropped", op: nodev1.Operation_OPERATION_CHAT,
			sim:  sim.Config{Faults: sim.Faults{DropAfter: 2}},
			body: chatBody("client-alias"),
			check: func(t *testing.T, _ *sim.Server, got outcome) {
				wantFailure(t, got, http.StatusBadGateway)
			},
		},
		{
			name: "cancel while the backend hangs", op: nodev1.Operation_OPERATION_CHAT, stream: true,
			sim:  sim.Config{Faults: sim.Faults{Hang: true}},
			body: chatBody("client-alias", streamOpts), cancelWhileHung: true,
			check: func(t *testing.T, _ *sim.Server, got outcome) {
				if !errors.Is(got.err, adapter.ErrCancelled) || !errors.Is(got.err, context.Canceled) {
					t.Errorf("err %v: want ErrCancelled wrapping context.Canceled", got.err)
				}
				if got.done || got.text != "" {
					t.Errorf("cancelled run produced an answer: %+v", got)
				}
			},
		},
		{
			name: "api key reaches the backend", op: nodev1.Operation_OPERATION_CHAT,
			sim: sim.Config{APIKey: simKey}, apiKey: simKey,
			body: chatBody("client-alias"),
			check: func(t *testing.T, s *sim.Server, got outcome) {
				wantAnswer(t, got, sim.DefaultMaxTokens, "stop", chatPrompt)
				if a := s.Stats().LastAuthorization; a != "Bearer "+simKey {
					t.Errorf("backend saw Authorization %q, want the adapter's key", a)
				}
			},
		},
		{
			name: "wrong api key", op: nodev1.Operation_OPERATION_CHAT,
			sim: sim.Config{APIKey: simKey}, apiKey: "wrong-key",
			body: chatBody("client-alias"),
			check: func(t *testing.T, _ *sim.Server, got outcome) {
				wantFailure(t, got, http.StatusUnauthorized)
			},
		},
		{
			name: "no api key", op: nodev1.Operation_OPERATION_CHAT,
			sim:  sim.Config{APIKey: simKey},
			body: chatBody("client-alias"),
			check: func(t *testing.T, s *sim.Server, got outcome) {
				wantFailure(t, got, http.StatusUnauthorized)
				if a := s.Stats().LastAuthorization; a != "" {
					t.Errorf("adapter without a key sent Authorization %q", a)
				}
			},
		},
	}
}

func TestConformance(t *testing.T) {
	cases := conformanceCases()
	// outcomes[group][adapter+"/"+case] for the cross-adapter comparison.
	outcomes := map[string]map[string]outcome{}
	for _, d := range conformanceDrivers {
		t.Run(d.name, func(t *testing.T) {
			for _, tc := range cases {
				t.Run(tc.name, func(t *testing.T) {
					s, url := startSim(t, d.protocol, tc.sim)
					got := runCase(t, d, s, url, tc)
					tc.check(t, s, got)
					// Every case: one backend request (no retries), on the
					// operation's path, naming the served model, never the
					// body's "client-alias".
					served := cmp.Or(tc.served, sim.DefaultModel)
					if seen := s.Seen(); len(seen) != 1 || seen[0].Path != d.paths[tc.op] || seen[0].Model != served {
						t.Errorf("backend saw %+v, want one request to %s for model %q", seen, d.paths[tc.op], served)
					}
					if tc.op == nodev1.Operation_OPERATION_EMBEDDINGS {
						// An OpenAI embeddings answer has no finish reason;
						// the normalized path always completes with "stop".
						got.finishReason = ""
					}
					if tc.group != "" {
						if outcomes[tc.group] == nil {
							outcomes[tc.group] = map[string]outcome{}
						}
						outcomes[tc.group][d.name+"/"+tc.name] = got
					}
				})
			}
		})
	}
	t.Run("same outcome on every adapter", func(t *testing.T) {
		for group, byRun := range outcomes {
			sameOutcome(t, group, byRun)
		}
		// A dropped stream relays a prefix of the answer it would have given.
		for run, dropped := range outcomes["dropped"] {
			for _, full := range outcomes["chat"] {
				if !strings.HasPrefix(full.text, dropped.text) {
					t.Errorf("%s: partial text %q is not a prefix of the full answer %q", run, dropped.text, full.text)
				}
				break
			}
		}
	})
}

// sameOutcome fails unless every outcome in byRun is the same. Error
// messages and values are left out: they describe the failure in each
// path's own words; the status is compared.
func sameOutcome(t *testing.T, group string, byRun map[string]outcome) {
	t.Helper()
	var (
		firstRun string
		first    outcome
	)
	for run, got := range byRun {
		got.err, got.errMsg = nil, ""
		if firstRun == "" {
			firstRun, first = run, got
			continue
		}
		if !reflect.DeepEqual(got, first) {
			t.Errorf("group %q: outcomes differ\n%s: %+v\n%s: %+v", group, firstRun, first, run, got)
		}
	}
}

// startSim starts a simulator for cfg, speaking protocol, with a fixed seed;
// it is stopped when the test ends.
func startSim(t *testing.T, protocol sim.Protocol, cfg sim.Config) (*sim.Server, string) {
	t.Helper()
	cfg.Protocol = protocol
	cfg.Seed = simSeed
	s, err := sim.New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	url, stop, err := s.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	return s, url
}

// runCase runs tc through a fresh adapter built by d against s, served at
// url, and waits until s has released every in-flight slot.
func runCase(t *testing.T, d conformanceDriver, s *sim.Server, url string, tc conformanceCase) outcome {
	t.Helper()
	a, err := d.build(url, tc.apiKey)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Close) // runs before the simulator's stop
	req := adapter.Request{Op: tc.op, Stream: tc.stream, ServedModel: cmp.Or(tc.served, sim.DefaultModel), Body: []byte(tc.body)}

	var got outcome
	if !tc.cancelWhileHung {
		got = d.run(context.Background(), t, a, req)
	} else {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		res := make(chan outcome, 1)
		go func() { res <- d.run(ctx, t, a, req) }()
		waitFor(t, "the backend to admit the request", func() bool { return s.Stats().InFlight == 1 })
		cancel()
		select {
		case got = <-res:
		case <-time.After(hangGuard):
			t.Fatalf("adapter did not return within %v of its context being cancelled", hangGuard)
		}
	}
	waitFor(t, "the backend to release every in-flight slot", func() bool { return s.Stats().InFlight == 0 })
	return got
}

// hangGuard bounds every wait in this suite. It only turns a hang into a
// failure; no case asserts anything about elapsed time.
const hangGuard = 30 * time.Second

// waitFor polls cond until it holds; it fails the test after hangGuard.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testenv.Eventually(t, what, cond)
}

// ---- drivers ----

// eventLog is an EventSink that keeps every event and how they were batched.
type eventLog struct {
	mu      sync.Mutex // guards the fields below
	batches [][]*nodev1.RunEvent
}

func (l *eventLog) Send(events ...*nodev1.RunEvent) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.batches = append(l.batches, events)
	return nil
}

// runNormalized drives a Normalizer and reads its run events. It also
// checks their grammar: STARTED first, then DELTAs, then USAGE and COMPLETE
// together in one batch, and nothing after; no COMPLETE on failure.
func runNormalized(ctx context.Context, t *testing.T, a adapter.Adapter, req adapter.Request) outcome {
	n, ok := a.(adapter.Normalizer)
	if !ok {
		t.Errorf("%T is not a Normalizer", a)
		return outcome{}
	}
	if p := n.Path(); p != nodev1.ExecutionPath_EXECUTION_PATH_NORMALIZED {
		t.Errorf("Path() = %v, want NORMALIZED", p)
	}
	log := &eventLog{}
	var got outcome
	got.err = n.Normalize(ctx, req, log)
	got.status, got.errMsg = errorStatus(got.err)

	log.mu.Lock()
	defer log.mu.Unlock()
	i := 0
	for bi, batch := range log.batches {
		for ei, e := range batch {
			if got.done {
				t.Errorf("event %v after COMPLETE", e.Type)
			}
			switch e.Type {
			case nodev1.RunEvent_TYPE_STARTED:
				if i != 0 {
					t.Errorf("STARTED is event %d, want 0", i)
				}
			case nodev1.RunEvent_TYPE_DELTA:
				got.text += e.Text
				for _, emb := range e.Embeddings {
					got.embeddings = append(got.embeddings, emb.Values)
				}
			case nodev1.RunEvent_TYPE_USAGE:
				got.promptTokens, got.completionTokens = int(e.PromptTokens), int(e.CompletionTokens)
				if ei+1 >= len(batch) || batch[ei+1].Type != nodev1.RunEvent_TYPE_COMPLETE {
					t.Errorf("batch %d: USAGE not followed by COMPLETE in the same batch", bi)
				}
			case nodev1.RunEvent_TYPE_COMPLETE:
				got.finishReason, got.done = e.FinishReason, true
			default:
				t.Errorf("adapter sent %v: failure events are the caller's", e.Type)
			}
			if i == 0 && e.Type != nodev1.RunEvent_TYPE_STARTED {
				t.Errorf("first event %v, want STARTED", e.Type)
			}
			i++
		}
	}
	if got.err != nil && got.done {
		t.Errorf("sent COMPLETE and returned %v", got.err)
	}
	if got.err == nil && !got.done {
		t.Errorf("returned nil without sending COMPLETE")
	}
	return got
}

// tunnelLog is a TunnelSink that keeps the head and the body bytes.
type tunnelLog struct {
	mu     sync.Mutex // guards the fields below
	heads  int
	status int
	header http.Header
	body   bytes.Buffer
}

func (l *tunnelLog) Head(h adapter.TunnelHead) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.heads++
	l.status, l.header = h.Status, h.Header
	l.body.Write(h.Body) // copies: the body is the adapter's
	return nil
}

func (l *tunnelLog) Data(p []byte) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.body.Write(p) // copies: p is reused by the adapter
	return nil
}

// runTunnel drives a Tunneler and parses the relayed answer as the OpenAI
// API defines it: a JSON object, SSE chunks, or an error object.
func runTunnel(ctx context.Context, t *testing.T, a adapter.Adapter, req adapter.Request) outcome {
	tn, ok := a.(adapter.Tunneler)
	if !ok {
		t.Errorf("%T is not a Tunneler", a)
		return outcome{}
	}
	if p := tn.Path(); p != nodev1.ExecutionPath_EXECUTION_PATH_TUNNEL {
		t.Errorf("Path() = %v, want TUNNEL", p)
	}
	log := &tunnelLog{}
	err := tn.Tunnel(ctx, req, log)

	log.mu.Lock()
	defer log.mu.Unlock()
	var got outcome
	switch {
	case log.heads > 1:
		t.Errorf("Head called %d times", log.heads)
	case log.heads == 0 && log.body.Len() > 0:
		t.Errorf("Data before Head")
	case log.heads == 0:
	case log.status < 200 || log.status > 299:
		got.status, got.errMsg = log.status, openAIErrorMessage(t, log.body.Bytes())
	case strings.HasPrefix(log.header.Get("Content-Type"), "text/event-stream"):
		got = parseSSE(t, log.body.Bytes(), err != nil)
	default:
		got = parseJSONAnswer(t, log.body.Bytes(), err != nil)
	}
	got.err = err
	if err != nil {
		got.status, got.errMsg = errorStatus(err)
		if got.done {
			t.Errorf("relayed a complete answer and returned %v", err)
		}
	}
	return got
}

// openAIAnswer is the part of a chat.completion, chat.completion.chunk,
// text_completion or embeddings list object the suite reads.
type openAIAnswer struct {
	Choices []struct {
		Message *struct {
			Content string `json:"content"`
		} `json:"message"`
		Delta *struct {
			Content string `json:"content"`
		} `json:"delta"`
		Text         string  `json:"text"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Data []struct {
		Embedding []float32 `json:"embedding"`
	} `json:"data"`
	Usage *struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
	} `json:"usage"`
}

// add folds one answer object (whole or a chunk) into got.
func (a openAIAnswer) add(got *outcome) {
	for _, c := range a.Choices {
		switch {
		case c.Message != nil:
			got.text += c.Message.Content
		case c.Delta != nil:
			got.text += c.Delta.Content
		default:
			got.text += c.Text
		}
		if c.FinishReason != nil {
			got.finishReason = *c.FinishReason
		}
	}
	for _, d := range a.Data {
		got.embeddings = append(got.embeddings, d.Embedding)
	}
	if a.Usage != nil {
		got.promptTokens, got.completionTokens = a.Usage.PromptTokens, a.Usage.CompletionTokens
	}
}

func parseJSONAnswer(t *testing.T, body []byte, broken bool) outcome {
	var got outcome
	var a openAIAnswer
	if err := json.Unmarshal(body, &a); err != nil {
		if !broken {
			t.Errorf("relayed body is not an OpenAI answer: %v: %q", err, body)
		}
		return got
	}
	a.add(&got)
	got.done = true
	return got
}

// parseSSE reads "data: " events; with broken set, a last event cut short
// is ignored.
func parseSSE(t *testing.T, body []byte, broken bool) outcome {
	var got outcome
	events := strings.Split(string(body), "\n\n")
	last := len(events) - 1
	if events[last] != "" && !broken {
		t.Errorf("stream ends inside an event: %q", events[last])
	}
	for _, ev := range events[:last] {
		data, ok := strings.CutPrefix(ev, "data: ")
		switch {
		case !ok:
			t.Errorf("not a data event: %q", ev)
		case got.done:
			t.Errorf("event after [DONE]: %q", ev)
		case data == "[DONE]":
			got.done = true
		default:
			var a openAIAnswer
			if err := json.Unmarshal([]byte(data), &a); err != nil {
				t.Errorf("event is not an OpenAI chunk: %v: %q", err, data)
				continue
			}
			a.add(&got)
		}
	}
	return got
}

// openAIErrorMessage is error.message of an OpenAI error body.
func openAIErrorMessage(t *testing.T, body []byte) string {
	var e struct {
		Error *struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal(body, &e); err != nil || e.Error == nil {
		t.Errorf("error answer is not an OpenAI error object: %q", body)
		return string(body)
	}
	return e.Error.Message
}

// errorStatus is err's status and message if it is an *adapter.Error.
func errorStatus(err error) (int, string) {
	var e *adapter.Error
	if errors.As(err, &e) {
		return e.Status, e.Message
	}
	return 0, ""
}

// ---- checks ----

// wantAnswer checks a complete text answer of n words.
func wantAnswer(t *testing.T, got outcome, n int, finish string, promptTokens int) {
	t.Helper()
	if got.err != nil || got.status != 0 || !got.done {
		t.Fatalf("want a complete answer, got err %v status %d (%q) done %v", got.err, got.status, got.errMsg, got.done)
	}
	if words := len(strings.Fields(got.text)); words != n {
		t.Errorf("text %q has %d words, want %d", got.text, words, n)
	}
	if got.finishReason != finish {
		t.Errorf("finish reason %q, want %q", got.finishReason, finish)
	}
	if got.promptTokens != promptTokens || got.completionTokens != n {
		t.Errorf("usage %d prompt + %d completion tokens, want %d + %d",
			got.promptTokens, got.completionTokens, promptTokens, n)
	}
}

// wantFailure checks an error outcome with the given status.
func wantFailure(t *testing.T, got outcome, status int) {
	t.Helper()
	if got.status != status {
		t.Errorf("error status %d (err %v), want %d", got.status, got.err, status)
	}
	if got.errMsg == "" {
		t.Errorf("no error message")
	}
	if got.done {
		t.Errorf("a failed run produced a complete answer: %+v", got)
	}
}

// wantEmbeddings checks two distinct unit vectors for the two inputs.
func wantEmbeddings(t *testing.T, _ *sim.Server, got outcome) {
	t.Helper()
	if got.err != nil || got.status != 0 || !got.done {
		t.Fatalf("want a complete answer, got err %v status %d (%q) done %v", got.err, got.status, got.errMsg, got.done)
	}
	if len(got.embeddings) != 2 {
		t.Fatalf("got %d vectors for 2 inputs", len(got.embeddings))
	}
	for i, v := range got.embeddings {
		var norm float64
		for _, x := range v {
			norm += float64(x) * float64(x)
		}
		if len(v) == 0 || math.Abs(math.Sqrt(norm)-1) > 1e-4 {
			t.Errorf("vector %d %v: want a non-empty unit vector", i, v)
		}
	}
	if reflect.DeepEqual(got.embeddings[0], got.embeddings[1]) {
		t.Errorf("two different inputs got the same vector")
	}
	if got.promptTokens != embedPT {
		t.Errorf("prompt tokens %d, want %d", got.promptTokens, embedPT)
	}
}

func joinFields(fields []string) string {
	if len(fields) == 0 {
		return ""
	}
	return "," + strings.Join(fields, ",")
}
