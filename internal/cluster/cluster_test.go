package cluster

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"iop/internal/testenv/etcdtest"
)

// waitState polls (every 20 ms, up to 30 s) until cond holds over the
// states of es.
func waitState(t *testing.T, what string, es []*Elector, cond func([]State) bool) []State {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		sts := make([]State, len(es))
		for i, e := range es {
			sts[i] = e.State()
		}
		if cond(sts) {
			return sts
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 30s; states %+v", what, sts)
		}
		select {
		case <-es[0].Changes():
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// oneLeader: exactly one elector leads and every elector names it at the
// same epoch.
func oneLeader(sts []State) bool {
	leaders := 0
	for _, s := range sts {
		if s.Leader {
			leaders++
		}
		if s.Epoch == 0 || s.Epoch != sts[0].Epoch || s.LeaderAddr != sts[0].LeaderAddr {
			return false
		}
	}
	return leaders == 1
}

func leaderOf(sts []State) int {
	for i, s := range sts {
		if s.Leader {
			return i
		}
	}
	return -1
}

func start(t *testing.T, endpoints []string, n int) []*Elector {
	t.Helper()
	var es []*Elector
	for i := range n {
		e, err := Start(Config{Etcd: endpoints, Name: fmt.Sprintf("edge-%d", i+1), Advertise: fmt.Sprintf("127.0.0.1:%d", 17000+i), SessionTTL: 2 * time.Second, ID: "test"}, nil)
		if err != nil {
			t.Fatal(err)
		}
		es = append(es, e)
	}
	t.Cleanup(func() {
		for _, e := range es {
			_ = e.Close()
		}
	})
	return es
}

// TestElection: three edges elect exactly one leader, which every edge
// names at one epoch; when the leader stops another is elected at a
// higher epoch; with one etcd member killed the election goes on; an edge
// whose session was lost (its lease revoked, as when it expires) steps
// down at once and follows the next leader, at a higher epoch.
func TestElection(t *testing.T) {
	etcd := etcdtest.Start(t)
	es := start(t, etcd.Endpoints(), 3)
	sts := waitState(t, "one leader", es, oneLeader)
	first, epoch := leaderOf(sts), sts[0].Epoch
	if sts[0].LeaderAddr != es[first].cfg.Advertise {
		t.Fatalf("leader address %q, want the leader's advertise %q", sts[0].LeaderAddr, es[first].cfg.Advertise)
	}

	// The leader stops: another is elected, at a higher epoch.
	rest := append(append([]*Elector{}, es[:first]...), es[first+1:]...)
	if err := es[first].Close(); err != nil {
		t.Fatal(err)
	}
	sts = waitState(t, "a new leader after the first stopped", rest, func(s []State) bool { return oneLeader(s) && s[0].Epoch > epoch })
	epoch = sts[0].Epoch

	// One etcd member down: the cluster keeps going.
	etcd.Kill(0)
	second := rest[leaderOf(sts)]
	cli, err := clientv3.New(clientv3.Config{Endpoints: etcd.Endpoints()[1:], DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, DefaultPrefix+"/test/", clientv3.WithFirstCreate()...)
	if err != nil || len(resp.Kvs) == 0 {
		t.Fatalf("leader key: %v %v", resp, err)
	}
	// The leader's session is lost (its lease revoked): it steps down, and
	// the other is elected at a higher epoch; the old one follows it.
	if _, err := cli.Revoke(ctx, clientv3.LeaseID(resp.Kvs[0].Lease)); err != nil {
		t.Fatal(err)
	}
	sts = waitState(t, "a new leader after the session loss", rest, func(s []State) bool {
		return oneLeader(s) && s[0].Epoch > epoch && !s[leaderIndex(rest, second)].Leader
	})
	if sts[0].Epoch <= epoch {
		t.Fatalf("epoch %d after failover, want > %d", sts[0].Epoch, epoch)
	}
	etcd.Restart(0)
}

func leaderIndex(es []*Elector, e *Elector) int {
	for i := range es {
		if es[i] == e {
			return i
		}
	}
	return -1
}

func TestConfigValidate(t *testing.T) {
	for _, c := range []Config{
		{},
		{Etcd: []string{"http://x:2379"}},
		{Etcd: []string{"http://x:2379"}, Name: "e"},
		{Etcd: []string{"http://x:2379"}, Name: "e", Advertise: "h:1", SessionTTL: time.Millisecond},
		{Etcd: []string{"http://x:2379"}, Name: "e", Advertise: "h:1", EtcdCert: "c"},
		{Etcd: []string{"http://x:2379"}, Name: "e", Advertise: "h:1", EtcdUsername: "u", ID: "prod"},
		{Etcd: []string{"http://x:2379"}, Name: "e", Advertise: "h:1"}, // no id, no token
		{Etcd: []string{"http://x:2379"}, Name: "e", Advertise: "h:1", ID: "a/b"},
		{Etcd: []string{"http://x:2379"}, Name: "e", Advertise: "h:1", ID: "prod", TLSCert: "c"},
		{Etcd: []string{"http://x:2379"}, Name: "e", Advertise: "h:1", ID: "prod", TLSCA: "ca"},
	} {
		if c.Validate() == nil {
			t.Errorf("%+v: valid, want an error", c)
		}
	}
	for _, c := range []Config{
		{Etcd: []string{"http://x:2379"}, Name: "e", Advertise: "h:1", ID: "prod"},
		{Etcd: []string{"http://x:2379"}, Name: "e", Advertise: "h:1", Token: "secret"},
		{Etcd: []string{"http://x:2379"}, Name: "e", Advertise: "h:1", ID: "prod", TLSCert: "c", TLSKey: "k", TLSCA: "ca"},
	} {
		if err := c.Validate(); err != nil {
			t.Errorf("%+v: %v", c, err)
		}
	}
}

// TestRegression_CloseWithoutEtcdReturns: a follower edge stopping while
// etcd is unreachable hung in Close for good (its campaign goroutine
// resigned on the etcd client's context, and Close waited for it before
// closing that client): SIGTERM printed "edge shutting down" and the
// process stayed. With every member killed, Close returns.
func TestRegression_CloseWithoutEtcdReturns(t *testing.T) {
	etcd := etcdtest.Start(t)
	es := start(t, etcd.Endpoints(), 2)
	waitState(t, "one leader", es, oneLeader)
	for i := range 3 {
		etcd.Kill(i)
	}
	closed := make(chan error, 2)
	for _, e := range es {
		go func() { closed <- e.Close() }()
	}
	deadline := time.After(30 * time.Second) // a failsafe, far above closeResignWait
	for range es {
		select {
		case <-closed:
		case <-deadline:
			t.Fatal("Close did not return with etcd unreachable")
		}
	}
}

// TestDeposeStepsDownAtOnce: a leader told of a higher epoch (a node's
// refusal, a peer) stops leading before Depose returns (Leads is 0), gives
// up its session and campaigns again; the election goes on at a higher
// epoch with one leader. Depose of an epoch not above this edge's is a
// no-op.
func TestDeposeStepsDownAtOnce(t *testing.T) {
	etcd := etcdtest.Start(t)
	es := start(t, etcd.Endpoints(), 2)
	sts := waitState(t, "one leader", es, oneLeader)
	li, epoch := leaderOf(sts), sts[0].Epoch
	l := es[li]
	if got := l.Leads(); got != epoch {
		t.Fatalf("Leads = %d, want %d", got, epoch)
	}
	l.Depose(epoch, "")
	if got := l.Leads(); got != epoch {
		t.Fatalf("after Depose of its own epoch: Leads = %d, want %d", got, epoch)
	}
	l.Depose(epoch+100, "")
	if got := l.Leads(); got != 0 {
		t.Fatalf("after Depose of a higher epoch: Leads = %d, want 0", got)
	}
	if st := l.State(); st.Leader {
		t.Fatalf("after Depose: state %+v, want not leading", st)
	}
	// Its session revoked, the election goes on at a higher epoch.
	waitState(t, "a leader above the deposed epoch", es, func(s []State) bool {
		return oneLeader(s) && s[0].Epoch > epoch
	})
}

// TestRegression_DuplicateNameWarns: two edges of one cluster given the
// same cluster.name ran without a word, their logs and the leader's view
// of its followers mixed up. The second to start warns, naming the
// first's advertise address (NameInUseBy, shown in /admin/v1/cluster);
// the first, and an edge with its own name, do not.
func TestRegression_DuplicateNameWarns(t *testing.T) {
	etcd := etcdtest.Start(t)
	var logs [3]syncLog
	var es []*Elector
	for i, c := range []struct{ name, addr string }{{"edge-a", "127.0.0.1:17100"}, {"edge-a", "127.0.0.1:17101"}, {"edge-b", "127.0.0.1:17102"}} {
		e, err := Start(Config{Etcd: etcd.Endpoints(), Name: c.name, Advertise: c.addr, SessionTTL: 2 * time.Second, ID: "test"},
			slog.New(slog.NewJSONHandler(&logs[i], nil)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = e.Close() })
		es = append(es, e)
		if i == 0 {
			waitState(t, "the first edge's session", es, func(s []State) bool { return s[0].Epoch != 0 })
		}
	}
	waitState(t, "one leader", es, oneLeader)
	deadline := time.Now().Add(30 * time.Second)
	for es[1].NameInUseBy() == "" && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if got := es[1].NameInUseBy(); got != "127.0.0.1:17100" {
		t.Fatalf("second edge-a: NameInUseBy %q, want the first's 127.0.0.1:17100", got)
	}
	if !strings.Contains(logs[1].String(), "another edge of this cluster has this edge's cluster.name") {
		t.Errorf("second edge-a logged no warning:\n%s", logs[1].String())
	}
	for _, i := range []int{0, 2} {
		if got := es[i].NameInUseBy(); got != "" || strings.Contains(logs[i].String(), "cluster.name") {
			t.Errorf("edge %d: NameInUseBy %q, log:\n%s", i, got, logs[i].String())
		}
	}
}

// syncLog is a log buffer safe for a logger and a test at once.
type syncLog struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncLog) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncLog) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
