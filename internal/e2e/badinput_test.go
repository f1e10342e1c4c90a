package e2e

// The bad-input suite: every kind of malformed
// request, sent to every route that takes a body (the OpenAI routes, the
// Ollama routes and POST /v1/runs) of a real edge with a real node and `iop
// sim` backends on both execution paths. Each one must get a 4xx with a
// clean error body in its API's shape, hold no slot, and leave the service
// able to answer a normal request on that route at once.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"image"
	"image/png"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"iop/internal/e2e/harness"
	"iop/internal/edge"
	"iop/internal/node"
	"iop/internal/process"
	"iop/internal/sim"
)

// Served models of the bad-input rig. Each provider also advertises a
// ghost model its simulator does not serve: a request for it is admitted
// and dispatched, then refused by the provider (404).
const (
	badNormModel  = "norm-model"  // Ollama sim: normalized path
	badTunModel   = "tun-model"   // OpenAI sim: tunnel path
	badGhostNorm  = "ghost-norm"  // advertised by the Ollama provider, unknown to its sim
	badGhostTun   = "ghost-tun"   // advertised by the OpenAI provider, unknown to its sim
	badPlainModel = "plain-model" // a provider without any capability
	badMixedAlias = "mixed"       // plain-model and norm-model: only the latter has vision
)

// badRig is an edge with one node: a capacity-1 provider per execution
// path (vision and embeddings), each behind a recording proxy, and a plain
// capacity-1 provider.
type badRig struct {
	e                 *process.Process
	base              string // http://host:port of the edge's HTTP API
	client            *http.Client
	normProxy, tunPrx *recordingProxy
}

// startBadRig starts the rig with the edge's request body limit set to
// maxBody bytes (0: the default, 32 MiB).
func startBadRig(t *testing.T, maxBody int64) *badRig {
	t.Helper()
	_, normURL := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOllama, Models: []string{badNormModel}, Seed: 3})
	_, tunURL := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOpenAI, Models: []string{badTunModel}, Seed: 3})
	_, plainURL := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOllama, Models: []string{badPlainModel}, Seed: 3})
	rig := &badRig{normProxy: startRecordingProxy(t, normURL), tunPrx: startRecordingProxy(t, tunURL)}

	ctx, cancel := context.WithCancel(context.Background())
	cfg := process.DefaultEdgeFile()
	cfg.Listen, cfg.NodeListen = "127.0.0.1:0", "127.0.0.1:0"
	cfg.Database = ":memory:"
	if maxBody != 0 {
		cfg.MaxBodyBytes = maxBody
	}
	cfg.Models = map[string]edge.ModelConfig{badMixedAlias: {Targets: []string{badPlainModel, badNormModel}}}
	e, err := process.Start(ctx, process.Config{Mode: process.ModeEdge, Edge: cfg}, process.Deps{Logger: harness.Logger(t, "edge")})
	if err != nil {
		t.Fatal(err)
	}
	rig.e, rig.base = e, "http://"+e.HTTPAddr
	harness.StopAtCleanup(t, cancel, e)
	caps := []string{"vision", "embeddings"}
	harness.Node(t, ctx, node.Config{
		NodeID: "gpu-1",
		Edge:   e.NodeAddr,
		Providers: []node.ProviderConfig{
			// "a-plain" sorts first: on a tie it would win, were it not
			// for the capability filter.
			{ID: "a-plain", Type: node.TypeOllama, BaseURL: plainURL, Models: []string{badPlainModel}, Capacity: 1},
			{ID: "ollama", Type: node.TypeOllama, BaseURL: rig.normProxy.URL, Models: []string{badNormModel, badGhostNorm}, Capacity: 1, Capabilities: caps},
			{ID: "vllm", Type: "vllm", BaseURL: rig.tunPrx.URL + "/v1", Models: []string{badTunModel, badGhostTun}, Capacity: 1, Capabilities: caps},
		},
	})
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	rig.client = &http.Client{Transport: tr}
	return rig
}

// badRoute is one route that takes a request body.
type badRoute struct {
	name, path string
	ollama     bool // Ollama error shape {"error":"..."}; any Content-Type accepted
	// good is a valid body for model; okBody checks a 200 answer to it.
	good   func(model string) string
	okBody func(t *testing.T, body []byte)
}

