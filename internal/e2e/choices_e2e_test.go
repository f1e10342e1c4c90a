package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"iop/internal/e2e/harness"
	"iop/internal/sse"
)

// A request for several choices (n, or best_of, above 1) can only be
// answered by an OpenAI-compatible provider (tunnel path). Through an alias
// of an Ollama and an OpenAI-compatible provider it reaches the latter,
// although the Ollama provider wins ties; to a model only Ollama serves it
// is answered 400 naming n at once, without reaching the provider.
func TestRegression_NAboveOneReachesOnlyOpenAICompatibleProviders(t *testing.T) {
	harness.Parallel(t)
	rig := startOllamaRig(t)
	requests := func() int {
		rig.ollamaProxy.mu.Lock()
		defer rig.ollamaProxy.mu.Unlock()
		return len(rig.ollamaProxy.reqs)
	}
	var answer struct {
		Model   string            `json:"model"`
		Choices []json.RawMessage `json:"choices"`
	}
	for _, c := range []struct {
		path, body string
		choices    int
	}{
		{"/v1/chat/completions", `{"model":"both","n":2,"max_tokens":3,"messages":[{"role":"user","content":"hi"}]}`, 2},
		{"/v1/completions", `{"model":"both","n":3,"max_tokens":3,"prompt":"hi"}`, 3},
	} {
		resp, data := rig.do(t, http.MethodPost, c.path, c.body)
		if err := json.Unmarshal(data, &answer); err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("%s %s: %d %s", c.path, c.body, resp.StatusCode, data)
		}
		if answer.Model != rigOpenAIModel || len(answer.Choices) != c.choices {
			t.Fatalf("%s: answered by %s with %d choices: %s", c.path, answer.Model, len(answer.Choices), data)
		}
	}
	// One choice still goes to the tie-break winner, the Ollama provider.
	if resp, data := rig.do(t, http.MethodPost, "/v1/chat/completions",
		`{"model":"both","n":1,"max_tokens":1,"messages":[{"role":"user","content":"hi"}]}`); resp.StatusCode != http.StatusOK || requests() != 1 {
		t.Fatalf("n 1: %d %s, the Ollama provider saw %d requests", resp.StatusCode, data, requests())
	}

	for _, c := range []struct{ path, body string }{
		{"/v1/chat/completions", `{"model":"llama3","n":2,"messages":[{"role":"user","content":"hi"}]}`},
		{"/v1/completions", `{"model":"llama3","n":2,"prompt":"hi"}`},
		{"/v1/completions", `{"model":"llama3:latest","best_of":2,"prompt":"hi"}`},
	} {
		resp, data := rig.do(t, http.MethodPost, c.path, c.body)
		var e struct {
			Error struct{ Message, Code string } `json:"error"`
		}
		if err := json.Unmarshal(data, &e); err != nil || resp.StatusCode != http.StatusBadRequest ||
			!strings.Contains(e.Error.Message, "n above 1") || e.Error.Code != "unsupported_capability" {
			t.Fatalf("%s %s: %d %s, want 400 naming n", c.path, c.body, resp.StatusCode, data)
		}
	}
	if got := requests(); got != 1 {
		t.Fatalf("the Ollama provider saw %d requests, want only the n 1 one", got)
	}
	waitIdle(t, rig.e)
}

