package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"iop/internal/e2e/harness"
	"iop/internal/node"
	"iop/internal/sim"
	"iop/internal/testenv"
)

// writeAtomically replaces path's content the way editors do: a new file
// renamed over the old one.
func writeAtomically(t *testing.T, path, content string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// adminQueue is one entry of GET /admin/v1/queues.
type adminQueue struct {
	Model  string `json:"model"`
	Policy struct {
		MaxQueue int `json:"max_queue"`
	} `json:"policy"`
	Queued int `json:"queued"`
}

// queueOf GETs /admin/v1/queues from base and returns model's entry.
func queueOf(t *testing.T, base, model string) adminQueue {
	t.Helper()
	resp, err := http.Get(base + "/admin/v1/queues")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var qs []adminQueue
	if err := json.NewDecoder(resp.Body).Decode(&qs); err != nil {
		t.Fatal(err)
	}
	for _, q := range qs {
		if q.Model == model {
			return q
		}
	}
	return adminQueue{}
}

// countReloads counts the "config reloaded" lines of c's JSON log whose
// trigger is trigger.
func countReloads(t *testing.T, c *harness.Command, trigger string) int {
	n := 0
	for _, l := range harness.JSONLines(t, c.Log.String()) {
		if l["msg"] == "config reloaded" && l["trigger"] == trigger {
			n++
		}
	}
	return n
}

// TestConfigReloadUnderLoad runs `iop edge --config FILE`, fills a model's
// queue (max_queue 1) behind a held slot, raises max_queue to 2 by
// rewriting the file and sees the next admission queue instead of getting
// 429; then an invalid file is refused with a log line naming the error and
// the running config keeps working; then SIGHUP reloads the file again.
func TestConfigReloadUnderLoad(t *testing.T) {
	harness.Parallel(t)
	_, slowURL := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOllama, Models: []string{"slow-m"}, TokensPerSecond: 50, DefaultMaxTokens: 1000})
	dir := t.TempDir()
	path := filepath.Join(dir, "edge.yaml")
	writeAtomically(t, path, "models:\n  slow: {targets: [slow-m], max_queue: 1}\n")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	edgeCmd := harness.StartCommand(t, ctx, "edge", "--config", path, "--listen", "127.0.0.1:0", "--node-listen", "127.0.0.1:0", "--database", ":memory:", "--log-format", "json")
	ready := edgeCmd.WaitLog(t, "edge ready")
	base := ready["http"].(string)
	nodeCtx, stopNode := context.WithCancel(ctx)
	harness.Node(t, nodeCtx, node.Config{
		NodeID:    "gpu-1",
		Edge:      ready["node_endpoint"].(string),
		Providers: []node.ProviderConfig{{ID: "slow", Type: node.TypeOllama, BaseURL: slowURL, Models: []string{"slow-m"}, Capacity: 1}},
	})
	client := openai.NewClient(option.WithBaseURL(base+"/v1"), option.WithAPIKey("k"), option.WithMaxRetries(0))
	bg := context.Background()
	params := func(model string, maxTokens int64) openai.ChatCompletionNewParams {
		return openai.ChatCompletionNewParams{Model: model, MaxTokens: openai.Int(maxTokens),
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}}
	}
	is429 := func(err error) bool {
		var apiErr *openai.Error
		return errors.As(err, &apiErr) && apiErr.StatusCode == http.StatusTooManyRequests
	}

	holder := client.Chat.Completions.NewStreaming(bg, params("slow", 1000))
	if !holder.Next() {
		t.Fatalf("holder: %v", holder.Err())
	}
	waitCtx, leave := context.WithCancel(bg)
	waiters := make(chan error, 3)
	wait := func() {
		go func() {
			_, err := client.Chat.Completions.New(waitCtx, params("slow", 1))
			waiters <- err
		}()
	}
	wait()
	testenv.Eventually(t, "one queued", func() bool { return queueOf(t, base, "slow").Queued == 1 })
	if _, err := client.Chat.Completions.New(bg, params("slow", 1)); !is429(err) {
		t.Fatalf("with max_queue 1: %v, want 429", err)
	}

	// Raise max_queue to 2 and add an alias while the slot is held and one
	// request waits.
	writeAtomically(t, path, "models:\n  slow: {targets: [slow-m], max_queue: 2}\n  also-slow: {targets: [slow-m]}\n")
	testenv.Eventually(t, "max_queue 2", func() bool { return queueOf(t, base, "slow").Policy.MaxQueue == 2 })
	wait()
	testenv.Eventually(t, "two queued", func() bool { return queueOf(t, base, "slow").Queued == 2 })
	if _, err := client.Chat.Completions.New(bg, params("slow", 1)); !is429(err) {
		t.Fatalf("third waiter with max_queue 2: %v, want 429", err)
	}
	if reloaded := edgeCmd.WaitLog(t, "config reloaded"); fmt.Sprint(reloaded["added"], reloaded["changed"]) != "[also-slow] [slow]" {
		t.Errorf("reload line %v", reloaded)
	}

	// An invalid file is refused, named in the log, and changes nothing.
	writeAtomically(t, path, "models:\n  slow: {targets: [slow-m], max_queue: -4}\n")
	refused := edgeCmd.WaitLog(t, "config reload refused; the running config stays")
	if err, _ := refused["err"].(string); !strings.Contains(err, "models.slow.max_queue -4 is negative") || refused["level"] != "ERROR" {
		t.Errorf("refusal line %v", refused)
	}
	if q := queueOf(t, base, "slow"); q.Policy.MaxQueue != 2 || q.Queued != 2 {
		t.Errorf("after a refused reload: %+v", q)
	}
	leave()
	holder.Close()
	for range 2 {
		if err := <-waiters; !errors.Is(err, context.Canceled) {
			t.Errorf("queued request: %v", err)
		}
	}
	testenv.Eventually(t, "the edge idle", func() bool {
		resp, err := http.Get(base + "/admin/v1/providers")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var ps []struct {
			InFlight int `json:"in_flight"`
			Queued   int `json:"queued"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&ps); err != nil {
			t.Fatal(err)
		}
		return len(ps) == 1 && ps[0].InFlight == 0 && ps[0].Queued == 0
	})
	// The running config still serves, the new alias too.
	for _, model := range []string{"slow", "also-slow"} {
		if _, err := client.Chat.Completions.New(bg, params(model, 1)); err != nil {
			t.Fatalf("%s after the refused reload: %v", model, err)
		}
	}

	// SIGHUP reads the file again (here the fixed one): one reload line
	// says so. The lines are counted by trigger: the file change's own line
	// may reach the log (a pipe from the edge process) after max_queue 3
	// is seen, so a count of every reload line taken now could be one
	// short, and the two lines could then arrive at once.
	writeAtomically(t, path, "models:\n  slow: {targets: [slow-m], max_queue: 3}\n")
	testenv.Eventually(t, "max_queue 3", func() bool { return queueOf(t, base, "slow").Policy.MaxQueue == 3 })
	if n := countReloads(t, edgeCmd, "SIGHUP"); n != 0 {
		t.Fatalf("%d reloads by SIGHUP before the SIGHUP", n)
	}
	if err := edgeCmd.Cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "a SIGHUP reload", func() bool { return countReloads(t, edgeCmd, "SIGHUP") == 1 })
	var sighup map[string]any
	for _, l := range harness.JSONLines(t, edgeCmd.Log.String()) {
		if l["msg"] == "config reloaded" {
			sighup = l
		}
	}
	if sighup["trigger"] != "SIGHUP" {
		t.Errorf("last reload line %v", sighup)
	}

	stopNode()
	cancel()
	if err := <-edgeCmd.Done(); err != nil {
		t.Errorf("edge: %v", err)
	}
}
