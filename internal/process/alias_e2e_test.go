package process

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"iop/internal/edge"
	"iop/internal/node"
	"iop/internal/sim"
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
	t.Parallel()
	tiny, tinyURL := startSim(t, sim.Config{Protocol: sim.ProtocolOllama, Models: []string{"tiny:latest"}, TTFT: 200 * time.Millisecond})
	other, otherURL := startSim(t, sim.Config{Protocol: sim.ProtocolOllama, Models: []string{"other"}, TTFT: 200 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	e := startTestEdge(t, ctx, map[string]edge.ModelConfig{"coder": {Targets: []string{"tiny", "other"}}})
	stopOnCleanup(t, cancel, e)
	startNode(t, ctx, node.Config{NodeID: "n1", Edge: e.NodeAddr, DiscoveryInterval: discoveryInterval, Providers: []node.ProviderConfig{
		{ID: "a", Type: node.TypeOllama, BaseURL: tinyURL, Capacity: 1},
		{ID: "b", Type: node.TypeOllama, BaseURL: otherURL, Models: []string{"other"}, Capacity: 1},
	}})
	waitSnapshot(t, e, func(s edge.Snapshot) bool {
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
