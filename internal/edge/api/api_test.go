package api

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"iop/internal/edge/contract"
	"iop/internal/wire/nodev1"
)

// client returns an official OpenAI client pointed at env, without retries.
func (e *testEnv) client() openai.Client {
	return openai.NewClient(
		option.WithBaseURL(e.srv.URL+"/v1/"),
		option.WithAPIKey("test-key"),
		option.WithHTTPClient(e.srv.Client()),
		option.WithMaxRetries(0),
	)
}

func chatParams(model, prompt string) openai.ChatCompletionNewParams {
	return openai.ChatCompletionNewParams{
		Model:    model,
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(prompt)},
	}
}

// rawResponse is one raw HTTP exchange.
type rawResponse struct {
	status int
	header http.Header
	body   string
}

// post sends body to path with the given Content-Type ("" for none).
func (e *testEnv) post(t *testing.T, path, contentType, body string) rawResponse {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, e.srv.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	return e.do(t, req)
}

func (e *testEnv) get(t *testing.T, path string) rawResponse {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, e.srv.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	return e.do(t, req)
}

func (e *testEnv) do(t *testing.T, req *http.Request) rawResponse {
	t.Helper()
	resp, err := e.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading body: %v", err)
	}
	return rawResponse{status: resp.StatusCode, header: resp.Header, body: string(b)}
}

