package adapter

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"

	"iop/internal/wire/nodev1"
)

// This file holds the tunnel's response hygiene tests: what an
// OpenAI-compatible provider answers must reach the client without the
// provider's secrets or internals (DESIGN "Edge HTTP API"), and error answers
// must have the OpenAI error shape.

const (
	// testKey is the provider API key of the reported leak.
	testKey = "sk-supersecret-123"
	// reportedAddr is where the reporter's provider listened; its URL is in
	// the reported error body.
	reportedAddr = "127.0.0.1:19030"
)

// hygieneProvider is a stand-in OpenAI-compatible server that counts the
// requests it gets.
type hygieneProvider struct {
	*httptest.Server
	hits atomic.Int32
}

// startProvider serves h on addr if it is free ("" or taken: any port), so a
// reported input that names the provider's address can be replayed as is.
func startProvider(t *testing.T, addr string, h http.HandlerFunc) *hygieneProvider {
	t.Helper()
	p := &hygieneProvider{}
	p.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.hits.Add(1)
		io.Copy(io.Discard, r.Body)
		h(w, r)
	}))
	if addr != "" {
		if ln, err := net.Listen("tcp", addr); err == nil {
			p.Listener.Close()
			p.Listener = ln
		}
	}
	p.Start()
	t.Cleanup(p.Close)
	return p
}

// tunnelCase is one provider answer and exactly what the sink must get.
type tunnelCase struct {
	addr string // the provider's preferred address, "" for any
	// answer writes the provider's answer; base is the adapter's BaseURL.
	answer     func(w http.ResponseWriter, base string)
	wantStatus int         // the status Head got, 0 for no Head
	wantHeader http.Header // the headers Head got
	wantBody   string      // every Data chunk, concatenated
	wantErr    int         // the returned *Error's Status, 0 for nil
	forbidden  []string    // more text that must not reach the sink or the error
}

// runTunnelCase tunnels one chat request to a provider answering as tc
// says (API key testKey, BaseURL its URL + "/v1"), checks what the sink got
// and that no secret appears in it or in the returned error. It returns
// the provider.
func runTunnelCase(t *testing.T, tc tunnelCase) *hygieneProvider {
	t.Helper()
	p := startProvider(t, tc.addr, func(w http.ResponseWriter, r *http.Request) { tc.answer(w, "http://"+r.Host+"/v1") })
	base := p.URL + "/v1"
	o := newOpenAI(t, Config{BaseURL: base, APIKey: testKey})
	rec := &tunnelRec{}
	err := o.Tunnel(context.Background(), Request{Op: nodev1.Operation_OPERATION_CHAT, ServedModel: "m", Body: []byte(`{"model":"x"}`)}, rec)

	switch {
	case tc.wantErr == 0 && err != nil:
		t.Errorf("Tunnel: %v, want nil", err)
	case tc.wantErr != 0:
		if e := asError(t, err); e.Status != tc.wantErr || !errors.Is(err, ErrProviderStatus) {
			t.Errorf("Tunnel: %+v, want ErrProviderStatus with status %d", e, tc.wantErr)
		}
	}
	if rec.status != tc.wantStatus {
		t.Errorf("status %d, want %d", rec.status, tc.wantStatus)
	}
	if len(rec.header) != 0 || len(tc.wantHeader) != 0 {
		if !reflect.DeepEqual(rec.header, tc.wantHeader) {
			t.Errorf("header\n got %v\nwant %v", rec.header, tc.wantHeader)
		}
	}
	if got := rec.body(); got != tc.wantBody {
		t.Errorf("body\n got %s\nwant %s", got, tc.wantBody)
	}
	out := sinkText(rec, err)
	secrets := append([]string{testKey, "Bearer " + testKey, base, p.URL, p.Listener.Addr().String()}, tc.forbidden...)
	for _, s := range secrets {
		if strings.Contains(out, s) {
			t.Errorf("sink output or error holds %q:\n%s", s, out)
		}
	}
	return p
}

// sinkText is everything rec got, and err's text.
func sinkText(rec *tunnelRec, err error) string {
	var b strings.Builder
	fmt.Fprintf(&b, "status %d\n", rec.status)
	rec.header.Write(&b)
	b.WriteString(rec.body())
	if err != nil {
		b.WriteString("\nerror: " + err.Error())
	}
	return b.String()
}

// answerWith is a provider answer with the given status, headers and body.
func answerWith(status int, header http.Header, body string) func(http.ResponseWriter, string) {
	return func(w http.ResponseWriter, _ string) {
		for k, vs := range header {
			w.Header()[k] = vs
		}
		w.WriteHeader(status)
		io.WriteString(w, body)
	}
}