func hasJSONKey(key string) func(*testing.T, []byte) {
	return func(t *testing.T, body []byte) {
		t.Helper()
		var m map[string]json.RawMessage
		if err := json.Unmarshal(body, &m); err != nil || m[key] == nil {
			t.Fatalf("answer without %q: %s", key, body)
		}
	}
}

// badRoutes are the routes under test.
var badRoutes = []badRoute{
	{name: "chat", path: "/v1/chat/completions",
		good: func(m string) string {
			return `{"model":"` + m + `","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`
		},
		okBody: hasJSONKey("choices")},
	{name: "completions", path: "/v1/completions",
		good:   func(m string) string { return `{"model":"` + m + `","max_tokens":2,"prompt":"hi"}` },
		okBody: hasJSONKey("choices")},
	{name: "embeddings", path: "/v1/embeddings",
		good:   func(m string) string { return `{"model":"` + m + `","input":"hi"}` },
		okBody: hasJSONKey("data")},
	{name: "ollama-chat", path: "/api/chat", ollama: true,
		good: func(m string) string {
			return `{"model":"` + m + `","stream":false,"options":{"num_predict":2},"messages":[{"role":"user","content":"hi"}]}`
		},
		okBody: hasJSONKey("message")},
	{name: "ollama-generate", path: "/api/generate", ollama: true,
		good: func(m string) string {
			return `{"model":"` + m + `","stream":false,"options":{"num_predict":2},"prompt":"hi"}`
		},
		okBody: hasJSONKey("response")},
	{name: "runs", path: "/v1/runs",
		good: func(m string) string { return `{"model":"` + m + `","max_tokens":2,"prompt":"hi"}` },
		okBody: func(t *testing.T, body []byte) {
			t.Helper()
			var r runJSON
			if err := json.Unmarshal(body, &r); err != nil || r.State != "complete" || r.Output == "" {
				t.Fatalf("run not complete: %s", body)
			}
		}},
}

// badCase is one bad request and what its error must say.
type badCase struct {
	body   string
	status int    // default 400
	param  string // the error's param on OpenAI routes ("" = null)
	code   string // the error's code on OpenAI routes (default invalid_request)
}

// send posts body to path with the given Content-Type ("" = none).
func (rig *badRig) send(t *testing.T, path, contentType, body string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, rig.base+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := rig.client.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("POST %s: reading the answer: %v", path, err)
	}
	return resp, data
}

// checkErrorBody checks an error answer: its status, and a clean body in
// the route's shape. OpenAI: exactly {"error":{"message","type","param",
// "code"}}, message and type non-empty, param and code a string or null.
// Ollama: exactly {"error":"<non-empty>"}.
func checkErrorBody(t *testing.T, rt badRoute, resp *http.Response, body []byte, c badCase) {
	t.Helper()
	want := c.status
	if want == 0 {
		want = http.StatusBadRequest
	}
	if resp.StatusCode != want {
		t.Fatalf("%s %s: status %d, want %d: %s", rt.name, clipBody(c.body), resp.StatusCode, want, body)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Fatalf("%s %s: Content-Type %q", rt.name, clipBody(c.body), ct)
	}
	if rt.ollama {
		var e map[string]any
		if err := json.Unmarshal(body, &e); err != nil || len(e) != 1 {
			t.Fatalf("%s %s: not an Ollama error: %s", rt.name, clipBody(c.body), body)
		}
		if msg, ok := e["error"].(string); !ok || strings.TrimSpace(msg) == "" {
			t.Fatalf("%s %s: not an Ollama error: %s", rt.name, clipBody(c.body), body)
		}
		return
	}
	var outer map[string]map[string]any
	if err := json.Unmarshal(body, &outer); err != nil || len(outer) != 1 || outer["error"] == nil {
		t.Fatalf("%s %s: not an OpenAI error: %s", rt.name, clipBody(c.body), body)
	}
	e := outer["error"]
	if len(e) != 4 {
		t.Fatalf("%s %s: error fields %v, want message, type, param, code", rt.name, clipBody(c.body), e)
	}
	for _, k := range []string{"message", "type"} {
		if s, ok := e[k].(string); !ok || strings.TrimSpace(s) == "" {
			t.Fatalf("%s %s: error %s %v", rt.name, clipBody(c.body), k, e[k])
		}
	}
	for _, k := range []string{"param", "code"} {
		if v, ok := e[k]; !ok || (v != nil && fmt.Sprint(v) == "") {
			t.Fatalf("%s %s: error %s %v", rt.name, clipBody(c.body), k, v)
		}
	}
	wantParam := any(nil)
	if c.param != "" {
		wantParam = c.param
	}
	if e["param"] != wantParam {
		t.Errorf("%s %s: param %v, want %v", rt.name, clipBody(c.body), e["param"], wantParam)
	}
	wantCode := c.code
	if wantCode == "" {
		wantCode = "invalid_request"
	}
	if e["code"] != wantCode {
		t.Errorf("%s %s: code %v, want %s", rt.name, clipBody(c.body), e["code"], wantCode)
	}
}

