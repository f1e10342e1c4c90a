package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"iop/internal/e2e/harness"
	"iop/internal/edge"
	"iop/internal/node"
	"iop/internal/ollamatest"
)

// TestRealOllama_Thinking: a real Ollama's thinking crosses both APIs on
// both paths, in the formats Ollama itself writes. The Ollama serves a
// tiny thinking model twice: "think-n" through a provider of type ollama
// (native API, normalized path) and "think-v1" through one of type openai
// on Ollama's own /v1 (tunnel path), whose reasoning field is "reasoning".
// The model never closes its thinking once it starts, so an answer that
// thinks is all thinking.
func TestRealOllama_Thinking(t *testing.T) {
	harness.ParallelOllama(t)
	s := ollamatest.Start(t)
	s.CreateModel(t, "think-n", ollamatest.Thinking)
	s.CreateModel(t, "think-v1", ollamatest.Thinking)
	native, tunnel := startRecordingProxy(t, s.URL), startRecordingProxy(t, s.URL)
	ctx, cancel := context.WithCancel(context.Background())
	e := harness.Edge(t, ctx, harness.EdgeConfig(map[string]edge.ModelConfig{}))
	t.Cleanup(cancel)
	harness.Node(t, ctx, node.Config{
		NodeID: "gpu-1",
		Edge:   e.NodeAddr,
		Providers: []node.ProviderConfig{
			{ID: "native", Type: node.TypeOllama, BaseURL: native.URL, Models: []string{"think-n"}, Capacity: 2},
			{ID: "v1", Type: node.TypeOpenAI, BaseURL: tunnel.URL + "/v1", Models: []string{"think-v1"}, Capacity: 2},
		},
	})
	c := &http.Client{Transport: &http.Transport{}}
	defer c.CloseIdleConnections()
	post := func(path, body string) (int, []byte) { return postTo(t, c, "http://"+e.HTTPAddr+path, body) }

	// An OpenAI client: an Ollama provider's thinking comes as
	// reasoning_content (streamed as it comes, and whole); Ollama's /v1
	// sends "reasoning", which reaches the client as sent.
	for _, tc := range []struct {
		model, field string
	}{{"think-n", "reasoning_content"}, {"think-v1", "reasoning"}} {
		for _, stream := range []bool{true, false} {
			body := `{"model":"` + tc.model + `","max_tokens":6,"messages":[{"role":"user","content":"hi"}]}`
			if stream {
				body = strings.Replace(body, `"max_tokens"`, `"stream":true,"max_tokens"`, 1)
			}
			status, data := post("/v1/chat/completions", body)
			a := readOpenAIAnswer(t, data, stream)
			got := a.reasoning
			if tc.field == "reasoning" {
				got = a.other
			}
			if status != http.StatusOK || got == "" || a.content != "" {
				t.Errorf("%s stream %v: %d, %s %q, content %q: %s", tc.model, stream, status, tc.field, got, a.content, data)
			}
			if stream && a.reasoningChunks+strings.Count(string(data), `"reasoning":"`) < 2 {
				t.Errorf("%s: the reasoning came in one piece, not as it was made: %s", tc.model, data)
			}
		}
	}
	// reasoning_effort "none" reaches the native API as think false: no
	// thinking, text instead.
	status, data := post("/v1/chat/completions", `{"model":"think-n","max_tokens":4,"reasoning_effort":"none","messages":[{"role":"user","content":"hi"}]}`)
	if a := readOpenAIAnswer(t, data, false); status != http.StatusOK || a.reasoning != "" || a.content == "" || sentField(t, native, "think") != "false" {
		t.Errorf(`reasoning_effort "none": %d %+v, Ollama got think %s`, status, a, sentField(t, native, "think"))
	}

	// An Ollama client: message.thinking from either provider, the /v1
	// one's "reasoning" translated; think false turns it off.
	for _, model := range []string{"think-n", "think-v1"} {
		for _, think := range []string{`"think":true,`, ``} {
			for _, stream := range []string{"", `"stream":false,`} {
				status, data := post("/api/chat", `{"model":"`+model+`",`+think+stream+`"options":{"num_predict":6},"messages":[{"role":"user","content":"hi"}]}`)
				thinking, text, lines := ollamaThinking(t, data)
				if status != http.StatusOK || thinking == "" || text != "" || (stream == "" && lines < 2) {
					t.Errorf("%s %s%s: %d thinking %q text %q in %d lines: %s", model, think, stream, status, thinking, text, lines, data)
				}
			}
		}
		// think false: the native API does not think and answers text; /v1
		// gets no reasoning_effort (see translate.thinkEffort), its model
		// thinks all the same (this one for the whole answer), and the
		// client is shown none of it, as Ollama shows no thinking then.
		status, data := post("/api/chat", `{"model":"`+model+`","think":false,"stream":false,"options":{"num_predict":4},"messages":[{"role":"user","content":"hi"}]}`)
		thinking, text, _ := ollamaThinking(t, data)
		if status != http.StatusOK || thinking != "" || (model == "think-n") != (text != "") {
			t.Errorf("%s think false: %d %s", model, status, data)
		}
	}
	// think true reaches /v1 without a reasoning_effort: Ollama's /v1 takes
	// levels for gpt-oss only, and a thinking model thinks by default.
	if got := sentField(t, tunnel, "reasoning_effort"); got != "" {
		t.Errorf("/v1 got reasoning_effort %s", got)
	}
	// A level is Ollama's to refuse for this model, on either path, in its
	// words.
	for _, model := range []string{"think-n", "think-v1"} {
		status, data := post("/api/chat", `{"model":"`+model+`","think":"high","stream":false,"messages":[{"role":"user","content":"hi"}]}`)
		if status != http.StatusBadRequest || !bytes.Contains(data, []byte(`think value \"high\" is not supported for this model`)) {
			t.Errorf("%s think high: %d %s", model, status, data)
		}
	}
	// The generate API: thinking at the top level.
	status, data = post("/api/generate", `{"model":"think-n","think":true,"stream":false,"prompt":"hi","options":{"num_predict":4}}`)
	var g struct{ Thinking, Response string }
	if err := json.Unmarshal(data, &g); err != nil || status != http.StatusOK || g.Thinking == "" {
		t.Errorf("generate: %d %s", status, data)
	}
	waitIdle(t, e)
}
