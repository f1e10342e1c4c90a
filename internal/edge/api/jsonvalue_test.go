package api

import (
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"

	"iop/internal/edge/api/request"
	"iop/internal/translate"
	"iop/internal/wire/nodev1"
)

// TestRoutesParseBodyOnce: each OpenAI route parses the client's bytes
// once: its checks, needs, estimated input tokens and the
// iop_ollama member's removal all come from that one parse.
func TestRoutesParseBodyOnce(t *testing.T) {
	for _, c := range []struct {
		path, body string
		run        *fakeRun
		needs      []string
		estimate   int
	}{
		{"/v1/chat/completions",
			`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"look at this"},{"type":"image_url","image_url":{"url":"https://example.com/a.png"}}]}],` +
				`"tools":[{"type":"function","function":{"name":"f"}}],"iop_ollama":{"think":true}}`,
			scriptedRun(normalized, events(delta("hi"), complete("stop"))),
			[]string{request.NeedTools, request.NeedVision, request.NeedRemoteImages},
			(len("look at this") + len(`{"type":"function","function":{"name":"f"}}`) + 3) / 4},
		{"/v1/completions", `{"model":"m","prompt":["one","two"],"n":2}`,
			scriptedRun(normalized, events(delta("hi"), complete("stop"))),
			[]string{request.NeedPromptBatch, request.NeedChoices}, (len("onetwo") + 3) / 4},
		{"/v1/embeddings", `{"model":"m","input":"some text"}`,
			scriptedRun(normalized, events(&nodev1.RunEvent{Type: nodev1.RunEvent_TYPE_DELTA, Embeddings: []*nodev1.Embedding{{Values: []float32{1}}}}), events(complete("stop"))),
			[]string{request.NeedEmbeddings}, (len("some text") + 3) / 4},
	} {
		t.Run(c.path, func(t *testing.T) {
			env := newEnv(t, Config{}, runWith(c.run))
			before := request.BodyParses()
			resp, err := http.Post(env.srv.URL+c.path, "application/json", strings.NewReader(c.body))
			if err != nil {
				t.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d", resp.StatusCode)
			}
			if n := request.BodyParses() - before; n != 1 {
				t.Errorf("the body was parsed %d times, want 1", n)
			}
			reqs := env.gw.requests()
			if len(reqs) != 1 {
				t.Fatalf("dispatched %d requests", len(reqs))
			}
			r := reqs[0]
			if !slices.Equal(r.Needs, c.needs) || r.EstimatedInputTokens != c.estimate {
				t.Errorf("needs %q estimate %d, want %q %d", r.Needs, r.EstimatedInputTokens, c.needs, c.estimate)
			}
			if strings.Contains(string(r.Body), translate.ExtensionKey) || !json.Valid(r.Body) {
				t.Errorf("dispatched body %s", r.Body)
			}
		})
	}
}