func clipBody(s string) string {
	if len(s) > 80 {
		return s[:80] + "…"
	}
	return s
}

// healthy checks that the rig holds no slot and that a normal request on
// rt, on both execution paths, is answered 200.
func (rig *badRig) healthy(t *testing.T, rt badRoute) {
	t.Helper()
	waitIdle(t, rig.e)
	for _, model := range []string{badNormModel, badTunModel} {
		resp, body := rig.send(t, rt.path, "application/json", rt.good(model))
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s after bad input: a normal request for %s got %d %s", rt.name, model, resp.StatusCode, body)
		}
		rt.okBody(t, body)
	}
	waitIdle(t, rig.e)
}

// checkCases sends each case to rt, checks each error, then that the
// service is healthy.
func (rig *badRig) checkCases(t *testing.T, rt badRoute, cases []badCase) {
	t.Helper()
	for _, c := range cases {
		resp, body := rig.send(t, rt.path, "application/json", c.body)
		checkErrorBody(t, rt, resp, body, c)
	}
	rig.healthy(t, rt)
}

func TestBadInput_InvalidJSON(t *testing.T) {
	harness.Parallel(t)
	rig := startBadRig(t, 0)
	bodies := []string{``, `{`, `{"model":`, `{"model":"norm-model",}`, `not json`, `{"model":"norm-model"}{}`, "{\"model\":\"\xff\"", `{'model':'x'}`}
	for _, rt := range badRoutes {
		t.Run(rt.name, func(t *testing.T) {
			var cases []badCase
			for _, b := range bodies {
				cases = append(cases, badCase{body: b})
			}
			rig.checkCases(t, rt, cases)
		})
	}
}

func TestBadInput_BodyNotAnObject(t *testing.T) {
	harness.Parallel(t)
	rig := startBadRig(t, 0)
	for _, rt := range badRoutes {
		t.Run(rt.name, func(t *testing.T) {
			var cases []badCase
			for _, b := range []string{`[]`, `true`, `null`, `"x"`, `7`, ` [{"model":"norm-model"}] `} {
				cases = append(cases, badCase{body: b})
			}
			rig.checkCases(t, rt, cases)
		})
	}
}

// TestBadInput_ContentType: a JSON body without a Content-Type is served on
// every route; a non-JSON Content-Type is 415 on the OpenAI routes and the
// runs API, while the Ollama routes accept any Content-Type on purpose
// (Ollama's own curl examples send none or curl's form default).
func TestBadInput_ContentType(t *testing.T) {
	harness.Parallel(t)
	rig := startBadRig(t, 0)
	for _, rt := range badRoutes {
		t.Run(rt.name, func(t *testing.T) {
			resp, body := rig.send(t, rt.path, "", rt.good(badNormModel))
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("no Content-Type: %d %s", resp.StatusCode, body)
			}
			rt.okBody(t, body)
			for _, ct := range []string{"application/json; charset=utf-8", "application/vnd.iop+json"} {
				if resp, body := rig.send(t, rt.path, ct, rt.good(badNormModel)); resp.StatusCode != http.StatusOK {
					t.Fatalf("Content-Type %s: %d %s", ct, resp.StatusCode, body)
				}
			}
			for _, ct := range []string{"text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", "application/xml", "not a media type"} {
				resp, body := rig.send(t, rt.path, ct, rt.good(badNormModel))
				if rt.ollama {
					if resp.StatusCode != http.StatusOK {
						t.Fatalf("Ollama route with Content-Type %s: %d %s, want it accepted", ct, resp.StatusCode, body)
					}
					rt.okBody(t, body)
					continue
				}
				checkErrorBody(t, rt, resp, body, badCase{body: ct, status: http.StatusUnsupportedMediaType, code: "unsupported_media_type"})
			}
			rig.healthy(t, rt)
		})
	}
}

