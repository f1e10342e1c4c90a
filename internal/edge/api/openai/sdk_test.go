package openai

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	oai "github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"iop/internal/edge/api/apitest"
	"iop/internal/edge/contract"
)

// sdkClient is OpenAI's Go SDK on env's server.
func sdkClient(env *apitest.Env) oai.Client {
	return oai.NewClient(
		option.WithBaseURL(env.Srv.URL+"/v1/"),
		option.WithAPIKey("test-key"),
		option.WithHTTPClient(env.Srv.Client()),
		option.WithMaxRetries(0),
	)
}

func chatParams(model, prompt string) oai.ChatCompletionNewParams {
	return oai.ChatCompletionNewParams{
		Model:    model,
		Messages: []oai.ChatCompletionMessageParamUnion{oai.UserMessage(prompt)},
	}
}

func TestChatNormalizedNonStream(t *testing.T) {
	t.Parallel()
	run := apitest.ScriptedRun(apitest.Normalized,
		apitest.Events(apitest.Started(), apitest.Delta("Hello")),
		apitest.Events(apitest.Delta(", world"), apitest.Usage(5, 2), apitest.Complete("stop")),
	)
	env := newEnv(t, apitest.RunWith(run))
	client := sdkClient(env)

	got, err := client.Chat.Completions.New(context.Background(), chatParams("alias", "say hello"))
	if err != nil {
		t.Fatal(err)
	}
	if got.ID != "chatcmpl-run1" || got.Object != "chat.completion" || got.Model != "alias" || got.Created != 1700000000 {
		t.Errorf("id/object/model/created = %q %q %q %d, want chatcmpl-run1 chat.completion alias 1700000000",
			got.ID, got.Object, got.Model, got.Created)
	}
	if len(got.Choices) != 1 {
		t.Fatalf("choices = %d, want 1", len(got.Choices))
	}
	c := got.Choices[0]
	if c.Index != 0 || c.Message.Role != "assistant" || c.Message.Content != "Hello, world" || c.FinishReason != "stop" {
		t.Errorf("choice = %+v", c)
	}
	if got.Usage.PromptTokens != 5 || got.Usage.CompletionTokens != 2 || got.Usage.TotalTokens != 7 {
		t.Errorf("usage = %+v, want 5/2/7", got.Usage)
	}

	reqs := env.GW.Requests()
	if len(reqs) != 1 {
		t.Fatalf("dispatched %d requests, want 1", len(reqs))
	}
	r := reqs[0]
	if r.Model != "alias" || r.Operation != contract.OperationChat || r.Stream || len(r.Needs) != 0 {
		t.Errorf("dispatched %+v", r)
	}
	if want := (len("say hello") + 3) / 4; r.EstimatedInputTokens != want {
		t.Errorf("EstimatedInputTokens = %d, want %d", r.EstimatedInputTokens, want)
	}
	if !json.Valid(r.Body) || !strings.Contains(string(r.Body), `"alias"`) {
		t.Errorf("dispatched body %s", r.Body)
	}
	if _, ok := r.Headers["Authorization"]; ok {
		t.Errorf("client credentials forwarded: %v", r.Headers)
	}
}

func TestChatNormalizedStream(t *testing.T) {
	t.Parallel()
	for _, includeUsage := range []bool{false, true} {
		t.Run(fmt.Sprintf("include_usage=%v", includeUsage), func(t *testing.T) {
			t.Parallel()
			run := apitest.ScriptedRun(apitest.Normalized,
				apitest.Events(apitest.Started()),
				apitest.Events(apitest.Delta("The")),
				apitest.Events(apitest.Delta(" quick"), apitest.Delta(" fox")),
				apitest.Events(apitest.Usage(3, 3), apitest.Complete("length")),
			)
			env := newEnv(t, apitest.RunWith(run))
			client := sdkClient(env)
			params := chatParams("m", "go")
			if includeUsage {
				params.StreamOptions = oai.ChatCompletionStreamOptionsParam{IncludeUsage: oai.Bool(true)}
			}
			stream := client.Chat.Completions.NewStreaming(context.Background(), params)
			defer stream.Close()

			var chunks []oai.ChatCompletionChunk
			acc := oai.ChatCompletionAccumulator{}
			for stream.Next() {
				chunks = append(chunks, stream.Current())
				acc.AddChunk(stream.Current())
			}
			if err := stream.Err(); err != nil {
				t.Fatal(err)
			}
			// role chunk, 3 deltas, finish chunk, maybe usage chunk
			want := 5
			if includeUsage {
				want = 6
			}
			if len(chunks) != want {
				t.Fatalf("got %d chunks, want %d: %+v", len(chunks), want, chunks)
			}
			first := chunks[0]
			if first.Choices[0].Delta.Role != "assistant" || first.Choices[0].Delta.Content != "" {
				t.Errorf("first chunk delta = %+v, want role assistant, empty content", first.Choices[0].Delta)
			}
			for _, c := range chunks {
				if c.ID != "chatcmpl-run1" || c.Object != "chat.completion.chunk" || c.Model != "m" {
					t.Errorf("chunk id/object/model = %q %q %q", c.ID, c.Object, c.Model)
				}
			}
			if got := acc.Choices[0].Message.Content; got != "The quick fox" {
				t.Errorf("content = %q, want %q", got, "The quick fox")
			}
			if got := acc.Choices[0].FinishReason; got != "length" {
				t.Errorf("finish_reason = %q, want length", got)
			}
			last := chunks[len(chunks)-1]
			if includeUsage {
				if len(last.Choices) != 0 || last.Usage.PromptTokens != 3 || last.Usage.CompletionTokens != 3 || last.Usage.TotalTokens != 6 {
					t.Errorf("usage chunk = %+v, want no choices and usage 3/3/6", last)
				}
			} else if last.JSON.Usage.Valid() {
				t.Errorf("usage sent without include_usage: %+v", last.Usage)
			}
			if reqs := env.GW.Requests(); len(reqs) != 1 || !reqs[0].Stream {
				t.Errorf("dispatched %+v, want one streaming request", reqs)
			}
		})
	}
}

// TestChatStreamWireFormat pins the exact SSE bytes of a normalized stream.
func TestChatStreamWireFormat(t *testing.T) {
	t.Parallel()
	run := apitest.ScriptedRun(apitest.Normalized, apitest.Events(apitest.Delta("Hi"), apitest.Usage(1, 1), apitest.Complete("")))
	env := newEnv(t, apitest.RunWith(run))
	resp := env.Post(t, chatPath, "application/json",
		`{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"x"}]}`)
	if resp.Status != http.StatusOK {
		t.Fatalf("status %d: %s", resp.Status, resp.Body)
	}
	if ct, cc := resp.Header.Get("Content-Type"), resp.Header.Get("Cache-Control"); ct != "text/event-stream" || cc != "no-cache" {
		t.Errorf("Content-Type %q, Cache-Control %q", ct, cc)
	}
	const head = `"id":"chatcmpl-run1","object":"chat.completion.chunk","created":1700000000,"model":"m"`
	want := "data: {" + head + `,"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}` + "\n\n" +
		"data: {" + head + `,"choices":[{"index":0,"delta":{"content":"Hi"},"logprobs":null,"finish_reason":null}]}` + "\n\n" +
		"data: {" + head + `,"choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}]}` + "\n\n" +
		"data: {" + head + `,"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}` + "\n\n" +
		"data: [DONE]\n\n"
	if resp.Body != want {
		t.Errorf("stream body:\n%s\nwant:\n%s", resp.Body, want)
	}
}
