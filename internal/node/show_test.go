package node

import (
	"bytes"
	"strings"
	"testing"

	"iop/internal/wire/nodev1"
)

// TestScrubShow: the host's paths leave an /api/show answer (the FROM
// line names the model, an ADAPTER or projector FROM the blob, a
// parent_model path is ""), and every other byte stays as the server
// wrote it: member order, spacing of values, number spellings, escapes.
func TestScrubShow(t *testing.T) {
	for _, tc := range []struct{ name, in, want string }{
		{"from and parent",
			`{"license":"MIT","modelfile":"# FROM tiny:latest\n\nFROM /root/.ollama/models/blobs/sha256-abc\nTEMPLATE \"\u003c|x|\u003e\"\nFROM /root/.ollama/models/blobs/sha256-proj\nADAPTER C:\\models\\blobs\\sha256-lora\n",` +
				`"details":{"parent_model":"/root/.ollama/models/blobs/sha256-abc","format":"gguf"},"model_info":{"eps":0.00001,"n":1e3}}`,
			`{"license":"MIT","modelfile":"# FROM tiny:latest\n\nFROM tiny:latest\nTEMPLATE \"\u003c|x|\u003e\"\nFROM sha256-proj\nADAPTER sha256-lora\n",` +
				`"details":{"parent_model":"","format":"gguf"},"model_info":{"eps":0.00001,"n":1e3}}`},
		{"a model name stays",
			`{"modelfile":"FROM llama3.2:latest\n","details":{"parent_model":"llama3.2:latest"}}`,
			`{"modelfile":"FROM llama3.2:latest\n","details":{"parent_model":"llama3.2:latest"}}`},
		{"spacing between members", "{ \"a\" : [1, 2] ,\n \"details\" : { \"parent_model\" : \"/x/y\" } }\n",
			`{"a":[1, 2],"details":{"parent_model":""}}` + "\n"},
	} {
		got, err := scrubShow([]byte(tc.in), "tiny:latest")
		if err != nil || string(got) != tc.want {
			t.Errorf("%s:\n got %s (%v)\nwant %s", tc.name, got, err, tc.want)
		}
	}
	if _, err := scrubShow([]byte(`["not an object"]`), "m"); err == nil {
		t.Error("an array was taken for an answer")
	}
}

// TestAgentAnswersShowRequests: the node answers a ShowRequest with its
// Ollama's /api/show (model and verbose passed on), scrubbed, in parts of
// at most showChunk bytes, the last one marked; a provider that is unknown
// or no Ollama gets one part with an error.
func TestAgentAnswersShowRequests(t *testing.T) {
	s := startPSServer(t, psOf())
	big := strings.Repeat("x", 2*showChunk+10)
	s.show = `{"modelfile":"FROM /root/.ollama/models/blobs/sha256-abc\n","template":"` + big + `"}`
	e, addr := startEdge(t)
	startAgent(t, testConfig(addr,
		ProviderConfig{ID: "ol", Type: TypeOllama, BaseURL: s.url, Models: []string{"tiny"}},
		ProviderConfig{ID: "oa", Type: TypeOpenAI, BaseURL: s.url + "/v1", Models: []string{"gpt"}}), newTestClock(), nil)
	c := connect(t, e, 1, hour)
	show := func(id uint64, provider string) *nodev1.EdgeMessage {
		return &nodev1.EdgeMessage{Msg: &nodev1.EdgeMessage_ShowRequest{ShowRequest: &nodev1.ShowRequest{
			RequestId: id, ProviderId: provider, Model: "tiny", Verbose: true}}}
	}
	c.send(t, show(7, "ol"))
	var body []byte
	for parts := 0; ; parts++ {
		a := c.next(t).GetShowAnswer()
		if a == nil || a.GetRequestId() != 7 || a.GetStatus() != 200 || a.GetError() != "" || len(a.GetData()) > showChunk {
			t.Fatalf("part %d: %v", parts, a)
		}
		body = append(body, a.GetData()...)
		if a.GetLast() {
			if parts != 2 {
				t.Errorf("%d parts, want 3", parts+1)
			}
			break
		}
	}
	if want := `{"modelfile":"FROM tiny\n","template":"` + big + `"}`; !bytes.Equal(body, []byte(want)) {
		t.Errorf("body of %d bytes, want the scrubbed %d", len(body), len(want))
	}
	if len(s.asked) != 1 || s.asked[0] != `{"model":"tiny","verbose":true}` {
		t.Errorf("the Ollama was asked %q", s.asked)
	}
	for i, p := range []string{"nope", "oa"} {
		c.send(t, show(uint64(8+i), p))
		if a := c.next(t).GetShowAnswer(); a.GetRequestId() != uint64(8+i) || !a.GetLast() || a.GetError() == "" || len(a.GetData()) != 0 {
			t.Errorf("provider %q: %v", p, a)
		}
	}
}
