package edge

import (
	"context"
	"fmt"
	"net"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"iop/internal/cluster"
	"iop/internal/edge/contract"
	"iop/internal/scheduler"
	"iop/internal/testenv/etcdtest"
	"iop/internal/wire/nodev1"
)

// benchEdge serves an edge of the cluster on etcd and connects one node
// (n1, provider p1 of capacity 1000 serving m) to it.
func benchEdge(b *testing.B, etcd *etcdtest.Cluster, name string) *Service {
	b.Helper()
	cfg := testConfig()
	cfg.HeartbeatInterval = time.Hour
	clis := clusterListener(b)
	cfg.Cluster = &cluster.Config{Etcd: etcd.Endpoints(), Name: name, Advertise: clis.Addr().String(), SessionTTL: 2 * time.Second, ID: "bench"}
	srv, err := NewServer(cfg, Deps{ClusterListener: clis})
	if err != nil {
		b.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, lis) }()
	b.Cleanup(func() { cancel(); <-served })
	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cc.Close() })
	stream, err := nodev1.NewNodeGatewayClient(cc).Connect(ctx)
	if err != nil {
		b.Fatal(err)
	}
	h := hello("n1", prov("p1", nodev1.ExecutionPath_EXECUTION_PATH_NORMALIZED, 1000, "m"))
	if err := stream.Send(&nodev1.NodeMessage{Msg: &nodev1.NodeMessage_Hello{Hello: h}}); err != nil {
		b.Fatal(err)
	}
	if _, err := stream.Recv(); err != nil {
		b.Fatal(err)
	}
	go func() {
		for {
			if _, err := stream.Recv(); err != nil {
				return
			}
		}
	}()
	return srv.Service()
}

// BenchmarkClusterAdmit measures one admission and its release, one at a
// time: local, by the leader in its own scheduler (what a single edge
// does), and follower, by a follower at the leader over gRPC on loopback
// (its Admit stream answered with the lease; the release goes on in the
// background as in a run's end). p50-ns is the median admission.
func BenchmarkClusterAdmit(b *testing.B) {
	etcd := etcdtest.Start(b)
	svcs := []*Service{benchEdge(b, etcd, "edge-1"), benchEdge(b, etcd, "edge-2")}
	var leader, follower *Service
	deadline := time.Now().Add(30 * time.Second)
	for leader == nil || follower == nil {
		if time.Now().After(deadline) {
			b.Fatal("no ready leader known to both edges within 30s")
		}
		leader, follower = nil, nil
		for i, s := range svcs {
			st, _ := s.Cluster()
			other, _ := svcs[1-i].Cluster()
			if st.Leader && st.Ready && other.Epoch == st.Epoch && !other.Leader {
				leader, follower = s, svcs[1-i]
			}
		}
		// The follower must have the node too (its registry) and see the
		// leader; poll.
		select {
		case <-time.After(10 * time.Millisecond):
		}
	}
	for follower.reg.current("n1") == nil || leader.reg.current("n1") == nil {
		select {
		case <-time.After(10 * time.Millisecond):
		}
	}
	req := contract.Request{Model: "m", RunID: "bench"}
	run := func(b *testing.B, admit func(i int) func()) {
		times := make([]time.Duration, 0, b.N)
		b.ResetTimer()
		for i := range b.N {
			start := time.Now()
			release := admit(i)
			times = append(times, time.Since(start))
			release()
		}
		b.StopTimer()
		slices.Sort(times)
		b.ReportMetric(float64(times[len(times)/2].Nanoseconds()), "p50-ns")
	}
	b.Run("local", func(b *testing.B) {
		run(b, func(i int) func() {
			l, err := leader.sched.Admit(context.Background(), scheduler.Request{
				Group: "m", Resolve: leader.resolver("m", needsOf(req), nil),
			})
			if err != nil {
				b.Fatal(err)
			}
			l.Track(fmt.Sprint("bench-local-", i))
			return func() { l.Release("done") }
		})
	})
	b.Run("follower", func(b *testing.B) {
		run(b, func(i int) func() {
			r := req
			r.RunID = fmt.Sprint("bench-follower-", i)
			rl, err := follower.cl.admit(context.Background(), r, nil, prefixRoute{}, func() {})
			if err != nil || rl == nil {
				b.Fatalf("follower admit: %v (lease %v)", err, rl)
			}
			return func() { rl.release("done") }
		})
	})
}