// openAIError decodes an OpenAI error body, failing unless it has exactly
// the four fields message, type, param, code.
func openAIError(t *testing.T, body string) (message, typ string, param, code *string) {
	t.Helper()
	var shape map[string]map[string]json.RawMessage
	if err := json.Unmarshal([]byte(body), &shape); err != nil {
		t.Fatalf("error body %q is not JSON: %v", body, err)
	}
	fields, ok := shape["error"]
	if !ok || len(shape) != 1 {
		t.Fatalf("error body %q is not {\"error\":{...}}", body)
	}
	for _, k := range []string{"message", "type", "param", "code"} {
		if _, ok := fields[k]; !ok {
			t.Fatalf("error body %q lacks %q", body, k)
		}
	}
	var e struct {
		Error struct {
			Message string  `json:"message"`
			Type    string  `json:"type"`
			Param   *string `json:"param"`
			Code    *string `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal([]byte(body), &e); err != nil {
		t.Fatal(err)
	}
	return e.Error.Message, e.Error.Type, e.Error.Param, e.Error.Code
}

func str(p *string) string {
	if p == nil {
		return "<null>"
	}
	return *p
}

const simpleChat = `{"model":"m","messages":[{"role":"user","content":"hello"}]}`

const tunnelJSON = `{"id":"chatcmpl-up","object":"chat.completion","created":1,"model":"served-model",` +
	`"choices":[{"index":0,"message":{"role":"assistant","content":"from upstream"},"finish_reason":"stop"}],` +
	`"usage":{"prompt_tokens":4,"completion_tokens":2,"total_tokens":6}}`

func TestChatTunnelNonStream(t *testing.T) {
	run := scriptedRun(tunnel,
		tunnelHead(200, map[string]string{"content-type": "application/json", "Content-Length": "9999", "X-Upstream": "1"}),
		tunnelData(tunnelJSON[:40]),
		tunnelData(tunnelJSON[40:]),
		tunnelEnd(),
	)
	env := newEnv(t, Config{}, runWith(run))
	client := env.client()
	got, err := client.Chat.Completions.New(context.Background(), chatParams("m", "hi"))
	if err != nil {
		t.Fatal(err)
	}
	if got.ID != "chatcmpl-up" || got.Model != "served-model" || got.Choices[0].Message.Content != "from upstream" || got.Usage.TotalTokens != 6 {
		t.Errorf("tunnelled answer changed: %+v", got)
	}
}

func TestChatTunnelHeadersAndBytes(t *testing.T) {
	run := scriptedRun(tunnel,
		tunnelHead(201, map[string]string{"content-type": "application/json", "Content-Length": "9999", "X-Upstream": "1", "Connection": "close"}),
		tunnelData(tunnelJSON),
		tunnelEnd(),
	)
	env := newEnv(t, Config{}, runWith(run))
	resp := env.post(t, "/v1/chat/completions", "", simpleChat)
	if resp.status != 201 || resp.body != tunnelJSON {
		t.Errorf("got %d %q, want 201 and the upstream bytes", resp.status, resp.body)
	}
	if resp.header.Get("Content-Type") != "application/json" || resp.header.Get("X-Upstream") != "1" {
		t.Errorf("headers not relayed: %v", resp.header)
	}
}

func TestChatTunnelStream(t *testing.T) {
	sse := `data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"served-model","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}` + "\n\n" +
		`data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"served-model","choices":[{"index":0,"delta":{"content":"tun"},"finish_reason":null}]}` + "\n\n" +
		`data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"served-model","choices":[{"index":0,"delta":{"content":"nel"},"finish_reason":"stop"}]}` + "\n\n" +
		"data: [DONE]\n\n"
	// Cut the bytes at arbitrary points, as a network would.
	msgs := []*nodev1.RunUp{tunnelHead(200, map[string]string{"Content-Type": "text/event-stream"})}
	for i := 0; i < len(sse); i += 37 {
		msgs = append(msgs, tunnelData(sse[i:min(i+37, len(sse))]))
	}
	msgs = append(msgs, tunnelEnd())
	env := newEnv(t, Config{}, runWith(scriptedRun(tunnel, msgs...)))

	client := env.client()
	stream := client.Chat.Completions.NewStreaming(context.Background(), chatParams("m", "hi"))
	defer stream.Close()
	acc := openai.ChatCompletionAccumulator{}
	n := 0
	for stream.Next() {
		acc.AddChunk(stream.Current())
		n++
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if n != 3 || acc.Choices[0].Message.Content != "tunnel" || acc.Model != "served-model" {
		t.Errorf("got %d chunks, content %q, model %q", n, acc.Choices[0].Message.Content, acc.Model)
	}
}

func TestModels(t *testing.T) {
	env := newEnv(t, Config{}, failWith(errors.New("unused")))
	client := env.client()
	page, err := client.Models.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, m := range page.Data {
		ids = append(ids, m.ID)
		if m.Object != "model" || m.OwnedBy != "iop" || m.Created != 1700000000 {
			t.Errorf("model %+v", m)
		}
	}
	if !slices.Equal(ids, []string{"m", "alias"}) {
		t.Errorf("models = %v, want [m alias]", ids)
	}
	if raw := env.get(t, "/v1/models"); !strings.HasPrefix(raw.body, `{"object":"list","data":[`) {
		t.Errorf("list body %s", raw.body)
	}

	m, err := client.Models.Get(context.Background(), "alias")
	if err != nil || m.ID != "alias" {
		t.Errorf("Get(alias) = %+v, %v", m, err)
	}
	_, err = client.Models.Get(context.Background(), "nope")
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 404 || apiErr.Code != "model_not_found" {
		t.Errorf("Get(nope) error = %v, want 404 model_not_found", err)
	}
}

func TestRoutes(t *testing.T) {
	ready := true
	env := newEnv(t, Config{Ready: func() bool { return ready }}, failWith(errors.New("unused")))

	tests := []struct {
		name, method, path string
		wantStatus         int
		wantBody           string // exact; "" = an OpenAI error body
		wantCode           string
		wantAllow          string
	}{
		{"healthz", "GET", "/healthz", 200, "ok", "", ""},
		{"readyz", "GET", "/readyz", 200, "ready", "", ""},
		{"unknown path", "GET", "/v1/nope", 404, "", "unknown_url", ""},
		{"unknown path at the root", "POST", "/nope", 404, "", "unknown_url", ""},
		{"chat by GET", "GET", "/v1/chat/completions", 405, "", "method_not_allowed", "POST"},
		{"models by POST", "POST", "/v1/models", 405, "", "method_not_allowed", "GET"},
		{"healthz by DELETE", "DELETE", "/healthz", 405, "", "method_not_allowed", "GET"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, _ := http.NewRequest(tt.method, env.srv.URL+tt.path, nil)
			resp := env.do(t, req)
			if resp.status != tt.wantStatus {
				t.Fatalf("status = %d, want %d (%s)", resp.status, tt.wantStatus, resp.body)
			}
			if tt.wantBody != "" {
				if resp.body != tt.wantBody {
					t.Errorf("body = %q, want %q", resp.body, tt.wantBody)
				}
				return
			}
			_, _, _, code := openAIError(t, resp.body)
			if str(code) != tt.wantCode {
				t.Errorf("code = %s, want %s", str(code), tt.wantCode)
			}
			if got := resp.header.Get("Allow"); got != tt.wantAllow {
				t.Errorf("Allow = %q, want %q", got, tt.wantAllow)
			}
		})
	}

	ready = false // the server is idle between requests: no race
	if resp := env.get(t, "/readyz"); resp.status != 503 {
		t.Errorf("readyz when not ready = %d, want 503", resp.status)
	}
}

func TestChatBadRequests(t *testing.T) {
	tests := []struct {
		name        string
		contentType string
		body        string
		wantStatus  int
		wantParam   string // "<null>" for none
	}{
		{"malformed JSON", "application/json", `{"model":"m",`, 400, "<null>"},
		{"empty body", "application/json", ``, 400, "<null>"},
		{"not an object", "application/json", `["m"]`, 400, "<null>"},
		{"null body", "application/json", `null`, 400, "<null>"},
		{"trailing garbage", "application/json", simpleChat + `x`, 400, "<null>"},
		{"missing model", "application/json", `{"messages":[{"role":"user","content":"x"}]}`, 400, "model"},
		{"empty model", "application/json", `{"model":"","messages":[{"role":"user","content":"x"}]}`, 400, "model"},
		{"blank model", "application/json", `{"model":"  ","messages":[{"role":"user","content":"x"}]}`, 400, "model"},
		{"model not a string", "application/json", `{"model":7,"messages":[{"role":"user","content":"x"}]}`, 400, "model"},
		{"messages not an array", "application/json", `{"model":"m","messages":"x"}`, 400, "messages"},
		{"missing messages", "application/json", `{"model":"m"}`, 400, "messages"},
		{"empty messages", "application/json", `{"model":"m","messages":[]}`, 400, "messages"},
		{"message not an object", "application/json", `{"model":"m","messages":["hi"]}`, 400, "messages[0]"},
		{"role not a string", "application/json", `{"model":"m","messages":[{"role":"user","content":"a"},{"role":1,"content":"x"}]}`, 400, "messages[1].role"},
		{"content a number", "application/json", `{"model":"m","messages":[{"role":"user","content":5}]}`, 400, "messages[0].content"},
		{"part text a number", "application/json", `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":1}]}]}`, 400, "messages[0].content[0].text"},
		{"stream not a bool", "application/json", `{"model":"m","stream":"yes","messages":[{"role":"user","content":"x"}]}`, 400, "stream"},
		{"include_usage not a bool", "application/json", `{"model":"m","stream":true,"stream_options":{"include_usage":1},"messages":[{"role":"user","content":"x"}]}`, 400, "stream_options.include_usage"},
		{"max_tokens a string", "application/json", `{"model":"m","max_tokens":"10","messages":[{"role":"user","content":"x"}]}`, 400, "max_tokens"},
		{"max_tokens a fraction", "application/json", `{"model":"m","max_tokens":1.5,"messages":[{"role":"user","content":"x"}]}`, 400, "max_tokens"},
		{"temperature a string", "application/json", `{"model":"m","temperature":"hot","messages":[{"role":"user","content":"x"}]}`, 400, "temperature"},
		{"tools not an array", "application/json", `{"model":"m","tools":{},"messages":[{"role":"user","content":"x"}]}`, 400, "tools"},
		{"text/plain", "text/plain", simpleChat, 415, "<null>"},
		{"form", "application/x-www-form-urlencoded", simpleChat, 415, "<null>"},
		{"garbled content type", "application/json; ===", simpleChat, 415, "<null>"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := newEnv(t, Config{}, failWith(errors.New("must not dispatch")))
			resp := env.post(t, "/v1/chat/completions", tt.contentType, tt.body)
			if resp.status != tt.wantStatus {
				t.Fatalf("status = %d, want %d (%s)", resp.status, tt.wantStatus, resp.body)
			}
			msg, typ, param, _ := openAIError(t, resp.body)
			if str(param) != tt.wantParam || typ != "invalid_request_error" || msg == "" {
				t.Errorf("param %s type %q message %q, want param %s", str(param), typ, msg, tt.wantParam)
			}
			if n := len(env.gw.requests()); n != 0 {
				t.Errorf("dispatched %d requests, want none", n)
			}
		})
	}
}

func TestChatAcceptsJSONContentTypes(t *testing.T) {
	for _, ct := range []string{"", "application/json", "application/json; charset=utf-8", "application/vnd.api+json"} {
		t.Run(ct, func(t *testing.T) {
			env := newEnv(t, Config{}, runWith(scriptedRun(normalized, events(delta("ok"), complete("stop")))))
			if resp := env.post(t, "/v1/chat/completions", ct, simpleChat); resp.status != 200 {
				t.Errorf("Content-Type %q: status %d (%s)", ct, resp.status, resp.body)
			}
		})
	}
}

func TestChatBodyLimit(t *testing.T) {
	env := newEnv(t, Config{MaxBodyBytes: 64}, runWith(scriptedRun(normalized, events(complete("stop")))))
	big := `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("x", 100) + `"}]}`
	resp := env.post(t, "/v1/chat/completions", "application/json", big)
	if resp.status != http.StatusRequestEntityTooLarge {
		t.Fatalf("status = %d, want 413 (%s)", resp.status, resp.body)
	}
	if _, _, _, code := openAIError(t, resp.body); str(code) != "request_too_large" {
		t.Errorf("code = %s", str(code))
	}
	if resp := env.post(t, "/v1/chat/completions", "application/json", simpleChat); resp.status != 200 {
		t.Errorf("a body under the limit: status %d (%s)", resp.status, resp.body)
	}
}

func TestChatDerivesNeeds(t *testing.T) {
	tests := []struct {
		name      string
		body      string
		wantNeeds []string
		wantEst   int
	}{
		{"plain", simpleChat, nil, 2},
		// The tool definition's 44 characters of JSON count with the 8 of text.
		{"tools", `{"model":"m","tools":[{"type":"function","function":{"name":"f"}}],"messages":[{"role":"user","content":"12345678"}]}`, []string{"tools"}, 13},
		{"empty tools", `{"model":"m","tools":[],"messages":[{"role":"user","content":"x"}]}`, nil, 1},
		{"image", `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"what is this"},{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}}]}]}`, []string{"vision"}, 3},
		{"tools and image", `{"model":"m","tools":[{"type":"function","function":{"name":"f"}}],"messages":[{"role":"system","content":"abcd"},{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}`, []string{"tools", "vision"}, 12},
		{"unicode counts characters", `{"model":"m","messages":[{"role":"user","content":"日本語です"}]}`, nil, 2},
		{"one choice", `{"model":"m","n":1,"messages":[{"role":"user","content":"x"}]}`, nil, 1},
		{"several choices", `{"model":"m","n":2,"tools":[{"type":"function","function":{"name":"f"}}],"messages":[{"role":"user","content":"x"}]}`, []string{"tools", "choices"}, 11},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := newEnv(t, Config{}, runWith(scriptedRun(normalized, events(complete("stop")))))
			if resp := env.post(t, "/v1/chat/completions", "", tt.body); resp.status != 200 {
				t.Fatalf("status %d (%s)", resp.status, resp.body)
			}
			r := env.gw.requests()[0]
			if !slices.Equal(r.Needs, tt.wantNeeds) || r.EstimatedInputTokens != tt.wantEst {
				t.Errorf("Needs %v est %d, want %v %d", r.Needs, r.EstimatedInputTokens, tt.wantNeeds, tt.wantEst)
			}
			if string(r.Body) != tt.body {
				t.Errorf("body changed: %s", r.Body)
			}
		})
	}
}

