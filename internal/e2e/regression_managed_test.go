package e2e

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strings"
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
// and the good model got 503 provider_unavailable for the cool-down. A
// model whose server never answers its health URL (504 after its
// start_timeout) is the same.
func TestRegression_ManagedBrokenServerKeepsTheOtherModelsServed(t *testing.T) {
	harness.ParallelLong(t)
	bin := harness.IOP(t)
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
	// A server that runs but never answers its health URL: every run
	// waits start_timeout for it, then fails 504.
	mute := managed.Server{
		Cmd:          []string{"sh", "-c", "exec sleep 600"},
		Env:          map[string]string{"P": "${PORT}"},
		StartTimeout: 500 * time.Millisecond,
	}
	harness.Node(t, ctx, node.Config{
		NodeID: "gpu",
		Edge:   e.NodeAddr,
		Providers: []node.ProviderConfig{{ID: "mg", Type: node.TypeManaged, Capacity: 2, MaxLoadedModels: 3,
			Servers: map[string]managed.Server{"good": good, "broken": broken, "mute": mute}}},
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
	for _, bad := range []struct {
		model string
		code  int
	}{{"broken", http.StatusBadGateway}, {"mute", http.StatusGatewayTimeout}} {
		for i := range edge.DefaultBreakerFailures {
			code, body := chat(bad.model)
			if code != bad.code || !strings.Contains(body, `"error"`) || !strings.Contains(body, "model server") {
				t.Fatalf("%s model, request %d: %d %s, want %d with an error naming the model server", bad.model, i, code, body, bad.code)
			}
		}
		if code, body := chat("good"); code != http.StatusOK {
			t.Fatalf("good model after the %s one failed: %d %s, want 200", bad.model, code, body)
		}
	}
}
