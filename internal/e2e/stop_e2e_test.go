package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"iop/internal/e2e/harness"
	"iop/internal/edge"
	"iop/internal/node"
	"iop/internal/process"
	"iop/internal/sim"
)

// stopPath is one execution path of the stop tests: the model that takes
// it and the URL of its simulator.
type stopPath struct{ name, model, simURL string }

// startStopStack is an edge with one node driving an Ollama-protocol
// simulator (normalized path, model "stop-ollama") and an OpenAI-protocol
// one as vLLM (tunnel path, "stop-openai"), each answering 16 tokens.
func startStopStack(t *testing.T) (*process.Process, []stopPath) {
	t.Helper()
	_, ollamaURL := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOllama, Models: []string{"stop-ollama"}})
	_, openaiURL := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOpenAI, Models: []string{"stop-openai"}})
	ctx, cancel := context.WithCancel(context.Background())
	e := harness.Edge(t, ctx, harness.EdgeConfig(map[string]edge.ModelConfig{}))
	t.Cleanup(cancel)
	harness.Node(t, ctx, node.Config{
		NodeID: "gpu-1",
		Edge:   e.NodeAddr,
		Providers: []node.ProviderConfig{
			{ID: "ollama-1", Type: node.TypeOllama, BaseURL: ollamaURL, Models: []string{"stop-ollama"}, Capacity: 2},
			{ID: "vllm-1", Type: "vllm", BaseURL: openaiURL + "/v1", Models: []string{"stop-openai"}, Capacity: 2},
		},
	})
	return e, []stopPath{{"normalized", "stop-ollama", ollamaURL}, {"tunnel", "stop-openai", openaiURL}}
}

// stopFor is a stop sequence inside text that spans two of its words (the
// end of the 4th and the start of the 5th, so it crosses a streamed
// delta's boundary), and the text before its first occurrence.
func stopFor(t *testing.T, text string) (stop, before string) {
	t.Helper()
	words := strings.Fields(text)
	if len(words) < 6 {
		t.Fatalf("answer %q: too short to pick a stop sequence", text)
	}
	w4, w5 := words[3], words[4]
	stop = w4[max(len(w4)-2, 0):] + " " + w5[:min(2, len(w5))]
	return stop, text[:strings.Index(text, stop)]
}

// messagesAnswer is a Messages answer's text, stop_reason and
// stop_sequence, streamed or not.
func messagesAnswer(t *testing.T, c *http.Client, url, body string, stream bool) (text, reason string, seq *string) {
	t.Helper()
	status, out := postTo(t, c, url, body)
	if status != http.StatusOK {
		t.Fatalf("%s: %d %s", body, status, out)
	}
	if !stream {
		var msg struct {
			Content []struct {
				Type, Text string
			} `json:"content"`
			StopReason   string  `json:"stop_reason"`
			StopSequence *string `json:"stop_sequence"`
		}
		if err := json.Unmarshal(out, &msg); err != nil {
			t.Fatalf("%s: %v", out, err)
		}
		for _, b := range msg.Content {
			text += b.Text
		}
		return text, msg.StopReason, msg.StopSequence
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	sawDelta := false
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		var ev struct {
			Type  string `json:"type"`
			Delta struct {
				Type         string  `json:"type"`
				Text         string  `json:"text"`
				StopReason   string  `json:"stop_reason"`
				StopSequence *string `json:"stop_sequence"`
			} `json:"delta"`
		}
		if err := json.Unmarshal([]byte(data), &ev); err != nil {
			t.Fatalf("event %s: %v", data, err)
		}
		switch {
		case ev.Type == "content_block_delta" && ev.Delta.Type == "text_delta":
			text += ev.Delta.Text
		case ev.Type == "message_delta":
			reason, seq, sawDelta = ev.Delta.StopReason, ev.Delta.StopSequence, true
		}
	}
	if !sawDelta {
		t.Fatalf("no message_delta in %s", out)
	}
	return text, reason, seq
}

// chatAnswer is a chat completion's content and finish_reason, streamed
// or not.
func chatAnswer(t *testing.T, c *http.Client, url, body string, stream bool) (text, finish string) {
	t.Helper()
	status, out := postTo(t, c, url, body)
	if status != http.StatusOK {
		t.Fatalf("%s: %d %s", body, status, out)
	}
	type choice struct {
		Message      struct{ Content string } `json:"message"`
		Delta        struct{ Content string } `json:"delta"`
		FinishReason *string                  `json:"finish_reason"`
	}
	var obj struct{ Choices []choice }
	if !stream {
		if err := json.Unmarshal(out, &obj); err != nil || len(obj.Choices) != 1 || obj.Choices[0].FinishReason == nil {
			t.Fatalf("%s: %v", out, err)
		}
		return obj.Choices[0].Message.Content, *obj.Choices[0].FinishReason
	}
	for _, line := range strings.Split(string(out), "\n") {
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok || data == "[DONE]" {
			continue
		}
		obj.Choices = nil
		if err := json.Unmarshal([]byte(data), &obj); err != nil {
			t.Fatalf("event %s: %v", data, err)
		}
		for _, ch := range obj.Choices {
			text += ch.Delta.Content
			if ch.FinishReason != nil {
				finish = *ch.FinishReason
			}
		}
	}
	return text, finish
}

