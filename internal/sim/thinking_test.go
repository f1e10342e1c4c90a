package sim

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"iop/internal/sse"
)

// ollamaThought is what a test reads from one Ollama answer object.
type ollamaThought struct {
	Message *struct {
		Role     string `json:"role"`
		Content  string `json:"content"`
		Thinking string `json:"thinking"`
	} `json:"message"`
	Response  *string `json:"response"`
	Thinking  string  `json:"thinking"`
	Done      bool    `json:"done"`
	EvalCount int     `json:"eval_count"`
	Error     string  `json:"error"`
}

func (o ollamaThought) parts() (content, thinking string) {
	if o.Message != nil {
		return o.Message.Content, o.Message.Thinking
	}
	if o.Response != nil {
		return *o.Response, o.Thinking
	}
	return "", o.Thinking
}

// ollamaAnswer posts body to path and returns the answer's objects (one
// when not streamed).
func ollamaAnswer(t *testing.T, url, path, body string) (int, []ollamaThought) {
	t.Helper()
	resp := mustPost(t, newClient(t), url+path, []byte(body))
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var out []ollamaThought
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		var o ollamaThought
		if err := json.Unmarshal([]byte(line), &o); err != nil {
			t.Fatalf("line %q: %v", line, err)
		}
		out = append(out, o)
	}
	return resp.StatusCode, out
}

// TestOllamaThinkingFormat: a thinking model streams its reasoning first,
// a token per object with empty content and the token in message.thinking
// (chat) or thinking (generate), then its text; not streamed, the whole
// reasoning is there; eval_count counts it. As Ollama (v0.17.4) does, an
// unset think thinks, false does not, a level sets how long.
func TestOllamaThinkingFormat(t *testing.T) {
	_, url, _ := startSim(t, Config{Protocol: ProtocolOllama, Thinking: true, ThinkLevels: true, Seed: 3})
	for _, c := range []struct {
		name, path, body string
		thinks           int
	}{
		{"chat, think unset", "/api/chat", `{"model":"sim-model","messages":[{"role":"user","content":"hi"}],"options":{"num_predict":3}}`, thinkingMedium},
		{"chat, think true", "/api/chat", `{"model":"sim-model","think":true,"messages":[{"role":"user","content":"hi"}],"options":{"num_predict":3}}`, thinkingMedium},
		{"chat, think high", "/api/chat", `{"model":"sim-model","think":"high","messages":[{"role":"user","content":"hi"}],"options":{"num_predict":3}}`, thinkingHigh},
		{"chat, think low", "/api/chat", `{"model":"sim-model","think":"low","messages":[{"role":"user","content":"hi"}],"options":{"num_predict":3}}`, thinkingLow},
		{"chat, think false", "/api/chat", `{"model":"sim-model","think":false,"messages":[{"role":"user","content":"hi"}],"options":{"num_predict":3}}`, 0},
		{"generate, think true", "/api/generate", `{"model":"sim-model","think":true,"prompt":"hi","options":{"num_predict":3}}`, thinkingMedium},
		{"generate, raw", "/api/generate", `{"model":"sim-model","raw":true,"prompt":"hi","options":{"num_predict":3}}`, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			status, lines := ollamaAnswer(t, url, c.path, c.body)
			if status != http.StatusOK || len(lines) != c.thinks+3+1 {
				t.Fatalf("status %d, %d lines; want %d thinking, 3 text and the final one", status, len(lines), c.thinks)
			}
			var streamedThinking string
			for i, l := range lines[:len(lines)-1] {
				content, thinking := l.parts()
				if (c.path == "/api/chat") != (l.Message != nil) || (c.path == "/api/generate") != (l.Response != nil) {
					t.Fatalf("line %d: chat answers carry message, generate answers response: %+v", i, l)
				}
				if i < c.thinks && (content != "" || thinking == "") || i >= c.thinks && (content == "" || thinking != "") {
					t.Fatalf("line %d: content %q thinking %q; want %d thinking lines, then text", i, content, thinking, c.thinks)
				}
				if c.path == "/api/generate" && l.Message != nil {
					t.Fatalf("a generate answer's thinking is top-level: %+v", l)
				}
				streamedThinking += thinking
			}
			if final := lines[len(lines)-1]; !final.Done || final.EvalCount != c.thinks+3 {
				t.Fatalf("final %+v, want done with eval_count %d", final, c.thinks+3)
			}
			whole := strings.Replace(c.body, `"model"`, `"stream":false,"model"`, 1)
			status, lines = ollamaAnswer(t, url, c.path, whole)
			if status != http.StatusOK || len(lines) != 1 {
				t.Fatalf("not streamed: %d, %d objects", status, len(lines))
			}
			if _, thinking := lines[0].parts(); thinking != streamedThinking || len(strings.Fields(thinking)) != c.thinks {
				t.Fatalf("not streamed: thinking %q, streamed %q", thinking, streamedThinking)
			}
		})
	}
	t.Run("show lists the thinking capability", func(t *testing.T) {
		resp := mustPost(t, newClient(t), url+"/api/show", []byte(`{"model":"sim-model"}`))
		defer resp.Body.Close()
		var show struct{ Capabilities []string }
		if err := json.NewDecoder(resp.Body).Decode(&show); err != nil || !strings.Contains(strings.Join(show.Capabilities, ","), "thinking") {
			t.Fatalf("capabilities %v, %v", show.Capabilities, err)
		}
	})
}

