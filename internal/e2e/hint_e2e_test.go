package e2e

import (
	"context"
	"strings"
	"testing"

	"iop/internal/e2e/harness"
	"iop/internal/node"
)

// TestRegression_NodeAtTheEdgeHTTPPortIsToldSo: a node dialing the edge's
// HTTP API address instead of its node endpoint got a hint about TLS; the
// log now says it is the HTTP port and to use node_listen.
func TestRegression_NodeAtTheEdgeHTTPPortIsToldSo(t *testing.T) {
	harness.Parallel(t)
	ctx, cancel := context.WithCancel(context.Background())
	e := harness.Edge(t, ctx, harness.EdgeConfig(nil))
	t.Cleanup(cancel)
	rec := failingNode(t, e, node.Config{NodeID: "lost", Edge: e.HTTPAddr,
		Providers: []node.ProviderConfig{{ID: "p", Type: node.TypeOllama, BaseURL: "http://127.0.0.1:1", Models: []string{"m"}}}})
	if hint := rec["hint"]; !strings.Contains(hint, "HTTP") || !strings.Contains(hint, "node_listen") || strings.Contains(hint, "tls_ca") {
		t.Fatalf("log %v: want a hint naming the HTTP port and node_listen", rec)
	}
}