// TestBadInput_Model: a missing or empty model is a 400 naming "model" (as
// OpenAI answers: "you must provide a model parameter"); an unknown one is
// 404 model_not_found (Ollama: `model 'x' not found`).
func TestBadInput_Model(t *testing.T) {
	harness.Parallel(t)
	rig := startBadRig(t, 0)
	for _, rt := range badRoutes {
		t.Run(rt.name, func(t *testing.T) {
			good := rt.good("MODEL")
			with := func(model string) string { return strings.Replace(good, `"MODEL"`, model, 1) }
			cases := []badCase{
				{body: strings.Replace(good, `"model":"MODEL",`, "", 1), param: "model"},
				{body: with(`""`), param: "model"},
				{body: with(`"   "`), param: "model"},
				{body: with(`null`), param: "model"},
				{body: with(`"no-such-model"`), status: http.StatusNotFound, param: "model", code: "model_not_found"},
				{body: with(`"norm-model:7b"`), status: http.StatusNotFound, param: "model", code: "model_not_found"},
				{body: with(`"` + strings.Repeat("x", 100_000) + `"`), status: http.StatusNotFound, param: "model", code: "model_not_found"},
			}
			rig.checkCases(t, rt, cases)
			if rt.ollama {
				resp, body := rig.send(t, rt.path, "", with(`"no-such-model"`))
				if !strings.Contains(string(body), `model 'no-such-model' not found`) {
					t.Errorf("Ollama unknown model: %d %s", resp.StatusCode, body)
				}
			}
		})
	}
}

// TestBadInput_InvalidMessageRole covers the routes that take messages.
func TestBadInput_InvalidMessageRole(t *testing.T) {
	harness.Parallel(t)
	rig := startBadRig(t, 0)
	for _, rt := range badRoutes {
		if rt.path != "/v1/chat/completions" && rt.path != "/api/chat" && rt.path != "/v1/runs" {
			continue // no messages: completions, embeddings, generate
		}
		t.Run(rt.name, func(t *testing.T) {
			msgs := func(role string) string {
				return `{"model":"norm-model","stream":false,"messages":[{"role":"user","content":"hi"},{` + role + `"content":"x"}]}`
			}
			cases := []badCase{
				{body: msgs(`"role":"wizard",`), param: "messages[1].role"},
				{body: msgs(`"role":"USER",`), param: "messages[1].role"},
				{body: msgs(`"role":"",`), param: "messages[1].role"},
				{body: msgs(``), param: "messages[1].role"},
			}
			if !rt.ollama {
				// Ollama's own role field is a string: a wrong type is a
				// wrong type there (see TestBadInput_WrongFieldTypes).
				cases = append(cases, badCase{body: msgs(`"role":7,`), param: "messages[1].role"})
			}
			rig.checkCases(t, rt, cases)
		})
	}
}

