package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"iop/internal/e2e/harness"
	"iop/internal/process"
	"iop/internal/sim"
	"iop/internal/testenv"
)

// TestMessagesClientGoneCancelsRun: a Messages client that goes away
// cancels its run on both paths, streamed (after its first text delta) and
// not: the provider sees the abort, the slot (capacity 1) is freed, and the
// next Messages request on that provider is answered whole.
func TestMessagesClientGoneCancelsRun(t *testing.T) {
	harness.Parallel(t)
	e, paths := startCancelStack(t, process.DefaultEdgeFile(), 1, sim.Config{TokensPerSecond: 100})
	url := "http://" + e.HTTPAddr + "/v1/messages"
	body := func(model string, maxTokens int, stream bool) string {
		return fmt.Sprintf(`{"model":%q,"max_tokens":%d,"stream":%v,"messages":[{"role":"user","content":"count for me"}]}`, model, maxTokens, stream)
	}
	c := &http.Client{Transport: &http.Transport{}}
	defer c.CloseIdleConnections()
	for _, p := range paths {
		for _, stream := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/stream %v", p.name, stream), func(t *testing.T) {
				stats := p.backend.Stats()
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				req, _ := http.NewRequestWithContext(ctx, "POST", url, strings.NewReader(body(p.model, 100_000, stream)))
				req.Header.Set("Content-Type", "application/json")
				errc := make(chan error, 1)
				go func() {
					resp, err := c.Do(req)
					if err != nil {
						errc <- err
						return
					}
					defer resp.Body.Close()
					if resp.StatusCode != http.StatusOK {
						errc <- fmt.Errorf("status %d", resp.StatusCode)
						return
					}
					sc := bufio.NewScanner(resp.Body)
					for sc.Scan() {
						if strings.Contains(sc.Text(), `"text_delta"`) {
							cancel() // the client goes away after its first text
						}
					}
					errc <- sc.Err()
				}()
				if !stream {
					testenv.Eventually(t, "the run reaches the backend", func() bool { return p.backend.Stats().Requests == stats.Requests+1 })
					cancel()
				}
				if err := <-errc; !errors.Is(err, context.Canceled) {
					t.Fatalf("client: %v, want context.Canceled", err)
				}
				testenv.Eventually(t, "the backend sees the abort", func() bool { return p.backend.Stats().Cancelled == stats.Cancelled+1 })
				waitIdle(t, e)
				// The one slot is free: the next request is answered whole.
				resp, err := c.Post(url, "application/json", strings.NewReader(body(p.model, 3, false)))
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Body.Close()
				var msg struct {
					StopReason string `json:"stop_reason"`
					Usage      struct {
						OutputTokens int `json:"output_tokens"`
					} `json:"usage"`
				}
				if err := json.NewDecoder(resp.Body).Decode(&msg); err != nil || resp.StatusCode != 200 || msg.StopReason != "max_tokens" || msg.Usage.OutputTokens != 3 {
					t.Fatalf("next request: %d %+v %v", resp.StatusCode, msg, err)
				}
				waitIdle(t, e)
			})
		}
	}
}
