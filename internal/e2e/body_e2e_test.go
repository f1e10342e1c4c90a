package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"iop/internal/e2e/harness"
	"iop/internal/node"
	"iop/internal/process"
)

// TestEndToEndBodySizes: through a real edge and node, the provider gets
// the client's body whole, whether it is small enough to go inline in the
// Dispatch message (at most 64 KiB) or goes down the run stream in Body
// chunks (here 300 KiB: five chunks).
func TestEndToEndBodySizes(t *testing.T) {
	harness.Parallel(t)
	up := startUpstream(t, nil)
	e := startEdgeWith(t, process.DefaultEdgeFile(), harness.Logger(t, "edge"))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	harness.Node(t, ctx, node.Config{NodeID: "n1", Edge: e.NodeAddr, Providers: []node.ProviderConfig{
		{ID: "up", Type: node.TypeOpenAI, BaseURL: up.URL + "/v1", Models: []string{"m"}, Capacity: 1},
	}})
	for i, size := range []int{10, 60 << 10, 300 << 10} {
		content := strings.Repeat("x", size)
		body, _ := json.Marshal(map[string]any{"model": "m", "messages": []map[string]string{{"role": "user", "content": content}}})
		resp, err := http.Post("http://"+e.HTTPAddr+"/v1/chat/completions", "application/json", strings.NewReader(string(body)))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%d bytes of content: status %d", size, resp.StatusCode)
		}
		reqs := up.requests()
		if len(reqs) != i+1 {
			t.Fatalf("%d bytes of content: provider got %d requests, want %d", size, len(reqs), i+1)
		}
		var got struct {
			Model    string `json:"model"`
			Messages []struct {
				Content string `json:"content"`
			} `json:"messages"`
		}
		if err := json.Unmarshal(reqs[i].Body, &got); err != nil {
			t.Fatalf("%d bytes of content: provider got %d bytes that are not JSON: %v", size, len(reqs[i].Body), err)
		}
		if got.Model != "m" || len(got.Messages) != 1 || got.Messages[0].Content != content {
			t.Fatalf("%d bytes of content: provider got model %q and %d messages", size, got.Model, len(got.Messages))
		}
	}
}
