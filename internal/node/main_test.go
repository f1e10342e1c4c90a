package node

import (
	"context"
	"flag"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"syscall"
	"testing"

	"go.uber.org/goleak"

	"iop/internal/sim"
)

// envSimChild makes the test binary an OpenAI-protocol `iop sim` (serveSim)
// instead of running tests: a managed provider's server in these tests.
const envSimChild = "IOP_NODE_TEST_SIM"

func TestMain(m *testing.M) {
	if os.Getenv(envSimChild) == "1" {
		os.Exit(serveSim(os.Args[1:]))
	}
	goleak.VerifyTestMain(m)
}

// serveSim serves sim model --model on --listen until SIGTERM.
func serveSim(args []string) int {
	fs := flag.NewFlagSet("sim", flag.ContinueOnError)
	listen := fs.String("listen", "", "address")
	model := fs.String("model", "", "served model")
	if fs.Parse(args) != nil {
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	s, err := sim.New(sim.Config{Protocol: sim.ProtocolOpenAI, Models: []string{*model}}, slog.New(slog.DiscardHandler))
	if err != nil {
		return 1
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return 1
	}
	if s.Serve(ctx, ln) != nil && ctx.Err() == nil {
		return 1
	}
	return 0
}
