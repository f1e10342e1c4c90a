package e2e

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"iop/internal/e2e/harness"
	"iop/internal/edge"
	"iop/internal/edge/contract"
	"iop/internal/node"
	"iop/internal/sim"
	"iop/internal/testenv"
	"iop/internal/wire/memlink"
)

// BenchmarkDispatchRoundTrip measures one run through a real edge Service
// and a real node Agent, per run: Service.Dispatch, the node calling its
// provider (iop sim, OpenAI protocol, no latency: the tunnel path) and the
// answer read to its end with Run.Recv, then Run.Close. The node reaches
// the edge over each link: grpc (loopback gRPC, as a remote node) and
// memory (the node in the edge's process, package memlink). seq runs one
// at a time (the latency of the two hops), par4xcpu four per GOMAXPROCS
// at once, agent100k one at a time with an agent's 95 KiB request
// (internal/edge/testdata/agent_100k.json); cpu-ns/op is the process's
// CPU time per run (edge, node and simulator together). No HTTP client is
// involved: the edge's API layer is not measured.
func BenchmarkDispatchRoundTrip(b *testing.B) {
	agent, err := os.ReadFile("../edge/testdata/agent_100k.json")
	if err != nil {
		b.Fatal(err)
	}
	for _, link := range []string{harness.LinkGRPC, harness.LinkMemory} {
		b.Run(link, func(b *testing.B) { benchDispatch(b, link, agent) })
	}
}

func benchDispatch(b *testing.B, link string, agent []byte) {
	s, err := sim.New(sim.Config{Protocol: sim.ProtocolOpenAI, Models: []string{"m"}, DefaultMaxTokens: 4}, slog.New(slog.DiscardHandler))
	if err != nil {
		b.Fatal(err)
	}
	url, stopSim, err := s.Start("127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer stopSim()

	cfg := edge.DefaultConfig()
	srv, err := edge.NewServer(cfg, edge.Deps{Logger: slog.New(slog.DiscardHandler)})
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
	ncfg := node.Config{
		NodeID: "bench",
		Edge:   lis.Addr().String(),
		Providers: []node.ProviderConfig{{
			ID: "p", Type: node.TypeSim, Protocol: node.TypeOpenAI, BaseURL: url + "/v1", Models: []string{"m"}, Capacity: 64,
		}},
	}
	var opts []node.Option
	if link == harness.LinkMemory {
		ml := memlink.New(srv.NodeGateway())
		defer ml.Close()
		ncfg.Edge, opts = "", []node.Option{node.WithGateway(ml)}
	}
	a, err := node.New(ncfg, slog.New(slog.DiscardHandler), opts...)
	if err != nil {
		b.Fatal(err)
	}
	ran := make(chan error, 1)
	go func() { ran <- a.Run(ctx) }()
	defer func() {
		cancel()
		<-ran
		<-served
	}()
	select {
	case <-a.Ready():
	case <-time.After(10 * time.Second):
		b.Fatal("the node did not connect")
	}
	svc := srv.Service()
	small := []byte(`{"model":"m","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`)
	one := func(body []byte) error {
		r, err := svc.Dispatch(context.Background(), contract.Request{Model: "m", Operation: contract.OperationChat, Body: body})
		if err != nil {
			return err
		}
		defer r.Close(contract.OutcomeCompleted)
		for {
			m, err := r.Recv()
			if errors.Is(err, io.EOF) {
				return nil
			}
			if err != nil {
				return err
			}
			if m.Ends {
				return nil
			}
		}
	}
	// Until the provider is in rotation (the node's Hello went through)
	// and its warm streams, if any, are open: the first run then measures
	// what every run does.
	testenv.Eventually(b, "the provider in rotation and the node's warm run streams open", func() bool {
		snap := svc.Snapshot()
		return len(snap.Providers) == 1 && snap.Providers[0].Status == "available" &&
			len(snap.Nodes) == 1 && snap.Nodes[0].IdleRunStreams >= node.WarmStreams
	})
	if err := one(small); err != nil {
		b.Fatal(err)
	}

	b.Run("seq", func(b *testing.B) {
		b.ReportAllocs()
		cpu := cpuTime()
		for b.Loop() {
			if err := one(small); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(cpuTime()-cpu)/float64(b.N), "cpu-ns/op")
	})
	b.Run("par4xcpu", func(b *testing.B) {
		b.ReportAllocs()
		b.SetParallelism(4)
		cpu := cpuTime()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if err := one(small); err != nil {
					b.Error(err)
					return
				}
			}
		})
		b.ReportMetric(float64(cpuTime()-cpu)/float64(b.N), "cpu-ns/op")
	})
	b.Run("agent100k", func(b *testing.B) {
		b.ReportAllocs()
		cpu := cpuTime()
		for b.Loop() {
			if err := one(agent); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(cpuTime()-cpu)/float64(b.N), "cpu-ns/op")
	})
}

// cpuTime is the CPU time (user and system) the process has used, in
// nanoseconds: the edge's, the node's and the simulator's together, the
// least noisy figure on a shared machine.
func cpuTime() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}
