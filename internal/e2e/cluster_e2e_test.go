package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"iop/internal/auth"
	"iop/internal/e2e/harness"
	"iop/internal/sim"
	"iop/internal/testenv"
	"iop/internal/testenv/etcdtest"
)

// clusterRig is three `iop edge` processes of one cluster on a real
// three-member etcd, each with its own `iop node` (one node id, n1, on
// every edge: until nodes dial several edges themselves, one process per
// edge stands in for one node on every edge) driving the same two
// simulated model servers: p1 (model m, capacity 2) and p2 (model k,
// capacity 8).
type clusterRig struct {
	t          *testing.T
	bin        string
	etcd       *etcdtest.Cluster
	sim1, sim2 *sim.Server
	url1, url2 string
	url3       string // model slow: long answers (max_tokens sets their length)
	big, small string // client keys: small has max_concurrent 2
	rpm        string // client key with requests_per_minute 3
	admin      string
	hashes     [4]string
	edges      []*clusterEdge
}

type clusterEdge struct {
	name               string
	cfgPath            string
	base, nodeAddr     string
	advertise          string
	proc               *harness.Command
	node               *harness.Command
	down               atomic.Bool
	httpAddr, nodeList string
}

func newClusterRig(t *testing.T) *clusterRig {
	t.Helper()
	rig := newClusterEdges(t)
	for _, e := range rig.edges {
		rig.startNode(e)
	}
	return rig
}

// newClusterEdges is the rig's etcd, model servers and three edges, with
// no node yet.
func newClusterEdges(t *testing.T) *clusterRig {
	t.Helper()
	rig := &clusterRig{t: t, etcd: etcdtest.Start(t), bin: harness.IOP(t)}
	// About 130 ms per answer: long enough to overlap, short enough for
	// many rounds.
	rig.sim1, rig.url1 = harness.Sim(t, sim.Config{Protocol: sim.ProtocolOllama, Models: []string{"m"}, TTFT: 50 * time.Millisecond, TokensPerSecond: 100, DefaultMaxTokens: 8})
	rig.sim2, rig.url2 = harness.Sim(t, sim.Config{Protocol: sim.ProtocolOllama, Models: []string{"k"}, TTFT: 50 * time.Millisecond, TokensPerSecond: 100, DefaultMaxTokens: 8})
	_, rig.url3 = harness.Sim(t, sim.Config{Protocol: sim.ProtocolOllama, Models: []string{"slow"}, TokensPerSecond: 100, DefaultMaxTokens: 100_000})
	var h [4]string
	rig.big, h[0] = auth.Generate()
	rig.small, h[1] = auth.Generate()
	rig.admin, h[2] = auth.Generate()
	rig.rpm, h[3] = auth.Generate()
	rig.hashes = h
	for i := range 3 {
		rig.edges = append(rig.edges, rig.startEdge(i, nil))
	}
	return rig
}

