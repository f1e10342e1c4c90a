package e2e

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"iop/internal/auth"
	"iop/internal/e2e/harness"
	"iop/internal/node"
	"iop/internal/quota"
	"iop/internal/sim"
)

// TestRegression_QuotaLlamaCompletionNPredict: llama.cpp's /completion
// and /infill take the answer's length from n_predict (default -1:
// until the end of the context), not max_tokens. A key with 2000 tokens
// a minute asking n_predict 3000, or none, must not get 3000 tokens from
// the provider in one minute; on main the edge clamps a max_tokens the
// server ignores and settles the request at its reservation.
func TestRegression_QuotaLlamaCompletionNPredict(t *testing.T) {
	harness.Parallel(t)
	const limit = 2000
	key, hash := auth.Generate()
	cfg := harness.EdgeConfig(nil)
	cfg.Keys = []auth.Key{{Name: "q", Hash: hash, Quota: quota.Limits{TokensPerMinute: limit}}}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	e := harness.Edge(t, ctx, cfg)
	s, url := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOpenAI, Models: []string{"m"}, DefaultMaxTokens: 3000})
	harness.Node(t, ctx, node.Config{NodeID: "n", Edge: e.NodeAddr, Providers: []node.ProviderConfig{
		{ID: "p", Type: "vllm", BaseURL: url + "/v1", Models: []string{"m"}, Capacity: 4, Capabilities: mediaCaps},
	}})
	for _, body := range []string{
		`{"model":"m","prompt":"a","n_predict":3000}`,
		`{"model":"m","prompt":"a"}`,
		`{"model":"m","input_prefix":"a","input_suffix":"b"}`,
	} {
		path := "/completion"
		if strings.Contains(body, "input_prefix") {
			path = "/infill"
		}
		req, err := http.NewRequestWithContext(ctx, "POST", "http://"+e.HTTPAddr+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		t.Logf("%s %s: %d", path, body, resp.StatusCode)
	}
	if st := s.Stats(); st.MaxTokensPerMinute > limit {
		t.Errorf("the simulator produced %d tokens in a minute for a key of %d tokens a minute", st.MaxTokensPerMinute, limit)
	}
}
