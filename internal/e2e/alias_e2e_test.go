package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"iop/internal/auth"
	"iop/internal/e2e/harness"
	"iop/internal/edge"
	"iop/internal/edge/adminwire"
	"iop/internal/edge/contract"
	"iop/internal/node"
	"iop/internal/process"
	"iop/internal/sim"
	"iop/internal/status"
)

// TestRegression_AliasTargetWithoutTag: an alias target written without a
// tag ("tiny") names the model a discovered Ollama provider lists as
// "tiny:latest" (Ollama's rule: no tag means latest). With a real edge and
// node, an alias of targets [tiny, other] over a provider discovering
// "tiny:latest" and one configured with "other", each of capacity 1, two
// requests at a time share the alias's requests between both providers,
// and the discovered one is sent its own spelling, "tiny:latest". Before
// the name rule reached alias targets, "tiny" matched nothing and every
// request went to "other".
func TestRegression_AliasTargetWithoutTag(t *testing.T) {
	harness.Parallel(t)
	tiny, tinyURL := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOllama, Models: []string{"tiny:latest"}, TTFT: 200 * time.Millisecond})
	other, otherURL := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOllama, Models: []string{"other"}, TTFT: 200 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	e := harness.Edge(t, ctx, harness.EdgeConfig(map[string]edge.ModelConfig{"coder": {Targets: []string{"tiny", "other"}}}))
	t.Cleanup(cancel)
	harness.Node(t, ctx, node.Config{NodeID: "n1", Edge: e.NodeAddr, DiscoveryInterval: discoveryInterval, Providers: []node.ProviderConfig{
		{ID: "a", Type: node.TypeOllama, BaseURL: tinyURL, Capacity: 1},
		{ID: "b", Type: node.TypeOllama, BaseURL: otherURL, Models: []string{"other"}, Capacity: 1},
	}})
	waitSnapshot(t, e, func(s contract.Snapshot) bool {
		for _, p := range s.Providers {
			if p.ProviderID == "a" && p.Healthy && slices.Contains(p.Models, "tiny:latest") {
				return true
			}
		}
		return false
	})

	c := &http.Client{Transport: &http.Transport{}}
	t.Cleanup(c.CloseIdleConnections)
	const requests = 6
	var wg sync.WaitGroup
	errs := make(chan string, requests)
	for range requests / 2 {
		for range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				status, body := postTo(t, c, "http://"+e.HTTPAddr+"/v1/chat/completions",
					`{"model":"coder","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`)
				if status != http.StatusOK {
					errs <- fmt.Sprintf("%d %s", status, body)
				}
			}()
		}
		wg.Wait()
	}
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	chats := func(s *sim.Server, model string) (n int) {
		for _, r := range s.Seen() {
			if r.Path == "/api/chat" {
				if r.Model != model {
					t.Errorf("%s got a chat for %q", model, r.Model)
				}
				n++
			}
		}
		return n
	}
	nTiny, nOther := chats(tiny, "tiny:latest"), chats(other, "other")
	if nTiny == 0 || nOther == 0 || nTiny+nOther != requests {
		t.Fatalf("tiny:latest got %d chats, other %d; want the %d requests shared by both", nTiny, nOther, requests)
	}
}

// TestAliasUnmatchedTargetsEndToEnd: with a real edge and node, an alias
// whose only target no node serves (a typo) is answered 404 with the
// reason, in each API's error shape (OpenAI, Anthropic, Ollama), not 503;
// GET /admin/v1/queues lists every alias's targets and unmatched targets,
// and iop status warns of them.
func TestAliasUnmatchedTargetsEndToEnd(t *testing.T) {
	harness.Parallel(t)
	_, url := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOllama, Models: []string{"tiny:latest"}})
	ctx, cancel := context.WithCancel(context.Background())
	e := harness.Edge(t, ctx, harness.EdgeConfig(map[string]edge.ModelConfig{
		"coder": {Targets: []string{"tiny", "other"}},
		"typo":  {Targets: []string{"tinyy"}},
	}))
	t.Cleanup(cancel)
	harness.Node(t, ctx, node.Config{NodeID: "n1", Edge: e.NodeAddr, DiscoveryInterval: discoveryInterval,
		Providers: []node.ProviderConfig{{ID: "a", Type: node.TypeOllama, BaseURL: url}}})
	waitSnapshot(t, e, func(s contract.Snapshot) bool {
		return len(s.Providers) == 1 && s.Providers[0].Healthy
	})
	c := &http.Client{Transport: &http.Transport{}}
	t.Cleanup(c.CloseIdleConnections)
	base := "http://" + e.HTTPAddr
	const reason = "alias typo: no configured target is served by any node: tinyy"
	for _, tc := range []struct {
		path, body string
		message    func([]byte) (string, error)
		want       string
	}{
		{"/v1/chat/completions", `{"model":"typo","messages":[{"role":"user","content":"hi"}]}`, func(b []byte) (string, error) {
			var v struct {
				Error struct{ Message, Type, Code string }
			}
			err := json.Unmarshal(b, &v)
			return v.Error.Type + " " + v.Error.Code + " " + v.Error.Message, err
		}, "invalid_request_error model_not_found " + reason},
		{"/v1/messages", `{"model":"typo","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`, func(b []byte) (string, error) {
			var v struct {
				Type  string
				Error struct{ Type, Message string }
			}
			err := json.Unmarshal(b, &v)
			return v.Type + " " + v.Error.Type + " " + v.Error.Message, err
		}, "error not_found_error " + reason},
		{"/api/chat", `{"model":"typo","messages":[{"role":"user","content":"hi"}]}`, func(b []byte) (string, error) {
			var v struct{ Error string }
			err := json.Unmarshal(b, &v)
			return v.Error, err
		}, "model 'typo' not found: " + reason},
	} {
		status, body := postTo(t, c, base+tc.path, tc.body)
		got, err := tc.message(body)
		if status != http.StatusNotFound || err != nil || got != tc.want {
			t.Errorf("%s: %d %s\n got %q\nwant %q", tc.path, status, body, got, tc.want)
		}
	}
	// coder is served through its matched target.
	if status, body := postTo(t, c, base+"/v1/chat/completions", `{"model":"coder","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`); status != http.StatusOK {
		t.Fatalf("coder: %d %s", status, body)
	}

	var queues []adminwire.Queue
	getJSON(t, e, "/admin/v1/queues", &queues)
	got := map[string]string{}
	for _, q := range queues {
		got[q.Model] = fmt.Sprint(q.Targets, q.UnmatchedTargets)
	}
	if want := map[string]string{"coder": "[tiny other] [other]", "typo": "[tinyy] [tinyy]"}; !maps.Equal(got, want) {
		t.Fatalf("queues %v, want %v", got, want)
	}
	v, err := status.Fetch(context.Background(), c, base)
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	if err := status.Render(&out, v, time.Now()); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"WARNING: alias coder: its target other matches no model any node serves",
		"WARNING: alias typo: its target tinyy matches no model any node serves (every target: its requests get 404)",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("iop status lacks %q:\n%s", want, out.String())
		}
	}
}

