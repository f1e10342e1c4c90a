package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"iop/internal/e2e/harness"
	"iop/internal/process"
	"iop/internal/sim"
)

// TestLogsOneLinePerRequestAndNoSecrets runs `iop edge` and `iop node` as
// commands with --log-format json at debug level, sends requests that carry
// a client Authorization header to a provider with an API key (and to one
// whose key the provider refuses), and checks the per-request lines, the
// node connect/fence lines with their generation, and that no secret
// appears anywhere in either log.
func TestLogsOneLinePerRequestAndNoSecrets(t *testing.T) {
	const providerKey, wrongKey, clientKey = "sk-provider-secret-7f3a", "sk-wrong-secret-99c1", "client-secret-5e2b"
	harness.Parallel(t)
	keyEnv, wrongKeyEnv := harness.Env(t, providerKey), harness.Env(t, wrongKey)
	_, goodURL := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOpenAI, Models: []string{"good-m"}, APIKey: providerKey})
	_, badURL := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOpenAI, Models: []string{"bad-m"}, APIKey: providerKey})
	dir := t.TempDir()
	edgeYAML := filepath.Join(dir, "edge.yaml")
	if err := os.WriteFile(edgeYAML, []byte("models:\n  chat: {targets: [good-m]}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	edgeCmd := harness.StartCommand(t, ctx, "edge", "--config", edgeYAML, "--listen", "127.0.0.1:0", "--node-listen", "127.0.0.1:0", "--database", ":memory:", "--log-format", "json", "--log-level", "debug")
	ready := edgeCmd.WaitLog(t, "edge ready")
	base, nodeAddr := ready["http"].(string), ready["node_endpoint"].(string)

	nodeYAML := filepath.Join(dir, "node.yaml")
	nodeCfg := fmt.Sprintf(`node_id: gpu-1
edge: %s
providers:
  - {id: good, type: vllm, base_url: %s/v1, models: [good-m], api_key_env: %s}
  - {id: bad, type: vllm, base_url: %s/v1, models: [bad-m], api_key_env: %s}
`, nodeAddr, goodURL, keyEnv, badURL, wrongKeyEnv)
	if err := os.WriteFile(nodeYAML, []byte(nodeCfg), 0o600); err != nil {
		t.Fatal(err)
	}
	nodeCtx, stopNode := context.WithCancel(ctx)
	nodeCmd := harness.StartCommand(t, nodeCtx, "node", "--config", nodeYAML, "--log-format", "json", "--log-level", "debug")
	connected := edgeCmd.WaitLog(t, "node connected")
	if connected["node"] != "gpu-1" || connected["generation"] != 1.0 {
		t.Fatalf("node connected line %v", connected)
	}

	post := func(body string) (int, string) {
		req, _ := http.NewRequest(http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+clientKey)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if status, body := post(`{"model":"chat","stream":true,"stream_options":{"include_usage":true},"max_tokens":3,"messages":[{"role":"user","content":"hi"}]}`); status != 200 || !strings.Contains(body, "[DONE]") {
		t.Fatalf("good stream: %d %s", status, body)
	}
	if status, body := post(`{"model":"bad-m","messages":[{"role":"user","content":"hi"}]}`); status != 401 || strings.Contains(body, wrongKey) {
		t.Fatalf("refused key: %d %s", status, body)
	}
	if status, _ := post(`{"model":"nope","messages":[{"role":"user","content":"hi"}]}`); status != 404 {
		t.Fatalf("unknown model: %d", status)
	}

	// Three request lines, each once, with the fields an operator needs.
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	var requests []map[string]any
	for len(requests) < 3 && time.Now().Before(deadline) {
		<-tick.C
		requests = requests[:0]
		for _, l := range harness.JSONLines(t, edgeCmd.Log.String()) {
			if l["msg"] == "request" {
				requests = append(requests, l)
			}
		}
	}
	if len(requests) != 3 {
		t.Fatalf("%d request lines, want 3:\n%s", len(requests), edgeCmd.Log.String())
	}
	ok := requests[0]
	for _, k := range []string{"run_id", "model", "node_id", "provider_id", "served_model", "path", "queue_reason", "queue_wait", "status", "duration", "input_tokens", "output_tokens", "generation"} {
		if _, has := ok[k]; !has {
			t.Errorf("request line lacks %s: %v", k, ok)
		}
	}
	if ok["model"] != "chat" || ok["served_model"] != "good-m" || ok["provider_id"] != "good" || ok["path"] != "tunnel" ||
		ok["status"] != 200.0 || ok["output_tokens"] != 3.0 || ok["outcome"] != "completed" || ok["level"] != "INFO" {
		t.Errorf("request line %v", ok)
	}
	// The provider's error answer, relayed whole on the tunnel path, is a
	// failed run as on the normalized path: upstream_error, at warn.
	if r := requests[1]; r["status"] != 401.0 || r["provider_id"] != "bad" || r["outcome"] != "upstream_error" || r["level"] != "WARN" {
		t.Errorf("refused-key request line %v", r)
	}
	if r := requests[2]; r["status"] != 404.0 || r["queue_reason"] != "unknown_model" || r["run_id"] != nil {
		t.Errorf("unknown-model request line %v", r)
	}
	if _, err := process.NewLogger(io.Discard, "info", "xml"); err == nil || !strings.Contains(err.Error(), "--log-format") {
		t.Errorf("--log-format xml: %v", err)
	}

	stopNode()
	if err := <-nodeCmd.Done(); err != nil {
		t.Errorf("node: %v", err)
	}
	fenced := edgeCmd.WaitLog(t, "node fenced")
	if fenced["node"] != "gpu-1" || fenced["generation"] != 1.0 {
		t.Errorf("node fenced line %v", fenced)
	}
	cancel()
	if err := <-edgeCmd.Done(); err != nil {
		t.Errorf("edge: %v", err)
	}
	for name, log := range map[string]string{"edge": edgeCmd.Log.String(), "node": nodeCmd.Log.String()} {
		for _, secret := range []string{providerKey, wrongKey, clientKey} {
			if strings.Contains(log, secret) {
				t.Errorf("the %s log holds the secret %q", name, secret)
			}
		}
	}
}