var jsonHeader = http.Header{"Content-Type": {"application/json"}}

// ---- the reported bugs ----

// The provider's 401 body echoed its API key and URL, and the tunnel relayed
// it verbatim.
func TestTunnelRegression_KeyEchoedInErrorBody(t *testing.T) {
	runTunnelCase(t, tunnelCase{
		addr: reportedAddr,
		answer: func(w http.ResponseWriter, base string) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusUnauthorized)
			// With the provider on reportedAddr this is the reported body.
			io.WriteString(w, `{"error":{"message":"Incorrect API key provided: Bearer `+testKey+` at `+base+`"}}`)
		},
		wantStatus: 401,
		wantHeader: jsonHeader,
		wantBody:   `{"error":{"message":"Incorrect API key provided: Bearer [redacted] at [provider]","type":"upstream_error","param":null,"code":null}}`,
		forbidden:  []string{reportedAddr},
	})
}

// The provider's 307 reached the client with its internal Location, its
// cookie and its Server header.
func TestTunnelRegression_RedirectRelayed(t *testing.T) {
	p := runTunnelCase(t, tunnelCase{
		answer: answerWith(http.StatusTemporaryRedirect, http.Header{
			"Location":   {"http://internal/admin/v1/chat/completions"},
			"Set-Cookie": {"session=s3cr3t; Path=/; HttpOnly"},
			"Server":     {"nginx"},
		}, ""),
		wantErr:   502,
		forbidden: []string{"internal", "session", "s3cr3t", "nginx"},
	})
	if n := p.hits.Load(); n != 1 {
		t.Errorf("provider got %d requests, want 1", n)
	}
}

// The provider's nginx error page reached the client as HTML. Its message
// (the page's title) is kept, as for any plain-text or HTML error
// body; its markup and the proxy's signature are not.
func TestTunnelRegression_HTMLErrorPageRelayed(t *testing.T) {
	runTunnelCase(t, tunnelCase{
		answer: answerWith(http.StatusBadGateway, http.Header{
			"Content-Type": {"text/html"},
			"Server":       {"nginx/1.25.3"},
		}, "<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n<center><h1>502 Bad Gateway</h1></center>\r\n<hr><center>nginx/1.25.3</center>\r\n</body>\r\n</html>\r\n"),
		wantStatus: 502,
		wantHeader: jsonHeader,
		wantBody:   `{"error":{"message":"502 Bad Gateway","type":"upstream_error","param":null,"code":"502"}}`,
		forbidden:  []string{"<html", "nginx"},
	})
}

// vLLM's {"object":"error",...} reached the client, which expects
// {"error":{...}}.
func TestTunnelRegression_VLLMErrorShapeRelayed(t *testing.T) {
	const msg = "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens (4000 in the messages, 1000 in the completion). Please reduce the length of the messages or completion."
	runTunnelCase(t, tunnelCase{
		answer: answerWith(http.StatusBadRequest, jsonHeader,
			`{"object":"error","message":"`+msg+`","type":"BadRequestError","param":null,"code":400}`),
		wantStatus: 400,
		wantHeader: jsonHeader,
		wantBody:   `{"error":{"message":"` + msg + `","type":"upstream_error","param":null,"code":"400"}}`,
		forbidden:  []string{`"object"`},
	})
}

// A 200 KB response header from the provider reached clients.
func TestTunnelRegression_HugeHeaderRelayed(t *testing.T) {
	const body = `{"id":"c1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}]}`
	huge := strings.Repeat("a", 200<<10)
	runTunnelCase(t, tunnelCase{
		answer: answerWith(http.StatusOK, http.Header{
			"Content-Type":         {"application/json"},
			"X-Request-Id":         {huge},
			"X-Debug-Trace":        {huge},
			"Openai-Processing-Ms": {"12"},
		}, body),
		wantStatus: 200,
		wantHeader: http.Header{"Content-Type": {"application/json"}, "Openai-Processing-Ms": {"12"}},
		wantBody:   body,
	})
}

// ---- the rules behind them ----