// TestOllamaThinkRefusals: a model that cannot think answers as Ollama's
// server does (v0.17.4, server/routes.go): think true is "does not support
// thinking", a level too in a chat (the capability is checked first) and
// "think value ... is not supported" in a generate (the level is checked
// first); false is fine; an unknown value is refused by any model; a
// thinking model without Config.ThinkLevels refuses a level.
func TestOllamaThinkRefusals(t *testing.T) {
	_, plain, _ := startSim(t, Config{Protocol: ProtocolOllama})
	_, thinker, _ := startSim(t, Config{Protocol: ProtocolOllama, Thinking: true})
	for _, c := range []struct {
		url, path, body string
		status          int
		err             string
	}{
		{plain, "/api/chat", `{"model":"sim-model","think":true,"messages":[{"role":"user","content":"hi"}]}`, 400, `"sim-model" does not support thinking`},
		{plain, "/api/chat", `{"model":"sim-model","think":"high","messages":[{"role":"user","content":"hi"}]}`, 400, `"sim-model" does not support thinking`},
		{plain, "/api/generate", `{"model":"sim-model","think":"high","prompt":"hi"}`, 400, `think value "high" is not supported for this model`},
		{plain, "/api/generate", `{"model":"sim-model","think":true,"prompt":"hi"}`, 400, `"sim-model" does not support thinking`},
		{plain, "/api/chat", `{"model":"sim-model","think":false,"stream":false,"messages":[{"role":"user","content":"hi"}]}`, 200, ""},
		{thinker, "/api/chat", `{"model":"sim-model","think":"max","messages":[{"role":"user","content":"hi"}]}`, 400, `invalid think value: "max"`},
		// A thinking model that is not gpt-oss (Config.ThinkLevels) takes no level.
		{thinker, "/api/chat", `{"model":"sim-model","think":"low","messages":[{"role":"user","content":"hi"}]}`, 400, `think value "low" is not supported for this model`},
		{thinker, "/api/generate", `{"model":"sim-model","think":"high","prompt":"hi"}`, 400, `think value "high" is not supported for this model`},
		{thinker, "/api/chat", `{"model":"sim-model","think":true,"stream":false,"messages":[{"role":"user","content":"hi"}]}`, 200, ""},
		{plain, "/api/chat", `{"model":"nope","think":true,"messages":[{"role":"user","content":"hi"}]}`, 404, "model not found"},
	} {
		status, lines := ollamaAnswer(t, c.url, c.path, c.body)
		if status != c.status || !strings.Contains(lines[0].Error, c.err) {
			t.Errorf("%s %s: %d %q, want %d %q", c.path, c.body, status, lines[0].Error, c.status, c.err)
		}
		if c.err != "" && !strings.HasPrefix(lines[0].Error, c.err) && status == 400 {
			t.Errorf("%s: error %q is not worded as Ollama words it (%q)", c.body, lines[0].Error, c.err)
		}
	}
}

