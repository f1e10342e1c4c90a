package e2e

// The dashboard test drives a real headless Chromium (Debian's chromium
// package, which `make test` installs when it is missing) against `iop dev`
// started in-process. Its screenshot, dashboard.png, goes to $IOP_ARTIFACTS
// when that is set, else to the test's artifact directory (kept with
// `go test -artifacts -outputdir DIR`, else removed after the test).

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/packages/ssestream"

	"iop/internal/e2e/harness"
	"iop/internal/edge"
	"iop/internal/edge/contract"
	"iop/internal/node"
	"iop/internal/process"
	"iop/internal/sim"
)

// artifactDir is where the test saves files for people to look at.
func artifactDir(t *testing.T) string {
	if dir := os.Getenv("IOP_ARTIFACTS"); dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	return t.ArtifactDir()
}

// TestDashboardInBrowser opens /ui of `iop dev` in headless Chromium, checks
// that it shows the node and both providers, the queue of the demo alias
// from the start and of a served model from its first request, drives load and sees the
// provider's in-flight count rise and fall live (from the events stream),
// sees a refusal listed, and saves a screenshot.
func TestDashboardInBrowser(t *testing.T) {
	harness.ParallelLong(t)
	ctx, cancel := context.WithCancel(context.Background())
	d, err := process.Start(ctx, process.Config{Mode: process.ModeDev, Dev: process.DevConfig{Listen: "127.0.0.1:0", NodeListen: "127.0.0.1:0", ForceSim: true,
		SimCapacity: 4, SimTokensPerSecond: 20, SimTTFT: 10 * time.Millisecond, SimMaxTokens: 100_000}}, process.Deps{Logger: harness.Logger(t, "iop dev")})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		cancel()
		if err := d.Wait(); err != nil {
			t.Errorf("iop dev: %v", err)
		}
	}()
	base := "http://" + d.HTTPAddr

	page := harness.Tab(t, 1280, 860, 90*time.Second)

	const ollama = `[data-provider="dev/sim-ollama"] .in-flight`
	// waitFor waits, in the page, until the JavaScript expression is true.
	waitFor := func(what, expr string) {
		t.Helper()
		if _, err := chromedp.Run(page, chromedp.Poll[bool](expr, chromedp.WithPollingTimeout(30*time.Second))); err != nil {
			text, _ := chromedp.Run(page, chromedp.Evaluate[string]("document.body.innerText"))
			t.Fatalf("page never showed %s: %v\npage text:\n%s", what, err, text)
		}
	}
	textIs := func(sel, want string) string {
		return fmt.Sprintf(`(document.querySelector(%q) || {}).textContent === %q`, sel, want)
	}
	if err := chromedp.Do(page, chromedp.Navigate(base+"/ui")); err != nil {
		t.Fatal(err)
	}
	waitFor("the node", `document.querySelector('[data-node="dev"]') !== null`)
	waitFor("the normalized provider idle", textIs(ollama, "0 / 4"))
	waitFor("the tunnel provider idle", textIs(`[data-provider="dev/sim-openai"] .in-flight`, "0 / 4"))
	waitFor("the live events stream", `document.querySelector('#conn.live') !== null`)
	// A configured alias has its queue listed before any request, with its
	// policy; a served model's appears with its first request.
	waitFor("the demo alias's queue", `(document.querySelector('[data-queue="demo"]') || {}).textContent === "demo01630s"`)

	// Three long answers on sim-ollama: 1000 tokens at 20 tokens/s.
	client := newClient(d)
	var streams []*ssestream.Stream[openai.ChatCompletionChunk]
	for i := range 3 {
		s := client.Chat.Completions.NewStreaming(context.Background(), openai.ChatCompletionNewParams{Model: "sim-ollama",
			MaxTokens: openai.Int(1000), Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(fmt.Sprint("load ", i))}})
		if !s.Next() {
			t.Fatalf("stream %d: %v", i, s.Err())
		}
		defer s.Close()
		streams = append(streams, s)
	}
	waitFor("3 in flight", textIs(ollama, "3 / 4"))
	waitFor("the sim-ollama queue, empty", `(document.querySelector('[data-queue="sim-ollama"]') || {}).textContent === "sim-ollama01630s"`)
	if _, err := client.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{Model: "no-such-model",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("x")}}); err == nil {
		t.Fatal("unknown model answered")
	}
	waitFor("the refusal", `[...document.querySelectorAll('#refusals li')].some(li => li.textContent.includes('404 unknown_model'))`)

	png, err := chromedp.Run(page, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	shot := filepath.Join(artifactDir(t), "dashboard.png")
	if err := os.WriteFile(shot, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s", shot)

	streams[0].Close()
	waitFor("2 in flight", textIs(ollama, "2 / 4"))
	for _, s := range streams[1:] {
		s.Close()
	}
	waitFor("0 in flight", textIs(ollama, "0 / 4"))
	waitFor("a provider in rotation shown available", textIs(`[data-provider="dev/sim-ollama"] .state`, "healthy · available"))

	// A provider whose circuit opened (its model server answers 500) is
	// not shown available; the page reads the admin API again within 10 s.
	_, flakyURL := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOllama, Models: []string{"flaky-m"}, Faults: sim.Faults{ErrorRate: 1}})
	nodeCtx, stopNodes := context.WithCancel(context.Background())
	defer stopNodes()
	harness.Node(t, nodeCtx, node.Config{NodeID: "flaky", Edge: d.NodeAddr,
		Providers: []node.ProviderConfig{{ID: "broken", Type: node.TypeOllama, BaseURL: flakyURL, Models: []string{"flaky-m"}}}})
	for i := 0; i < edge.DefaultBreakerFailures; i++ {
		client.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{Model: "flaky-m",
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("x")}})
	}
	if p, _ := providerSnapshot(d.Service.Snapshot(), "flaky", "broken"); p.Circuit != edge.CircuitOpen {
		t.Fatalf("circuit %q after %d failures, want open", p.Circuit, edge.DefaultBreakerFailures)
	}
	const broken = `[data-provider="flaky/broken"]`
	waitFor("the open circuit", fmt.Sprintf(`(document.querySelector(%q) || {textContent: ""}).textContent.startsWith("circuit")`, broken+" .state"))
	waitFor("the open circuit marked", fmt.Sprintf(`document.querySelector(%q) !== null`, broken+".out"))

	// A node that drains: its provider and its row say so, live.
	_, slowURL := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOllama, Models: []string{"slow-m"}, TokensPerSecond: 20, DefaultMaxTokens: 100_000})
	leaving, err := node.New(node.Config{NodeID: "leaving", Edge: d.NodeAddr,
		Providers: []node.ProviderConfig{{ID: "p", Type: node.TypeOllama, BaseURL: slowURL, Models: []string{"slow-m"}}}}, harness.Logger(t, "node"))
	if err != nil {
		t.Fatal(err)
	}
	leavingDone := make(chan error, 1)
	go func() { leavingDone <- leaving.Run(nodeCtx) }()
	<-leaving.Ready()
	held := client.Chat.Completions.NewStreaming(context.Background(), openai.ChatCompletionNewParams{Model: "slow-m",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hold")}})
	if !held.Next() {
		t.Fatalf("stream on the leaving node: %v", held.Err())
	}
	leaving.Drain("test")
	waitFor("the draining provider", textIs(`[data-provider="leaving/p"] .state`, "draining · no new requests"))
	waitFor("the draining node", `document.querySelector('tr.draining[data-node="leaving"]') !== null`)
	held.Close()
	if err := <-leavingDone; err != nil {
		t.Fatalf("leaving node: %v", err)
	}

	// An orphan (its node gone) as the admin API lists it, rendered by the
	// page. (The edge forgets an orphan with nothing in flight at once, so
	// the page may never see one of its own.)
	orphan, err := chromedp.Run(page, chromedp.Evaluate[string](`(() => {
		state.providers.set("gone/p", {node_id: "gone", provider_id: "p", type: "ollama", capacity: 2, in_flight: 0, long_capacity: 2,
			long_in_flight: 0, queued: 0, load_ratio: 0, health: "unhealthy", models: ["m"], capabilities: [], status: "orphan", circuit: "closed"});
		render();
		return document.querySelector('[data-provider="gone/p"] .state').textContent;
	})()`))
	if err != nil {
		t.Fatal(err)
	}
	if orphan != "orphan · node gone" {
		t.Errorf("an orphan is shown %q", orphan)
	}
	png, err = chromedp.Run(page, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(artifactDir(t), "dashboard-states.png"), png, 0o644); err != nil {
		t.Fatal(err)
	}
}

// providerSnapshot is node's provider id in s.
func providerSnapshot(s contract.Snapshot, node, id string) (contract.ProviderSnapshot, bool) {
	for _, p := range s.Providers {
		if p.NodeID == node && p.ProviderID == id {
			return p, true
		}
	}
	return contract.ProviderSnapshot{}, false
}

// TestDashboardShowsUnmatchedTargets opens /ui of a real edge with a node
// in headless Chromium: an alias with a target no node serves shows it
// beside its queue; an alias whose targets all match shows nothing.
func TestDashboardShowsUnmatchedTargets(t *testing.T) {
	harness.Parallel(t)
	_, url := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOllama, Models: []string{"tiny:latest"}})
	ctx, cancel := context.WithCancel(context.Background())
	e := harness.Edge(t, ctx, harness.EdgeConfig(map[string]edge.ModelConfig{
		"coder": {Targets: []string{"tiny", "tinyy"}},
		"fine":  {Targets: []string{"tiny"}},
	}))
	t.Cleanup(cancel)
	harness.Node(t, ctx, node.Config{NodeID: "n1", Edge: e.NodeAddr, DiscoveryInterval: discoveryInterval,
		Providers: []node.ProviderConfig{{ID: "a", Type: node.TypeOllama, BaseURL: url}}})
	waitSnapshot(t, e, func(s contract.Snapshot) bool { return len(s.Providers) == 1 && s.Providers[0].Healthy })

	page := harness.Tab(t, 800, 600, 90*time.Second)
	if err := chromedp.Do(page, chromedp.Navigate("http://"+e.HTTPAddr+"/ui")); err != nil {
		t.Fatal(err)
	}
	const shown = `(document.querySelector('[data-queue="coder"] .unmatched') || {}).textContent === "unmatched: tinyy" &&
		document.querySelector('[data-queue="fine"]') !== null && document.querySelector('[data-queue="fine"] .unmatched') === null`
	if _, err := chromedp.Run(page, chromedp.Poll[bool](shown, chromedp.WithPollingTimeout(30*time.Second))); err != nil {
		text, _ := chromedp.Run(page, chromedp.Evaluate[string]("document.body.innerText"))
		t.Fatalf("the page never showed coder's unmatched target: %v\npage text:\n%s", err, text)
	}
}