func TestChatDispatchErrors(t *testing.T) {
	tests := []struct {
		name           string
		err            error
		wantStatus     int
		wantCode       string
		wantRetryAfter string
		wantInMessage  string
	}{
		{"unknown model", fmt.Errorf("%w: %w", ErrUnknownModel, errors.New("scheduler: unknown model")), 404, "model_not_found", "", `"vis"`},
		{"capability missing", fmt.Errorf("%w: no candidate accepts the request: no provider of %q has vision", ErrCandidatesRejected, "vis"), 400, "unsupported_capability", "", "vision"},
		{"capability text names none", ErrCandidatesRejected, 400, "unsupported_capability", "", "vision"},
		{"queue full", fmt.Errorf("%w: 16 waiting", ErrQueueFull), 429, "queue_full", "1", ""},
		{"queue timeout", ErrQueueTimeout, 503, "queue_timeout", "5", ""},
		{"no provider", ErrNoProvider, 503, "provider_unavailable", "5", ""},
		{"provider unavailable", ErrProviderUnavailable, 503, "provider_unavailable", "5", ""},
		{"dispatch timeout", ErrDispatchTimeout, 502, "upstream_unavailable", "", "dispatch timeout"},
		{"dispatch refused", ErrDispatchRefused, 502, "upstream_unavailable", "", ""},
		{"stale generation", ErrStaleGeneration, 502, "upstream_unavailable", "", ""},
		{"node gone", fmt.Errorf("%w: node n1 gen 3", ErrNodeGone), 502, "upstream_unavailable", "", "node gone"},
		{"unknown error hides its text", errors.New("dial http://10.0.0.1:8000 key=sk-secret"), 500, "internal_error", "", ""},
	}
	body := `{"model":"vis","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}`
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := newEnv(t, Config{}, failWith(tt.err))
			resp := env.post(t, "/v1/chat/completions", "application/json", body)
			if resp.status != tt.wantStatus {
				t.Fatalf("status = %d, want %d (%s)", resp.status, tt.wantStatus, resp.body)
			}
			msg, _, _, code := openAIError(t, resp.body)
			if str(code) != tt.wantCode {
				t.Errorf("code = %s, want %s", str(code), tt.wantCode)
			}
			if got := resp.header.Get("Retry-After"); got != tt.wantRetryAfter {
				t.Errorf("Retry-After = %q, want %q", got, tt.wantRetryAfter)
			}
			if !strings.Contains(msg, tt.wantInMessage) {
				t.Errorf("message %q does not contain %q", msg, tt.wantInMessage)
			}
			if strings.Contains(resp.body, "10.0.0.1") || strings.Contains(resp.body, "sk-secret") {
				t.Errorf("body leaks the wrapped error: %s", resp.body)
			}
			reqs := env.gw.requests()
			if len(reqs) != 1 || !slices.Equal(reqs[0].Needs, []string{"vision"}) {
				t.Errorf("dispatch calls %+v, want one needing vision", reqs)
			}
			if runs := env.gw.allRuns(); len(runs) != 0 {
				t.Errorf("%d runs created, want none", len(runs))
			}
		})
	}
}

