package edge

import (
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"iop/internal/auth"
	"iop/internal/edge/contract"
	"iop/internal/wire/nodev1"
)

// refused dials with h and checks the edge answers HelloRefused naming
// reason, then ends the stream with PermissionDenied.
func refused(t *testing.T, e *testEdge, h *nodev1.Hello, reason string) {
	t.Helper()
	n := e.dial(t, h)
	m, err := n.stream.Recv()
	if err != nil {
		t.Fatalf("node %s: Recv: %v, want HelloRefused", h.GetNodeId(), err)
	}
	if r := m.GetHelloRefused(); r == nil || !strings.Contains(r.GetReason(), reason) {
		t.Fatalf("node %s: got %v, want HelloRefused containing %q", h.GetNodeId(), m, reason)
	}
	if _, err := n.stream.Recv(); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("node %s: stream ended with %v, want PermissionDenied", h.GetNodeId(), err)
	}
}

func helloWith(node, token string) *nodev1.Hello {
	h := hello(node, prov("p1", normalized, 1, "m1"))
	h.Token = token
	return h
}

// TestReplayedNodeTokenWithAnotherNodeID: a token listed for some node ids
// is refused from any other node id, however valid the token.
func TestReplayedNodeTokenWithAnotherNodeID(t *testing.T) {
	cfg := testConfig()
	cfg.Tokens = []NodeToken{{Token: "gpu-token", Nodes: []string{"gpu-1"}}, {Token: "shared"}}
	e := startEdge(t, cfg)
	e.connect(t, helloWith("gpu-1", "gpu-token"))
	refused(t, e, helloWith("gpu-2", "gpu-token"), "not accepted for this node id")
	refused(t, e, helloWith("gpu-2", "wrong"), "token not accepted")
	refused(t, e, helloWith("gpu-2", ""), "token not accepted")
	// A shared token serves any node id.
	e.connect(t, helloWith("gpu-2", "shared"))
	snap := e.svc.Snapshot()
	if len(snap.Nodes) != 2 {
		t.Fatalf("nodes %+v, want gpu-1 and gpu-2", snap.Nodes)
	}
}

// TestNodeIDTakeoverNeedsTheSameToken: a node id is bound to the token it
// first joined with. Another valid token cannot take it over, even after
// the first node left, and the refusal leaves the current connection
// alone; the same token may reconnect (replacing the connection, as a
// restarted node does).
func TestNodeIDTakeoverNeedsTheSameToken(t *testing.T) {
	cfg := testConfig()
	cfg.Tokens = []NodeToken{{Token: "token-a"}, {Token: "token-b"}}
	e := startEdge(t, cfg)
	first := e.connect(t, helloWith("n1", "token-a"))
	refused(t, e, helloWith("n1", "token-b"), "bound to another token")
	snap := e.svc.Snapshot()
	if len(snap.Nodes) != 1 || snap.Nodes[0].Generation != first.gen {
		t.Fatalf("after a refused takeover: nodes %+v, want n1 still at generation %d", snap.Nodes, first.gen)
	}
	// The first connection still serves: a request reaches it.
	run, _, d := e.startRun(t, first, chatReq("m1"))
	if d.GetProviderId() != "p1" {
		t.Fatalf("dispatch %v", d)
	}
	run.Close("test done")
	second := e.connect(t, helloWith("n1", "token-a"))
	if err := first.waitClosed(t); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("replaced connection ended with %v", err)
	}
	second.cancel()
	second.waitClosed(t)
	e.waitUntil(t, "n1 gone", func(s contract.Snapshot) bool { return len(s.Nodes) == 0 })
	refused(t, e, helloWith("n1", "token-b"), "bound to another token")
	// Token b is fine for another node id.
	e.connect(t, helloWith("n2", "token-b"))
}

// TestOpenEdgeStillBindsNodeIDs: with no tokens configured any node may
// join, but a node id stays bound to whatever token it joined with.
func TestOpenEdgeStillBindsNodeIDs(t *testing.T) {
	e := startEdge(t, testConfig())
	e.connect(t, helloWith("n1", ""))
	refused(t, e, helloWith("n1", "something"), "bound to another token")
	e.connect(t, helloWith("n2", "anything"))
}