func TestTunnelRelaysAllowlistedHeadersOnly(t *testing.T) {
	const body = `{"object":"list","data":[]}`
	for _, tc := range []struct {
		name   string
		status int
		header func(base string) http.Header
		want   http.Header
	}{
		{
			name:   "allowlist",
			status: 200,
			header: func(string) http.Header {
				return http.Header{
					"Content-Type":                   {"application/json"},
					"Cache-Control":                  {"no-cache, must-revalidate"},
					"Retry-After":                    {"3"},
					"X-Request-Id":                   {"req_abc"},
					"Openai-Processing-Ms":           {"12"},
					"Openai-Version":                 {"2020-10-01"},
					"X-Ratelimit-Limit-Requests":     {"5000"},
					"X-Ratelimit-Remaining-Tokens":   {"39000"},
					"Set-Cookie":                     {"__cf_bm=abc; path=/", "_cfuvid=def; path=/"},
					"Server":                         {"cloudflare"},
					"Location":                       {"http://internal/"},
					"Content-Location":               {"http://internal/x"},
					"Via":                            {"1.1 internal-proxy"},
					"X-Powered-By":                   {"Express"},
					"Strict-Transport-Security":      {"max-age=31536000"},
					"Access-Control-Allow-Origin":    {"*"},
					"Alt-Svc":                        {`h3=":443"`},
					"Keep-Alive":                     {"timeout=5"},
					"Proxy-Authenticate":             {"Basic"},
					"Www-Authenticate":               {"Bearer"},
					"X-Ratelimit":                    {"not a family member"},
					"Openai":                         {"not a family member"},
					"X-Openai-Processing-Ms-Spoofed": {"1"},
					// Regression (second breaker round): account ids leaked
					// through an Openai-* prefix allowlist.
					"Openai-Org-Id":          {"org-123"},
					"Openai-Organization-Id": {"org-123"},
					"Openai-Organization":    {"org-123"},
					"Openai-Project":         {"proj_1"},
					"Openai-Debug":           {"internal"},
					// identity: a gzip answer is decoded, and its
					// Content-Encoding dropped (decodeBody).
					"Content-Encoding": {"identity"},
				}
			},
			want: http.Header{
				"Content-Type":                 {"application/json"},
				"Cache-Control":                {"no-cache, must-revalidate"},
				"Retry-After":                  {"3"},
				"X-Request-Id":                 {"req_abc"},
				"Openai-Processing-Ms":         {"12"},
				"Openai-Version":               {"2020-10-01"},
				"X-Ratelimit-Limit-Requests":   {"5000"},
				"X-Ratelimit-Remaining-Tokens": {"39000"},
				"Content-Encoding":             {"identity"},
			},
		},
		{
			name:   "named by Connection",
			status: 200,
			header: func(string) http.Header {
				return http.Header{
					"Content-Type": {"application/json"},
					"Connection":   {"keep-alive, x-request-id"},
					"X-Request-Id": {"req_abc"},
				}
			},
			want: http.Header{"Content-Type": {"application/json"}},
		},
		{
			name:   "values over 8 KiB",
			status: 200,
			header: func(string) http.Header {
				return http.Header{
					"Content-Type":                   {"application/json"},
					"X-Ratelimit-Limit-Requests":     {strings.Repeat("1", 8<<10)},
					"X-Ratelimit-Remaining-Requests": {strings.Repeat("1", 8<<10+1)},
					"Openai-Model":                   {"gpt", strings.Repeat("g", 8<<10+1), "4o"},
				}
			},
			want: http.Header{
				"Content-Type":               {"application/json"},
				"X-Ratelimit-Limit-Requests": {strings.Repeat("1", 8<<10)},
				"Openai-Model":               {"gpt", "4o"},
			},
		},
		{
			name:   "secrets in values",
			status: 200,
			header: func(base string) http.Header {
				return http.Header{
					"Content-Type": {"application/json"},
					"X-Request-Id": {"req for Bearer " + testKey + " at " + base + "/chat/completions"},
				}
			},
			want: http.Header{
				"Content-Type": {"application/json"},
				"X-Request-Id": {"req for Bearer [redacted] at [provider]/chat/completions"},
			},
		},
		{
			name:   "error answer",
			status: 429,
			header: func(string) http.Header {
				return http.Header{
					"Content-Type":                   {"text/plain; charset=utf-8"},
					"Retry-After":                    {"20"},
					"X-Ratelimit-Remaining-Requests": {"0"},
					"X-Request-Id":                   {"req_abc"},
					"Set-Cookie":                     {"session=s3cr3t"},
					"Server":                         {"nginx"},
				}
			},
			want: http.Header{
				"Content-Type":                   {"application/json"},
				"Retry-After":                    {"20"},
				"X-Ratelimit-Remaining-Requests": {"0"},
				"X-Request-Id":                   {"req_abc"},
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wantBody := body
			if tc.status != 200 {
				wantBody = fmt.Sprintf(`{"error":{"message":"upstream returned HTTP %d","type":"upstream_error","param":null,"code":"%d"}}`, tc.status, tc.status)
			}
			runTunnelCase(t, tunnelCase{
				answer: func(w http.ResponseWriter, base string) {
					for k, vs := range tc.header(base) {
						w.Header()[k] = vs
					}
					w.WriteHeader(tc.status)
					io.WriteString(w, body)
				},
				wantStatus: tc.status,
				wantHeader: tc.want,
				wantBody:   wantBody,
				forbidden:  []string{"s3cr3t", "internal", "cloudflare", "nginx"},
			})
		})
	}
}