// errNodeGoneRecv is a Recv failure of unknown origin (the real one wraps
// edge.ErrNodeGone).
var errNodeGoneRecv = errors.New("node n1 disconnected: http://10.0.0.1 sk-secret")

// failingRun yields msgs, then fails Recv with err.
type failingRun struct {
	*fakeRun
	err error
}

func (r *failingRun) Recv() (contract.Message, error) {
	m, err := r.fakeRun.Recv()
	if errors.Is(err, io.EOF) {
		return contract.Message{}, r.err
	}
	return m, err
}

func TestChatUpstreamErrorsBeforeFirstByte(t *testing.T) {
	tests := []struct {
		name       string
		path       contract.Path
		stream     bool
		msgs       []*nodev1.RunUp
		recvErr    error // after msgs, instead of io.EOF
		wantStatus int
		wantCode   string
		wantInMsg  string
	}{
		{"error event, no status", normalized, false, []*nodev1.RunUp{events(started(), errorEvent(0, "model crashed"))}, nil, 502, "upstream_error", "model crashed"},
		{"error event 504", normalized, false, []*nodev1.RunUp{events(errorEvent(504, "provider timed out"))}, nil, 504, "upstream_timeout", "provider timed out"},
		{"error event 400", normalized, false, []*nodev1.RunUp{events(errorEvent(400, "context too long"))}, nil, 400, "upstream_rejected", "context too long"},
		// The node's own refusal of a request it cannot translate (issue
		// 15): the client's error, naming the field, not the provider's.
		{"node translation error", normalized, false, []*nodev1.RunUp{events(&nodev1.RunEvent{Type: nodev1.RunEvent_TYPE_ERROR, Status: 400,
			Error: "echo: not supported by this provider", InvalidRequest: true, Param: "echo"})}, nil, 400, "invalid_request", "echo: not supported"},
		{"node translation error without a field", normalized, true, []*nodev1.RunUp{events(&nodev1.RunEvent{Type: nodev1.RunEvent_TYPE_ERROR, Status: 400,
			Error: "request body is not a valid chat completions object", InvalidRequest: true})}, nil, 400, "invalid_request", "not a valid chat"},
		{"tunnel node refusal", tunnel, false, []*nodev1.RunUp{tunnelError(400, "operation is not supported")}, nil, 400, "invalid_request", "operation is not supported"},
		{"stream error event before first delta", normalized, true, []*nodev1.RunUp{events(started()), events(errorEvent(0, "boom"))}, nil, 502, "upstream_error", "boom"},
		{"stream error event 429", normalized, true, []*nodev1.RunUp{events(errorEvent(429, "slow down"))}, nil, 429, "upstream_rate_limited", "slow down"},
		{"cancelled by node", normalized, false, []*nodev1.RunUp{events(cancelledEvent())}, nil, 502, "upstream_error", "cancelled"},
		{"ended without complete", normalized, true, []*nodev1.RunUp{events(started())}, nil, 502, "upstream_error", "without completing"},
		{"recv fails", normalized, false, []*nodev1.RunUp{events(delta("partial"))}, errNodeGoneRecv, 502, "upstream_error", "lost"},
		{"node gone, mapped", normalized, true, nil, fmt.Errorf("%w: %w", ErrNodeGone, errNodeGoneRecv), 502, "upstream_unavailable", "node gone"},
		{"tunnel message on normalized path", normalized, false, []*nodev1.RunUp{tunnelHead(200, nil)}, nil, 502, "upstream_error", "unexpected"},
		{"tunnel error 502", tunnel, false, []*nodev1.RunUp{tunnelError(502, "connection refused")}, nil, 502, "upstream_error", "connection refused"},
		{"tunnel error 504", tunnel, true, []*nodev1.RunUp{tunnelError(504, "upstream timeout")}, nil, 504, "upstream_timeout", "upstream timeout"},
		{"tunnel error no status", tunnel, true, []*nodev1.RunUp{tunnelError(0, "")}, nil, 502, "upstream_error", "Bad Gateway"},
		{"tunnel end before head", tunnel, false, []*nodev1.RunUp{tunnelEnd()}, nil, 502, "upstream_error", ""},
		{"tunnel data before head", tunnel, false, []*nodev1.RunUp{tunnelData("x")}, nil, 502, "upstream_error", ""},
		{"tunnel bad status", tunnel, false, []*nodev1.RunUp{tunnelHead(0, nil)}, nil, 502, "upstream_error", ""},
		{"unknown path", contract.PathUnknown, false, nil, nil, 500, "internal_error", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fr := scriptedRun(tt.path, tt.msgs...)
			var run Run = fr
			if tt.recvErr != nil {
				run = &failingRun{fakeRun: fr, err: tt.recvErr}
			}
			env := newEnv(t, Config{}, func(context.Context, contract.Request) (Run, error) { return run, nil })
			body := fmt.Sprintf(`{"model":"m","stream":%v,"messages":[{"role":"user","content":"x"}]}`, tt.stream)
			resp := env.post(t, "/v1/chat/completions", "application/json", body)
			if resp.status != tt.wantStatus {
				t.Fatalf("status = %d, want %d (%s)", resp.status, tt.wantStatus, resp.body)
			}
			if ct := resp.header.Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type = %q, want application/json", ct)
			}
			msg, typ, param, code := openAIError(t, resp.body)
			if str(code) != tt.wantCode || !strings.Contains(msg, tt.wantInMsg) {
				t.Errorf("code %s message %q, want code %s message containing %q", str(code), msg, tt.wantCode, tt.wantInMsg)
			}
			if tt.wantCode == "invalid_request" {
				wantParam := ""
				if strings.HasPrefix(tt.name, "node translation error") && !strings.HasSuffix(tt.name, "without a field") {
					wantParam = "echo"
				}
				gotParam := ""
				if param != nil {
					gotParam = *param
				}
				if typ != "invalid_request_error" || gotParam != wantParam || msg == "echo: echo: not supported by this provider" {
					t.Errorf("type %s param %q message %q, want invalid_request_error naming %q once", typ, gotParam, msg, wantParam)
				}
			}
			if strings.Contains(resp.body, "sk-secret") {
				t.Errorf("body leaks the Recv error: %s", resp.body)
			}
		})
	}
}