// openaiReasoningAnswer posts a chat body and returns the reasoning and
// text of choice 0, read from the stream's deltas or the message, and the
// completion tokens.
func openaiReasoningAnswer(t *testing.T, url, body, field string, stream bool) (reasoning, text string, chunks, completion int) {
	t.Helper()
	resp := mustPost(t, newClient(t), url+"/v1/chat/completions", []byte(body))
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	type part map[string]json.RawMessage
	str := func(p part, k string) string {
		var s string
		_ = json.Unmarshal(p[k], &s)
		return s
	}
	other := map[string]string{ReasoningContent: ReasoningPlain, ReasoningPlain: ReasoningContent}[field]
	read := func(data []byte) {
		var obj struct {
			Choices []struct {
				Delta   part `json:"delta"`
				Message part `json:"message"`
			} `json:"choices"`
			Usage *struct {
				CompletionTokens int `json:"completion_tokens"`
			} `json:"usage"`
		}
		if err := json.Unmarshal(data, &obj); err != nil {
			t.Fatalf("%s: %v", data, err)
		}
		if obj.Usage != nil {
			completion = obj.Usage.CompletionTokens
		}
		for _, c := range obj.Choices {
			p := c.Delta
			if p == nil {
				p = c.Message
			}
			if _, ok := p[other]; ok {
				t.Fatalf("the reasoning came under %q, not %q: %s", other, field, data)
			}
			if r := str(p, field); r != "" {
				reasoning += r
				if text != "" {
					t.Fatalf("reasoning after text: %s", data)
				}
				chunks++
			}
			text += str(p, "content")
		}
	}
	if !stream {
		data, _ := io.ReadAll(resp.Body)
		read(data)
		return
	}
	if err := sse.ReadAll(resp.Body, func(e sse.Event) error {
		if string(e.Data) != "[DONE]" {
			read(e.Data)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return
}

// TestOpenAIReasoningFormat: a thinking model reasons by default, a token
// per delta under the configured field before its text, whole in the
// message when not streamed; reasoning_effort sets how long ("none": not
// at all); completion_tokens counts it. A model that cannot think ignores
// the setting; an effort outside OpenAI's set is refused.
func TestOpenAIReasoningFormat(t *testing.T) {
	const ask = `{"model":"sim-model","max_tokens":3,"stream":%s,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]%s}`
	body := func(stream bool, extra string) string {
		s := "false"
		if stream {
			s = "true"
		}
		return strings.Replace(strings.Replace(ask, "%s", s, 1), "%s", extra, 1)
	}
	for _, field := range []string{ReasoningContent, ReasoningPlain} {
		_, url, _ := startSim(t, Config{Protocol: ProtocolOpenAI, Thinking: true, ReasoningField: field, Seed: 5})
		for extra, want := range map[string]int{
			``:                               thinkingMedium,
			`,"reasoning_effort":"high"`:     thinkingHigh,
			`,"reasoning_effort":"minimal"`:  thinkingMinimal,
			`,"reasoning_effort":"none"`:     0,
			`,"reasoning":{"effort":"low"}`:  thinkingLow,
			`,"reasoning":{"enabled":false}`: 0,
		} {
			reasoning, text, chunks, completion := openaiReasoningAnswer(t, url, body(true, extra), field, true)
			if chunks != want || len(strings.Fields(reasoning)) != want || len(strings.Fields(text)) != 3 || completion != want+3 {
				t.Errorf("%s%s: %d reasoning chunks %q, text %q, completion %d; want %d chunks", field, extra, chunks, reasoning, text, completion, want)
			}
			whole, text2, _, completion2 := openaiReasoningAnswer(t, url, body(false, extra), field, false)
			if whole != reasoning || text2 != text || completion2 != completion {
				t.Errorf("%s%s not streamed: %q %q %d; streamed %q %q %d", field, extra, whole, text2, completion2, reasoning, text, completion)
			}
		}
	}
	_, plain, _ := startSim(t, Config{Protocol: ProtocolOpenAI})
	if r, _, _, completion := openaiReasoningAnswer(t, plain, body(true, `,"reasoning_effort":"high"`), ReasoningContent, true); r != "" || completion != 3 {
		t.Errorf("a model that cannot think reasoned %q (%d tokens)", r, completion)
	}
	resp := mustPost(t, newClient(t), plain+"/v1/chat/completions", []byte(body(false, `,"reasoning_effort":"max"`)))
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("reasoning_effort max: %d, want 400", resp.StatusCode)
	}
	if err := (Config{Protocol: ProtocolOpenAI, ReasoningField: "thoughts"}).Validate(); err == nil {
		t.Error("an unknown reasoning field is valid")
	}
}