func (rig *clusterRig) startEdge(i int, e *clusterEdge) *clusterEdge {
	t := rig.t
	t.Helper()
	if e == nil {
		e = &clusterEdge{name: fmt.Sprintf("edge-%d", i+1), httpAddr: testenv.ProcessAddr(t), nodeList: testenv.ProcessAddr(t), advertise: testenv.ProcessAddr(t)}
		e.base, e.nodeAddr = "http://"+e.httpAddr, e.nodeList
		e.cfgPath = filepath.Join(t.TempDir(), e.name+".yaml")
		yaml := fmt.Sprintf(`listen: %s
node_listen: %s
database: ":memory:"
max_retries: 0
heartbeat_interval: 1s
queue: {max_queue: 512, queue_timeout: 30s}
keys:
  - {name: big, hash: %q}
  - {name: small, hash: %q, max_concurrent: 2}
  - {name: rpm, hash: %q, requests_per_minute: 3}
admin_keys:
  - {name: ops, hash: %q}
cluster:
  etcd: [%s]
  name: %s
  advertise: %s
  session_ttl: 2s
  id: e2e
`, e.httpAddr, e.nodeList, rig.hashes[0], rig.hashes[1], rig.hashes[3], rig.hashes[2], strings.Join(rig.etcd.Endpoints(), ", "), e.name, e.advertise)
		if err := os.WriteFile(e.cfgPath, []byte(yaml), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	e.proc = harness.StartProgram(t, nil, e.name, rig.bin, "edge", "--config", e.cfgPath, "--log-format", "json", "--log-level", "info")
	e.down.Store(false)
	testenv.Eventually(t, e.name+" answers", func() bool { return getStatus(e.base+"/healthz") == http.StatusOK })
	return e
}

func (rig *clusterRig) startNode(e *clusterEdge) {
	t := rig.t
	t.Helper()
	path := filepath.Join(t.TempDir(), "node-"+e.name+".yaml")
	yaml := fmt.Sprintf(`node_id: n1
edge: %s
reconnect_min: 50ms
reconnect_max: 200ms
providers:
  - {id: p1, type: ollama, base_url: %q, models: [m], capacity: 2}
  - {id: p2, type: ollama, base_url: %q, models: [k], capacity: 8}
  - {id: p3, type: ollama, base_url: %q, models: [slow], capacity: 8}
`, e.nodeAddr, rig.url1, rig.url2, rig.url3)
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	e.node = harness.StartProgram(t, nil, "node of "+e.name, rig.bin, "node", "--config", path, "--log-level", "info")
	rig.waitNodeOn(e)
}

// waitNodeOn waits until e lists both providers of node n1 available.
func (rig *clusterRig) waitNodeOn(e *clusterEdge) {
	rig.t.Helper()
	testenv.Eventually(rig.t, "node n1 on "+e.name, func() bool {
		var ps []struct {
			NodeID string `json:"node_id"`
			Status string `json:"status"`
		}
		if rig.admin2(e, "/admin/v1/providers", &ps) != nil {
			return false
		}
		n := 0
		for _, p := range ps {
			if p.NodeID == "n1" && p.Status == "available" {
				n++
			}
		}
		return n == 3
	})
}

// admin2 GETs an admin route of e into v.
func (rig *clusterRig) admin2(e *clusterEdge, path string, v any) error {
	req, _ := http.NewRequest(http.MethodGet, e.base+path, nil)
	req.Header.Set("Authorization", "Bearer "+rig.admin)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := http.DefaultClient.Do(req.WithContext(ctx))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", path, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

type clusterView struct {
	Cluster    bool   `json:"cluster"`
	Name       string `json:"name"`
	Leader     bool   `json:"leader"`
	Ready      bool   `json:"ready"`
	Epoch      int64  `json:"epoch"`
	HeldLeases int    `json:"held_leases"`
	Leases     int    `json:"leases"`
	Runs       int    `json:"runs"`
	Waiters    int    `json:"waiters"`
}

func (rig *clusterRig) view(e *clusterEdge) (clusterView, error) {
	var v clusterView
	err := rig.admin2(e, "/admin/v1/cluster", &v)
	return v, err
}

// leader returns the index of the live edge that leads a rebuilt epoch
// above after, with every live edge naming that epoch; -1 if none yet.
func (rig *clusterRig) leader(after int64) (int, int64) {
	li, epoch := -1, int64(0)
	for i, e := range rig.edges {
		if e.down.Load() {
			continue
		}
		v, err := rig.view(e)
		if err != nil || v.Epoch <= after || (epoch != 0 && v.Epoch != epoch) {
			return -1, 0
		}
		epoch = v.Epoch
		if v.Leader && v.Ready {
			li = i
		}
	}
	return li, epoch
}

// outcome tallies of the storm.
type stormTally struct {
	mu        sync.Mutex
	completed int
	clean503  int
	limited   int // 429 with Retry-After: the small key over its limit
	edgeDown  int // connection refused by a killed edge (a load balancer routes away)
	bad       []string
}

func (s *stormTally) add(f func(*stormTally)) {
	s.mu.Lock()
	f(s)
	s.mu.Unlock()
}

// ask sends one chat request for model with key to e and tallies it.
func (rig *clusterRig) ask(client *http.Client, e *clusterEdge, key, model string, tally *stormTally) {
	body := `{"model":"` + model + `","messages":[{"role":"user","content":"hi"}]}`
	req, _ := http.NewRequest(http.MethodPost, e.base+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		if e.down.Load() {
			tally.add(func(s *stormTally) { s.edgeDown++ })
			return
		}
		tally.add(func(s *stormTally) { s.bad = append(s.bad, fmt.Sprintf("%s: %v", e.name, err)) })
		return
	}
	b, rerr := io.ReadAll(resp.Body)
	resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusOK && rerr == nil:
		tally.add(func(s *stormTally) { s.completed++ })
	case resp.StatusCode == http.StatusServiceUnavailable && resp.Header.Get("Retry-After") != "":
		tally.add(func(s *stormTally) { s.clean503++ })
	case resp.StatusCode == http.StatusTooManyRequests && resp.Header.Get("Retry-After") != "" && key == rig.small:
		tally.add(func(s *stormTally) { s.limited++ })
	case rerr != nil && e.down.Load():
		tally.add(func(s *stormTally) { s.edgeDown++ })
	default:
		tally.add(func(s *stormTally) {
			s.bad = append(s.bad, fmt.Sprintf("%s: %d %s (read: %v)", e.name, resp.StatusCode, strings.TrimSpace(string(b)), rerr))
		})
	}
}

// storm runs clients that each send requests, one at a time, to the live
// edges in turn until stop is closed.
func (rig *clusterRig) storm(clients int, key, model string, stop <-chan struct{}, tally *stormTally) *sync.WaitGroup {
	var wg sync.WaitGroup
	client := &http.Client{Timeout: 60 * time.Second} // a hang fails the test
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := c; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				e := rig.edges[i%len(rig.edges)]
				if e.down.Load() {
					continue
				}
				rig.ask(client, e, key, model, tally)
			}
		}()
	}
	return &wg
}

