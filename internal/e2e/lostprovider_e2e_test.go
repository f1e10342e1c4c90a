package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"iop/internal/e2e/harness"
	"iop/internal/edge/adminwire"
	"iop/internal/testenv"
)

// startSimAt runs `iop sim` with args as a child process and waits
// until it answers on addr; it is killed at cleanup.
func startSimAt(t *testing.T, bin, addr string, args ...string) {
	t.Helper()
	logs := &harness.Buffer{}
	cmd := exec.Command(bin, append([]string{"sim", "--listen", addr, "--log-level", "warn"}, args...)...)
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("sim %s output:\n%s", addr, logs.String())
		}
	})
	testenv.Eventually(t, "iop sim on "+addr+" answers", func() bool {
		status, _ := call(t, context.Background(), http.MethodGet, "http://"+addr+"/api/version", "")
		return status == http.StatusOK
	})
}

// adminProviders reads GET /admin/v1/providers of the edge at base.
func adminProviders(t *testing.T, base string) []adminwire.Provider {
	t.Helper()
	status, b := call(t, context.Background(), http.MethodGet, base+"/admin/v1/providers", "")
	var ps []adminwire.Provider
	if status != http.StatusOK || json.Unmarshal(b, &ps) != nil {
		t.Fatalf("GET /admin/v1/providers: %d %s", status, b)
	}
	return ps
}

func findProvider(ps []adminwire.Provider, node, id string) (adminwire.Provider, bool) {
	for _, p := range ps {
		if p.NodeID == node && p.ProviderID == id {
			return p, true
		}
	}
	return adminwire.Provider{}, false
}

// httpAnswer is one HTTP answer: status, headers and whole body.
type httpAnswer struct {
	status int
	header http.Header
	body   []byte
	err    error
}

