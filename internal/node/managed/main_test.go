package managed

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"iop/internal/sim"
)

// envChild makes the test binary a model server (serveChild) instead of
// running tests: the Manager under test starts os.Args[0] as its command.
const envChild = "IOP_MANAGED_TEST_CHILD"

func TestMain(m *testing.M) {
	switch os.Getenv(envChild) {
	case "sim":
		os.Exit(serveChild(os.Args[1:]))
	case "node":
		os.Exit(serveNode(os.Args[1:]))
	}
	goleak.VerifyTestMain(m)
}

// serveChild is `iop sim --protocol openai` with two test knobs: --sleep
// waits before it listens (a slow start), --never-listen never does (a
// health timeout).
func serveChild(args []string) int {
	fs := flag.NewFlagSet("child", flag.ContinueOnError)
	listen := fs.String("listen", "", "address")
	model := fs.String("model", "", "served model")
	sleep := fs.Duration("sleep", 0, "wait before listening")
	never := fs.Bool("never-listen", false, "never listen")
	tps := fs.Float64("tokens-per-second", 0, "token rate")
	tokens := fs.Int("default-max-tokens", 0, "tokens per answer")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	fmt.Printf("child of model %s starting\n", *model)
	fmt.Fprintf(os.Stderr, "child of model %s on stderr\n", *model)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	if *never {
		<-ctx.Done()
		return 0
	}
	time.Sleep(*sleep)
	s, err := sim.New(sim.Config{Protocol: sim.ProtocolOpenAI, Models: []string{*model}, TokensPerSecond: *tps, DefaultMaxTokens: *tokens},
		slog.New(slog.NewTextHandler(os.Stderr, nil)))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := s.Serve(ctx, ln); err != nil && ctx.Err() == nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}
