package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"iop/internal/e2e/harness"
	"iop/internal/node"
	"iop/internal/sim"
	"iop/internal/testenv"
)

// discoveryInterval is the node's discovery interval in these tests: a
// model created while the node runs must be listed within about one.
const discoveryInterval = 200 * time.Millisecond

// discoveredServer is a model server behind a zero-config provider (type
// ollama and base_url, nothing else) whose models and life a test changes.
type discoveredServer struct {
	url        string
	toolsModel string // answers chat with tools ("tools" in /api/show)
	plainModel string // answers chat, without tools ("completion" alone)
	embedModel string // answers embeddings only ("embedding")
	create     func(t *testing.T, name string)
	remove     func(t *testing.T, name string)
	stop       func(t *testing.T)
	start      func(t *testing.T)
	// mark returns a position in what the server saw so far, for the
	// checks below to look only at later requests.
	mark func() int
	// checkToolsReached checks that of the two chat requests to
	// toolsModel, the same but for tools, the one sent after withTools
	// (and answered body) reached the server with its tools and the one
	// sent after without did without.
	checkToolsReached func(t *testing.T, without, withTools int, body []byte)
	// checkEmbedReached checks that the server embedded with embedModel
	// after mark.
	checkEmbedReached func(t *testing.T, mark int)
}

// simDiscoveredServer is an Ollama simulator serving a tools model, a
// plain one and an embedding model.
func simDiscoveredServer(t *testing.T) *discoveredServer {
	t.Helper()
	s, err := sim.New(sim.Config{Protocol: sim.ProtocolOllama, Models: []string{"coder:latest", "plain:latest", "embed:latest"},
		Capabilities: map[string][]string{
			"coder:latest": {"completion", "tools", "thinking"},
			"plain:latest": {"completion"},
			"embed:latest": {"embedding"},
		}}, harness.Logger(t, "node"))
	if err != nil {
		t.Fatal(err)
	}
	u, stop, err := s.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if stop != nil {
			stop()
		}
	})
	d := &discoveredServer{url: u, toolsModel: "coder:latest", plainModel: "plain:latest", embedModel: "embed:latest"}
	d.create = func(t *testing.T, name string) {
		if err := s.AddModel(name, "completion"); err != nil {
			t.Fatal(err)
		}
	}
	d.remove = func(t *testing.T, name string) { s.RemoveModel(name) }
	d.stop = func(t *testing.T) {
		stop()
		stop = nil
	}
	d.start = func(t *testing.T) {
		again, st, err := s.Start(strings.TrimPrefix(u, "http://"))
		if err != nil || again != u {
			t.Fatalf("restarting the sim at %s: %s %v", u, again, err)
		}
		stop = st
	}
	d.mark = func() int { return len(s.Seen()) }
	d.checkToolsReached = func(t *testing.T, _, withTools int, body []byte) {
		// The sim calls a tool only when the request defined it.
		if !strings.Contains(string(body), `"tool_calls"`) || !strings.Contains(string(body), "get_weather") {
			t.Fatalf("the answer calls no tool: %s", body)
		}
		if !slices.ContainsFunc(s.Seen()[withTools:], func(r sim.SeenRequest) bool { return r.Path == "/api/chat" && r.Model == "coder:latest" }) {
			t.Fatalf("the server got no chat for coder:latest: %+v", s.Seen()[withTools:])
		}
	}
	d.checkEmbedReached = func(t *testing.T, mark int) {
		if !slices.ContainsFunc(s.Seen()[mark:], func(r sim.SeenRequest) bool { return r.Path == "/api/embed" && r.Model == "embed:latest" }) {
			t.Fatalf("the server embedded nothing with embed:latest: %+v", s.Seen()[mark:])
		}
	}
	return d
}

