package edge

import (
	"context"
	"errors"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"iop/internal/wire/nodev1"
)

// benchAnswer is a non-streamed chat completion as iop sim answers one.
const benchAnswer = `{"id":"chatcmpl-sim-1","object":"chat.completion","created":1767225600,"model":"bench-openai","system_fingerprint":"fp_sim",` +
	`"choices":[{"index":0,"message":{"role":"assistant","content":"Lorem ipsum dolor sit amet consectetur adipiscing elit"},"logprobs":null,"finish_reason":"length"}],` +
	`"usage":{"prompt_tokens":12,"completion_tokens":8,"total_tokens":20}}`

// answerReader is a NodeGateway whose Run reads a run's messages, each
// decoded once (decodeRunUp), until one ends the run, then ends the stream,
// as the edge reads a run stream.
type answerReader struct {
	nodev1.UnimplementedNodeGatewayServer
}

func (answerReader) Run(stream grpc.BidiStreamingServer[nodev1.RunUp, nodev1.RunDown]) error {
	for {
		m, err := stream.Recv()
		if err != nil {
			return err
		}
		if rm, ok := decodeRunUp(m); ok && rm.msg.Ends {
			return nil
		}
	}
}

// BenchmarkTunnelAnswerOverGRPC measures one small non-streamed tunnel
// answer going up a run stream over loopback gRPC, per answer: a new Run
// stream, RunOpen, the answer, and the edge's side reading it to its
// terminal message; as the node sent it before (three_messages:
// TunnelHead, TunnelData, TunnelEnd) and as it sends it now (one_message:
// a TunnelHead with data and end). cpu-ns/op is the process's CPU time
// (both ends) per answer.
func BenchmarkTunnelAnswerOverGRPC(b *testing.B) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := grpc.NewServer()
	nodev1.RegisterNodeGatewayServer(srv, answerReader{})
	go srv.Serve(lis)
	defer srv.Stop()
	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	defer cc.Close()
	client := nodev1.NewNodeGatewayClient(cc)
	headers := map[string]string{"Content-Type": "application/json"}
	open := &nodev1.RunUp{Msg: &nodev1.RunUp_Open{Open: &nodev1.RunOpen{RunId: "run_0123456789abcdef", NodeId: "n", Generation: 1}}}
	for _, bc := range []struct {
		name string
		msgs []*nodev1.RunUp
	}{
		{"three_messages", []*nodev1.RunUp{
			{Msg: &nodev1.RunUp_TunnelHead{TunnelHead: &nodev1.TunnelHead{Status: 200, Headers: headers}}},
			{Msg: &nodev1.RunUp_TunnelData{TunnelData: &nodev1.TunnelData{Data: []byte(benchAnswer)}}},
			{Msg: &nodev1.RunUp_TunnelEnd{TunnelEnd: &nodev1.TunnelEnd{}}},
		}},
		{"one_message", []*nodev1.RunUp{
			{Msg: &nodev1.RunUp_TunnelHead{TunnelHead: &nodev1.TunnelHead{Status: 200, Headers: headers, Data: []byte(benchAnswer), End: true}}},
		}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			cpu := cpuTime()
			for b.Loop() {
				stream, err := client.Run(context.Background())
				if err != nil {
					b.Fatal(err)
				}
				for _, m := range append([]*nodev1.RunUp{open}, bc.msgs...) {
					if err := stream.Send(m); err != nil {
						b.Fatal(err)
					}
				}
				if err := stream.CloseSend(); err != nil {
					b.Fatal(err)
				}
				if _, err := stream.Recv(); !errors.Is(err, io.EOF) {
					b.Fatalf("run stream ended with %v, want EOF", err)
				}
			}
			b.ReportMetric(float64(cpuTime()-cpu)/float64(b.N), "cpu-ns/op")
		})
	}
}

// cpuTime is the CPU time the process used so far, user and system, every
// goroutine's: on a loaded machine a steadier figure than the wall time
// per op.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
