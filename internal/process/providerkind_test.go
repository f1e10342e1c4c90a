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
	if len(ps) != 1 || !strings.Contains(ps[0].String(), `type "tgi": want ollama, openai, vllm, sim, cli or managed`) {
		t.Fatalf("problems %q, want one naming type tgi and the known types", ps)
	}
}

// TestCheckConfigManaged: iop check of a node config with a managed
// provider reports each problem of its servers, and none for a good one.
func TestCheckConfigManaged(t *testing.T) {
	t.Parallel()
	k, err := ConfigKind(KindNode)
	if err != nil {
		t.Fatal(err)
	}
	const head = "node_id: n\nedge: 127.0.0.1:7000\nproviders:\n  - id: llama\n    type: managed\n"
	for _, tc := range []struct {
		name, yaml, want string
	}{
		{"good", head + "    servers:\n      qwen:\n        cmd: [llama-server, --port, \"${PORT}\"]\n        ttl: 10m\n", ""},
		{"no servers", head, "servers is required for type managed"},
		{"no cmd", head + "    servers:\n      qwen:\n        ttl: 10m\n", `servers["qwen"]: cmd is required`},
		{"port not in url", head + "    servers:\n      qwen:\n        cmd: [llama-server, --port, \"${PORT}\"]\n        url: http://127.0.0.1:8080/v1\n", `servers["qwen"]: url "http://127.0.0.1:8080/v1": the command listens on ${PORT}, so url must use ${PORT} too`},
		{"port only in url", head + "    servers:\n      qwen:\n        cmd: [llama-server, --port, \"8080\"]\n", `url "http://127.0.0.1:${PORT}/v1" uses ${PORT} but the command does not`},
		{"unknown placeholder", head + "    servers:\n      qwen:\n        cmd: [llama-server, --port, \"${PORT}\", -m, \"${MODLE}\"]\n", "cmd[4]: unknown placeholder ${MODLE}"},
		{"models set", head + "    models: [other]\n    servers:\n      qwen:\n        cmd: [llama-server, --port, \"${PORT}\"]\n", "leave models out"},
		{"base_url set", head + "    base_url: http://127.0.0.1:1/v1\n    servers:\n      qwen:\n        cmd: [llama-server, --port, \"${PORT}\"]\n", "not used by type managed"},
		{"servers on openai", "node_id: n\nedge: 127.0.0.1:7000\nproviders:\n  - type: openai\n    base_url: http://127.0.0.1:1/v1\n    servers:\n      qwen:\n        cmd: [x]\n", "servers is only for type managed"},
	} {
		ps := CheckConfig(k, []byte(tc.yaml))
		if tc.want == "" {
			if len(ps) != 0 {
				t.Errorf("%s: problems %q, want none", tc.name, ps)
			}
			continue
		}
		found := false
		for _, p := range ps {
			found = found || strings.Contains(p.String(), tc.want)
		}
		if !found {
			t.Errorf("%s: problems %q, want one with %q", tc.name, ps, tc.want)
		}
	}
}