func TestChatErrorAfterStreamStarted(t *testing.T) {
	sseHead := tunnelHead(200, map[string]string{"Content-Type": "text/event-stream; charset=utf-8"})
	tests := []struct {
		name      string
		path      contract.Path
		msgs      []*nodev1.RunUp
		recvErr   error
		wantFirst string // the body starts with this
		wantCode  string
		wantInMsg string
	}{
		{"normalized error event", normalized, []*nodev1.RunUp{events(delta("par")), events(delta("tial"), errorEvent(500, "model crashed"))},
			nil, `data: {"id":"chatcmpl-run1"`, "upstream_error", "model crashed"},
		{"normalized recv failure", normalized, []*nodev1.RunUp{events(delta("partial"))},
			fmt.Errorf("%w: %w", ErrNodeGone, errNodeGoneRecv), `data: {"id":"chatcmpl-run1"`, "upstream_unavailable", "node gone"},
		{"normalized ended without complete", normalized, []*nodev1.RunUp{events(delta("partial"))},
			nil, `data: {"id":"chatcmpl-run1"`, "upstream_error", "without completing"},
		{"tunnel error", tunnel, []*nodev1.RunUp{sseHead, tunnelData("data: {\"x\":1}\n\n"), tunnelError(504, "upstream timeout")},
			nil, "data: {\"x\":1}\n\n", "upstream_timeout", "upstream timeout"},
		{"tunnel ended without end", tunnel, []*nodev1.RunUp{sseHead, tunnelData("data: {\"x\":1}\n\n")},
			nil, "data: {\"x\":1}\n\n", "upstream_error", "without completing"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fr := scriptedRun(tt.path, tt.msgs...)
			var run Run = fr
			if tt.recvErr != nil {
				run = &failingRun{fakeRun: fr, err: tt.recvErr}
			}
			env := newEnv(t, Config{}, func(context.Context, contract.Request) (Run, error) { return run, nil })
			resp := env.post(t, "/v1/chat/completions", "",
				`{"model":"m","stream":true,"messages":[{"role":"user","content":"x"}]}`)
			if resp.status != http.StatusOK {
				t.Fatalf("status = %d, want 200 (headers were sent)", resp.status)
			}
			if !strings.HasPrefix(resp.body, tt.wantFirst) {
				t.Errorf("body does not start with %q:\n%s", tt.wantFirst, resp.body)
			}
			if strings.Contains(resp.body, "[DONE]") {
				t.Errorf("a failed stream ended with [DONE]:\n%s", resp.body)
			}
			events := strings.Split(strings.TrimSuffix(resp.body, "\n\n"), "\n\n")
			last, ok := strings.CutPrefix(events[len(events)-1], "data: ")
			if !ok || !strings.HasSuffix(resp.body, "\n\n") {
				t.Fatalf("last event %q is not a data event", events[len(events)-1])
			}
			msg, _, _, code := openAIError(t, last)
			if str(code) != tt.wantCode || !strings.Contains(msg, tt.wantInMsg) {
				t.Errorf("error event code %s message %q, want %s containing %q", str(code), msg, tt.wantCode, tt.wantInMsg)
			}
			if strings.Contains(resp.body, "sk-secret") {
				t.Errorf("stream leaks the Recv error: %s", resp.body)
			}
		})
	}
}

