package e2e

// End-to-end tests: a client that has read its whole
// answer may send its next request at once and never meets its own key's
// max_concurrent limit. A real edge (HTTP on loopback TCP, its node
// endpoint over gRPC), a real node agent and `iop sim` backends of both
// protocols serve every route that runs a model.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"iop/internal/auth"
	"iop/internal/e2e/harness"
	"iop/internal/node"
	"iop/internal/process"
	"iop/internal/sim"
)

// The models of a keyRig: one served by a simulated Ollama (the normalized
// path), one by a simulated OpenAI-compatible server (the tunnel path),
// and the same two whose streamed answers fail midway (an error inside the
// 2xx stream, as vLLM and Ollama report a failed generation).
const (
	normModel    = "m-norm"
	tunModel     = "m-tun"
	normErrModel = "m-norm-err"
	tunErrModel  = "m-tun-err"
	// The same two, slow: 1000 tokens at 20 tokens/s.
	normSlowModel = "m-norm-slow"
	tunSlowModel  = "m-tun-slow"
)

// keyRig is a real edge with client keys, an admin key, a usage ledger in
// an SQLite file of a temp dir and its JSON log captured, and one node
// serving the rig's models.
type keyRig struct {
	e      *process.Process
	base   string
	admin  string          // the admin key
	log    *harness.Buffer // the edge's JSON log (info)
	db     string          // the SQLite file of run records and the ledger
	client *http.Client
	// drainAfter: once a client has its answer's end, the rest of the body
	// (the framing's end) is read in the background and the connection
	// goes back to the client's pool, so that a next request finds an
	// open connection and reaches the edge within microseconds; else the
	// body is closed at once (the client leaves its connection).
	drainAfter bool
	drains     sync.WaitGroup
}

// startKeyRig starts a keyRig with keys (an admin key is added).
func startKeyRig(t *testing.T, keys []auth.Key) *keyRig {
	t.Helper()
	simCfg := func(p sim.Protocol, model string, streamErrorAfter int) sim.Config {
		return sim.Config{Protocol: p, Models: []string{model}, Seed: 13, DefaultMaxTokens: 4,
			Faults: sim.Faults{StreamErrorAfter: streamErrorAfter}}
	}
	slow := func(p sim.Protocol, model string) sim.Config {
		return sim.Config{Protocol: p, Models: []string{model}, Seed: 13, DefaultMaxTokens: 1000, TokensPerSecond: 20}
	}
	_, normURL := harness.Sim(t, simCfg(sim.ProtocolOllama, normModel, 0))
	_, tunURL := harness.Sim(t, simCfg(sim.ProtocolOpenAI, tunModel, 0))
	_, normErrURL := harness.Sim(t, simCfg(sim.ProtocolOllama, normErrModel, 2))
	_, tunErrURL := harness.Sim(t, simCfg(sim.ProtocolOpenAI, tunErrModel, 2))
	_, normSlowURL := harness.Sim(t, slow(sim.ProtocolOllama, normSlowModel))
	_, tunSlowURL := harness.Sim(t, slow(sim.ProtocolOpenAI, tunSlowModel))
	admin, adminHash := auth.Generate()
	rig := &keyRig{admin: admin, log: &harness.Buffer{}, db: filepath.Join(t.TempDir(), "iop.db"),
		client: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}}
	t.Cleanup(func() {
		rig.drains.Wait()
		rig.client.CloseIdleConnections()
	})
	cfg := process.DefaultEdgeFile()
	cfg.Keys = keys
	cfg.AdminKeys = []auth.Key{{Name: "ops", Hash: adminHash}}
	cfg.Database = rig.db
	cfg.Queue.MaxQueue = 256
	// The *-err providers fail inside every stream on purpose; a
	// provider's error in its stream counts for the circuit breaker, which
	// would take them out of rotation and turn their requests into 503s.
	cfg.CircuitBreaker.Failures = -1
	logger, err := process.NewLogger(rig.log, "info", "json")
	if err != nil {
		t.Fatal(err)
	}
	rig.e = startEdgeWith(t, cfg, logger)
	rig.base = "http://" + rig.e.HTTPAddr
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	caps := []string{"embeddings"}
	harness.Node(t, ctx, node.Config{NodeID: "gpu-1", Edge: rig.e.NodeAddr, Providers: []node.ProviderConfig{
		{ID: "norm", Type: node.TypeOllama, BaseURL: normURL, Models: []string{normModel}, Capacity: 64, Capabilities: caps},
		{ID: "tun", Type: node.TypeOpenAI, BaseURL: tunURL + "/v1", Models: []string{tunModel}, Capacity: 64, Capabilities: caps},
		{ID: "norm-err", Type: node.TypeOllama, BaseURL: normErrURL, Models: []string{normErrModel}, Capacity: 64},
		{ID: "tun-err", Type: node.TypeOpenAI, BaseURL: tunErrURL + "/v1", Models: []string{tunErrModel}, Capacity: 64},
		{ID: "norm-slow", Type: node.TypeOllama, BaseURL: normSlowURL, Models: []string{normSlowModel}, Capacity: 64},
		{ID: "tun-slow", Type: node.TypeOpenAI, BaseURL: tunSlowURL + "/v1", Models: []string{tunSlowModel}, Capacity: 64},
	}})
	return rig
}

