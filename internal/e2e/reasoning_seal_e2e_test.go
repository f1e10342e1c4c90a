package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"iop/internal/e2e/harness"
	"iop/internal/edge"
	"iop/internal/node"
	"iop/internal/sim"
)

// TestResponses_EncryptedReasoning: include ["reasoning.encrypted_content"]
// gives each reasoning item of a Responses answer an opaque
// encrypted_content, whole and streamed (response.output_item.done), on
// both execution paths; a later request with store false that sends the
// item back is accepted, and iop turns the token back into the reasoning
// text (the stored input item's reasoning_text, with store true); a
// token altered by one character is a 400 invalid_request_error naming
// input[1].encrypted_content. Without include there is none.
func TestResponses_EncryptedReasoning(t *testing.T) {
	harness.Parallel(t)
	_, ollamaURL := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOllama, Models: []string{"seal-ollama"}, Thinking: true, ThinkLevels: true})
	_, openaiURL := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOpenAI, Models: []string{"seal-openai"}, Thinking: true})
	ctx, cancel := context.WithCancel(context.Background())
	e := harness.Edge(t, ctx, harness.EdgeConfig(map[string]edge.ModelConfig{}))
	t.Cleanup(cancel)
	harness.Node(t, ctx, node.Config{
		NodeID: "gpu-1",
		Edge:   e.NodeAddr,
		Providers: []node.ProviderConfig{
			{ID: "ollama-1", Type: node.TypeOllama, BaseURL: ollamaURL, Models: []string{"seal-ollama"}, Capacity: 2},
			{ID: "vllm-1", Type: "vllm", BaseURL: openaiURL + "/v1", Models: []string{"seal-openai"}, Capacity: 2},
		},
	})
	c := &http.Client{Transport: &http.Transport{}}
	defer c.CloseIdleConnections()
	url := "http://" + e.HTTPAddr + "/v1/responses"
	type item struct {
		Type             string                        `json:"type"`
		ID               string                        `json:"id"`
		EncryptedContent string                        `json:"encrypted_content"`
		Summary          []struct{ Text string }       `json:"summary"`
		Content          []struct{ Type, Text string } `json:"content"`
	}
	type response struct {
		ID     string `json:"id"`
		Output []item `json:"output"`
		Usage  struct {
			OutputTokensDetails struct {
				ReasoningTokens int `json:"reasoning_tokens"`
			} `json:"output_tokens_details"`
		} `json:"usage"`
		Error struct{ Type, Param string } `json:"error"`
	}
	post := func(body string) (int, response, []byte) {
		t.Helper()
		status, out := postTo(t, c, url, body)
		var r response
		if !strings.HasPrefix(string(out), "event:") && !strings.HasPrefix(string(out), "data:") {
			if err := json.Unmarshal(out, &r); err != nil {
				t.Fatalf("%s: %v", out, err)
			}
		}
		return status, r, out
	}
	for _, model := range []string{"seal-ollama", "seal-openai"} {
		t.Run(model, func(t *testing.T) {
			ask := fmt.Sprintf(`{"model":%q,"input":"think first","reasoning":{"effort":"low"},"max_output_tokens":4,"store":false%%s}`, model)
			status, plain, out := post(fmt.Sprintf(ask, ""))
			if status != 200 || len(plain.Output) == 0 || plain.Output[0].Type != "reasoning" || plain.Output[0].EncryptedContent != "" {
				t.Fatalf("without include: %d %s", status, out)
			}
			status, sealed, out := post(fmt.Sprintf(ask, `,"include":["reasoning.encrypted_content"]`))
			rs := sealed.Output[0]
			if status != 200 || rs.Type != "reasoning" || rs.EncryptedContent == "" || len(rs.Summary) != 1 || rs.Summary[0].Text == "" ||
				sealed.Usage.OutputTokensDetails.ReasoningTokens == 0 || strings.Contains(rs.EncryptedContent, rs.Summary[0].Text) {
				t.Fatalf("with include: %d %s", status, out)
			}
			status, _, out = post(fmt.Sprintf(ask, `,"stream":true,"include":["reasoning.encrypted_content"]`))
			if status != 200 || !strings.Contains(string(out), `"type":"response.output_item.done"`) || !strings.Contains(string(out), `"encrypted_content":"`) {
				t.Fatalf("streamed: %d %s", status, out)
			}

			next := func(token string, store bool) string {
				return fmt.Sprintf(`{"model":%q,"store":%v,"max_output_tokens":2,"input":[
					{"role":"user","content":"think first"},
					{"type":"reasoning","id":%q,"summary":[],"encrypted_content":%q},
					{"role":"assistant","content":"ok"},
					{"role":"user","content":"and then?"}]}`, model, store, rs.ID, token)
			}
			if status, _, out := post(next(rs.EncryptedContent, false)); status != 200 {
				t.Errorf("the item sent back with store false: %d %s", status, out)
			}
			status, stored, out := post(next(rs.EncryptedContent, true))
			if status != 200 {
				t.Fatalf("the item sent back with store true: %d %s", status, out)
			}
			status, items := getFrom(t, c, url+"/"+stored.ID+"/input_items?order=asc")
			var list struct{ Data []item }
			if err := json.Unmarshal(items, &list); status != 200 || err != nil || len(list.Data) != 4 || len(list.Data[1].Content) != 1 ||
				list.Data[1].Content[0].Type != "reasoning_text" || list.Data[1].Content[0].Text != rs.Summary[0].Text {
				t.Errorf("stored input items: %d %s; want the reasoning %q back as reasoning_text", status, items, rs.Summary[0].Text)
			}

			tampered := []byte(rs.EncryptedContent)
			tampered[len(tampered)/2] ^= 1
			status, bad, out := post(next(string(tampered), false))
			if status != 400 || bad.Error.Type != "invalid_request_error" || bad.Error.Param != "input[1].encrypted_content" {
				t.Errorf("tampered: %d %s, want 400 invalid_request_error naming input[1].encrypted_content", status, out)
			}
		})
	}
	waitIdle(t, e)
}

// getFrom GETs url and returns the status and body.
func getFrom(t *testing.T, c *http.Client, url string) (int, []byte) {
	t.Helper()
	resp, err := c.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, body
}