func TestNodeTokenByHash(t *testing.T) {
	cfg := testConfig()
	cfg.Tokens = []NodeToken{{Hash: auth.Hash("hashed-token"), Nodes: []string{"n1"}}}
	e := startEdge(t, cfg)
	refused(t, e, helloWith("n1", auth.Hash("hashed-token")), "token not accepted")
	e.connect(t, helloWith("n1", "hashed-token"))
}

func TestTokensConfig(t *testing.T) {
	cfg, err := ParseConfig([]byte(`
tokens:
  - plain
  - {token: gpu, nodes: [gpu-1, gpu-2]}
  - {hash: "` + auth.Hash("x") + `"}
`))
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Tokens) != 3 || cfg.Tokens[0].Token != "plain" || cfg.Tokens[1].Nodes[1] != "gpu-2" || cfg.Tokens[2].Hash == "" {
		t.Fatalf("tokens %+v", cfg.Tokens)
	}
	for name, doc := range map[string]string{
		"empty":          `tokens: [""]`,
		"token and hash": `tokens: [{token: a, hash: "` + auth.Hash("a") + `"}]`,
		"bad hash":       `tokens: [{hash: "sha256:12"}]`,
		"empty node":     `tokens: [{token: a, nodes: [""]}]`,
		"unknown field":  `tokens: [{token: a, node: n1}]`,
		"cert, no key":   `tls_cert: /x.crt`,
		"ca, no cert":    `client_ca: /ca.crt`,
		"bad key hash":   `keys: [{name: a, hash: plaintext}]`,
		"admin no name":  `admin_keys: [{hash: "` + auth.Hash("a") + `"}]`,
	} {
		if _, err := ParseConfig([]byte(doc)); err == nil {
			t.Errorf("%s: %s accepted", name, doc)
		}
	}
}

// TestRegression_TwoNodesWithOneNodeIDDoNotReplaceEachOther: two running
// node processes given one node_id replaced each other's connection over
// and over, each replacement cutting the other's runs (18 of 24 requests
// failed). While the first process's connection is live,
// a Hello of the same node_id from another instance is refused (AlreadyExists,
// saying why) and the first keeps its generation and its run; the same
// instance reconnecting replaces its connection as before; once the first
// has been silent two heartbeat intervals, the other gets in.
func TestRegression_TwoNodesWithOneNodeIDDoNotReplaceEachOther(t *testing.T) {
	e := startEdge(t, testConfig())
	first := hello("gpu-1", prov("p", normalized, 1, "m1"))
	first.Instance = "aaaa"
	n := e.connect(t, first)
	run, _, _ := e.startRun(t, n, chatReq("m1"))
	defer run.Close("test")

	other := hello("gpu-1", prov("p", normalized, 1, "m1"))
	other.Instance = "bbbb"
	d := e.dial(t, other)
	m, err := d.stream.Recv()
	if err != nil || !strings.Contains(m.GetHelloRefused().GetReason(), "in use by another running node") {
		t.Fatalf("the other instance: %v %v, want HelloRefused saying the node_id is in use", m, err)
	}
	if _, err := d.stream.Recv(); status.Code(err) != codes.AlreadyExists {
		t.Fatalf("stream ended with %v, want AlreadyExists", err)
	}
	if ended, _ := run.outcome(); ended {
		t.Fatal("the first node's run ended")
	}
	if nodes := e.svc.Snapshot().Nodes; len(nodes) != 1 || nodes[0].Generation != n.gen {
		t.Fatalf("nodes %+v, want gpu-1 at generation %d", nodes, n.gen)
	}

	// Silent for two heartbeat intervals (its heartbeats are lost): the
	// other instance gets in, replacing it.
	e.clk.Advance(2 * testConfig().HeartbeatInterval)
	n2 := e.connect(t, other)
	if n2.gen <= n.gen {
		t.Fatalf("generation %d after %d", n2.gen, n.gen)
	}
	// The same instance reconnecting replaces its own connection at once.
	n3 := e.connect(t, other)
	if n3.gen <= n2.gen {
		t.Fatalf("a reconnect of the same instance: generation %d after %d", n3.gen, n2.gen)
	}
}