// TestBadInput_WrongFieldTypes: a well-known field of the wrong JSON type
// is a 400 naming it.
func TestBadInput_WrongFieldTypes(t *testing.T) {
	harness.Parallel(t)
	rig := startBadRig(t, 0)
	const msg = `"messages":[{"role":"user","content":"hi"}]`
	perRoute := map[string][]badCase{
		"chat": {
			{body: `{"model":7,` + msg + `}`, param: "model"},
			{body: `{"model":"norm-model","messages":"hi"}`, param: "messages"},
			{body: `{"model":"norm-model","messages":["hi"]}`, param: "messages[0]"},
			{body: `{"model":"norm-model","messages":[{"role":"user","content":7}]}`, param: "messages[0].content"},
			{body: `{"model":"norm-model","messages":[{"role":"user","content":[{"type":"text","text":7}]}]}`, param: "messages[0].content[0].text"},
			{body: `{"model":"norm-model",` + msg + `,"stream":"yes"}`, param: "stream"},
			{body: `{"model":"norm-model",` + msg + `,"max_tokens":"5"}`, param: "max_tokens"},
			{body: `{"model":"norm-model",` + msg + `,"temperature":"hot"}`, param: "temperature"},
			{body: `{"model":"norm-model",` + msg + `,"stop":7}`, param: "stop"},
			{body: `{"model":"norm-model",` + msg + `,"tools":{}}`, param: "tools"},
			{body: `{"model":"norm-model",` + msg + `,"stream_options":[]}`, param: "stream_options"},
		},
		"completions": {
			{body: `{"model":["norm-model"],"prompt":"hi"}`, param: "model"},
			{body: `{"model":"norm-model","prompt":7}`, param: "prompt"},
			{body: `{"model":"norm-model","prompt":{"text":"hi"}}`, param: "prompt"},
			{body: `{"model":"norm-model","prompt":["a",1]}`, param: "prompt[1]"},
			{body: `{"model":"norm-model","prompt":"hi","max_tokens":true}`, param: "max_tokens"},
			{body: `{"model":"norm-model","prompt":"hi","stream":1}`, param: "stream"},
		},
		"embeddings": {
			{body: `{"model":{},"input":"hi"}`, param: "model"},
			{body: `{"model":"norm-model","input":true}`, param: "input"},
			{body: `{"model":"norm-model","input":[["a"]]}`, param: "input[0][0]"},
			{body: `{"model":"norm-model","input":"hi","dimensions":"8"}`, param: "dimensions"},
			{body: `{"model":"norm-model","input":"hi","encoding_format":7}`, param: "encoding_format"},
		},
		"ollama-chat": {
			{body: `{"model":7,` + msg + `}`},
			{body: `{"model":"norm-model","messages":"hi"}`},
			{body: `{"model":"norm-model","messages":[{"role":7,"content":"hi"}]}`},
			{body: `{"model":"norm-model","messages":[{"role":"user","content":7}]}`},
			{body: `{"model":"norm-model","messages":[{"role":"user","content":"hi","images":"abc"}]}`},
			{body: `{"model":"norm-model",` + msg + `,"stream":"no"}`},
			{body: `{"model":"norm-model",` + msg + `,"options":[]}`},
			{body: `{"model":"norm-model",` + msg + `,"options":{"temperature":"hot"}}`},
			{body: `{"model":"norm-model",` + msg + `,"options":{"stop":7}}`},
			{body: `{"model":"norm-model",` + msg + `,"tools":"x"}`},
		},
		"ollama-generate": {
			{body: `{"model":7,"prompt":"hi"}`},
			{body: `{"model":"norm-model","prompt":7}`},
			{body: `{"model":"norm-model","prompt":"hi","images":[7]}`},
			{body: `{"model":"norm-model","prompt":"hi","raw":"yes"}`},
			{body: `{"model":"norm-model","prompt":"hi","system":{}}`},
			{body: `{"model":"norm-model","prompt":"hi","options":{"num_predict":"5"}}`},
		},
		"runs": {
			{body: `{"model":7,"prompt":"hi"}`, param: "model"},
			{body: `{"model":"norm-model","prompt":7}`, param: "prompt"},
			{body: `{"model":"norm-model","prompt":"hi","background":"yes"}`, param: "background"},
			{body: `{"model":"norm-model","prompt":"hi","session_id":7}`, param: "session_id"},
			{body: `{"model":"norm-model","prompt":"hi","metadata":[]}`, param: "metadata"},
			{body: `{"model":"norm-model","prompt":"hi","metadata":{"k":7}}`, param: "metadata.k"},
			{body: `{"model":"norm-model","messages":"hi"}`, param: "messages"},
			{body: `{"model":"norm-model","prompt":"hi","max_tokens":"5"}`, param: "max_tokens"},
		},
	}
	for _, rt := range badRoutes {
		t.Run(rt.name, func(t *testing.T) { rig.checkCases(t, rt, perRoute[rt.name]) })
	}
}