// answerKind is how a client reads an answer to its end.
type answerKind int

const (
	// kindJSON: one JSON object, decoded (json.Decoder stops at its last
	// byte, before any end of the body).
	kindJSON answerKind = iota
	// kindSSE: server-sent events up to `data: [DONE]`.
	kindSSE
	// kindNDJSON: JSON lines up to the one with "done": true.
	kindNDJSON
	// kindRunEvents: a background run's 202, then its event stream
	// (GET /v1/runs/{id}/events) up to `data: [DONE]`.
	kindRunEvents
)

// answer is what a client saw of one request.
type answer struct {
	status int
	code   string // the error code of an error answer or an error event
	whole  bool   // the answer's end (its last object, [DONE], the done line) was read
	state  string // a run record's state
	text   string // a short excerpt, for failure messages
}

// route is one way of running a model: its path, how its answer ends, and
// its body for a model.
type route struct {
	name string
	path string
	kind answerKind
	body func(model string) string
}

// modelRoutes are every route that runs a model, streamed and not where it
// streams, with small answers.
var modelRoutes = []route{
	{"chat", "/v1/chat/completions", kindJSON, func(m string) string {
		return `{"model":"` + m + `","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`
	}},
	{"chat-stream", "/v1/chat/completions", kindSSE, func(m string) string {
		return `{"model":"` + m + `","stream":true,"max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`
	}},
	{"completions", "/v1/completions", kindJSON, func(m string) string {
		return `{"model":"` + m + `","max_tokens":4,"prompt":"once upon"}`
	}},
	{"completions-stream", "/v1/completions", kindSSE, func(m string) string {
		return `{"model":"` + m + `","stream":true,"max_tokens":4,"prompt":"once upon"}`
	}},
	{"embeddings", "/v1/embeddings", kindJSON, func(m string) string {
		return `{"model":"` + m + `","input":["a b","c"]}`
	}},
	{"ollama-chat", "/api/chat", kindJSON, func(m string) string {
		return `{"model":"` + m + `","stream":false,"options":{"num_predict":4},"messages":[{"role":"user","content":"hi"}]}`
	}},
	{"ollama-chat-stream", "/api/chat", kindNDJSON, func(m string) string {
		return `{"model":"` + m + `","options":{"num_predict":4},"messages":[{"role":"user","content":"hi"}]}`
	}},
	{"ollama-generate", "/api/generate", kindJSON, func(m string) string {
		return `{"model":"` + m + `","stream":false,"options":{"num_predict":4},"prompt":"hi"}`
	}},
	{"ollama-generate-stream", "/api/generate", kindNDJSON, func(m string) string {
		return `{"model":"` + m + `","options":{"num_predict":4},"prompt":"hi"}`
	}},
	{"ollama-embed", "/api/embed", kindJSON, func(m string) string {
		return `{"model":"` + m + `","input":["a b","c"]}`
	}},
	{"ollama-embeddings", "/api/embeddings", kindJSON, func(m string) string {
		return `{"model":"` + m + `","prompt":"a b"}`
	}},
	{"run", "/v1/runs", kindJSON, func(m string) string {
		return `{"model":"` + m + `","max_tokens":4,"prompt":"hi"}`
	}},
	{"run-background", "/v1/runs", kindRunEvents, func(m string) string {
		return `{"model":"` + m + `","max_tokens":4,"prompt":"hi","background":true}`
	}},
}

