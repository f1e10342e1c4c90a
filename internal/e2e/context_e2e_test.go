package e2e

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"iop/internal/e2e/harness"
)

// A non-raw /api/generate answer carries "context" on its final object, as
// Ollama's does, on both execution paths, streamed or not. iop
// has no tokenizer, so it is iop's encoding of the conversation; sent
// back with the next prompt, the provider gets the earlier prompt and
// answer as history before the new prompt, the memory Ollama's context
// gives. A context of another server (a real Ollama's token ids) is 400
// naming "context"; a raw answer has none, as in Ollama.
func TestGenerateContextContinuesTheConversation(t *testing.T) {
	harness.Parallel(t)
	rig := startOllamaRig(t)
	type final struct {
		Response string `json:"response"`
		Done     bool   `json:"done"`
		Context  []int  `json:"context"`
	}
	generate := func(t *testing.T, body string) final {
		t.Helper()
		resp, data := rig.do(t, http.MethodPost, "/api/generate", body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %d %s", body, resp.StatusCode, data)
		}
		var out final
		for _, line := range bytes.Split(bytes.TrimSpace(data), []byte("\n")) {
			var l final
			if err := json.Unmarshal(line, &l); err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			if !l.Done && l.Context != nil {
				t.Fatalf("context on a line that is not the last: %s", line)
			}
			out.Response += l.Response
			out.Done, out.Context = l.Done, l.Context
		}
		return out
	}
	// sentTurns are the role: content turns of the last request p relayed.
	sentTurns := func(t *testing.T, p *recordingProxy) []string {
		var body struct {
			Messages []struct{ Role, Content string } `json:"messages"`
		}
		if err := json.Unmarshal(p.last(t).Body, &body); err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, m := range body.Messages {
			out = append(out, m.Role+": "+m.Content)
		}
		return out
	}
	for _, c := range []struct {
		name, model string
		proxy       *recordingProxy
	}{
		{"normalized", rigOllamaModel, rig.ollamaProxy},
		{"tunnel", rigOpenAIModel, rig.openaiProx},
	} {
		for _, stream := range []bool{false, true} {
			t.Run(c.name+map[bool]string{false: "", true: "/stream"}[stream], func(t *testing.T) {
				s := map[bool]string{false: "false", true: "true"}[stream]
				first := generate(t, `{"model":"`+c.model+`","stream":`+s+`,"options":{"num_predict":3},"prompt":"my name is Ada"}`)
				if !first.Done || len(first.Context) < 3 || first.Response == "" {
					t.Fatalf("first answer %+v, want a final object with a context", first)
				}
				ctx, _ := json.Marshal(first.Context)
				second := generate(t, `{"model":"`+c.model+`","stream":`+s+`,"system":"be brief","options":{"num_predict":3},"prompt":"what is my name?","context":`+string(ctx)+`}`)
				want := []string{"system: be brief", "user: my name is Ada", "assistant: " + first.Response, "user: what is my name?"}
				if got := sentTurns(t, c.proxy); strings.Join(got, "|") != strings.Join(want, "|") {
					t.Fatalf("the provider got %q, want %q", got, want)
				}
				// The third turn's context holds all four turns but the system.
				ctx, _ = json.Marshal(second.Context)
				generate(t, `{"model":"`+c.model+`","stream":false,"options":{"num_predict":1},"prompt":"again","context":`+string(ctx)+`}`)
				if got := sentTurns(t, c.proxy); len(got) != 5 || got[3] != "assistant: "+second.Response || got[4] != "user: again" {
					t.Fatalf("the provider got %q, want the whole conversation", got)
				}
			})
		}
	}
	// A raw request's answer has no context, as Ollama's.
	if raw := generate(t, `{"model":"`+rigOllamaModel+`","stream":false,"raw":true,"options":{"num_predict":2},"prompt":"hi"}`); raw.Context != nil {
		t.Errorf("raw answer has a context: %v", raw.Context)
	}
	resp, data := rig.do(t, http.MethodPost, "/api/generate", `{"model":"`+rigOllamaModel+`","prompt":"hi","context":[128006,882,128007,271]}`)
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(data), "context: not a context iop gave") {
		t.Errorf("a foreign context: %d %s, want 400 naming context", resp.StatusCode, data)
	}
	waitIdle(t, rig.e)
}