// Batches: a completions request with several prompts, and a
// prompt or an embeddings input of token ids, can only be taken by an
// OpenAI-compatible provider (Ollama's /api/generate takes one prompt
// string, its /api/embed text only). Through the alias of an Ollama and
// an OpenAI-compatible provider they reach the latter, although the
// Ollama provider wins ties; for a model only Ollama serves they are
// answered 400 at once, saying why, and the provider sees nothing. Never
// the wrong provider's 400.
func TestRegression_BatchPromptReachesOnlyProvidersThatTakeIt(t *testing.T) {
	harness.Parallel(t)
	rig := startOllamaRig(t)
	requests := func() int {
		rig.ollamaProxy.mu.Lock()
		defer rig.ollamaProxy.mu.Unlock()
		return len(rig.ollamaProxy.reqs)
	}
	for _, c := range []struct {
		path, body string
		items      int // choices or vectors in the answer
	}{
		{"/v1/completions", `{"model":"both","max_tokens":2,"prompt":["one","two","three"]}`, 3},
		{"/v1/completions", `{"model":"both","max_tokens":2,"prompt":["one","two"],"n":2}`, 4},
		{"/v1/completions", `{"model":"both","max_tokens":2,"prompt":[1,2,3]}`, 1},
		{"/v1/completions", `{"model":"both","max_tokens":2,"prompt":[[1,2],[3]],"stream":true}`, 2},
		{"/v1/embeddings", `{"model":"both","input":[1,2,3]}`, 1},
		{"/v1/embeddings", `{"model":"both","input":[[1,2],[3]]}`, 2},
	} {
		resp, data := rig.do(t, http.MethodPost, c.path, c.body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s %s: %d %s", c.path, c.body, resp.StatusCode, data)
		}
		model, items := batchAnswer(t, data, strings.Contains(c.body, `"stream":true`))
		if model != rigOpenAIModel || items != c.items {
			t.Fatalf("%s %s: answered by %q with %d items, want %s with %d: %s", c.path, c.body, model, items, rigOpenAIModel, c.items, data)
		}
	}
	if got := requests(); got != 0 {
		t.Fatalf("the Ollama provider saw %d requests, want none", got)
	}
	// One prompt string, or strings to embed, still go to the tie-break
	// winner, the Ollama provider (which takes them).
	for _, c := range []struct{ path, body string }{
		{"/v1/completions", `{"model":"both","max_tokens":2,"prompt":["just one"]}`},
		{"/v1/embeddings", `{"model":"both","input":["a","b"]}`},
	} {
		if resp, data := rig.do(t, http.MethodPost, c.path, c.body); resp.StatusCode != http.StatusOK {
			t.Fatalf("%s %s: %d %s", c.path, c.body, resp.StatusCode, data)
		}
	}
	if got := requests(); got != 2 {
		t.Fatalf("the Ollama provider saw %d requests, want the 2 it takes", got)
	}

	for _, c := range []struct{ path, body, why string }{
		{"/v1/completions", `{"model":"llama3","prompt":["one","two"]}`, "send one request per prompt"},
		{"/v1/completions", `{"model":"llama3:latest","prompt":[[1],[2]]}`, "send one request per prompt"},
		{"/v1/completions", `{"model":"llama3","prompt":[5,6]}`, "takes token ids as input"},
		{"/v1/embeddings", `{"model":"llama3","input":[5,6]}`, "takes token ids as input"},
		{"/v1/embeddings", `{"model":"llama3","input":[[5],[6]]}`, "takes token ids as input"},
	} {
		resp, data := rig.do(t, http.MethodPost, c.path, c.body)
		var e struct {
			Error struct{ Message, Code string } `json:"error"`
		}
		if err := json.Unmarshal(data, &e); err != nil || resp.StatusCode != http.StatusBadRequest ||
			!strings.Contains(e.Error.Message, c.why) || e.Error.Code != "unsupported_capability" {
			t.Fatalf("%s %s: %d %s, want 400 saying %q", c.path, c.body, resp.StatusCode, data, c.why)
		}
	}
	if got := requests(); got != 2 {
		t.Fatalf("the Ollama provider saw %d requests, want no more after the refusals", got)
	}
	waitIdle(t, rig.e)
}

