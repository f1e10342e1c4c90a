package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"unicode/utf8"

	"iop/internal/e2e/harness"
	"iop/internal/edge"
	"iop/internal/node"
	"iop/internal/ollamatest"
)

// ollamaChatAnswer is an /api/chat answer's (not streamed) content and
// done_reason.
func ollamaChatAnswer(t *testing.T, c *http.Client, url, body string) (content, doneReason string) {
	t.Helper()
	status, out := postTo(t, c, url, body)
	var ans struct {
		Message    struct{ Content string } `json:"message"`
		DoneReason string                   `json:"done_reason"`
	}
	if err := json.Unmarshal(out, &ans); status != http.StatusOK || err != nil {
		t.Fatalf("%s: %d %s", body, status, out)
	}
	return ans.Message.Content, ans.DoneReason
}

// middleStop is a stop sequence of 3 bytes from the middle of text (on
// rune boundaries) and the text before its first occurrence.
func middleStop(t *testing.T, text string) (stop, before string) {
	t.Helper()
	i := len(text) / 2
	for i > 0 && !utf8.RuneStart(text[i]) {
		i--
	}
	j := min(i+3, len(text))
	for j < len(text) && !utf8.RuneStart(text[j]) {
		j++
	}
	if i == j {
		t.Fatalf("answer %q: too short for a stop sequence", text)
	}
	stop = text[i:j]
	return stop, text[:strings.Index(text, stop)]
}

// TestRealOllama_StopSequence: a real Ollama v0.17.4 ends an answer at a
// stop sequence as iop sim does (the text before it, done_reason "stop";
// TestRegression_StopSequenceReported checks the simulator with the same
// requests), and through iop the answer says which stop sequence ended
// it where iop can know: Messages stop_reason "stop_sequence" and
// stop_sequence on the native provider (normalized path; the node
// matches the stop sequences itself), with the same text as Ollama's;
// chat finish_reason "stop" and /api/chat done_reason "stop" with that
// text. Through Ollama's OpenAI API (tunnel path) the text is cut the
// same, but Ollama does not say why: end_turn.
func TestRealOllama_StopSequence(t *testing.T) {
	harness.ParallelOllama(t)
	s := ollamatest.Start(t)
	s.CreateModel(t, "tiny-stop", ollamatest.Plain)
	s.CreateModel(t, "tiny-stop-v1", ollamatest.Plain)
	ctx, cancel := context.WithCancel(context.Background())
	e := harness.Edge(t, ctx, harness.EdgeConfig(map[string]edge.ModelConfig{}))
	t.Cleanup(cancel)
	harness.Node(t, ctx, node.Config{
		NodeID: "gpu-1",
		Edge:   e.NodeAddr,
		Providers: []node.ProviderConfig{
			{ID: "native", Type: node.TypeOllama, BaseURL: s.URL, Models: []string{"tiny-stop"}, Capacity: 2},
			{ID: "v1", Type: node.TypeOpenAI, BaseURL: s.URL + "/v1", Models: []string{"tiny-stop-v1"}, Capacity: 2},
		},
	})
	c := &http.Client{Transport: &http.Transport{}}
	defer c.CloseIdleConnections()
	base := "http://" + e.HTTPAddr
	const prompt = "tell me a story"
	ollamaBody := func(model, options string) string {
		return fmt.Sprintf(`{"model":%q,"stream":false,"messages":[{"role":"user","content":%q}],"options":{"temperature":0,"seed":1,"num_predict":24%s}}`, model, prompt, options)
	}

	full, reason := ollamaChatAnswer(t, c, s.URL+"/api/chat", ollamaBody("tiny-stop", ""))
	if reason != "length" {
		t.Fatalf("without stop: done_reason %q", reason)
	}
	stop, before := middleStop(t, full)
	stopOption := fmt.Sprintf(`,"stop":["never-said",%q]`, stop)
	// Ollama itself: the text before the stop sequence, done_reason stop.
	if text, reason := ollamaChatAnswer(t, c, s.URL+"/api/chat", ollamaBody("tiny-stop", stopOption)); text != before || reason != "stop" {
		t.Fatalf("Ollama with stop %q: %q %q, want %q, stop", stop, text, reason, before)
	}
	// Through iop's Ollama API: the same.
	if text, reason := ollamaChatAnswer(t, c, base+"/api/chat", ollamaBody("tiny-stop", stopOption)); text != before || reason != "stop" {
		t.Errorf("iop /api/chat with stop %q: %q %q, want %q, stop", stop, text, reason, before)
	}
	for _, p := range []struct {
		model, reason string
		seq           bool
	}{{"tiny-stop", "stop_sequence", true}, {"tiny-stop-v1", "end_turn", false}} {
		for _, stream := range []bool{false, true} {
			body := fmt.Sprintf(`{"model":%q,"max_tokens":24,"temperature":0,"stream":%v,"stop_sequences":["never-said",%q],"messages":[{"role":"user","content":%q}]}`,
				p.model, stream, stop, prompt)
			text, reason, seq := messagesAnswer(t, c, base+"/v1/messages", body, stream)
			if text != before || reason != p.reason || (seq != nil) != p.seq || seq != nil && *seq != stop {
				t.Errorf("%s, stream %v: text %q stop_reason %q stop_sequence %v; want %q, %s", p.model, stream, text, reason, deref(seq), before, p.reason)
			}
			body = fmt.Sprintf(`{"model":%q,"max_tokens":24,"temperature":0,"seed":1,"stream":%v,"stop":%q,"messages":[{"role":"user","content":%q}]}`,
				p.model, stream, stop, prompt)
			if text, finish := chatAnswer(t, c, base+"/v1/chat/completions", body, stream); text != before || finish != "stop" {
				t.Errorf("%s chat, stream %v: %q %q, want %q, stop", p.model, stream, text, finish, before)
			}
		}
	}
	waitIdle(t, e)
}
