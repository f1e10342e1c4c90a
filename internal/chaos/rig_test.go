package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"iop/internal/auth"
	"iop/internal/cluster"
	"iop/internal/edge/adminwire"
	"iop/internal/testenv"
	"iop/internal/testenv/etcdtest"
)

// Timing of every run's deployment.
const (
	sessionTTL        = 3 * time.Second  // cluster.session_ttl (the default)
	heartbeatInterval = 1 * time.Second  // edge heartbeat_interval
	queueTimeout      = 10 * time.Second // queue.queue_timeout
	startWithin       = 30 * time.Second // bound on any process becoming ready
)

// The model servers: sims a and b serve model m (capacity 2 and 4, one per
// node), sim c serves model k (capacity 4, node n2 only) for the limited
// key alone, so its peak in flight is the key's peak concurrency.
var simCaps = map[string]int{"a": 2, "b": 4, "c": 4}

// The limited key's limits.
const (
	limMaxConcurrent = 2
	limPerMinute     = 60
)

// proc is one child process of a run.
type proc struct {
	name   string
	cmd    *exec.Cmd
	logs   *lockedBuffer
	exited chan struct{}
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func startProc(t testing.TB, name, bin string, args ...string) *proc {
	t.Helper()
	p := &proc{name: name, cmd: exec.Command(bin, args...), logs: &lockedBuffer{}, exited: make(chan struct{})}
	p.cmd.Stdout, p.cmd.Stderr = p.logs, p.logs
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() { _ = p.cmd.Wait(); close(p.exited) }()
	t.Cleanup(func() {
		_ = p.cmd.Process.Signal(syscall.SIGCONT)
		_ = p.cmd.Process.Kill()
		<-p.exited
		if t.Failed() && os.Getenv("IOP_CHAOS_LOGS") == "1" {
			t.Logf("%s output:\n%s", name, p.logs.String())
		}
	})
	return p
}

func (p *proc) signal(sig syscall.Signal) { _ = p.cmd.Process.Signal(sig) }

// stop sends SIGTERM and waits (up to within) for the exit, then kills.
func (p *proc) stop(within time.Duration) {
	p.signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(within):
		p.signal(syscall.SIGKILL)
		<-p.exited
	}
}

func (p *proc) kill() {
	p.signal(syscall.SIGKILL)
	<-p.exited
}

// freeAddr is an address for a child process to listen on, also when it
// restarts (testenv.ProcessAddr: no other process's connection takes it
// meanwhile).
func freeAddr(t testing.TB) string {
	t.Helper()
	return testenv.ProcessAddr(t)
}

// waitUntil polls cond every 50 ms until it holds or within passes.
func waitUntil(within time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(50 * time.Millisecond)
	}
	return true
}

// edge is one `iop edge` of the deployment.
type edge struct {
	name      string
	cfgPath   string
	base      string // http://listen
	nodeAddr  string // node_listen
	listen    string // cluster.listen (admission service)
	front     *proxy // cluster.advertise: other edges reach this one here
	proc      atomic.Pointer[proc]
	out       atomic.Bool // not taken by the load balancer (killed, frozen, restarting)
	killed    atomic.Bool // SIGKILLed: connection errors to it are expected
	frozenAt  atomic.Int64
	thawedAt  atomic.Int64
	nodeFront map[string]*proxy // node id → the proxy that node dials for this edge
}

// frozenDuring reports whether e was stopped (SIGSTOP) at any time in
// [from, to].
func (e *edge) frozenDuring(from, to time.Time) bool {
	f := e.frozenAt.Load()
	if f == 0 {
		return false
	}
	th := e.thawedAt.Load()
	if th < f {
		th = time.Now().UnixNano()
	}
	return f <= to.UnixNano() && th >= from.UnixNano()
}