// TestBadInput_NegativeOrAbsurdNumbers: numbers out of their field's range
// (negative counts, 1e30 tokens, numbers no float64 holds) are a 400 naming
// the field, before any queue wait.
func TestBadInput_NegativeOrAbsurdNumbers(t *testing.T) {
	harness.Parallel(t)
	rig := startBadRig(t, 0)
	const msg = `"messages":[{"role":"user","content":"hi"}]`
	chat := func(extra string) string { return `{"model":"norm-model",` + msg + `,` + extra + `}` }
	perRoute := map[string][]badCase{
		"chat": {
			{body: chat(`"max_tokens":-1`), param: "max_tokens"},
			{body: chat(`"max_tokens":0`), param: "max_tokens"},
			{body: chat(`"max_tokens":1e30`), param: "max_tokens"},
			{body: chat(`"max_tokens":99999999999999999999999`), param: "max_tokens"},
			{body: chat(`"max_tokens":2.5`), param: "max_tokens"},
			{body: chat(`"max_completion_tokens":-7`), param: "max_completion_tokens"},
			{body: chat(`"n":-1`), param: "n"},
			{body: chat(`"n":1000000`), param: "n"},
			{body: chat(`"temperature":1e400`), param: "temperature"},
			{body: chat(`"top_p":-1e999`), param: "top_p"},
			{body: chat(`"seed":1e300`), param: "seed"},
		},
		"completions": {
			{body: `{"model":"norm-model","prompt":"hi","max_tokens":-5}`, param: "max_tokens"},
			{body: `{"model":"norm-model","prompt":"hi","max_tokens":1e30}`, param: "max_tokens"},
			{body: `{"model":"norm-model","prompt":[-1]}`, param: "prompt[0]"},
			{body: `{"model":"norm-model","prompt":[4294967296]}`, param: "prompt[0]"},
			{body: `{"model":"norm-model","prompt":"hi","n":0}`, param: "n"},
			{body: `{"model":"norm-model","prompt":"hi","temperature":1e999}`, param: "temperature"},
		},
		"embeddings": {
			{body: `{"model":"norm-model","input":"hi","dimensions":-1}`, param: "dimensions"},
			{body: `{"model":"norm-model","input":"hi","dimensions":0}`, param: "dimensions"},
			{body: `{"model":"norm-model","input":"hi","dimensions":1e12}`, param: "dimensions"},
			{body: `{"model":"norm-model","input":[-1]}`, param: "input[0]"},
			{body: `{"model":"norm-model","input":[[1,2],[99999999999]]}`, param: "input[1][0]"},
		},
		"ollama-chat": {
			{body: chat(`"options":{"temperature":1e400}`)},
			{body: chat(`"options":{"top_p":-1e999}`)},
			{body: chat(`"options":{"num_predict":1.5}`)},
			{body: chat(`"options":{"num_predict":1e30}`)},
			{body: chat(`"options":{"seed":99999999999999999999999}`)},
		},
		"ollama-generate": {
			{body: `{"model":"norm-model","prompt":"hi","options":{"temperature":1e400}}`},
			{body: `{"model":"norm-model","prompt":"hi","options":{"num_predict":2.5}}`},
			{body: `{"model":"norm-model","prompt":"hi","options":{"seed":-1e300}}`},
		},
		"runs": {
			{body: `{"model":"norm-model","prompt":"hi","max_tokens":-1}`, param: "max_tokens"},
			{body: `{"model":"norm-model","prompt":"hi","max_tokens":1e30}`, param: "max_tokens"},
			{body: `{"model":"norm-model","prompt":"hi","n":1000000}`, param: "n"},
			{body: `{"model":"norm-model","prompt":"hi","temperature":1e400}`, param: "temperature"},
		},
	}
	for _, rt := range badRoutes {
		t.Run(rt.name, func(t *testing.T) { rig.checkCases(t, rt, perRoute[rt.name]) })
	}
}

// TestBadInput_BodyOverLimit: a body over max_body_bytes is 413 on every
// route, sent with a Content-Length or chunked, and the client reads the
// 413, also a raw client that stops sending at the limit and waits. (A
// client that writes its whole oversized body before reading:
// TestRegression_OversizedBodyNoConnectionReset.)
func TestBadInput_BodyOverLimit(t *testing.T) {
	harness.Parallel(t)
	const limit = 1 << 20
	rig := startBadRig(t, limit)
	for _, rt := range badRoutes {
		t.Run(rt.name, func(t *testing.T) {
			big := oversized(rt, limit+1<<20)
			tooLarge := badCase{body: "oversized", status: http.StatusRequestEntityTooLarge, code: "request_too_large"}
			t.Run("content-length", func(t *testing.T) {
				resp, body := rig.send(t, rt.path, "application/json", big)
				checkErrorBody(t, rt, resp, body, tooLarge)
			})
			t.Run("chunked", func(t *testing.T) {
				// A reader of unknown length: net/http sends it chunked.
				req, err := http.NewRequest(http.MethodPost, rig.base+rt.path, io.MultiReader(strings.NewReader(big)))
				if err != nil {
					t.Fatal(err)
				}
				req.Header.Set("Content-Type", "application/json")
				req.ContentLength = -1 // unknown: net/http sends it chunked
				resp, err := rig.client.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Body.Close()
				body, err := io.ReadAll(resp.Body)
				if err != nil {
					t.Fatal(err)
				}
				checkErrorBody(t, rt, resp, body, tooLarge)
			})
			for _, framing := range []string{"content-length", "chunked"} {
				t.Run("raw-stops-at-limit/"+framing, func(t *testing.T) {
					resp, body := rawPost(t, rig.e.HTTPAddr, rt.path, big, framing, limit+4096)
					checkErrorBody(t, rt, resp, body, tooLarge)
					// Sized, so that a client that stopped sending reads it
					// whole while the edge still waits for the rest.
					if resp.ContentLength != int64(len(body)) {
						t.Errorf("413 with Content-Length %d, body %d bytes", resp.ContentLength, len(body))
					}
				})
			}
			rig.healthy(t, rt)
		})
	}
}

