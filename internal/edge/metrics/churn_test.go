package metrics

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"iop/internal/clock"
	"iop/internal/edge"
	"iop/internal/edge/contract"
	"iop/internal/edge/lifecycle"
	"iop/internal/testenv"
	"iop/internal/wire/nodev1"
)

// labelSets counts the series of reg whose name is one of names.
func labelSets(t *testing.T, reg *prometheus.Registry, names ...string) int {
	t.Helper()
	n := 0
	for k := range series(t, reg) {
		for _, name := range names {
			if strings.HasPrefix(k, name+"{") {
				n++
			}
		}
	}
	return n
}

var nodeSeries = []string{"iop_node_connects_total", "iop_node_fences_total"}

// TestNodeLabelsOfGoneNodesForgotten: 10,000 nodes with distinct ids
// connect and are fenced; their label values stay while they may come back
// (less than edge.ForgetAfter) and are deleted at the first node event
// after that. A node that reconnected (its old connection's fence arriving
// after the new connection) and one that is connected keep theirs.
func TestNodeLabelsOfGoneNodesForgotten(t *testing.T) {
	const nodes = 10_000
	reg := prometheus.NewRegistry()
	m, err := New(reg, fixedSnapshot{})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Unix(1_000_000, 0)
	ev := func(typ lifecycle.Type, node string, gen uint64, at time.Time) {
		m.Observe(lifecycle.Event{Type: typ, NodeID: node, Generation: gen, Time: at, Reason: "stream ended"})
	}
	ev(lifecycle.NodeConnected, "stays", 1, t0)
	// "back" reconnects: its old connection's fence comes after the new
	// connection's event, and leaves it live.
	ev(lifecycle.NodeConnected, "back", 2, t0)
	ev(lifecycle.NodeConnected, "back", 3, t0)
	ev(lifecycle.NodeFenced, "back", 2, t0)
	before := labelSets(t, reg, nodeSeries...)
	for i := range nodes {
		at := t0.Add(time.Duration(i) * time.Millisecond)
		ev(lifecycle.NodeConnected, fmt.Sprintf("node-%05d", i), uint64(10+i), at)
		ev(lifecycle.NodeFenced, fmt.Sprintf("node-%05d", i), uint64(10+i), at)
	}
	if got := labelSets(t, reg, nodeSeries...); got != before+2*nodes {
		t.Fatalf("within ForgetAfter: %d node series, want %d", got, before+2*nodes)
	}
	later := t0.Add(nodes*time.Millisecond + edge.ForgetAfter)
	ev(lifecycle.NodeConnected, "stays", 1, later) // any node event
	if got := labelSets(t, reg, nodeSeries...); got != before {
		t.Fatalf("after ForgetAfter: %d node series, want the %d of the nodes still connected", got, before)
	}
	got := series(t, reg)
	if got["iop_node_connects_total{node=back}"] != 2 || got["iop_node_connects_total{node=stays}"] != 2 {
		t.Fatalf("live nodes' counters: %v", got)
	}
	m.mu.Lock()
	tracked, reasons, gone, expiry := len(m.nodeGen), len(m.reasons), len(m.gone), len(m.expiry)
	m.mu.Unlock()
	if tracked != 2 || reasons != 1 || gone != 0 || expiry != 0 {
		t.Fatalf("tracking %d nodes, fence reasons of %d, %d gone, %d expiry marks; want 2, 1, 0, 0", tracked, reasons, gone, expiry)
	}
}

// TestMetricsOfRealNodeChurn: a real edge whose node endpoint 500 nodes
// connect to over gRPC, one after another, each going away again. Once
// edge.ForgetAfter passed (on the edge's clock) and a node connects, the
// node and provider label sets are back at their starting size.
func TestMetricsOfRealNodeChurn(t *testing.T) {
	const nodes = 500
	clk := clock.NewFake(time.Unix(1_000_000, 0))
	reg := prometheus.NewRegistry()
	var svc *edge.Service
	m, err := New(reg, snapshotFunc(func() contract.Snapshot { return svc.Snapshot() }))
	if err != nil {
		t.Fatal(err)
	}
	cfg := edge.DefaultConfig()
	cfg.HeartbeatInterval = time.Hour
	// fenced counts the fences the metrics saw, so a disconnect waits for
	// its own (emitted on the connection's goroutine).
	var fenced atomic.Int64
	countFences := lifecycle.ObserverFunc(func(e lifecycle.Event) {
		if e.Type == lifecycle.NodeFenced {
			fenced.Add(1)
		}
	})
	srv, err := edge.NewServer(cfg, edge.Deps{Clock: clk, Observer: lifecycle.Observers{m, countFences}})
	if err != nil {
		t.Fatal(err)
	}
	svc = srv.Service()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, lis) }()
	defer func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	}()
	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	client := nodev1.NewNodeGatewayClient(cc)

	// connect opens a node's control stream and waits for Welcome; its
	// cancel ends the connection, and waits until the edge fenced it.
	connect := func(id string) (disconnect func()) {
		t.Helper()
		ctx, cancel := context.WithCancel(context.Background())
		stream, err := client.Connect(ctx)
		if err != nil {
			t.Fatal(err)
		}
		hello := &nodev1.Hello{NodeId: id, Providers: []*nodev1.Provider{{Id: "p", Type: "sim", Models: []string{"m-" + id},
			Capacity: 1, ExecutionPath: nodev1.ExecutionPath_EXECUTION_PATH_NORMALIZED, Healthy: true}}}
		if err := stream.Send(&nodev1.NodeMessage{Msg: &nodev1.NodeMessage_Hello{Hello: hello}}); err != nil {
			t.Fatal(err)
		}
		if first, err := stream.Recv(); err != nil || first.GetWelcome() == nil {
			t.Fatalf("node %s: %v %v, want Welcome", id, first, err)
		}
		waitFor(t, id+" connected", func() bool { return connected(svc.Snapshot(), id) })
		return func() {
			n := fenced.Load()
			cancel()
			waitFor(t, id+" fenced", func() bool { return fenced.Load() > n })
		}
	}
	forgetTrigger := func(stays func()) func() {
		clk.Advance(edge.ForgetAfter)
		stays()
		return connect("stays")
	}
	all := append([]string{"iop_provider_capacity", "iop_provider_in_flight", "iop_provider_healthy"}, nodeSeries...)
	stays := forgetTrigger(connect("stays"))
	before := labelSets(t, reg, all...)
	for i := range nodes {
		connect(fmt.Sprintf("churn-%03d", i))()
	}
	if got := labelSets(t, reg, nodeSeries...); got < 2*nodes {
		t.Fatalf("within ForgetAfter: %d node series, want at least %d", got, 2*nodes)
	}
	forgetTrigger(stays)
	var after int
	waitFor(t, "labels forgotten", func() bool { after = labelSets(t, reg, all...); return after == before })
	t.Logf("series of nodes and providers: %d before, %d after %d nodes came and went", before, after, nodes)
}

type snapshotFunc func() contract.Snapshot

func (f snapshotFunc) Snapshot() contract.Snapshot { return f() }

func connected(s contract.Snapshot, node string) bool {
	for _, n := range s.Nodes {
		if n.NodeID == node {
			return true
		}
	}
	return false
}

// waitFor polls cond until it holds, failing after 10 s (never reached by
// a passing test).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testenv.Eventually(t, what, cond)
}