// send sends one request with key and reads its answer as the strictest
// client does: up to the answer's end and not a byte further; then it
// returns at once, leaving the rest of the body (see drainAfter), so that
// its next request may start while the edge still finishes this one.
func (rig *keyRig) send(ctx context.Context, key, path, body string, kind answerKind) (answer, error) {
	return rig.sendUntil(ctx, key, path, body, kind, false)
}

// sendUntil is send; with early, it returns as soon as the first line of
// a streamed answer has come, keeping the connection until ctx ends (the
// caller then leaves by cancelling ctx).
func (rig *keyRig) sendUntil(ctx context.Context, key, path, body string, kind answerKind, early bool) (answer, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, rig.base+path, strings.NewReader(body))
	if err != nil {
		return answer{}, err
	}
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := rig.client.Do(req)
	if err != nil {
		return answer{}, err
	}
	defer rig.leave(ctx, resp.Body, early)
	a := answer{status: resp.StatusCode}
	if resp.StatusCode/100 != 2 || kind == kindJSON || kind == kindRunEvents {
		var v struct {
			ID    string          `json:"id"`
			State string          `json:"state"`
			Error json.RawMessage `json:"error"`
		}
		raw := json.RawMessage{}
		err := json.NewDecoder(resp.Body).Decode(&raw)
		a.text = clipText(string(raw))
		if err != nil {
			return a, nil
		}
		a.whole = true
		_ = json.Unmarshal(raw, &v)
		a.code, a.state = errorCode(v.Error), v.State
		if kind != kindRunEvents || resp.StatusCode != http.StatusAccepted {
			return a, nil
		}
		// A background run: its answer is its event stream.
		events, err := http.NewRequestWithContext(ctx, http.MethodGet, rig.base+"/v1/runs/"+v.ID+"/events", nil)
		if err != nil {
			return a, err
		}
		events.Header.Set("Authorization", "Bearer "+key)
		if resp, err = rig.client.Do(events); err != nil {
			return a, err
		}
		defer rig.leave(ctx, resp.Body, early)
		a = answer{status: resp.StatusCode}
		kind = kindSSE
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Bytes()
		a.text = clipText(string(line))
		if early && len(line) > 0 && !bytes.HasPrefix(line, []byte(":")) {
			return a, nil
		}
		switch kind {
		case kindSSE:
			data, ok := bytes.CutPrefix(line, []byte("data: "))
			if !ok {
				continue
			}
			if string(data) == "[DONE]" {
				a.whole = true
				return a, nil
			}
			var v struct {
				Error json.RawMessage `json:"error"`
			}
			if json.Unmarshal(data, &v) == nil && len(v.Error) > 0 && string(v.Error) != "null" {
				a.code, a.whole = errorCode(v.Error), true // an error event ends the stream
				return a, nil
			}
		case kindNDJSON:
			var v struct {
				Done  bool   `json:"done"`
				Error string `json:"error"`
			}
			if json.Unmarshal(line, &v) != nil {
				return a, fmt.Errorf("not an NDJSON line: %q", line)
			}
			if v.Error != "" {
				a.code, a.whole = "error", true
				return a, nil
			}
			if v.Done {
				a.whole = true
				return a, nil
			}
		}
	}
	return a, sc.Err()
}

// leave is done with a body whose answer was read: see drainAfter; a
// body left early is closed when ctx ends.
func (rig *keyRig) leave(ctx context.Context, body io.ReadCloser, early bool) {
	switch {
	case early:
		rig.drains.Go(func() {
			<-ctx.Done()
			body.Close()
		})
		return
	case !rig.drainAfter:
		body.Close()
		return
	}
	rig.drains.Go(func() {
		_, _ = io.Copy(io.Discard, body)
		body.Close()
	})
}

