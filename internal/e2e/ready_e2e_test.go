package e2e

import (
	"errors"
	"fmt"
	"io"
	"iop/internal/e2e/harness"
	"iop/internal/testenv"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// TestRegression_SIGTERMDuringBurstAnswersEveryRequest: a real `iop edge`
// process with a real node, serving eight clients that send request after
// request on kept-alive connections (and wait Retry-After after a 503),
// gets SIGTERM. /readyz answers 200
// before and 503 once the edge stops (before it exits); every request the
// clients sent gets an HTTP answer — a complete 200, or 503 with
// Retry-After — or is refused at connect (the listener is closed): none
// has its connection closed with no answer, not even a request arriving
// at the instant of SIGTERM. /readyz is 503 until the
// node connected.
func TestRegression_SIGTERMDuringBurstAnswersEveryRequest(t *testing.T) {
	harness.Parallel(t)
	bin := harness.IOP(t)
	simURL := startSimProcess(t, bin, "openai", "m", 400)
	httpAddr, nodeAddr := testenv.ProcessAddr(t), testenv.ProcessAddr(t)
	dir := t.TempDir()
	edgeCfg := filepath.Join(dir, "edge.yaml")
	if err := os.WriteFile(edgeCfg, []byte(fmt.Sprintf(`listen: %s
node_listen: %s
database: ":memory:"
drain_timeout: 5s
queue: {max_queue: 64, queue_timeout: 30s}
`, httpAddr, nodeAddr)), 0o600); err != nil {
		t.Fatal(err)
	}
	base := "http://" + httpAddr
	e := harness.StartProgram(t, nil, "edge", bin, "edge", "--config", edgeCfg, "--log-level", "info")
	testenv.Eventually(t, "the edge answers", func() bool { return getStatus(base+"/healthz") == http.StatusOK })
	if got := getStatus(base + "/readyz"); got != http.StatusServiceUnavailable {
		t.Fatalf("/readyz without a node = %d, want 503", got)
	}
	nodeCfg := filepath.Join(dir, "node.yaml")
	if err := os.WriteFile(nodeCfg, []byte(fmt.Sprintf(`node_id: n1
edge: %s
providers:
  - {id: p1, type: openai, base_url: %q, models: [m], capacity: 4}
`, nodeAddr, simURL+"/v1")), 0o600); err != nil {
		t.Fatal(err)
	}
	harness.StartProgram(t, nil, "node", bin, "node", "--config", nodeCfg, "--log-level", "info")
	testenv.Eventually(t, "/readyz with the node", func() bool { return getStatus(base+"/readyz") == http.StatusOK })

	var (
		stop                 atomic.Bool
		ok, refused, dialErr atomic.Int64
		mu                   sync.Mutex
		bad                  []string
		wg                   sync.WaitGroup
	)
	for c := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cl := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1}, Timeout: time.Minute}
			defer cl.CloseIdleConnections()
			for i := 0; !stop.Load(); i++ {
				body := fmt.Sprintf(`{"model":"m","max_tokens":4,"messages":[{"role":"user","content":"c%d r%d"}]}`, c, i)
				resp, err := cl.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(body))
				if err != nil {
					var op *net.OpError
					if errors.As(err, &op) && op.Op == "dial" {
						dialErr.Add(1) // the listener is closed: nothing was sent
						time.Sleep(5 * time.Millisecond)
						continue
					}
					mu.Lock()
					bad = append(bad, "no answer: "+err.Error())
					mu.Unlock()
					continue
				}
				b, rerr := io.ReadAll(resp.Body)
				resp.Body.Close()
				switch {
				case rerr != nil:
					mu.Lock()
					bad = append(bad, fmt.Sprintf("%d, body cut: %v", resp.StatusCode, rerr))
					mu.Unlock()
				case resp.StatusCode == http.StatusOK:
					ok.Add(1)
				case resp.StatusCode == http.StatusServiceUnavailable && resp.Header.Get("Retry-After") != "":
					refused.Add(1)
					// As a client or load balancer does: not again before
					// Retry-After.
					after, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
					time.Sleep(time.Duration(max(after, 1)) * time.Second)
				default:
					mu.Lock()
					bad = append(bad, fmt.Sprintf("%d %s", resp.StatusCode, b))
					mu.Unlock()
				}
			}
		}()
	}
	testenv.Eventually(t, "the burst is served", func() bool { return ok.Load() >= 40 })
	e.Signal(t, syscall.SIGTERM)
	testenv.Eventually(t, "/readyz is 503 while the edge stops", func() bool {
		st := getStatus(base + "/readyz")
		return st == http.StatusServiceUnavailable || st == 0
	})
	select {
	case <-e.Exited():
	case <-time.After(30 * time.Second):
		t.Fatal("the edge did not exit within 30s of SIGTERM")
	}
	stop.Store(true)
	wg.Wait()
	t.Logf("answered 200: %d, 503 with Retry-After: %d, refused at connect: %d", ok.Load(), refused.Load(), dialErr.Load())
	if len(bad) > 0 {
		t.Fatalf("%d requests without a proper answer, e.g. %q", len(bad), bad[:min(len(bad), 5)])
	}
}