// rig is one run's deployment.
type rig struct {
	t          testing.TB
	bin, dir   string
	dsn        string
	etcd       *etcdtest.Cluster
	sims       map[string]string // name → base URL
	big, lim   string            // client keys
	admin      string
	hashes     []string
	edges      []*edge
	nodes      map[string]*proc
	nodeCfgs   map[string]string
	foreign    *proc
	tag        string // unique per run: in edge names and prompts
	pidsMu     sync.Mutex
	pids       map[string]int // edge name → pid, for the proxies
	httpClient *http.Client
}

func (r *rig) edgePids() map[string]int {
	r.pidsMu.Lock()
	defer r.pidsMu.Unlock()
	out := make(map[string]int, len(r.pids))
	for k, v := range r.pids {
		out[k] = v
	}
	return out
}

// newRig starts a run's deployment; with foreignFirst, an edge of another
// deployment (other keys, other models, no node) campaigns on the same
// etcd (default prefix) before this deployment's edges start.
func newRig(t testing.TB, bin, dsn, tag string, foreignFirst bool) *rig {
	t.Helper()
	r := &rig{t: t, bin: bin, dir: t.TempDir(), dsn: dsn, tag: tag, sims: map[string]string{},
		nodes: map[string]*proc{}, nodeCfgs: map[string]string{}, pids: map[string]int{},
		httpClient: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}}
	t.Cleanup(r.httpClient.CloseIdleConnections)
	r.etcd = etcdtest.Start(t)
	var h [3]string
	r.big, h[0] = auth.Generate()
	r.lim, h[1] = auth.Generate()
	r.admin, h[2] = auth.Generate()
	r.hashes = h[:]
	for _, name := range []string{"a", "b", "c"} {
		r.startSim(name)
	}
	if foreignFirst {
		r.startForeign()
	}
	for i := range 3 {
		r.edges = append(r.edges, r.newEdge(i))
	}
	for _, e := range r.edges {
		r.startEdge(e)
	}
	r.startNode("n1")
	r.startNode("n2")
	if !foreignFirst && r.leader() == nil {
		if !waitUntil(startWithin, func() bool { return r.leader() != nil }) {
			t.Fatalf("no ready leader within %s", startWithin)
		}
	}
	return r
}

func (r *rig) startSim(name string) {
	addr := freeAddr(r.t)
	model := "m"
	if name == "c" {
		model = "k"
	}
	// About 200 ms per answer: TTFT 50 ms, then 8 tokens at 50/s.
	startProc(r.t, "sim "+name, r.bin, "sim", "--protocol", "ollama", "--listen", addr, "--model", model,
		"--ttft", "50ms", "--tokens-per-second", "50", "--default-max-tokens", "8", "--count-repeats", "--log-level", "warn")
	url := "http://" + addr
	if !waitUntil(startWithin, func() bool { return r.status(url+"/api/version", "") == http.StatusOK }) {
		r.t.Fatalf("sim %s does not answer", name)
	}
	r.sims[name] = url
}