// errorCode is the code of an OpenAI error object, or the message of an
// Ollama error string; "" for none.
func errorCode(raw json.RawMessage) string {
	if len(raw) == 0 || string(raw) == "null" {
		return ""
	}
	var obj struct {
		Code *string `json:"code"`
	}
	if json.Unmarshal(raw, &obj) == nil {
		if obj.Code != nil {
			return *obj.Code
		}
		return "error"
	}
	var s string
	_ = json.Unmarshal(raw, &s)
	return s
}

func clipText(s string) string {
	if len(s) > 300 {
		return s[:300] + "…"
	}
	return s
}

// TestFinishedAnswerFreesItsCallerSequential: a strictly sequential client
// with a key of max_concurrent 1 sends its next request as soon as it has
// read the end of its answer (and leaves the connection), 200 rounds on
// every route, streamed and not, on both execution paths: it is never
// refused. Each (route, path) has its own key and client, all at once.
func TestFinishedAnswerFreesItsCallerSequential(t *testing.T) {
	harness.ParallelLong(t)
	const rounds = 200
	type sequence struct {
		route route
		model string
		key   auth.Key
		token string
	}
	var seqs []sequence
	for _, rt := range modelRoutes {
		for _, model := range []string{normModel, tunModel} {
			token, hash := auth.Generate()
			seqs = append(seqs, sequence{rt, model, auth.Key{Name: rt.name + "@" + model, Hash: hash, MaxConcurrent: 1}, token})
		}
	}
	var keys []auth.Key
	for _, s := range seqs {
		keys = append(keys, s.key)
	}
	rig := startKeyRig(t, keys)
	rig.drainAfter = true
	var wg sync.WaitGroup
	for _, s := range seqs {
		wg.Go(func() {
			for i := range rounds {
				a, err := rig.send(context.Background(), s.token, s.route.path, s.route.body(s.model), s.route.kind)
				if err != nil || a.status/100 != 2 || !a.whole || a.code != "" || a.state != "" && a.state != "complete" {
					t.Errorf("%s round %d: status %d code %q state %q whole %v err %v: %s", s.key.Name, i, a.status, a.code, a.state, a.whole, err, a.text)
					return
				}
			}
		})
	}
	wg.Wait()
	waitIdle(t, rig.e)
}

// TestFinishedAnswerFreesItsCallerConcurrent: N clients sharing a key of
// max_concurrent N, each streaming one request after the other, are never
// refused, on every streamed route and both execution paths.
func TestFinishedAnswerFreesItsCallerConcurrent(t *testing.T) {
	harness.ParallelLong(t)
	const clients, rounds = 3, 60
	type group struct {
		route route
		model string
		token string
	}
	var (
		groups []group
		keys   []auth.Key
	)
	for _, rt := range modelRoutes {
		if rt.kind != kindSSE && rt.kind != kindNDJSON && rt.kind != kindRunEvents {
			continue
		}
		for _, model := range []string{normModel, tunModel} {
			token, hash := auth.Generate()
			keys = append(keys, auth.Key{Name: rt.name + "@" + model, Hash: hash, MaxConcurrent: clients})
			groups = append(groups, group{rt, model, token})
		}
	}
	rig := startKeyRig(t, keys)
	rig.drainAfter = true
	var wg sync.WaitGroup
	for _, g := range groups {
		for c := range clients {
			wg.Go(func() {
				for i := range rounds {
					a, err := rig.send(context.Background(), g.token, g.route.path, g.route.body(g.model), g.route.kind)
					if err != nil || a.status/100 != 2 || !a.whole || a.code != "" {
						t.Errorf("%s@%s client %d round %d: status %d code %q whole %v err %v: %s",
							g.route.name, g.model, c, i, a.status, a.code, a.whole, err, a.text)
						return
					}
				}
			})
		}
	}
	wg.Wait()
	waitIdle(t, rig.e)
}