// TestRegression_StopSequenceReported: a Messages answer ended by one of
// the request's stop_sequences says so on both execution paths, streamed
// (message_delta) and not: stop_reason "stop_sequence" and stop_sequence
// the matched string, the text cut before it (the sequence spans two
// streamed deltas); a stop sequence the answer never reaches leaves
// end_turn and stop_sequence null. Chat completions with the same stop
// end "stop" with the same text. Before, stop_reason was end_turn and
// stop_sequence null whatever ended the answer.
func TestRegression_StopSequenceReported(t *testing.T) {
	harness.Parallel(t)
	e, paths := startStopStack(t)
	base := "http://" + e.HTTPAddr
	c := &http.Client{Transport: &http.Transport{}}
	defer c.CloseIdleConnections()
	for _, p := range paths {
		t.Run(p.name, func(t *testing.T) {
			prompt := "tell me a story about " + p.name
			full, finish := chatAnswer(t, c, base+"/v1/chat/completions",
				fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":%q}]}`, p.model, prompt), false)
			if finish != "stop" {
				t.Fatalf("without stop: finish %q", finish)
			}
			stop, before := stopFor(t, full)
			for _, stream := range []bool{false, true} {
				body := fmt.Sprintf(`{"model":%q,"max_tokens":100,"stream":%v,"stop_sequences":["never-said",%q],"messages":[{"role":"user","content":%q}]}`,
					p.model, stream, stop, prompt)
				text, reason, seq := messagesAnswer(t, c, base+"/v1/messages", body, stream)
				if text != before || reason != "stop_sequence" || seq == nil || *seq != stop {
					t.Errorf("stream %v: text %q stop_reason %q stop_sequence %v; want %q, stop_sequence, %q", stream, text, reason, deref(seq), before, stop)
				}
				body = fmt.Sprintf(`{"model":%q,"max_tokens":100,"stream":%v,"stop_sequences":["never-said"],"messages":[{"role":"user","content":%q}]}`,
					p.model, stream, prompt)
				text, reason, seq = messagesAnswer(t, c, base+"/v1/messages", body, stream)
				if text != full || reason != "end_turn" || seq != nil {
					t.Errorf("stream %v, no match: text %q stop_reason %q stop_sequence %v; want %q, end_turn, null", stream, text, reason, deref(seq), full)
				}
				body = fmt.Sprintf(`{"model":%q,"stream":%v,"stop":[%q],"messages":[{"role":"user","content":%q}]}`, p.model, stream, stop, prompt)
				text, finish = chatAnswer(t, c, base+"/v1/chat/completions", body, stream)
				if text != before || finish != "stop" {
					t.Errorf("chat stream %v: text %q finish %q; want %q, stop", stream, text, finish, before)
				}
			}
			// iop's Ollama API: the text before the stop, done_reason stop.
			ollamaBody := fmt.Sprintf(`{"model":%q,"stream":false,"messages":[{"role":"user","content":%q}],"options":{"stop":[%q]}}`, p.model, prompt, stop)
			if text, reason := ollamaChatAnswer(t, c, base+"/api/chat", ollamaBody); text != before || reason != "stop" {
				t.Errorf("/api/chat: %q %q, want %q, stop", text, reason, before)
			}
			// The simulator itself, as Ollama v0.17.4 (TestRealOllama_StopSequence)
			// and vLLM answer: the text before the stop, "stop", and
			// vLLM's stop_reason naming it.
			if p.name == "normalized" {
				if text, reason := ollamaChatAnswer(t, c, p.simURL+"/api/chat", ollamaBody); text != before || reason != "stop" {
					t.Errorf("sim /api/chat: %q %q, want %q, stop", text, reason, before)
				}
				return
			}
			status, out := postTo(t, c, p.simURL+"/v1/chat/completions",
				fmt.Sprintf(`{"model":%q,"stop":%q,"messages":[{"role":"user","content":%q}]}`, p.model, stop, prompt))
			var ans struct {
				Choices []struct {
					Message      struct{ Content string } `json:"message"`
					FinishReason string                   `json:"finish_reason"`
					StopReason   *string                  `json:"stop_reason"`
				} `json:"choices"`
			}
			if err := json.Unmarshal(out, &ans); status != 200 || err != nil || len(ans.Choices) != 1 ||
				ans.Choices[0].Message.Content != before || ans.Choices[0].FinishReason != "stop" || deref(ans.Choices[0].StopReason) != deref(&stop) {
				t.Errorf("sim chat: %d %s, want %q, stop, stop_reason %q", status, out, before, stop)
			}
		})
	}
	waitIdle(t, e)
}

// deref is *s, or "<nil>".
func deref(s *string) string {
	if s == nil {
		return "<nil>"
	}
	return fmt.Sprintf("%q", *s)
}