func (r *rig) newEdge(i int) *edge {
	t := r.t
	e := &edge{name: fmt.Sprintf("%s-edge-%c", r.tag, 'a'+i), listen: freeAddr(t), nodeFront: map[string]*proxy{}}
	httpAddr := freeAddr(t)
	e.nodeAddr = freeAddr(t)
	e.base = "http://" + httpAddr
	e.front = startProxy(t, e.listen, func(c net.Conn) string { return ownerOf(c, r.edgePids()) })
	for _, n := range []string{"n1", "n2"} {
		e.nodeFront[n] = startProxy(t, e.nodeAddr, nil)
	}
	e.cfgPath = filepath.Join(r.dir, e.name+".yaml")
	yaml := fmt.Sprintf(`listen: %s
node_listen: %s
heartbeat_interval: %s
queue: {max_queue: 512, queue_timeout: %s}
runs_dsn: %q
ledger_dsn: %q
keys:
  - {name: big, hash: %q}
  - {name: lim, hash: %q, max_concurrent: %d, requests_per_minute: %d}
admin_keys:
  - {name: ops, hash: %q}
cluster:
  id: chaos
  etcd: [%s]
  name: %s
  advertise: %s
  listen: %s
  session_ttl: %s
`, httpAddr, e.nodeAddr, heartbeatInterval, queueTimeout, r.dsn, r.dsn, r.hashes[0], r.hashes[1], limMaxConcurrent, limPerMinute,
		r.hashes[2], strings.Join(r.etcd.Endpoints(), ", "), e.name, e.front.addr(), e.listen, sessionTTL)
	if err := os.WriteFile(e.cfgPath, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	return e
}

// startEdge starts (or restarts) e and waits until it answers /healthz.
func (r *rig) startEdge(e *edge) {
	p := startProc(r.t, e.name, r.bin, "edge", "--config", e.cfgPath, "--log-format", "json", "--log-level", "info")
	e.proc.Store(p)
	r.pidsMu.Lock()
	r.pids[e.name] = p.cmd.Process.Pid
	r.pidsMu.Unlock()
	if !waitUntil(startWithin, func() bool { return r.status(e.base+"/healthz", "") == http.StatusOK }) {
		r.t.Fatalf("%s does not answer /healthz:\n%s", e.name, p.logs.String())
	}
	e.killed.Store(false)
	e.out.Store(false)
}

// startForeign starts an edge of another deployment on the same etcd and
// default prefix: its own key and model, no node.
func (r *rig) startForeign() {
	t := r.t
	_, hash := auth.Generate()
	path := filepath.Join(r.dir, "foreign.yaml")
	listen := freeAddr(t)
	yaml := fmt.Sprintf(`listen: %s
node_listen: %s
database: ":memory:"
keys:
  - {name: other, hash: %q}
models:
  other-model: {targets: [other]}
cluster:
  id: foreign
  etcd: [%s]
  name: %s-foreign
  advertise: %s
  session_ttl: %s
`, freeAddr(t), freeAddr(t), hash, strings.Join(r.etcd.Endpoints(), ", "), r.tag, listen, sessionTTL)
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	r.foreign = startProc(t, "foreign edge", r.bin, "edge", "--config", path, "--log-level", "info")
	// It campaigns first: wait until its key is in its election.
	if !r.campaigning(cluster.DefaultPrefix + "/foreign/") {
		t.Fatalf("the foreign edge has no key under %s/foreign/ within %s:\n%s", cluster.DefaultPrefix, startWithin, r.foreign.logs.String())
	}
}

// campaigning waits (up to startWithin) until an edge's key is under
// prefix in etcd: it campaigns in that election.
func (r *rig) campaigning(prefix string) bool {
	cli, err := clientv3.New(clientv3.Config{Endpoints: r.etcd.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		r.t.Fatalf("etcd client: %v", err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), startWithin)
	defer cancel()
	// Watch from now, then look: a key put in between is seen by one of
	// the two.
	wch := cli.Watch(ctx, prefix, clientv3.WithPrefix(), clientv3.WithCreatedNotify())
	<-wch // created
	if resp, err := cli.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithCountOnly()); err == nil && resp.Count > 0 {
		return true
	}
	for wr := range wch {
		for _, ev := range wr.Events {
			if ev.Type == clientv3.EventTypePut {
				return true
			}
		}
	}
	return false
}

// startNode starts (or restarts) node id: n1 drives sim a, n2 sims b and c;
// each dials every edge through its own proxies.
func (r *rig) startNode(id string) {
	t := r.t
	path, ok := r.nodeCfgs[id]
	if !ok {
		var edges []string
		for _, e := range r.edges {
			edges = append(edges, e.nodeFront[id].addr())
		}
		providers := fmt.Sprintf("  - {id: pa, type: ollama, base_url: %q, models: [m], capacity: %d}\n", r.sims["a"], simCaps["a"])
		if id == "n2" {
			providers = fmt.Sprintf("  - {id: pb, type: ollama, base_url: %q, models: [m], capacity: %d}\n", r.sims["b"], simCaps["b"]) +
				fmt.Sprintf("  - {id: pc, type: ollama, base_url: %q, models: [k], capacity: %d}\n", r.sims["c"], simCaps["c"])
		}
		yaml := fmt.Sprintf("node_id: %s\nedges: [%s]\nreconnect_min: 50ms\nreconnect_max: 500ms\ndrain_timeout: 5s\nproviders:\n%s",
			id, strings.Join(edges, ", "), providers)
		path = filepath.Join(r.dir, "node-"+id+".yaml")
		if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
			t.Fatal(err)
		}
		r.nodeCfgs[id] = path
	}
	r.nodes[id] = startProc(t, "node "+id, r.bin, "node", "--config", path, "--log-level", "info")
	want := map[string]int{"n1": 1, "n2": 2}[id]
	for _, e := range r.edges {
		if e.out.Load() {
			continue
		}
		ok := waitUntil(startWithin, func() bool {
			var ps []adminwire.Provider
			if r.adminGet(e, "/admin/v1/providers", &ps) != nil {
				return false
			}
			n := 0
			for _, p := range ps {
				if p.NodeID == id && p.Status == "available" {
					n++
				}
			}
			return n == want
		})
		if !ok {
			// Rare (once in about fifty starts): say everything the two
			// processes said, whatever IOP_CHAOS_LOGS is.
			var ps []adminwire.Provider
			err := r.adminGet(e, "/admin/v1/providers", &ps)
			t.Fatalf("node %s not on %s within %s; the edge's providers: %+v (err %v)\nnode %s output:\n%s\n%s output:\n%s",
				id, e.name, startWithin, ps, err, id, r.nodes[id].logs.String(), e.name, e.proc.Load().logs.String())
		}
	}
}