func TestTunnelErrorBodies(t *testing.T) {
	longPrefix := strings.Repeat("x", maxFallbackMessage-9) // testKey would straddle the cut
	for _, tc := range []struct {
		name   string
		status int
		ctype  string
		body   func(base string) string
		want   string
	}{
		{
			name: "openai error", status: 404, ctype: "application/json",
			body: func(string) string {
				return `{"error":{"message":"The model 'gpt-5' does not exist","type":"invalid_request_error","param":"model","code":"model_not_found"}}`
			},
			want: `{"error":{"message":"The model 'gpt-5' does not exist","type":"invalid_request_error","param":"model","code":"model_not_found"}}`,
		},
		{
			name: "openai error with extra fields", status: 502, ctype: "application/json",
			body: func(base string) string {
				return `{"error":{"message":"Provider returned error","code":502,"metadata":{"raw":"401 ` + testKey + ` ` + base + `","provider_name":"internal"}},"user_id":"u1"}`
			},
			want: `{"error":{"message":"Provider returned error","type":"upstream_error","param":null,"code":"502"}}`,
		},
		{
			name: "secrets JSON-escaped", status: 401, ctype: "application/json",
			body: func(base string) string {
				escaped := strings.ReplaceAll(base, "/", `\/`)
				return `{"error":{"message":"key sk\u002dsupersecret-123 refused by ` + escaped + `\/chat\/completions","type":"auth","param":"` + testKey + `","code":"` + base + `"}}`
			},
			want: `{"error":{"message":"key [redacted] refused by [provider]/chat/completions","type":"auth","param":"[redacted]","code":"[provider]"}}`,
		},
		{
			name: "origin and host alone", status: 403, ctype: "application/json",
			body: func(base string) string {
				origin := strings.TrimSuffix(base, "/v1")
				return `{"error":{"message":"see ` + origin + `/docs or ` + strings.TrimPrefix(origin, "http://") + `"}}`
			},
			want: `{"error":{"message":"see [provider]/docs or [provider]","type":"upstream_error","param":null,"code":null}}`,
		},
		{
			name: "vllm error with a string code", status: 404, ctype: "application/json",
			body: func(string) string {
				return `{"object":"error","message":"The model ` + "`gpt-5`" + ` does not exist.","type":"NotFoundError","param":null,"code":"model_not_found"}`
			},
			want: `{"error":{"message":"The model ` + "`gpt-5`" + ` does not exist.","type":"upstream_error","param":null,"code":"model_not_found"}}`,
		},
		{
			name: "vllm message over 1 KiB", status: 400, ctype: "application/json",
			body: func(string) string {
				return `{"object":"error","message":"` + longPrefix + testKey + ` and more","code":400}`
			},
			want: `{"error":{"message":"` + longPrefix + `[redac…","type":"upstream_error","param":null,"code":"400"}}`,
		},
		{
			name: "tgi error", status: 422, ctype: "application/json",
			body: func(string) string {
				return `{"error":"Input validation error: inputs must have less than 4096 tokens","error_type":"validation"}`
			},
			want: `{"error":{"message":"Input validation error: inputs must have less than 4096 tokens","type":"upstream_error","param":null,"code":"422"}}`,
		},
		{
			name: "fastapi detail", status: 404, ctype: "application/json",
			body: func(string) string { return `{"detail":"Not Found"}` },
			want: `{"error":{"message":"Not Found","type":"upstream_error","param":null,"code":"404"}}`,
		},
		{
			name: "fastapi validation detail", status: 422, ctype: "application/json",
			body: func(string) string { return `{"detail":[{"loc":["body","model"],"msg":"field required"}]}` },
			want: `{"error":{"message":"upstream returned HTTP 422","type":"upstream_error","param":null,"code":"422"}}`,
		},
		{
			name: "plain text", status: 500, ctype: "text/plain",
			body: func(base string) string { return "Internal Server Error: " + testKey + " " + base },
			want: `{"error":{"message":"Internal Server Error: [redacted] [provider]","type":"upstream_error","param":null,"code":"500"}}`,
		},
		{
			name: "empty", status: 503, ctype: "",
			body: func(string) string { return "" },
			want: `{"error":{"message":"upstream returned HTTP 503","type":"upstream_error","param":null,"code":"503"}}`,
		},
		{
			name: "json array", status: 500, ctype: "application/json",
			body: func(string) string { return `[{"error":{"message":"hidden"}}]` },
			want: `{"error":{"message":"upstream returned HTTP 500","type":"upstream_error","param":null,"code":"500"}}`,
		},
		{
			name: "error object without message", status: 500, ctype: "application/json",
			body: func(string) string { return `{"error":{"type":"server_error","code":null}}` },
			want: `{"error":{"message":"upstream returned HTTP 500","type":"upstream_error","param":null,"code":"500"}}`,
		},
		{
			name: "over 64 KiB", status: 500, ctype: "application/json",
			body: func(string) string {
				return `{"error":{"message":"` + strings.Repeat("m", errorBodyLimit) + `"}}`
			},
			want: `{"error":{"message":"upstream returned HTTP 500","type":"upstream_error","param":null,"code":"500"}}`,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			runTunnelCase(t, tunnelCase{
				answer: func(w http.ResponseWriter, base string) {
					if tc.ctype != "" {
						w.Header().Set("Content-Type", tc.ctype)
					}
					w.WriteHeader(tc.status)
					io.WriteString(w, tc.body(base))
				},
				wantStatus: tc.status,
				wantHeader: jsonHeader,
				wantBody:   tc.want,
				forbidden:  []string{"sk-sup", "internal", "hidden"},
			})
		})
	}
}