// oversized is a valid request for rt with size bytes of message text.
func oversized(rt badRoute, size int) string {
	return strings.Replace(rt.good(badNormModel), `"hi"`, `"`+strings.Repeat("a", size)+`"`, 1)
}

// rawPost writes a POST of body to addr over a plain TCP connection, framed
// with a Content-Length or chunked, but only its first send bytes; then it
// reads the answer (with a deadline, so a hang fails the test). A write
// error (the server reset the connection) fails the test when the whole
// body was to be sent.
func rawPost(t *testing.T, addr, path, body, framing string, send int) (*http.Response, []byte) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(20 * time.Second)); err != nil {
		t.Fatal(err)
	}
	// A small send buffer: what the edge does not read stays with the
	// client instead of in the kernel.
	if err := conn.(*net.TCPConn).SetWriteBuffer(64 << 10); err != nil {
		t.Fatal(err)
	}
	var wire bytes.Buffer
	fmt.Fprintf(&wire, "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n", path, addr)
	if framing == "chunked" {
		wire.WriteString("Transfer-Encoding: chunked\r\n\r\n")
		for rest := body; rest != ""; {
			n := min(len(rest), 64<<10)
			fmt.Fprintf(&wire, "%x\r\n%s\r\n", n, rest[:n])
			rest = rest[n:]
		}
		wire.WriteString("0\r\n\r\n")
	} else {
		fmt.Fprintf(&wire, "Content-Length: %d\r\n\r\n%s", len(body), body)
	}
	data := wire.Bytes()
	whole := send >= len(body)
	if !whole {
		data = data[:send]
	}
	if _, err := conn.Write(data); err != nil && whole {
		t.Fatalf("writing the whole body: %v (the server reset the connection)", err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("reading the answer: %v", err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading the answer's body: %v", err)
	}
	return resp, out
}

// TestBadInput_LargeImageAccepted: a 2 MB request with an image data URL,
// under the (default) limit, is answered 200 by a provider with the vision
// capability, which gets the image intact; a provider without vision that
// serves the same alias is passed over.
func TestBadInput_LargeImageAccepted(t *testing.T) {
	harness.Parallel(t)
	rig := startBadRig(t, 0)
	b64 := base64.StdEncoding.EncodeToString(noisePNG(t, 620)) // ~2 MB
	dataURL := "data:image/png;base64," + b64
	openaiBody := func(model string) string {
		return `{"model":"` + model + `","max_tokens":2,"messages":[{"role":"user","content":[` +
			`{"type":"text","text":"what is this?"},{"type":"image_url","image_url":{"url":"` + dataURL + `"}}]}]}`
	}
	check := func(t *testing.T, resp *http.Response, body []byte, proxy *recordingProxy, wantInBody string) {
		t.Helper()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%d %s", resp.StatusCode, clipBody(string(body)))
		}
		if got := proxy.last(t); !bytes.Contains(got.Body, []byte(wantInBody)) {
			t.Fatalf("the provider did not get the image (%d bytes to %s)", len(got.Body), got.Path)
		}
		waitIdle(t, rig.e)
	}
	t.Run("chat/normalized", func(t *testing.T) {
		body := openaiBody(badMixedAlias)
		if len(body) < 2_000_000 {
			t.Fatalf("request of %d bytes, want 2 MB", len(body))
		}
		resp, out := rig.send(t, "/v1/chat/completions", "application/json", body)
		// The Ollama provider gets the image as base64 in "images".
		check(t, resp, out, rig.normProxy, `"`+b64+`"`)
	})
	t.Run("chat/tunnel", func(t *testing.T) {
		resp, out := rig.send(t, "/v1/chat/completions", "application/json", openaiBody(badTunModel))
		check(t, resp, out, rig.tunPrx, dataURL)
	})
	ollamaBody := func(model string) string {
		return `{"model":"` + model + `","stream":false,"options":{"num_predict":2},"messages":[{"role":"user","content":"what is this?","images":["` + b64 + `"]}]}`
	}
	t.Run("ollama-chat/normalized", func(t *testing.T) {
		resp, out := rig.send(t, "/api/chat", "", ollamaBody(badMixedAlias))
		check(t, resp, out, rig.normProxy, `"`+b64+`"`)
	})
	t.Run("ollama-chat/tunnel", func(t *testing.T) {
		resp, out := rig.send(t, "/api/chat", "", ollamaBody(badTunModel))
		check(t, resp, out, rig.tunPrx, dataURL)
	})
}

