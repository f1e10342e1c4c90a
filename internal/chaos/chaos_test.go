package chaos

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"iop/internal/edge/adminwire"
	"iop/internal/testenv"
)

// Environment of the suite.
const (
	enableEnv   = "IOP_CHAOS"          // "1" runs the suite
	scenarioEnv = "IOP_CHAOS_SCENARIO" // run only these scenarios (comma-separated names)
	runsEnv     = "IOP_CHAOS_RUNS"     // runs per scenario; default 5
	binEnv      = "IOP_CHAOS_BIN"      // a built iop binary; default: built here
	tableEnv    = "IOP_CHAOS_TABLE"    // where the table goes; default bin/chaos-table.md
)

// Phases of a run.
const (
	warmUp   = 4 * time.Second  // load before the fault
	recovery = 10 * time.Second // load after the fault's reference time
	graceRef = 500 * time.Millisecond
)

// scenario is one fault. fault runs mid-load and returns the reference
// time admission must resume after (the kill, the end of a freeze).
type scenario struct {
	name         string
	what         string
	foreignFirst bool
	fault        func(t *testing.T, r *rig) time.Time
	// gapWithin, when set, bounds the longest time with no new result on
	// any edge: a leader frozen longer than session_ttl is replaced, so
	// admission must not wait for it to wake.
	gapWithin time.Duration
	// answersFor is how long after the fault began the leader may still
	// answer (queue, beat) before it is lost to the followers: 0 for a
	// kill, a freeze or a cut; for a lost quorum, session_ttl after the
	// last renewal etcd may still grant (the leader steps down when its
	// last renewal is session_ttl old; a surviving raft leader grants
	// renewals until its check-quorum notices the loss, up to two
	// election timeouts). A 503 no_leader is bounded from the later of its
	// request and that instant.
	answersFor time.Duration
	// providersStay: every node keeps its connection to every edge that
	// serves, or makes a new one to an edge that starts: a 503
	// provider_unavailable is a wrong answer.
	providersStay bool
}

var scenarios = []scenario{
	{name: "kill", what: "SIGKILL of the leader", fault: killLeader},
	{name: "stop1", what: "SIGSTOP of the leader 1 s", fault: freezeLeader(1 * time.Second)},
	{name: "stop3.5", what: "SIGSTOP of the leader 3.5 s", fault: freezeLeader(3500 * time.Millisecond)},
	{name: "stop10", what: "SIGSTOP of the leader 10 s", fault: freezeLeader(10 * time.Second), gapWithin: resumeWithin},
	{name: "stop20", what: "SIGSTOP of the leader 20 s", fault: freezeLeader(20 * time.Second), gapWithin: resumeWithin},
	{name: "quorum", what: "etcd quorum lost 8 s (2 of 3 members killed)", fault: loseQuorum, answersFor: etcdQuorumNoticed + sessionTTL},
	{name: "cut", what: "a follower's link to the leader stalled 8 s", fault: stallFollower},
	{name: "restart-follower", what: "a follower restarted (SIGTERM, start)", fault: restartFollower, providersStay: true},
	{name: "restart-node", what: "a node restarted (SIGTERM, start)", fault: restartNode},
	{name: "second-deployment", what: "another deployment's edge on the same etcd", foreignFirst: true, fault: func(*testing.T, *rig) time.Time { return time.Now() }},
}

func killLeader(t *testing.T, r *rig) time.Time {
	l := r.mustLeader(t)
	l.out.Store(true)
	l.killed.Store(true)
	at := time.Now()
	l.proc.Load().kill()
	t.Logf("killed leader %s", l.name)
	return at
}

func freezeLeader(d time.Duration) func(*testing.T, *rig) time.Time {
	return func(t *testing.T, r *rig) time.Time {
		l := r.mustLeader(t)
		l.out.Store(true)
		l.thawedAt.Store(0)
		l.frozenAt.Store(time.Now().UnixNano())
		l.proc.Load().signal(syscall.SIGSTOP)
		time.Sleep(d)
		l.proc.Load().signal(syscall.SIGCONT)
		at := time.Now()
		l.thawedAt.Store(at.UnixNano())
		l.out.Store(false)
		t.Logf("froze leader %s for %s", l.name, d)
		return at
	}
}