// waitQuiet waits until every live edge relays no run and holds no lease
// or waiter, and both model servers have nothing in flight: nothing leaked
// or counted twice.
func (rig *clusterRig) waitQuiet(what string) {
	t := rig.t
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		quiet, views := true, []clusterView{}
		for _, e := range rig.edges {
			if e.down.Load() {
				continue
			}
			v, err := rig.view(e)
			views = append(views, v)
			quiet = quiet && err == nil && v.Runs == 0 && v.Leases == 0 && v.HeldLeases == 0 && v.Waiters == 0
		}
		quiet = quiet && rig.sim1.Stats().InFlight == 0 && rig.sim2.Stats().InFlight == 0
		if quiet {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not quiet within 30s: edges %+v, sims in flight %d and %d", what, views, rig.sim1.Stats().InFlight, rig.sim2.Stats().InFlight)
		}
		<-tick.C
	}
}

// TestClusterThreeEdgesStormAndFailover: three real edges, one elected
// scheduler. A storm of clients spread over the three edges never puts a
// provider above its capacity (the model server's own peak in-flight is
// the judge), and a key's max_concurrent holds across the edges. The
// leader is SIGKILLed mid-storm: another edge leads and admits (the time
// is printed), no provider goes above capacity, every client is answered
// (completed, or a clean 503 with Retry-After), and afterwards no edge
// holds a lease or run. One etcd member killed: the edges keep serving.
// The old leader restarted: it follows (a higher epoch leads).
func TestClusterThreeEdgesStormAndFailover(t *testing.T) {
	harness.Parallel(t)
	rig := newClusterRig(t)
	var li int
	var epoch int64
	testenv.Eventually(t, "one ready leader", func() bool { li, epoch = rig.leader(0); return li >= 0 })

	// Phase 1: the storm, model m (capacity 2) with the big key and model
	// k (capacity 8) with the small key (max_concurrent 2).
	tally := &stormTally{}
	stop := make(chan struct{})
	wgBig := rig.storm(12, rig.big, "m", stop, tally)
	stopSmall := make(chan struct{})
	wgSmall := rig.storm(9, rig.small, "k", stopSmall, tally)
	testenv.Eventually(t, "requests completed on every edge", func() bool {
		tally.mu.Lock()
		defer tally.mu.Unlock()
		return tally.completed >= 30
	})
	close(stopSmall)
	wgSmall.Wait()
	if got := rig.sim2.Stats().MaxInFlight; got > 2 {
		t.Fatalf("key small (max_concurrent 2) had %d requests at once at its model server, across edges", got)
	}
	if rig.sim2.Stats().MaxInFlight < 2 {
		t.Logf("key small peaked at %d (the limit was not reached)", rig.sim2.Stats().MaxInFlight)
	}

	// Phase 2: SIGKILL the leader mid-storm.
	killed := rig.edges[li]
	tally.mu.Lock()
	before := tally.completed
	tally.mu.Unlock()
	killed.down.Store(true)
	killed.proc.Signal(t, syscall.SIGKILL)
	killedAt := time.Now()
	_ = killed.proc.Wait(t, 10*time.Second)
	var nl int
	var nepoch int64
	testenv.Eventually(t, "a new ready leader", func() bool { nl, nepoch = rig.leader(epoch); return nl >= 0 })
	electedIn := time.Since(killedAt)
	// Admitting: a request through the new leader completes.
	testenv.Eventually(t, "requests completed after the failover", func() bool {
		tally.mu.Lock()
		defer tally.mu.Unlock()
		return tally.completed > before+10
	})
	t.Logf("leader %s SIGKILLed: %s leads at epoch %d (was %d), ready %s after the kill; admitting %s after",
		killed.name, rig.edges[nl].name, nepoch, epoch, electedIn.Round(time.Millisecond), time.Since(killedAt).Round(time.Millisecond))
	fmt.Printf("cluster failover: new leader ready %s after SIGKILL of the leader\n", electedIn.Round(time.Millisecond))

	// Phase 3: one etcd member down; the storm goes on.
	rig.etcd.Kill(0)
	tally.mu.Lock()
	before = tally.completed
	tally.mu.Unlock()
	testenv.Eventually(t, "requests completed with one etcd member down", func() bool {
		tally.mu.Lock()
		defer tally.mu.Unlock()
		return tally.completed > before+10
	})
	close(stop)
	wgBig.Wait()
	if got := rig.sim1.Stats().MaxInFlight; got > 2 {
		t.Fatalf("provider p1 (capacity 2) had %d requests at once at its model server", got)
	}
	tally.mu.Lock()
	bad, counts := tally.bad, fmt.Sprintf("completed %d, clean 503 %d, limited %d, to the killed edge %d", tally.completed, tally.clean503, tally.limited, tally.edgeDown)
	tally.mu.Unlock()
	t.Log("storm: " + counts)
	if len(bad) > 0 {
		t.Fatalf("%d answers neither completed nor a clean 503 (%s); first: %s", len(bad), counts, bad[0])
	}
	rig.waitQuiet("after the storm")

	// Phase 4: the old leader comes back and follows the higher epoch.
	rig.startEdge(li, killed)
	testenv.Eventually(t, "the restarted edge follows", func() bool {
		v, err := rig.view(killed)
		return err == nil && v.Epoch == nepoch && !v.Leader
	})
	rig.etcd.Restart(0)
}
