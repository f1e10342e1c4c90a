package e2e

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"iop/internal/auth"
	"iop/internal/e2e/harness"
	"iop/internal/sim"
	"iop/internal/testenv"
	"iop/internal/testenv/etcdtest"
)

// TestQuotaHoldsAcrossEdgesAndFailover: three `iop edge` processes of one
// cluster on a real etcd and one PostgreSQL usage ledger, one `iop node`
// dialing all three, an `iop sim` answering 2000 tokens a second. A key
// with 10k tokens per minute; 12 streaming clients asking max_tokens 800,
// spread over the three edges; the scheduler leader SIGKILLed in the
// middle of a window, its clients moving to the other edges. The
// simulator's own count of the tokens it produced in any 60 whole
// seconds never exceeds 10k: before the kill the leader counts every
// edge's reservations; after it the new leader rebuilds its windows from
// the ledger and the followers' holds and, not knowing what the old one
// let run last, fills its minute windows. Every refusal is a 429
// quota_exceeded with a Retry-After, or a 503 while no leader is known;
// requests are answered again after the failover.
func TestQuotaHoldsAcrossEdgesAndFailover(t *testing.T) {
	harness.ParallelLongest(t)
	const limit, maxTokens, clients = 10_000, 800, 12
	etcd := etcdtest.Start(t)
	dsn := testenv.Postgres(t)
	bin := harness.IOP(t)
	s, simURL := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOpenAI, Models: []string{"m"}, TokensPerSecond: 400, DefaultMaxTokens: 4000, Seed: 5})
	key, keyHash := auth.Generate()
	admin, adminHash := auth.Generate()
	rig := &clusterRig{t: t, bin: bin, etcd: etcd, admin: admin}
	for i := range 3 {
		e := &clusterEdge{name: fmt.Sprintf("edge-%d", i+1), httpAddr: testenv.ProcessAddr(t), nodeList: testenv.ProcessAddr(t), advertise: testenv.ProcessAddr(t)}
		e.base, e.nodeAddr = "http://"+e.httpAddr, e.nodeList
		e.cfgPath = filepath.Join(t.TempDir(), e.name+".yaml")
		yaml := fmt.Sprintf(`listen: %s
node_listen: %s
database: ":memory:"
ledger_dsn: %q
max_retries: 0
heartbeat_interval: 1s
queue: {max_queue: 512, queue_timeout: 30s}
keys:
  - {name: q, hash: %q, quota: {tokens_per_minute: %d}}
admin_keys:
  - {name: ops, hash: %q}
cluster:
  etcd: [%s]
  name: %s
  advertise: %s
  session_ttl: 2s
  id: e2e-quota
`, e.httpAddr, e.nodeList, dsn, keyHash, limit, adminHash, strings.Join(etcd.Endpoints(), ", "), e.name, e.advertise)
		if err := os.WriteFile(e.cfgPath, []byte(yaml), 0o600); err != nil {
			t.Fatal(err)
		}
		rig.edges = append(rig.edges, rig.startEdge(i, e))
	}
	var addrs []string
	for _, e := range rig.edges {
		addrs = append(addrs, e.nodeAddr)
	}
	nodeCfg := filepath.Join(t.TempDir(), "node.yaml")
	if err := os.WriteFile(nodeCfg, []byte(fmt.Sprintf(`node_id: n1
edges: [%s]
reconnect_min: 50ms
reconnect_max: 200ms
providers:
  - {id: p1, type: vllm, base_url: %q, models: [m], capacity: 16}
`, strings.Join(addrs, ", "), simURL+"/v1")), 0o600); err != nil {
		t.Fatal(err)
	}
	harness.StartProgram(t, nil, "node", bin, "node", "--config", nodeCfg, "--log-level", "info")
	var li int
	var epoch int64
	testenv.Eventually(t, "one ready leader", func() bool { li, epoch = rig.leader(0); return li >= 0 })
	for _, e := range rig.edges {
		testenv.Eventually(t, "model m on "+e.name, func() bool {
			var ps []struct {
				Status string `json:"status"`
			}
			return rig.admin2(e, "/admin/v1/providers", &ps) == nil && len(ps) == 1 && ps[0].Status == "available"
		})
	}

	// The answers report their usage: a request settles at what it used,
	// and the windows hold as much as they can, so what the dead leader
	// let run and no one counted would show at the simulator.
	body := `{"model":"m","stream":true,"stream_options":{"include_usage":true},"max_tokens":` + strconv.Itoa(maxTokens) + `,"messages":[{"role":"user","content":"tell me a story"}]}`
	client := &http.Client{Timeout: 60 * time.Second}
	var (
		mu                          sync.Mutex
		answered, refused, noLeader int
		killedAt                    time.Time
		answeredAfter               int // answered after the new leader's minute
		leaderReadyAt               time.Time
		streaming                   [3]int // answers being read, by edge
		late                        [3]int // of those, the ones past three quarters of their tokens
	)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for c := range clients {
		wg.Go(func() {
			at := c % 3
			for {
				select {
				case <-stop:
					return
				default:
				}
				e := rig.edges[at]
				if e.down.Load() {
					at = (at + 1) % 3
					continue
				}
				req, _ := http.NewRequest(http.MethodPost, e.base+"/v1/chat/completions", strings.NewReader(body))
				req.Header.Set("Authorization", "Bearer "+key)
				req.Header.Set("Content-Type", "application/json")
				resp, err := client.Do(req)
				if err != nil {
					if e.down.Load() {
						continue // the killed edge: a load balancer routes away
					}
					t.Errorf("request via %s: %v", e.name, err)
					return
				}
				mu.Lock()
				streaming[at] += b2i(resp.StatusCode == http.StatusOK)
				mu.Unlock()
				passed := false
				text := readEvents(resp, func(events int) {
					if !passed && events >= maxTokens*3/4 && resp.StatusCode == http.StatusOK {
						passed = true
						mu.Lock()
						late[at]++
						mu.Unlock()
					}
				})
				now := time.Now()
				wait := time.Duration(0)
				mu.Lock()
				streaming[at] -= b2i(resp.StatusCode == http.StatusOK)
				late[at] -= b2i(passed)
				switch resp.StatusCode {
				case http.StatusOK:
					if !strings.Contains(text, "data: [DONE]") && !e.down.Load() {
						t.Errorf("a stream via %s without its end: %s", e.name, text)
					}
					answered++
					if !leaderReadyAt.IsZero() && now.After(leaderReadyAt.Add(61*time.Second)) {
						answeredAfter++
					}
				case http.StatusTooManyRequests:
					after, err := strconv.Atoi(resp.Header.Get("Retry-After"))
					if err != nil || after < 1 || after > 62 || !strings.Contains(text, "quota_exceeded") {
						t.Errorf("429 via %s, Retry-After %q: %s", e.name, resp.Header.Get("Retry-After"), text)
					}
					refused++
					wait = time.Duration(after) * time.Second
				case http.StatusServiceUnavailable:
					if killedAt.IsZero() {
						t.Errorf("503 via %s before the kill: %s", e.name, text)
					}
					noLeader++
					wait = time.Second
				default:
					if !e.down.Load() {
						t.Errorf("status %d via %s: %s", resp.StatusCode, e.name, text)
					}
				}
				mu.Unlock()
				at = (at + 1) % 3
				select {
				case <-stop:
					return
				case <-time.After(wait):
				}
			}
		})
	}

	// Mid-window, late in the answers the leader relays itself: what
	// they produced is in no ledger, and no follower holds it.
	testenv.EventuallyWithin(t, 90*time.Second, "two answers streaming through the leader", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return streaming[li] >= 2
	})
	testenv.EventuallyWithin(t, 30*time.Second, "an answer through the leader past three quarters of its tokens", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return late[li] >= 1
	})
	killed := rig.edges[li]
	mu.Lock()
	killedAt = time.Now()
	mu.Unlock()
	killed.down.Store(true)
	killed.proc.Signal(t, syscall.SIGKILL)
	_ = killed.proc.Wait(t, 10*time.Second)
	testenv.EventuallyWithin(t, 30*time.Second, "a new ready leader", func() bool { li, _ = rig.leader(epoch); return li >= 0 })
	mu.Lock()
	leaderReadyAt = time.Now()
	mu.Unlock()
	// The new leader's filled minute passes, and the key spends again.
	testenv.EventuallyWithin(t, 3*time.Minute, "answers after the new leader's first minute", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return answeredAfter >= 3
	})
	close(stop)
	wg.Wait()

	st := s.Stats()
	t.Logf("answered %d (%d after the new leader's first minute), refused %d, 503 %d; simulator: admitted %d, %d tokens, at most %d in a minute",
		answered, answeredAfter, refused, noLeader, st.Admitted, st.OutputTokens, st.MaxTokensPerMinute)
	if st.MaxTokensPerMinute > limit {
		t.Errorf("the simulator produced %d tokens in a minute, over the key's %d across three edges and a leader kill", st.MaxTokensPerMinute, limit)
	}
	if refused == 0 || answered <= limit/(maxTokens+200) {
		t.Errorf("answered %d, refused %d: the quota was not exercised", answered, refused)
	}
	if answeredAfter == 0 {
		t.Errorf("no request answered after the new leader's first minute: the quota never came back")
	}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// readEvents reads resp's body and closes it, calling progress with the
// number of server-sent events (blank-line separated) read so far.
func readEvents(resp *http.Response, progress func(events int)) string {
	defer resp.Body.Close()
	var b strings.Builder
	buf := make([]byte, 32<<10)
	events, prev := 0, byte(0)
	for {
		n, err := resp.Body.Read(buf)
		b.Write(buf[:n])
		for _, c := range buf[:n] {
			if c == '\n' && prev == '\n' {
				events++
			}
			prev = c
		}
		progress(events)
		if err != nil {
			return b.String()
		}
	}
}