// batchAnswer reads an OpenAI completions or embeddings answer (streamed
// completions: SSE chunks) and returns its model and how many choices
// (distinct indexes) or vectors it has.
func batchAnswer(t *testing.T, data []byte, stream bool) (model string, items int) {
	t.Helper()
	var objs [][]byte
	if stream {
		if err := sse.ReadAll(bytes.NewReader(data), func(e sse.Event) error {
			if string(e.Data) != "[DONE]" {
				objs = append(objs, append([]byte(nil), e.Data...))
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	} else {
		objs = [][]byte{data}
	}
	seen := map[int]bool{}
	for _, raw := range objs {
		var obj struct {
			Model   string `json:"model"`
			Choices []struct {
				Index int `json:"index"`
			} `json:"choices"`
			Data []json.RawMessage `json:"data"`
		}
		if err := json.Unmarshal(raw, &obj); err != nil {
			t.Fatalf("%s: %v", raw, err)
		}
		model = obj.Model
		for _, c := range obj.Choices {
			seen[c.Index] = true
		}
		items += len(obj.Data)
	}
	return model, items + len(seen)
}

// TestRegression_LogprobsReachOnlyProvidersThatReturnThem: a chat request
// with logprobs true was answered by an Ollama provider without them (the
// README promises a 400 naming the field). A request
// for log probabilities (chat's logprobs or top_logprobs, a completion's
// logprobs) on an alias that mixes providers goes to the OpenAI-compatible
// one; on a model only an Ollama provider serves it is refused 400 saying
// why, and the Ollama provider sees none of them.
func TestRegression_LogprobsReachOnlyProvidersThatReturnThem(t *testing.T) {
	harness.Parallel(t)
	rig := startOllamaRig(t)
	requests := func() int {
		rig.ollamaProxy.mu.Lock()
		defer rig.ollamaProxy.mu.Unlock()
		return len(rig.ollamaProxy.reqs)
	}
	chat := `{"model":%q,"max_tokens":2,"messages":[{"role":"user","content":"hi"}],%s}`
	for _, c := range []struct{ path, body string }{
		{"/v1/chat/completions", fmt.Sprintf(chat, "both", `"logprobs":true`)},
		{"/v1/chat/completions", fmt.Sprintf(chat, "both", `"logprobs":true,"top_logprobs":2,"stream":true`)},
		{"/v1/completions", `{"model":"both","max_tokens":2,"prompt":"x","logprobs":1}`},
	} {
		resp, data := rig.do(t, http.MethodPost, c.path, c.body)
		if resp.StatusCode != http.StatusOK || !bytes.Contains(data, []byte(`"model":"`+rigOpenAIModel+`"`)) {
			t.Fatalf("%s %s: %d %s, want an answer of %s", c.path, c.body, resp.StatusCode, data, rigOpenAIModel)
		}
	}
	if got := requests(); got != 0 {
		t.Fatalf("the Ollama provider saw %d requests, want none", got)
	}
	// logprobs false is no request for them: the tie-break winner, the
	// Ollama provider, takes it.
	if resp, data := rig.do(t, http.MethodPost, "/v1/chat/completions", fmt.Sprintf(chat, "both", `"logprobs":false`)); resp.StatusCode != http.StatusOK {
		t.Fatalf("logprobs false: %d %s", resp.StatusCode, data)
	}
	if got := requests(); got != 1 {
		t.Fatalf("the Ollama provider saw %d requests, want 1", got)
	}
	for _, c := range []struct{ path, body string }{
		{"/v1/chat/completions", fmt.Sprintf(chat, "llama3", `"logprobs":true`)},
		{"/v1/chat/completions", fmt.Sprintf(chat, "llama3", `"top_logprobs":3`)},
		{"/v1/completions", `{"model":"llama3","prompt":"x","logprobs":0}`},
	} {
		resp, data := rig.do(t, http.MethodPost, c.path, c.body)
		var e struct {
			Error struct{ Message, Code string } `json:"error"`
		}
		if err := json.Unmarshal(data, &e); err != nil || resp.StatusCode != http.StatusBadRequest ||
			!strings.Contains(e.Error.Message, "returns logprobs") || e.Error.Code != "unsupported_capability" {
			t.Fatalf("%s %s: %d %s, want 400 saying no provider returns logprobs", c.path, c.body, resp.StatusCode, data)
		}
	}
	// Bad values are the client's error, before any queue.
	for _, body := range []string{fmt.Sprintf(chat, "both", `"logprobs":"yes"`), fmt.Sprintf(chat, "both", `"top_logprobs":21`)} {
		if resp, data := rig.do(t, http.MethodPost, "/v1/chat/completions", body); resp.StatusCode != http.StatusBadRequest {
			t.Fatalf("%s: %d %s, want 400", body, resp.StatusCode, data)
		}
	}
	if got := requests(); got != 1 {
		t.Fatalf("the Ollama provider saw %d requests, want no more after the refusals", got)
	}
	waitIdle(t, rig.e)
}
