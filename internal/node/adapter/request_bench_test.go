package adapter

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	"iop/internal/translate"
	"iop/internal/wire/nodev1"
)

// benchChat returns a canonical chat completions body of messages messages
// of contentChars bytes each, for model.
func benchChat(model string, messages, contentChars int) []byte {
	var b strings.Builder
	fmt.Fprintf(&b, `{"model":%q,"stream":true,"stream_options":{"include_usage":true},"max_tokens":256,"temperature":0.7,"messages":[`, model)
	content := strings.Repeat("x", contentChars)
	for i := range messages {
		if i > 0 {
			b.WriteByte(',')
		}
		role := "user"
		if i%2 == 1 {
			role = "assistant"
		}
		fmt.Fprintf(&b, `{"role":%q,"content":%q}`, role, content)
	}
	b.WriteString(`]}`)
	return []byte(b.String())
}

// benchFields are typical Ollama-only fields of an Ollama client's chat.
const benchFields = `{"keep_alive":"24h","options":{"num_ctx":8192,"top_k":40}}`

// BenchmarkNormalizeRequest measures what the Ollama adapter does to a
// request before calling its provider (the Dispatch's fields parsed, the
// canonical body translated to /api/chat), per request: an OpenAI
// client's (no fields) and an Ollama client's (keep_alive, options).
func BenchmarkNormalizeRequest(b *testing.B) {
	for _, bc := range []struct {
		name   string
		fields string
	}{{"openai_client", ""}, {"ollama_client_fields", benchFields}} {
		for _, size := range []struct {
			name           string
			messages, size int
		}{{"1msg_64B", 1, 64}, {"10msgs_1KiB", 10, 1024}} {
			body := benchChat("alias", size.messages, size.size)
			b.Run(bc.name+"/"+size.name, func(b *testing.B) {
				b.SetBytes(int64(len(body)))
				b.ReportAllocs()
				for b.Loop() {
					fields, err := translate.ParseOllamaFields([]byte(bc.fields))
					if err != nil {
						b.Fatal(err)
					}
					if _, err := translate.ToOllamaChat(body, "served", fields); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// BenchmarkNormalizeRequestAgent is BenchmarkNormalizeRequest for an
// agent's 95 KiB request of an OpenAI client (agentBody).
func BenchmarkNormalizeRequestAgent(b *testing.B) {
	body := agentBody(b, "alias")
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := translate.ToOllamaChat(body, "served", nil); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkTunnelRequest measures what the OpenAI tunnel does to a body
// before posting it, per request: the model rewrite, for a body whose model
// already is the served one and for one whose model is an alias.
func BenchmarkTunnelRequest(b *testing.B) {
	for _, bc := range []struct{ name, model string }{{"same_model", "served"}, {"alias", "alias"}} {
		body := benchChat(bc.model, 10, 1024)
		b.Run(bc.name+"/10msgs_1KiB", func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := rewriteModel(body, "served"); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkErrorObjectText measures the check every non-streamed 2xx tunnel
// answer goes through before it is relayed (is it an error object instead
// of an answer?), for a chat completion answer of a 16-token reply.
func BenchmarkErrorObjectText(b *testing.B) {
	body := []byte(`{"id":"chatcmpl-1","object":"chat.completion","created":1764547200,"model":"served",` +
		`"choices":[{"index":0,"message":{"role":"assistant","content":"one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen"},` +
		`"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":16,"total_tokens":28}}`)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if errorObjectText(body) != "" {
			b.Fatal("an answer taken for an error object")
		}
	}
}

// discardTunnel is a TunnelSink that drops what it is given.
type discardTunnel struct{}

func (discardTunnel) Head(TunnelHead) error { return nil }
func (discardTunnel) Data([]byte) error     { return nil }

// BenchmarkOpenAITunnel measures one tunneled request, non-streamed, to a
// local OpenAI-compatible server answering a 16-token chat completion
// (the HTTP round trip on loopback included): what the node's tunnel costs
// a request around its provider's answer.
func BenchmarkOpenAITunnel(b *testing.B) {
	answer := []byte(`{"id":"chatcmpl-1","object":"chat.completion","created":1764547200,"model":"served",` +
		`"choices":[{"index":0,"message":{"role":"assistant","content":"one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen"},` +
		`"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":16,"total_tokens":28}}`)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(answer)
	}))
	defer srv.Close()
	o, err := NewOpenAI(Config{BaseURL: srv.URL + "/v1"})
	if err != nil {
		b.Fatal(err)
	}
	defer o.Close()
	req := Request{Op: nodev1.Operation_OPERATION_CHAT, ServedModel: "served", Body: benchChat("served", 1, 64)}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if err := o.Tunnel(ctx, req, discardTunnel{}); err != nil {
			b.Fatal(err)
		}
	}
}

// agentBody is an agent's chat request of about 95 KiB, for model (the
// edge's testdata/agent_100k.json, its model replaced).
func agentBody(b *testing.B, model string) []byte {
	body, err := os.ReadFile("../../edge/testdata/agent_100k.json")
	if err != nil {
		b.Fatal(err)
	}
	body, err = rewriteModel(body, model)
	if err != nil {
		b.Fatal(err)
	}
	return body
}

// BenchmarkOpenAITunnelAgent is BenchmarkOpenAITunnel for an agent's
// 95 KiB request, whose model already is the served one (same_model) or is
// an alias the node rewrites (alias): what the node does to a large body
// on its way to the provider, the provider's read of it included.
func BenchmarkOpenAITunnelAgent(b *testing.B) {
	answer := []byte(`{"id":"chatcmpl-1","object":"chat.completion","created":1764547200,"model":"served",` +
		`"choices":[{"index":0,"message":{"role":"assistant","content":"one two three"},` +
		`"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":3,"total_tokens":15}}`)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(answer)
	}))
	defer srv.Close()
	o, err := NewOpenAI(Config{BaseURL: srv.URL + "/v1"})
	if err != nil {
		b.Fatal(err)
	}
	defer o.Close()
	for _, model := range []string{"served", "alias"} {
		name := "same_model"
		if model != "served" {
			name = "alias"
		}
		req := Request{Op: nodev1.Operation_OPERATION_CHAT, ServedModel: "served", Body: agentBody(b, model)}
		b.Run(name, func(b *testing.B) {
			b.SetBytes(int64(len(req.Body)))
			b.ReportAllocs()
			for b.Loop() {
				if err := o.Tunnel(context.Background(), req, discardTunnel{}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
