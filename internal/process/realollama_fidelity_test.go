package process

import (
	"net/http"
	"strings"
	"testing"
)

// TestRealOllama_Logprobs ports the assertions of Ollama's own integration
// tests TestAPIGenerateLogprobs, TestAPIChatLogprobs and TestNumPredict
// (integration/ of github.com/ollama/ollama v0.17.4) and runs them against
// the real Ollama directly and through iop (edge and node over gRPC, the
// native provider): both must pass alike. A model only the OpenAI-
// compatible provider serves refuses logprobs (400) instead of dropping
// them.
func TestRealOllama_Logprobs(t *testing.T) {
	rig := startRealRig(t)
	targets := map[string]string{"direct": rig.s.URL, "iop": "http://" + rig.e.HTTPAddr}
	opts := func(n int) string { return `"options":{"temperature":0,"seed":123,"num_predict":` + itoa(n) + `}` }
	cases := []struct {
		name, path, body string
		top              int
	}{
		// TestAPIGenerateLogprobs
		{"generate/no_logprobs", "/api/generate", `"prompt":"Why is the sky blue?","stream":false,` + opts(10), -1},
		{"generate/logprobs_only", "/api/generate", `"prompt":"Why is the sky blue?","stream":false,"logprobs":true,` + opts(10), 0},
		{"generate/logprobs_with_top_5", "/api/generate", `"prompt":"Why is the sky blue?","stream":false,"logprobs":true,"top_logprobs":5,` + opts(10), 5},
		// TestAPIChatLogprobs
		{"chat/top_3", "/api/chat", `"messages":[{"role":"user","content":"Say hello in one word"}],"stream":false,"logprobs":true,"top_logprobs":3,` + opts(5), 3},
		// TestNumPredict: streamed, one logprob per token, num_predict of them.
		{"num_predict", "/api/generate", `"prompt":"Write a long story.","stream":true,"logprobs":true,` + opts(10), 0},
		{"chat/streamed", "/api/chat", `"messages":[{"role":"user","content":"Say hello in one word"}],"logprobs":true,"top_logprobs":2,` + opts(5), 2},
	}
	for _, tc := range cases {
		for where, base := range targets {
			t.Run(tc.name+"/"+where, func(t *testing.T) {
				status, data := postTo(t, rig.client, base+tc.path, `{"model":"tiny",`+tc.body+`}`)
				if status != http.StatusOK {
					t.Fatalf("%d %s", status, data)
				}
				objs := decodeLogprobObjects(t, data)
				if tc.top < 0 {
					for _, o := range objs {
						if len(o.Logprobs) > 0 {
							t.Fatalf("logprobs not asked for: %s", data)
						}
					}
					return
				}
				checkLogprobs(t, objs, tc.top)
				if tc.name == "num_predict" {
					n := 0
					for _, o := range objs {
						n += len(o.Logprobs)
					}
					if n != 10 {
						t.Errorf("%d logprobs, want 10 (num_predict)", n)
					}
				}
			})
		}
	}
	status, data := rig.post(t, "/api/generate", `{"model":"tiny-v1","prompt":"hi","logprobs":true}`)
	if status != http.StatusBadRequest || !strings.Contains(string(data), "logprobs") {
		t.Errorf("logprobs on the tunnel path: %d %s, want 400", status, data)
	}
}
