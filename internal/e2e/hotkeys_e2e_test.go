package e2e

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"iop/internal/auth"
	"iop/internal/e2e/harness"
	"iop/internal/node"
	"iop/internal/sim"
	"iop/internal/testenv"
)

// TestHotKeysAndTokensReload runs `iop edge --config FILE` whose client
// keys live in a keys_file (read again only at SIGHUP) and whose node join
// tokens live in FILE (read again when it changes), and changes both while
// it runs: a key added works at once, a removed key gets 401 at once while
// its request in flight finishes, a key past its expires_at gets 401, a
// changed limit applies; a node with a token added by the reload joins.
func TestHotKeysAndTokensReload(t *testing.T) {
	harness.Parallel(t)
	_, simURL := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOllama, Models: []string{"m"}, TokensPerSecond: 40, DefaultMaxTokens: 40})
	dir := t.TempDir()
	path, keysPath := filepath.Join(dir, "edge.yaml"), filepath.Join(dir, "keys.yaml")
	secretA, hashA := auth.Generate()
	secretB, hashB := auth.Generate()
	secretC, hashC := auth.Generate()
	writeKeys := func(entries ...string) {
		writeAtomically(t, keysPath, "keys:\n"+strings.Join(entries, ""))
	}
	key := func(name, hash, extra string) string {
		return fmt.Sprintf("  - {name: %s, hash: %q%s}\n", name, hash, extra)
	}
	writeKeys(key("a", hashA, ""))
	edgeYAML := func(tokens ...string) string {
		return fmt.Sprintf("keys_file: %s\ntokens: [%s]\n", keysPath, strings.Join(tokens, ", "))
	}
	writeAtomically(t, path, edgeYAML("join-1"))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	edgeCmd := harness.StartCommand(t, ctx, "edge", "--config", path, "--listen", "127.0.0.1:0", "--node-listen", "127.0.0.1:0", "--database", ":memory:", "--log-format", "json")
	ready := edgeCmd.WaitLog(t, "edge ready")
	base, nodeAddr := ready["http"].(string), ready["node_endpoint"].(string)
	nodeCtx, stopNodes := context.WithCancel(ctx)
	defer stopNodes()
	harness.Node(t, nodeCtx, node.Config{NodeID: "n1", Edge: nodeAddr, Token: "join-1",
		Providers: []node.ProviderConfig{{ID: "p1", Type: node.TypeOllama, BaseURL: simURL, Models: []string{"m"}, Capacity: 4}}})

	status := func(secret string) int {
		t.Helper()
		client := openai.NewClient(option.WithBaseURL(base+"/v1"), option.WithAPIKey(secret), option.WithMaxRetries(0))
		_, err := client.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{Model: "m", MaxTokens: openai.Int(1),
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}})
		var apiErr *openai.Error
		switch {
		case err == nil:
			return http.StatusOK
		case errors.As(err, &apiErr):
			return apiErr.StatusCode
		}
		t.Fatalf("request: %v", err)
		return 0
	}
	hup := func(n int) {
		t.Helper()
		if err := edgeCmd.Cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, fmt.Sprintf("SIGHUP reload %d", n), func() bool { return countReloads(t, edgeCmd, "SIGHUP") == n })
	}
	if s := status(secretA); s != 200 {
		t.Fatalf("key a: %d", s)
	}
	if s := status(secretB); s != 401 {
		t.Fatalf("key b before it is added: %d, want 401", s)
	}

	// Added: b works after SIGHUP, without a restart.
	writeKeys(key("a", hashA, ""), key("b", hashB, ""))
	hup(1)
	if a, b := status(secretA), status(secretB); a != 200 || b != 200 {
		t.Fatalf("after adding b: a %d, b %d", a, b)
	}
	if l := lastLog(t, edgeCmd, "config reloaded"); fmt.Sprint(l["keys_added"]) != "[b]" {
		t.Errorf("reload line %v", l)
	}

	// A team and a price added: the reload line names them.
	writeAtomically(t, keysPath, "teams:\n  - {name: t1}\nprices:\n  m: {input: 1, output: 2}\nkeys:\n"+key("a", hashA, "")+key("b", hashB, ""))
	hup(2)
	if l := lastLog(t, edgeCmd, "config reloaded"); fmt.Sprint(l["teams_added"]) != "[t1]" || fmt.Sprint(l["prices_added"]) != "[m]" || l["keys_changed"] != nil {
		t.Errorf("reload line after adding a team and a price: %v", l)
	}

	// Removed while a request of a is in flight: a gets 401 at once, its
	// stream finishes.
	clientA := openai.NewClient(option.WithBaseURL(base+"/v1"), option.WithAPIKey(secretA), option.WithMaxRetries(0))
	stream := clientA.Chat.Completions.NewStreaming(context.Background(), openai.ChatCompletionNewParams{Model: "m",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}})
	if !stream.Next() {
		t.Fatalf("stream of a: %v", stream.Err())
	}
	writeKeys(key("b", hashB, ""))
	hup(3)
	if s := status(secretA); s != 401 {
		t.Fatalf("removed key a: %d, want 401", s)
	}
	chunks := 1
	for stream.Next() {
		chunks++
	}
	if err := stream.Err(); err != nil || chunks < 10 {
		t.Fatalf("a's stream in flight across its removal: %v after %d chunks", err, chunks)
	}
	stream.Close()

	// Rotation's overlap: c is listed with expires_at in the past (refused)
	// beside b; b gets a limit of 1 request per minute.
	writeKeys(key("b", hashB, ", requests_per_minute: 1"), key("c", hashC, fmt.Sprintf(", expires_at: %q", time.Now().Add(-time.Second).UTC().Format(time.RFC3339))))
	hup(4)
	if s := status(secretC); s != 401 {
		t.Errorf("key c past its expires_at: %d, want 401", s)
	}
	if first, second := status(secretB), status(secretB); first != 200 || second != 429 {
		t.Errorf("b with requests_per_minute 1: %d then %d, want 200 then 429", first, second)
	}

	// A broken keys file is refused; the keys stay.
	if err := os.WriteFile(keysPath, []byte("keys:\n  - {name: b, hash: nonsense}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := edgeCmd.Cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	refused := edgeCmd.WaitLog(t, "config reload refused; the running config stays")
	if err, _ := refused["err"].(string); !strings.Contains(err, "hash") {
		t.Errorf("refusal line %v", refused)
	}
	if s := status(secretC); s != 401 {
		t.Errorf("key c after a refused reload: %d", s)
	}

	// Join tokens: a node presenting join-2 is refused until the file adds
	// it (the file changed: no SIGHUP needed).
	writeKeys(key("b", hashB, ""))
	var n2Log harness.Buffer
	harness.ShowOnFailure(t, "node n2", &n2Log)
	agent, err := node.New(node.Config{NodeID: "n2", Edge: nodeAddr, Token: "join-2", ReconnectMin: 20 * time.Millisecond, ReconnectMax: 50 * time.Millisecond,
		Providers: []node.ProviderConfig{{ID: "p2", Type: node.TypeOllama, BaseURL: simURL, Models: []string{"m"}}}}, slog.New(slog.NewJSONHandler(&n2Log, nil)))
	if err != nil {
		t.Fatal(err)
	}
	agentDone := make(chan error, 1)
	go func() { agentDone <- agent.Run(nodeCtx) }()
	edgeCmd.WaitLog(t, "node refused")
	// The refused node says what to change.
	testenv.Eventually(t, "the node's refusal line with its hint", func() bool {
		for _, l := range harness.JSONLines(t, n2Log.String()) {
			if l["msg"] == "edge refused the node" && strings.Contains(fmt.Sprint(l["hint"]), "tokens: in the edge config") {
				return true
			}
		}
		return false
	})
	writeAtomically(t, path, edgeYAML("join-1", "join-2"))
	select {
	case <-agent.Ready():
	case <-time.After(10 * time.Second):
		t.Fatalf("node with join-2 not accepted after the reload:\n%s", edgeCmd.Log.String())
	}
	// The node may be accepted before the reload's line is written.
	testenv.Eventually(t, "the reload line of join-2", func() bool {
		l := lastLog(t, edgeCmd, "config reloaded")
		return l["trigger"] == "file changed" && l["tokens_added"] == float64(1)
	})
	stopNodes()
	if err := <-agentDone; err != nil {
		t.Errorf("node n2: %v", err)
	}
}