// noisePNG is a side×side PNG of random pixels (incompressible: about
// 4·side² bytes).
func noisePNG(t *testing.T, side int) []byte {
	t.Helper()
	img := image.NewNRGBA(image.Rect(0, 0, side, side))
	if _, err := rand.Read(img.Pix); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	enc := png.Encoder{CompressionLevel: png.NoCompression} // noise does not compress
	if err := enc.Encode(&buf, img); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// TestBadInput_FailureAfterAdmissionReleasesSlot: a request that passes
// the edge's checks but that its provider refuses (a model the simulator
// does not serve: 404) gets the provider's error, and gives its slot back
// before its client sees the answer: on a capacity-1 provider, the next
// request is admitted at once ("queue_reason": "immediate" in its run
// record) and answered.
func TestBadInput_FailureAfterAdmissionReleasesSlot(t *testing.T) {
	harness.Parallel(t)
	rig := startBadRig(t, 0)
	paths := []struct{ name, ghost, good string }{
		{"normalized", badGhostNorm, badNormModel},
		{"tunnel", badGhostTun, badTunModel},
	}
	for _, p := range paths {
		t.Run(p.name, func(t *testing.T) {
			// Through the runs API: the record of the next run says whether
			// it queued, and the failed run's answer comes only after the
			// run has ended, so "at once" is checked without a race.
			for range 3 {
				resp, body := rig.send(t, "/v1/runs", "application/json", `{"model":"`+p.ghost+`","prompt":"hi"}`)
				var failed runJSON
				if err := json.Unmarshal(body, &failed); err != nil || resp.StatusCode != http.StatusOK || failed.State != "error" || failed.Error == nil {
					t.Fatalf("run for a model the provider refuses: %d %s", resp.StatusCode, body)
				}
				resp, body = rig.send(t, "/v1/runs", "application/json", `{"model":"`+p.good+`","prompt":"hi","max_tokens":2}`)
				var next runJSON
				if err := json.Unmarshal(body, &next); err != nil || next.State != "complete" || next.Dispatch == nil {
					t.Fatalf("the next run: %d %s", resp.StatusCode, body)
				}
				if next.Dispatch.QueueReason != "immediate" {
					t.Fatalf("the next run was %s, want admitted at once (its slot was held): %s", next.Dispatch.QueueReason, body)
				}
			}
			// And through the chat routes, in both API shapes.
			for _, rt := range []badRoute{badRoutes[0], badRoutes[3]} {
				resp, body := rig.send(t, rt.path, "application/json", rt.good(p.ghost))
				checkProviderRefusal(t, rt, resp, body)
				rig.healthy(t, rt)
			}
		})
	}
}

// checkProviderRefusal checks the answer to a request its provider refused
// with 404: that status, and an error body in the route's shape.
func checkProviderRefusal(t *testing.T, rt badRoute, resp *http.Response, body []byte) {
	t.Helper()
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("%s: %d %s, want the provider's 404", rt.name, resp.StatusCode, body)
	}
	if rt.ollama {
		var e map[string]string
		if err := json.Unmarshal(body, &e); err != nil || len(e) != 1 || e["error"] == "" {
			t.Fatalf("%s: not an Ollama error: %s", rt.name, body)
		}
		return
	}
	var e struct {
		Error *struct {
			Message string `json:"message"`
			Type    string `json:"type"`
		} `json:"error"`
	}
	if err := json.Unmarshal(body, &e); err != nil || e.Error == nil || e.Error.Message == "" || e.Error.Type == "" {
		t.Fatalf("%s: not an OpenAI error: %s", rt.name, body)
	}
}