// status GETs url (with bearer key if set) and returns its status, 0 when
// nothing answers within 2 s.
func (r *rig) status(url, key string) int {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := r.httpClient.Do(req)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// adminGet GETs an admin route of e into v, within 2 s.
func (r *rig) adminGet(e *edge, path string, v any) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, e.base+path, nil)
	req.Header.Set("Authorization", "Bearer "+r.admin)
	resp, err := r.httpClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", path, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

// clusterView is GET /admin/v1/cluster.
type clusterView struct {
	Leader     bool  `json:"leader"`
	Ready      bool  `json:"ready"`
	Epoch      int64 `json:"epoch"`
	HeldLeases int   `json:"held_leases"`
	Leases     int   `json:"leases"`
	Runs       int   `json:"runs"`
	Waiters    int   `json:"waiters"`
}

func (r *rig) view(e *edge) (clusterView, error) {
	var v clusterView
	err := r.adminGet(e, "/admin/v1/cluster", &v)
	return v, err
}

// leader is the live edge that leads, ready, at the highest epoch; nil if none.
func (r *rig) leader() *edge {
	var best *edge
	var epoch int64
	for _, e := range r.edges {
		if e.out.Load() {
			continue
		}
		v, err := r.view(e)
		if err == nil && v.Leader && v.Ready && v.Epoch > epoch {
			best, epoch = e, v.Epoch
		}
	}
	return best
}

// simStats is GET /stats of an iop sim.
type simStats struct {
	InFlight    int   `json:"in_flight"`
	MaxInFlight int   `json:"max_in_flight"`
	Admitted    int64 `json:"admitted"`
	Repeated    int64 `json:"repeated"`
}

func (r *rig) simStats(name string) (simStats, error) {
	var s simStats
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, r.sims[name]+"/stats", nil)
	resp, err := r.httpClient.Do(req)
	if err != nil {
		return s, err
	}
	defer resp.Body.Close()
	return s, json.NewDecoder(resp.Body).Decode(&s)
}
