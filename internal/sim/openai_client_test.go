package sim

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

// TestOpenAIGoClient talks to the simulator with the official openai-go
// client, which iop's OpenAI adapter and users use: if it parses our
// answers, the wire format is right.
func TestOpenAIGoClient(t *testing.T) {
	s, url, _ := startSim(t, Config{Protocol: ProtocolOpenAI, APIKey: "sk-sim", Models: []string{"m1", "m2"}})
	client := openai.NewClient(
		option.WithBaseURL(url+"/v1"),
		option.WithAPIKey("sk-sim"),
		option.WithMaxRetries(0),
		option.WithHTTPClient(newClient(t)),
	)
	ctx := context.Background()
	chatParams := openai.ChatCompletionNewParams{
		Model:               "m2",
		Messages:            []openai.ChatCompletionMessageParamUnion{openai.SystemMessage("be brief"), openai.UserMessage("hello there")},
		MaxCompletionTokens: openai.Int(5),
	}

	t.Run("chat", func(t *testing.T) {
		got, err := client.Chat.Completions.New(ctx, chatParams)
		if err != nil {
			t.Fatal(err)
		}
		if len(got.Choices) != 1 || got.Choices[0].FinishReason != "length" || got.Model != "m2" {
			t.Fatalf("unexpected completion %s", got.RawJSON())
		}
		if n := len(strings.Fields(got.Choices[0].Message.Content)); n != 5 {
			t.Errorf("got %d words", n)
		}
		if got.Usage.PromptTokens != 4 || got.Usage.CompletionTokens != 5 || got.Usage.TotalTokens != 9 {
			t.Errorf("usage %+v", got.Usage)
		}
		if seen := s.Seen(); seen[len(seen)-1].Model != "m2" || seen[len(seen)-1].Authorization != "Bearer sk-sim" {
			t.Errorf("seen %+v", seen[len(seen)-1])
		}
	})

	t.Run("chat stream", func(t *testing.T) {
		params := chatParams
		params.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
		stream := client.Chat.Completions.NewStreaming(ctx, params)
		defer stream.Close()
		var acc openai.ChatCompletionAccumulator
		chunks := 0
		for stream.Next() {
			acc.AddChunk(stream.Current())
			chunks++
		}
		if err := stream.Err(); err != nil {
			t.Fatal(err)
		}
		nonStream, err := client.Chat.Completions.New(ctx, chatParams)
		if err != nil {
			t.Fatal(err)
		}
		// role chunk + 5 tokens + finish chunk + usage chunk
		if chunks != 8 {
			t.Errorf("got %d chunks, want 8", chunks)
		}
		if len(acc.Choices) != 1 || acc.Choices[0].Message.Content != nonStream.Choices[0].Message.Content {
			t.Errorf("streamed %+v, want content %q", acc.Choices, nonStream.Choices[0].Message.Content)
		}
		if acc.Choices[0].FinishReason != "length" || acc.Usage.CompletionTokens != 5 {
			t.Errorf("finish %q usage %+v", acc.Choices[0].FinishReason, acc.Usage)
		}
	})

	t.Run("completions stream", func(t *testing.T) {
		stream := client.Completions.NewStreaming(ctx, openai.CompletionNewParams{
			Model:     "m1",
			Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String("once upon a time")},
			MaxTokens: openai.Int(3),
		})
		defer stream.Close()
		var text strings.Builder
		var finish string
		for stream.Next() {
			for _, c := range stream.Current().Choices {
				text.WriteString(c.Text)
				finish = cmpOrString(string(c.FinishReason), finish)
			}
		}
		if err := stream.Err(); err != nil {
			t.Fatal(err)
		}
		if n := len(strings.Fields(text.String())); n != 3 || finish != "length" {
			t.Errorf("got %q (%d words), finish %q", text.String(), n, finish)
		}
	})

	t.Run("embeddings", func(t *testing.T) {
		for _, format := range []openai.EmbeddingNewParamsEncodingFormat{"", openai.EmbeddingNewParamsEncodingFormatFloat} {
			got, err := client.Embeddings.New(ctx, openai.EmbeddingNewParams{
				Model:          "m1",
				Input:          openai.EmbeddingNewParamsInputUnion{OfArrayOfStrings: []string{"a b", "c"}},
				EncodingFormat: format,
			})
			if err != nil {
				t.Fatal(err)
			}
			if len(got.Data) != 2 || len(got.Data[0].Embedding) != embedDims || got.Usage.PromptTokens != 3 {
				t.Errorf("unexpected embeddings %s", got.RawJSON())
			}
		}
	})

	t.Run("models", func(t *testing.T) {
		page, err := client.Models.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, m := range page.Data {
			ids = append(ids, m.ID)
		}
		if !slices.Equal(ids, []string{"m1", "m2"}) {
			t.Errorf("models %v", ids)
		}
	})

	t.Run("errors", func(t *testing.T) {
		tests := []struct {
			name     string
			client   openai.Client
			model    string
			wantCode int
			wantType string
		}{
			{"unknown model", client, "gpt-4o", http.StatusNotFound, "invalid_request_error"},
			{"bad key", openai.NewClient(option.WithBaseURL(url+"/v1"), option.WithAPIKey("wrong"),
				option.WithMaxRetries(0), option.WithHTTPClient(newClient(t))), "m1", http.StatusUnauthorized, "invalid_request_error"},
		}
		for _, tt := range tests {
			params := chatParams
			params.Model = tt.model
			_, err := tt.client.Chat.Completions.New(ctx, params)
			apiErr, ok := errors.AsType[*openai.Error](err)
			if !ok {
				t.Fatalf("%s: error %v is not an *openai.Error", tt.name, err)
			}
			if apiErr.StatusCode != tt.wantCode || apiErr.Type != tt.wantType || apiErr.Message == "" {
				t.Errorf("%s: got %d %q %q", tt.name, apiErr.StatusCode, apiErr.Type, apiErr.Message)
			}
		}
	})
}

func cmpOrString(a, b string) string {
	if a != "" {
		return a
	}
	return b
}
