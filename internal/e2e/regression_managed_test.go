package e2e

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"iop/internal/e2e/harness"
	"iop/internal/edge"
	"iop/internal/node"
	"iop/internal/node/managed"
	"iop/internal/testenv"
)

// TestRegression_ManagedBrokenServerKeepsTheOtherModelsServed: on a
// managed provider, one model whose server cannot start (its command
// exits at once) fails its own requests (502), but the other models of
// the provider, whose servers start fine, are still served: a server
// start failure is that model's, not the provider's, so it must not open
// the provider's circuit. Three requests for the broken model opened it
// and the good model got 503 provider_unavailable for the cool-down.
func TestRegression_ManagedBrokenServerKeepsTheOtherModelsServed(t *testing.T) {
	t.Parallel()
	bin := filepath.Join(t.TempDir(), "iop")
	if out, err := exec.Command("go", "build", "-o", bin, "iop/cmd/iop").CombinedOutput(); err != nil {
		t.Fatalf("go build iop/cmd/iop: %v\n%s", err, out)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	e := harness.Edge(t, ctx, harness.EdgeConfig(nil))
	good := managed.Server{
		Cmd:       []string{bin, "sim", "--protocol", "openai", "--listen", "127.0.0.1:${PORT}", "--model", "${MODEL}"},
		HealthURL: "http://127.0.0.1:${PORT}/v1/models",
		TTL:       time.Hour,
	}
	broken := managed.Server{
		Cmd: []string{"sh", "-c", "exit 3"},
		Env: map[string]string{"P": "${PORT}"},
	}
	harness.Node(t, ctx, node.Config{
		NodeID: "gpu",
		Edge:   e.NodeAddr,
		Providers: []node.ProviderConfig{{ID: "mg", Type: node.TypeManaged, Capacity: 2,
			Servers: map[string]managed.Server{"good": good, "broken": broken}}},
	})
	chat := func(model string) (int, string) {
		body := `{"model":"` + model + `","messages":[{"role":"user","content":"hi"}]}`
		resp, err := http.Post("http://"+e.HTTPAddr+"/v1/chat/completions", "application/json", bytes.NewBufferString(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	testenv.Eventually(t, "the good model to answer", func() bool {
		code, _ := chat("good")
		return code == http.StatusOK
	})
	for i := range edge.DefaultBreakerFailures {
		if code, body := chat("broken"); code != http.StatusBadGateway {
			t.Fatalf("broken model, request %d: %d %s, want 502", i, code, body)
		}
	}
	if code, body := chat("good"); code != http.StatusOK {
		t.Fatalf("good model after the broken one failed: %d %s, want 200", code, body)
	}
}
