package process

import (
	"strings"
	"testing"
)

// TestCheckConfigUnknownProviderKind: iop check of a node config whose
// provider type is not a known kind reports it, at the provider's line,
// naming the known types.
func TestCheckConfigUnknownProviderKind(t *testing.T) {
	t.Parallel()
	k, err := ConfigKind(KindNode)
	if err != nil {
		t.Fatal(err)
	}
	ps := CheckConfig(k, []byte("node_id: n\nedge: 127.0.0.1:7000\nproviders:\n  - type: tgi\n    base_url: http://127.0.0.1:1\n"))
	if len(ps) != 1 || !strings.Contains(ps[0].String(), `type "tgi": want ollama, openai, vllm, sim or cli`) {
		t.Fatalf("problems %q, want one naming type tgi and the known types", ps)
	}
}
