package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"iop/internal/e2e/harness"
	"iop/internal/edge"
	"iop/internal/node"
	"iop/internal/testenv"
)

// TestRegression_DrainKeepsAnswersFinishedAsItBegan: a node told to drain
// while its runs were in flight on warm run streams disconnected as soon as
// each run's last frame was queued on its stream, before the edge had read
// it; the edge fenced the connection and those clients got "upstream ended
// the response without completing it" (502, or an error event in place of
// the stream's end) for answers the provider had finished (1 to 5 of
// every 16 streams). The
// README says a draining node's runs in flight finish: every answer here
// must arrive whole. The runs go down warm streams (a first round leaves
// the connection with enough reused ones), the node is draining at the
// edge before the provider answers, and then every answer ends at once.
func TestRegression_DrainKeepsAnswersFinishedAsItBegan(t *testing.T) {
	harness.Parallel(t)
	const n = 8
	var (
		arrived = make(chan struct{}, 2*n)
		mu      sync.Mutex
		release = make(chan struct{})
		round   atomic.Int32
	)
	provider := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if round.Load() == 2 {
			arrived <- struct{}{}
			mu.Lock()
			rel := release
			mu.Unlock()
			<-rel
		}
		id := strings.TrimSuffix(strings.SplitAfter(string(body), `"content":"`)[1], `"}]}`)
		id = strings.SplitN(id, `"`, 2)[0]
		if strings.Contains(string(body), `"stream":true`) {
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprintf(w, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":%q}}]}\n\n", "answer "+id)
			fmt.Fprint(w, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n")
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"c","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":%q},"finish_reason":"stop"}]}`, "answer "+id)
	}))
	t.Cleanup(provider.Close)

	ctx, cancel := context.WithCancel(context.Background())
	e := harness.Edge(t, ctx, harness.EdgeConfig(map[string]edge.ModelConfig{}))
	t.Cleanup(cancel)
	agent, err := node.New(node.Config{
		NodeID:    "gpu-1",
		Edge:      e.NodeAddr,
		Providers: []node.ProviderConfig{{ID: "p", Type: "openai", BaseURL: provider.URL + "/v1", Models: []string{"m"}, Capacity: 2 * n}},
	}, harness.Logger(t, "node"))
	if err != nil {
		t.Fatal(err)
	}
	runErr := make(chan error, 1)
	go func() { runErr <- agent.Run(ctx) }()
	<-agent.Ready()

	ask := func(i int, stream bool) (int, string, error) {
		body := fmt.Sprintf(`{"model":"m","stream":%v,"messages":[{"role":"user","content":"q%d"}]}`, stream, i)
		resp, err := http.Post("http://"+e.HTTPAddr+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), err
	}
	// Round 1: bursts of n answers at once until the connection holds n
	// idle warm streams (a warm stream is reused after its run's clean end;
	// a run on a stream of its own is not).
	round.Store(1)
	var wg sync.WaitGroup
	idle := func() int {
		nodes := e.Service.Snapshot().Nodes
		if len(nodes) != 1 {
			return 0
		}
		return nodes[0].IdleRunStreams
	}
	for burst := 0; idle() < n; burst++ {
		if burst == 50 {
			t.Fatalf("after 50 bursts of %d requests the connection holds %d idle run streams, want %d", n, idle(), n)
		}
		for i := range n {
			wg.Go(func() {
				if code, _, err := ask(i, false); code != http.StatusOK || err != nil {
					t.Errorf("round 1, request %d: %d %v", i, code, err)
				}
			})
		}
		wg.Wait()
		waitIdle(t, e)
	}

	// Round 2: n runs at the provider, then the drain, then the answers.
	round.Store(2)
	type answer struct {
		code int
		body string
		err  error
	}
	answers := make([]answer, n)
	for i := range n {
		wg.Go(func() {
			code, body, err := ask(i, i%2 == 1)
			answers[i] = answer{code, body, err}
		})
	}
	for range n {
		<-arrived
	}
	agent.Drain("test")
	testenv.Eventually(t, "the node draining at the edge", func() bool {
		nodes := e.Service.Snapshot().Nodes
		return len(nodes) == 1 && nodes[0].Draining
	})
	close(release)
	wg.Wait()
	for i, a := range answers {
		want := fmt.Sprintf("answer q%d", i)
		streamed := i%2 == 1
		whole := a.code == http.StatusOK && a.err == nil && strings.Contains(a.body, want) && !strings.Contains(a.body, `"error"`)
		if streamed {
			whole = whole && strings.HasSuffix(a.body, "data: [DONE]\n\n")
		}
		if !whole {
			t.Errorf("request %d (streamed %v): %d %v %q, want its whole answer", i, streamed, a.code, a.err, a.body)
		}
	}
	if err := <-runErr; err != nil && !errors.Is(err, node.ErrDrained) {
		t.Errorf("node stopped with %v, want it drained", err)
	}
	waitIdle(t, e)
}