// bearer sends key as "Authorization: Bearer key".
type bearer string

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+string(b))
	return http.DefaultTransport.RoundTrip(r)
}

// TestCheckNodeAgainstEdge: iop check --edge compares a node config with a
// real edge's aliases, read from its admin API with an admin key: the
// models the node would advertise (one discovered from its simulated
// Ollama, one configured), which alias targets it serves ("tiny" as
// "tiny:latest"), which only the edge's other nodes serve, which none does
// (a warning), and its models no alias targets. Without the admin key the
// edge refuses, and the error says to give one.
func TestCheckNodeAgainstEdge(t *testing.T) {
	harness.Parallel(t)
	_, tinyURL := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOllama, Models: []string{"tiny:latest", "embed:latest"}})
	_, otherURL := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOllama, Models: []string{"other"}})
	admin, adminHash := auth.Generate()
	cfg := process.DefaultEdgeFile()
	cfg.AdminKeys = []auth.Key{{Name: "ops", Hash: adminHash}}
	cfg.Models = edge.Aliases{
		"chat":  {Targets: []string{"m1"}},
		"coder": {Targets: []string{"tiny", "other"}},
		"typo":  {Targets: []string{"tinyy"}},
	}
	e := startEdgeWith(t, cfg, harness.Logger(t, "edge"))
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	harness.Node(t, ctx, node.Config{NodeID: "elsewhere", Edge: e.NodeAddr,
		Providers: []node.ProviderConfig{{ID: "o", Type: node.TypeOllama, BaseURL: otherURL, Models: []string{"other"}}}})

	file := []byte(fmt.Sprintf("node_id: gpu-1\nedge: %s\nproviders:\n  - type: ollama\n    base_url: %s\n  - id: b\n    type: ollama\n    base_url: %s\n    models: [m1]\n",
		e.NodeAddr, tinyURL, tinyURL))
	k, err := process.ConfigKind(process.KindNode)
	if err != nil {
		t.Fatal(err)
	}
	if ps := process.CheckConfig(k, file); len(ps) > 0 {
		t.Fatalf("the node config has problems: %v", ps)
	}
	base := "http://" + e.HTTPAddr
	client := &http.Client{Transport: bearer(admin)}
	lines, warnings, err := process.CheckNodeAgainstEdge(context.Background(), client, base, file)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"provider ollama advertises embed:latest, tiny:latest",
		"provider b advertises m1",
		"alias chat: m1 by provider b",
		"alias coder: tiny by provider ollama (as tiny:latest); other by other nodes only",
		"warning: alias typo: tinyy by no node (neither this one nor any of the edge's: a typo?)",
		"model embed:latest (provider ollama): no alias targets it; clients may request it by its name",
	}
	if !slices.Equal(lines, want) || warnings != 1 {
		t.Fatalf("%d warnings, lines:\n%s\nwant:\n%s", warnings, strings.Join(lines, "\n"), strings.Join(want, "\n"))
	}

	_, _, err = process.CheckNodeAgainstEdge(context.Background(), http.DefaultClient, base, file)
	if !errors.Is(err, process.ErrEdgeAdmin) || !strings.Contains(err.Error(), "give an admin key") {
		t.Fatalf("without the admin key: %v", err)
	}
}