// A non-SSE tunnelled body that fails after its head cannot carry an error
// event: the connection is cut so the client never sees a complete answer.
func TestChatTunnelJSONErrorAfterHeadAborts(t *testing.T) {
	run := scriptedRun(tunnel,
		tunnelHead(200, map[string]string{"Content-Type": "application/json"}),
		tunnelData(tunnelJSON[:30]),
		tunnelError(502, "upstream reset"),
	)
	env := newEnv(t, Config{}, runWith(run))
	resp, err := env.srv.Client().Post(env.srv.URL+"/v1/chat/completions", "application/json", strings.NewReader(simpleChat))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err == nil {
		t.Fatalf("read a complete-looking body %q, want a read error", b)
	}
	// What came before the cut, but for the bytes held back to end the
	// answer (finalHold), which a failed answer never gets.
	if !strings.HasPrefix(tunnelJSON[:30], string(b)) || len(b) < 29 {
		t.Errorf("got %q before the cut, want %q but its last byte", b, tunnelJSON[:30])
	}
}

// Whatever the client is waiting for, leaving ends the handler promptly and
// closes the run exactly once, with the outcome "client_gone".
func TestChatClientDisconnect(t *testing.T) {
	tests := []struct {
		name   string
		path   contract.Path
		stream bool
		first  *nodev1.RunUp // sent, then awaited by the client; nil: the client waits for headers
		until  string        // the client reads until a line containing this
	}{
		{"normalized stream", normalized, true, events(delta("Hi")), `"content":"Hi"`},
		{"tunnel stream", tunnel, true, nil, ""},
		{"normalized non-stream", normalized, false, nil, ""},
		{"tunnel non-stream", tunnel, false, nil, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			run := liveRun(tt.path, 0)
			dispatched := make(chan struct{})
			env := newEnv(t, Config{}, func(context.Context, contract.Request) (Run, error) {
				close(dispatched)
				return run, nil
			})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			body := fmt.Sprintf(`{"model":"m","stream":%v,"messages":[{"role":"user","content":"x"}]}`, tt.stream)
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, env.srv.URL+"/v1/chat/completions", strings.NewReader(body))

			type result struct {
				resp *http.Response
				err  error
			}
			done := make(chan result, 1)
			go func() {
				resp, err := env.srv.Client().Do(req)
				done <- result{resp, err}
			}()
			<-dispatched
			if tt.path == tunnel && tt.stream {
				run.up <- tunnelHead(200, map[string]string{"Content-Type": "text/event-stream"})
				run.up <- tunnelData("data: {\"a\":1}\n\n")
				tt.until = `"a":1`
			} else if tt.first != nil {
				run.up <- tt.first
			}
			if tt.until != "" {
				res := <-done
				if res.err != nil {
					t.Fatal(res.err)
				}
				defer res.resp.Body.Close()
				sc := bufio.NewScanner(res.resp.Body)
				for sc.Scan() && !strings.Contains(sc.Text(), tt.until) {
				}
				if sc.Err() != nil {
					t.Fatal(sc.Err())
				}
			}
			cancel()
			if tt.until == "" {
				if res := <-done; !errors.Is(res.err, context.Canceled) {
					t.Errorf("client error = %v, want context.Canceled", res.err)
				}
			}
			select {
			case <-run.closed:
			case <-time.After(10 * time.Second):
				t.Fatal("the run was not closed after the client left")
			}
			env.waitHandlers()
			n, reasons := run.closeCalls()
			if n != 1 || reasons[0] != contract.OutcomeClientGone {
				t.Errorf("Close called %d times with %q, want once with %q", n, reasons, contract.OutcomeClientGone)
			}
		})
	}
}

// A client that leaves while its request is queued gets nothing written and
// no run is created.
func TestChatClientLeavesWhileQueued(t *testing.T) {
	queued := make(chan struct{})
	env := newEnv(t, Config{}, func(ctx context.Context, _ contract.Request) (Run, error) {
		close(queued)
		<-ctx.Done()
		return nil, fmt.Errorf("%w: %w", ErrQueueTimeout, ctx.Err())
	})
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, env.srv.URL+"/v1/chat/completions", strings.NewReader(simpleChat))
	done := make(chan error, 1)
	go func() {
		resp, err := env.srv.Client().Do(req)
		if err == nil {
			resp.Body.Close()
		}
		done <- err
	}()
	<-queued
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("client error = %v, want context.Canceled", err)
	}
	env.waitHandlers()
	if runs := env.gw.allRuns(); len(runs) != 0 {
		t.Errorf("%d runs created", len(runs))
	}
}