// TestTunnelStatusesNotRelayed: a redirect is never followed (it points back
// at the provider here, which counts the requests) nor relayed, and neither
// is a status outside 200-599.
func TestTunnelStatusesNotRelayed(t *testing.T) {
	for _, status := range []int{301, 302, 303, 307, 308, 600} {
		t.Run(fmt.Sprint(status), func(t *testing.T) {
			p := runTunnelCase(t, tunnelCase{
				answer: func(w http.ResponseWriter, base string) {
					w.Header().Set("Location", base+"/elsewhere")
					w.WriteHeader(status)
				},
				wantErr:   502,
				forbidden: []string{"elsewhere"},
			})
			if n := p.hits.Load(); n != 1 {
				t.Errorf("provider got %d requests, want 1", n)
			}
		})
	}
}

// headSink fails Head with err.
type headSink struct{ err error }

func (s headSink) Head(TunnelHead) error { return s.err }
func (s headSink) Data([]byte) error     { return nil }

func TestTunnelErrorAnswerSinkFailure(t *testing.T) {
	p := startProvider(t, "", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusInternalServerError)
	})
	o := newOpenAI(t, Config{BaseURL: p.URL})
	broken := errors.New("gone")
	err := o.Tunnel(context.Background(), Request{Op: nodev1.Operation_OPERATION_CHAT, ServedModel: "m", Body: []byte(`{}`)}, headSink{broken})
	if !errors.Is(err, ErrSink) || !errors.Is(err, broken) {
		t.Fatalf("err %v, want ErrSink wrapping %v", err, broken)
	}
}

// TestTunnelErrorAnswerCancelled: a cancel while the error body is being
// read ends the call with ErrCancelled, before any Head.
func TestTunnelErrorAnswerCancelled(t *testing.T) {
	headSent := make(chan struct{})
	p := startProvider(t, "", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusInternalServerError)
		io.WriteString(w, `{"error":`)
		w.(http.Flusher).Flush()
		close(headSent)
		<-r.Context().Done()
	})
	o := newOpenAI(t, Config{BaseURL: p.URL})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		<-headSent
		cancel()
	}()
	rec := &tunnelRec{}
	err := o.Tunnel(ctx, Request{Op: nodev1.Operation_OPERATION_CHAT, ServedModel: "m", Body: []byte(`{}`)}, rec)
	<-done
	if !errors.Is(err, ErrCancelled) {
		t.Fatalf("err %v, want ErrCancelled", err)
	}
	if rec.status != 0 || len(rec.chunks) != 0 {
		t.Errorf("sink got %d %q", rec.status, rec.body())
	}
}