// TestDiscoveryEndToEnd: a real edge and node (gRPC over TCP) with a
// zero-config Ollama provider (type and base_url alone) in front of a
// simulated Ollama whose models change and which stops and starts again:
// the provider serves what the server lists, each model with the
// capabilities its /api/show says (a tools request reaches the tools model
// with its tools; embeddings reach the embedding model; neither reaches a
// model without), a model created after the node started is listed (and
// served) within about one discovery interval, a removed one disappears,
// and a stopped server takes the provider out of rotation until it answers
// again, with no restart of edge or node.
func TestDiscoveryEndToEnd(t *testing.T) {
	harness.Parallel(t)
	runDiscoveryEndToEnd(t, simDiscoveredServer(t))
}

// runDiscoveryEndToEnd runs the discovery scenario against d.
func runDiscoveryEndToEnd(t *testing.T, d *discoveredServer) {
	ctx, cancel := context.WithCancel(context.Background())
	e := harness.Edge(t, ctx, harness.EdgeConfig(nil))
	t.Cleanup(cancel)
	harness.Node(t, ctx, node.Config{NodeID: "gpu-1", Edge: e.NodeAddr, DiscoveryInterval: discoveryInterval,
		Providers: []node.ProviderConfig{{ID: "ollama", Type: node.TypeOllama, BaseURL: d.url}}})
	c := &http.Client{Transport: &http.Transport{}}
	t.Cleanup(c.CloseIdleConnections)
	base := "http://" + e.HTTPAddr
	// listed returns the names /v1/models lists and those /api/tags lists.
	listed := func(t *testing.T) (ids, names []string) {
		t.Helper()
		var models struct {
			Data []struct {
				ID string `json:"id"`
			} `json:"data"`
		}
		getJSON(t, e, "/v1/models", &models)
		var tags struct {
			Models []struct {
				Name string `json:"name"`
			} `json:"models"`
		}
		getJSON(t, e, "/api/tags", &tags)
		for _, m := range models.Data {
			ids = append(ids, m.ID)
		}
		for _, m := range tags.Models {
			names = append(names, m.Name)
		}
		return ids, names
	}
	// waitListed waits until both list name (want) or neither does.
	waitListed := func(t *testing.T, what, name string, want bool) {
		t.Helper()
		testenv.Eventually(t, what, func() bool {
			ids, names := listed(t)
			return slices.Contains(ids, name) == want && slices.Contains(names, name) == want
		})
	}
	for _, m := range []string{d.toolsModel, d.plainModel, d.embedModel} {
		waitListed(t, "the discovered models are listed", m, true)
	}
	// The names the server lists, all of them: nothing configured. The
	// orders differ by design: /v1/models by name, /api/tags the most
	// recently modified first, as Ollama sorts it.
	if ids, names := listed(t); len(ids) != 3 || !slices.Equal(slices.Sorted(slices.Values(ids)), slices.Sorted(slices.Values(names))) {
		t.Fatalf("/v1/models lists %v, /api/tags %v, want the server's three models", ids, names)
	}

	chat := func(t *testing.T, model, extra string) (int, []byte) {
		t.Helper()
		return postTo(t, c, base+"/v1/chat/completions", fmt.Sprintf(
			`{"model":%q,"max_tokens":4,"messages":[{"role":"user","content":"what is the weather in Paris? use get_weather"}]%s}`, model, extra))
	}
	const tools = `,"tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}]`

	t.Run("tools reach a tools model", func(t *testing.T) {
		without := d.mark()
		if status, body := chat(t, d.toolsModel, ""); status != http.StatusOK {
			t.Fatalf("without tools: %d %s", status, body)
		}
		withTools := d.mark()
		status, body := chat(t, d.toolsModel, tools)
		if status != http.StatusOK {
			t.Fatalf("%d %s", status, body)
		}
		d.checkToolsReached(t, without, withTools, body)
	})
	t.Run("tools are refused for a model without", func(t *testing.T) {
		for _, m := range []string{d.plainModel, d.embedModel} {
			if status, body := chat(t, m, tools); status != http.StatusBadRequest || !strings.Contains(string(body), "tools") {
				t.Fatalf("%s: %d %s", m, status, body)
			}
		}
	})
	t.Run("embeddings reach the embedding model", func(t *testing.T) {
		mark := d.mark()
		status, body := postTo(t, c, base+"/v1/embeddings", fmt.Sprintf(`{"model":%q,"input":["a","b"]}`, d.embedModel))
		var got struct {
			Data []struct {
				Embedding []float64 `json:"embedding"`
			} `json:"data"`
		}
		if status != http.StatusOK || json.Unmarshal(body, &got) != nil || len(got.Data) != 2 || len(got.Data[0].Embedding) == 0 {
			t.Fatalf("/v1/embeddings: %d %s", status, body)
		}
		d.checkEmbedReached(t, mark)
		mark = d.mark()
		status, body = postTo(t, c, base+"/api/embed", fmt.Sprintf(`{"model":%q,"input":"a"}`, d.embedModel))
		if status != http.StatusOK || !strings.Contains(string(body), `"embeddings":[[`) {
			t.Fatalf("/api/embed: %d %s", status, body)
		}
		d.checkEmbedReached(t, mark)
		if status, body := postTo(t, c, base+"/v1/embeddings", fmt.Sprintf(`{"model":%q,"input":"a"}`, d.toolsModel)); status != http.StatusBadRequest {
			t.Fatalf("embeddings of a model without: %d %s", status, body)
		}
		if status, body := chat(t, d.embedModel, ""); status != http.StatusBadRequest || !strings.Contains(string(body), "completion") {
			t.Fatalf("chat with an embedding model: %d %s", status, body)
		}
	})
	t.Run("show and tags say what the server says", func(t *testing.T) {
		_, data := postTo(t, c, base+"/api/show", fmt.Sprintf(`{"model":%q}`, d.toolsModel))
		var show struct {
			Capabilities []string       `json:"capabilities"`
			Details      map[string]any `json:"details"`
		}
		if err := json.Unmarshal(data, &show); err != nil || !slices.Contains(show.Capabilities, "tools") ||
			slices.Contains(show.Capabilities, "embedding") || show.Details["format"] != "gguf" {
			t.Fatalf("/api/show: %s", data)
		}
		_, data = postTo(t, c, base+"/api/show", fmt.Sprintf(`{"model":%q}`, d.embedModel))
		if err := json.Unmarshal(data, &show); err != nil || !slices.Equal(show.Capabilities, []string{"embedding"}) {
			t.Fatalf("/api/show of the embedding model: %s", data)
		}
	})

	t.Run("a model created later is listed and served", func(t *testing.T) {
		d.create(t, "later:latest")
		waitListed(t, "the new model is listed", "later:latest", true)
		if status, body := chat(t, "later", ""); status != http.StatusOK {
			t.Fatalf("chat with the new model: %d %s", status, body)
		}
		d.remove(t, "later:latest")
		waitListed(t, "the removed model is no longer listed", "later:latest", false)
	})

	t.Run("a stopped server leaves rotation and comes back", func(t *testing.T) {
		health := func() bool {
			for _, p := range e.Service.Snapshot().Providers {
				if p.ProviderID == "ollama" && p.Status == "available" {
					return p.Healthy
				}
			}
			t.Fatal("no provider ollama")
			return false
		}
		d.stop(t)
		testenv.Eventually(t, "the provider is unhealthy", func() bool { return !health() })
		if status, body := chat(t, d.toolsModel, ""); status != http.StatusServiceUnavailable {
			t.Fatalf("chat while the server is down: %d %s", status, body)
		}
		d.start(t)
		testenv.Eventually(t, "the provider is healthy again", health)
		if status, body := chat(t, d.toolsModel, tools); status != http.StatusOK {
			t.Fatalf("chat after the server came back: %d %s", status, body)
		}
	})
	waitIdle(t, e)
}