// etcdQuorumNoticed bounds how long a raft leader left without its
// quorum may still grant lease renewals: two election timeouts of
// etcdtest's members (500 ms).
const etcdQuorumNoticed = 2 * 500 * time.Millisecond

func loseQuorum(t *testing.T, r *rig) time.Time {
	r.etcd.Kill(0)
	r.etcd.Kill(1)
	time.Sleep(8 * time.Second)
	r.etcd.Restart(0)
	at := time.Now()
	r.etcd.Restart(1)
	return at
}

func stallFollower(t *testing.T, r *rig) time.Time {
	l := r.mustLeader(t)
	f := r.follower(l)
	l.front.set(f.name, stall)
	time.Sleep(8 * time.Second)
	l.front.set(f.name, pass)
	t.Logf("stalled %s's link to leader %s; the leader's proxy saw connections %v", f.name, l.name, l.front.sources())
	return time.Now()
}

func restartFollower(t *testing.T, r *rig) time.Time {
	f := r.follower(r.mustLeader(t))
	f.out.Store(true)
	began := time.Now()
	f.proc.Load().stop(30 * time.Second)
	stopped := time.Now()
	r.startEdge(f)
	t.Logf("restarted follower %s: SIGTERM to exit %s", f.name, stopped.Sub(began).Round(time.Millisecond))
	return time.Now()
}

func restartNode(t *testing.T, r *rig) time.Time {
	r.nodes["n1"].stop(30 * time.Second)
	r.startNode("n1")
	return time.Now()
}

func (r *rig) mustLeader(t *testing.T) *edge {
	var l *edge
	if !waitUntil(startWithin, func() bool { l = r.leader(); return l != nil }) {
		t.Fatalf("no ready leader within %s", startWithin)
	}
	return l
}

// follower is a live edge other than l.
func (r *rig) follower(l *edge) *edge {
	for _, e := range r.edges {
		if e != l && !e.out.Load() {
			return e
		}
	}
	return nil
}

// TestChaos runs every scenario (or those of IOP_CHAOS_SCENARIO) RUNS
// times on a fresh deployment each, judges the invariants after every run
// and writes the table.
func TestChaos(t *testing.T) {
	if os.Getenv(enableEnv) != "1" {
		t.Skipf("the chaos suite runs with %s=1 (make chaos)", enableEnv)
	}
	runs := 5
	if s := os.Getenv(runsEnv); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			t.Fatalf("%s=%q: want a positive number", runsEnv, s)
		}
		runs = n
	}
	only := map[string]bool{}
	for _, s := range strings.Split(os.Getenv(scenarioEnv), ",") {
		if s = strings.TrimSpace(s); s != "" {
			only[s] = true
		}
	}
	for name := range only {
		if !known(name) {
			t.Fatalf("%s: no scenario %q (have %s)", scenarioEnv, name, names())
		}
	}
	bin := iopBinary(t)
	dsn := testenv.Postgres(t)
	var rows []row
	for _, sc := range scenarios {
		if len(only) > 0 && !only[sc.name] {
			continue
		}
		rw := row{scenario: sc}
		for i := 1; i <= runs; i++ {
			t.Run(fmt.Sprintf("%s/run%d", sc.name, i), func(t *testing.T) {
				tag := fmt.Sprintf("%s-r%d-%d", strings.ReplaceAll(sc.name, ".", ""), i, time.Now().UnixNano()%100000)
				f, ok := runOnce(t, bin, dsn, tag, sc)
				rw.add(f, ok)
			})
		}
		rows = append(rows, rw)
	}
	table := renderTable(rows, runs)
	fmt.Println(table)
	path := os.Getenv(tableEnv)
	if path == "" {
		path = filepath.Join("..", "..", "bin", "chaos-table.md")
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err == nil {
		if err := os.WriteFile(path, []byte(table), 0o644); err != nil {
			t.Errorf("writing the table: %v", err)
		}
	}
}