// postAsync posts a JSON body on its own goroutine.
func postAsync(url, body string) <-chan httpAnswer {
	ch := make(chan httpAnswer, 1)
	go func() {
		resp, err := http.Post(url, "application/json", strings.NewReader(body))
		if err != nil {
			ch <- httpAnswer{err: err}
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		ch <- httpAnswer{resp.StatusCode, resp.Header, b, err}
	}()
	return ch
}

func awaitAnswer(t *testing.T, ch <-chan httpAnswer) httpAnswer {
	t.Helper()
	select {
	case a := <-ch:
		if a.err != nil {
			t.Fatalf("request failed: %v", a.err)
		}
		return a
	case <-time.After(20 * time.Second):
		t.Fatal("no answer")
	}
	return httpAnswer{}
}

// toolsChat is a chat request for model that declares a tool: only a
// provider with the capability "tools" may take it.
func toolsChat(model string, stream bool) string {
	return fmt.Sprintf(`{"model":%q,"stream":%v,"max_tokens":4,"messages":[{"role":"user","content":"what is the weather"}],`+
		`"tools":[{"type":"function","function":{"name":"weather","parameters":{"type":"object","properties":{}}}}]}`, model, stream)
}

// wantUnavailable fails unless a is a 503 provider_unavailable with a
// Retry-After, in the OpenAI error shape.
func wantUnavailable(t *testing.T, what string, a httpAnswer) {
	t.Helper()
	_, _, code := openAIError(t, a.header, a.body)
	if a.status != http.StatusServiceUnavailable || code != "provider_unavailable" || a.header.Get("Retry-After") == "" {
		t.Fatalf("%s: %d %q (Retry-After %q) %s; want 503 provider_unavailable with Retry-After, never 400",
			what, a.status, code, a.header.Get("Retry-After"), a.body)
	}
}

// TestLostToolsProviderIsUnavailableE2E runs every part as its own process:
// `iop edge`, two `iop node`s and two `iop sim`s. Model m is served by a
// plain provider and by the only provider with "tools", whose simulator
// never answers (so its requests wait before their first byte). Before the
// tools provider ever connected, a tools request is a bad request (400).
// Then one tools request runs on it (streamed; within its retry window:
// no byte yet) and two more are queued for it; its node is killed
// (SIGKILL). Each of the three gets 503 provider_unavailable with
// Retry-After, never 400; so does a fresh tools request while the node may
// come back; a plain request still gets its answer.
func TestLostToolsProviderIsUnavailableE2E(t *testing.T) {
	harness.Parallel(t)
	dir := t.TempDir()
	bin := harness.IOP(t)
	toolsSim, plainSim := testenv.ProcessAddr(t), testenv.ProcessAddr(t)
	startSimAt(t, bin, toolsSim, "--protocol", "ollama", "--model", "m", "--hang")
	startSimAt(t, bin, plainSim, "--protocol", "ollama", "--model", "m")
	httpAddr, nodeAddr := testenv.ProcessAddr(t), testenv.ProcessAddr(t)
	startEdgeProcess(t, bin, httpAddr, nodeAddr, filepath.Join(dir, "edge.db"))
	base := "http://" + httpAddr

	nodeConfig := func(name, provider, simAddr, capabilities string, capacity int) string {
		path := filepath.Join(dir, name+".yaml")
		yaml := fmt.Sprintf("node_id: %s\nedge: %s\nreconnect_min: 50ms\nreconnect_max: 200ms\nproviders:\n"+
			"  - {id: %s, type: ollama, base_url: %q, models: [m], capacity: %d, capabilities: [%s]}\n",
			name, nodeAddr, provider, "http://"+simAddr, capacity, capabilities)
		if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	harness.StartProgram(t, nil, "iop node", bin, "node", "--log-level", "warn", "--config", nodeConfig("plain-node", "plain", plainSim, "", 4))
	testenv.Eventually(t, "the plain provider is available", func() bool {
		p, ok := findProvider(adminProviders(t, base), "plain-node", "plain")
		return ok && p.Status == "available"
	})

	// No live or configured provider has tools: a bad request.
	status, b := call(t, context.Background(), http.MethodPost, base+"/v1/chat/completions", toolsChat("m", false))
	if status != http.StatusBadRequest || !bytes.Contains(b, []byte("unsupported_capability")) {
		t.Fatalf("tools request with no tools provider: %d %s, want 400 unsupported_capability", status, b)
	}

	toolsNode := harness.StartProgram(t, nil, "iop node", bin, "node", "--log-level", "warn", "--config", nodeConfig("tools-node", "tools", toolsSim, "tools", 1))
	testenv.Eventually(t, "the tools provider is available", func() bool {
		p, ok := findProvider(adminProviders(t, base), "tools-node", "tools")
		return ok && p.Status == "available"
	})
	running := postAsync(base+"/v1/chat/completions", toolsChat("m", true))
	testenv.Eventually(t, "the tools provider holds the first request", func() bool {
		p, _ := findProvider(adminProviders(t, base), "tools-node", "tools")
		return p.InFlight == 1
	})
	queued1 := postAsync(base+"/v1/chat/completions", toolsChat("m", false))
	queued2 := postAsync(base+"/v1/chat/completions", toolsChat("m", true))
	testenv.Eventually(t, "two requests queued for the tools provider", func() bool {
		p, _ := findProvider(adminProviders(t, base), "tools-node", "tools")
		return p.Queued == 2
	})

	toolsNode.Signal(t, syscall.SIGKILL)
	wantUnavailable(t, "the request before its first byte", awaitAnswer(t, running))
	wantUnavailable(t, "the first queued request", awaitAnswer(t, queued1))
	wantUnavailable(t, "the second queued request", awaitAnswer(t, queued2))
	wantUnavailable(t, "a fresh tools request while its node may come back",
		awaitAnswer(t, postAsync(base+"/v1/chat/completions", toolsChat("m", false))))

	if status, b := call(t, context.Background(), http.MethodPost, base+"/v1/chat/completions", chatBody("m", false, 3)); status != http.StatusOK {
		t.Fatalf("a plain request after the loss: %d %s", status, b)
	}
	testenv.Eventually(t, "the tools provider is gone from /admin/v1/providers", func() bool {
		_, ok := findProvider(adminProviders(t, base), "tools-node", "tools")
		return !ok
	})
}