func known(name string) bool {
	for _, sc := range scenarios {
		if sc.name == name {
			return true
		}
	}
	return false
}

func names() string {
	var out []string
	for _, sc := range scenarios {
		out = append(out, sc.name)
	}
	return strings.Join(out, ", ")
}

// iopBinary is IOP_CHAOS_BIN, else the iop command built into a temporary
// directory.
func iopBinary(t *testing.T) string {
	if b := os.Getenv(binEnv); b != "" {
		return b
	}
	path := filepath.Join(t.TempDir(), "iop")
	if out, err := exec.Command("go", "build", "-o", path, "iop/cmd/iop").CombinedOutput(); err != nil {
		t.Fatalf("go build iop/cmd/iop: %v\n%s", err, out)
	}
	return path
}

// runOnce runs one scenario on a fresh deployment and judges it. A
// harness failure (a process that does not start) fails the test; an
// invariant broken marks the run failed and is reported in the table.
func runOnce(t *testing.T, bin, dsn, tag string, sc scenario) (figures, bool) {
	r := newRig(t, bin, dsn, tag, sc.foreignFirst)
	mon := startMonitor(r)
	ld := startLoad(r)
	loadStart := time.Now()
	if !sc.foreignFirst {
		if !waitUntil(warmUp+10*time.Second, func() bool { return ld.completed() >= 20 }) {
			t.Fatalf("the load completes nothing before the fault (%d completed)", ld.completed())
		}
	}
	time.Sleep(time.Until(loadStart.Add(warmUp)))
	began := time.Now()
	ref := sc.fault(t, r)
	time.Sleep(time.Until(ref.Add(recovery)))
	outs := ld.halt()
	mon.halt()
	f := judge(t, r, mon, outs, loadStart, began, began.Add(sc.answersFor), ref, sc.providersStay)
	f.gapWithin = sc.gapWithin
	ok := f.pass()
	t.Logf("%s %s: %s", sc.name, tag, f)
	if !ok {
		t.Errorf("%s: invariants broken: %s", sc.name, f)
		for _, s := range f.examples {
			t.Log("  " + s)
		}
	}
	return f, ok
}

func (l *load) completed() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, o := range l.outs {
		if o.complete {
			n++
		}
	}
	return n
}

// monitor samples every live edge's providers twice a second and keeps
// the most circuits seen not closed at once.
type monitor struct {
	r        *rig
	stop     chan struct{}
	done     chan struct{}
	mu       sync.Mutex
	maxOpen  int
	openSeen string
}

func startMonitor(r *rig) *monitor {
	m := &monitor{r: r, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(m.done)
		tick := time.NewTicker(500 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-m.stop:
				return
			case <-tick.C:
			}
			m.sample()
		}
	}()
	return m
}

func (m *monitor) sample() {
	var wg sync.WaitGroup
	for _, e := range m.r.edges {
		if e.out.Load() {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			var ps []adminwire.Provider
			if m.r.adminGet(e, "/admin/v1/providers", &ps) != nil {
				return
			}
			n, which := 0, []string{}
			for _, p := range ps {
				if p.Circuit != "" && p.Circuit != "closed" {
					n++
					which = append(which, p.NodeID+"/"+p.ProviderID+" "+p.Circuit)
				}
			}
			m.mu.Lock()
			if n > m.maxOpen {
				m.maxOpen = n
				m.openSeen = fmt.Sprintf("%s at %s: %s", e.name, time.Now().Format("15:04:05.000"), strings.Join(which, ", "))
			}
			m.mu.Unlock()
		}()
	}
	wg.Wait()
}

func (m *monitor) halt() {
	close(m.stop)
	<-m.done
}
