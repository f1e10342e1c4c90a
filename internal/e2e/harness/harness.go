package harness

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"iop/internal/edge"
	"iop/internal/node"
	"iop/internal/process"
	"iop/internal/sim"
	"iop/internal/testenv"
)

// Main runs the tests of m as TestMain does, with -parallel's slots
// handed out by Parallel and ParallelLong, checks that no goroutine
// outlives them (goleak), removes the binary IOP built, and exits. In a
// run of every test (no -test.run) it builds the binary while the first
// tests run, so no test waits for the whole build.
func Main(m *testing.M) {
	flag.Parse()
	takeParallel()
	var prebuild sync.WaitGroup
	if f := flag.Lookup("test.run"); f != nil && f.Value.String() == "" {
		prebuild.Go(buildBinary)
	}
	goleak.VerifyTestMain(afterBuild{m, &prebuild}, goleak.Cleanup(func(code int) {
		removeBinary()
		os.Exit(code)
	}))
}

// afterBuild is m whose Run also stops the slots' idle watch and the
// shared browser and waits for the binary's prebuild, so goleak finds
// their goroutines gone.
type afterBuild struct {
	m        *testing.M
	prebuild *sync.WaitGroup
}

func (a afterBuild) Run() int {
	code := a.m.Run()
	stopWatching()
	stopBrowser()
	a.prebuild.Wait()
	return code
}

// envs numbers the variables Env sets.
var envs atomic.Int64

// Env sets a new environment variable, IOP_TEST_ENV_<n> (n unique in the
// test binary), to value until t ends and returns its name: for a
// provider's api_key_env. Unlike t.Setenv it leaves t free to run in
// parallel, as no other test reads that name.
func Env(t testing.TB, value string) string {
	t.Helper()
	key := fmt.Sprintf("IOP_TEST_ENV_%d", envs.Add(1))
	if err := os.Setenv(key, value); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Unsetenv(key) })
	return key
}

// Buffer is a bytes.Buffer that concurrent writers (a logger, a child's
// output) and a test may use at once.
type Buffer struct {
	mu  sync.Mutex // guards buf
	buf bytes.Buffer
}

// Write appends p; it never fails.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns everything written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// ShowOnFailure prints b's contents under name (t.Logf) at the end of the
// test, if it failed.
func ShowOnFailure(t testing.TB, name string, b *Buffer) {
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("%s log:\n%s", name, b.String())
		}
	})
}

// Logger returns a logger (slog text lines, level debug) for the component
// name whose lines are printed only if t fails (ShowOnFailure).
func Logger(t testing.TB, name string) *slog.Logger {
	var b Buffer
	ShowOnFailure(t, name, &b)
	return slog.New(slog.NewTextHandler(&b, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// Sim starts an `iop sim` server for cfg on a loopback port and returns it
// with its base URL (http://127.0.0.1:PORT); it stops at cleanup.
func Sim(t testing.TB, cfg sim.Config) (*sim.Server, string) {
	t.Helper()
	s, err := sim.New(cfg, Logger(t, "sim"))
	if err != nil {
		t.Fatal(err)
	}
	url, stop, err := s.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	return s, url
}

// EdgeConfig is process.DefaultEdgeFile with both listeners on loopback ports
// the system picks, run records and the ledger in memory, and models as
// its model groups.
func EdgeConfig(models map[string]edge.ModelConfig) process.EdgeFile {
	cfg := process.DefaultEdgeFile()
	cfg.Listen, cfg.NodeListen = "127.0.0.1:0", "127.0.0.1:0"
	cfg.Database = ":memory:"
	cfg.Models = models
	return cfg
}

// Edge starts an edge (process.ModeEdge) for cfg, with its log kept by
// Logger, and returns it serving; it drains when ctx ends (as
// process.Start says). At cleanup it drains it and waits for it to stop,
// failing t if it stopped with an error; a test may end ctx, Drain or
// Abort it earlier. A cfg with the default lame duck
// (process.DefaultLameDuck) gets TestLameDuck instead: no load balancer
// waits on a test's edge, and a stopping edge would hold its test's slot
// for it. A test of the lame duck sets another.
func Edge(t testing.TB, ctx context.Context, cfg process.EdgeFile) *process.Process {
	t.Helper()
	if cfg.LameDuck == process.DefaultLameDuck {
		cfg.LameDuck = TestLameDuck
	}
	p := start(t, ctx, "edge", process.Config{Mode: process.ModeEdge, Edge: cfg}, nil)
	RememberEdge(t, p)
	return p
}

// TestLameDuck is the lame duck (process.ServeConfig.LameDuck) of the
// edges Edge starts.
const TestLameDuck = 10 * time.Millisecond

// Dev starts iop dev (process.ModeDev) for cfg on loopback ports the
// system picks, with the simulator (ForceSim) and SimCapacity 2 unless cfg
// sets one, its banner written to stdout (may be nil). It stops as Edge's
// does.
func Dev(t testing.TB, cfg process.DevConfig, stdout io.Writer) *process.Process {
	t.Helper()
	cfg.Listen, cfg.NodeListen, cfg.ForceSim = "127.0.0.1:0", "127.0.0.1:0", true
	if cfg.SimCapacity == 0 {
		cfg.SimCapacity = 2
	}
	return start(t, context.Background(), "iop dev", process.Config{Mode: process.ModeDev, Dev: cfg}, stdout)
}

func start(t testing.TB, ctx context.Context, name string, cfg process.Config, stdout io.Writer) *process.Process {
	t.Helper()
	p, err := process.Start(ctx, cfg, process.Deps{Logger: Logger(t, name), Stdout: stdout})
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	t.Cleanup(func() {
		p.Drain("test ended")
		if err := p.Wait(); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	})
	return p
}

// StopAtCleanup ends p's context with cancel at the end of the test and
// waits for p to stop, failing t if it stopped with an error: for a
// process a test started with process.Start itself. Cleanups registered
// after it (the nodes') run first.
func StopAtCleanup(t testing.TB, cancel context.CancelFunc, p *process.Process) {
	t.Cleanup(func() {
		cancel()
		if err := p.Wait(); err != nil {
			t.Errorf("%s: %v", p.Mode, err)
		}
	})
}

// Node runs a node agent for cfg (its log kept by Logger) until ctx ends
// or the test does, and returns it once it is connected to an edge. At
// cleanup it stops it and fails t if Run returned an error.
func Node(t testing.TB, ctx context.Context, cfg node.Config, opts ...node.Option) *node.Agent {
	t.Helper()
	agent, done, err := runNode(t, ctx, cfg, opts...)
	select {
	case <-agent.Ready():
	case <-done:
		t.Fatalf("node %s stopped before connecting: %v", cfg.NodeID, *err)
	case <-time.After(testenv.WaitDeadline):
		t.Fatalf("node %s did not connect within %v", cfg.NodeID, testenv.WaitDeadline)
	}
	return agent
}

// NodeNotReady is Node without waiting for the connection (for a node
// whose edge is not there yet, or refuses it).
func NodeNotReady(t testing.TB, ctx context.Context, cfg node.Config, opts ...node.Option) *node.Agent {
	t.Helper()
	agent, _, _ := runNode(t, ctx, cfg, opts...)
	return agent
}

// runNode runs the agent; done is closed when Run returned, *err is then
// what it returned.
func runNode(t testing.TB, ctx context.Context, cfg node.Config, opts ...node.Option) (agent *node.Agent, done chan struct{}, err *error) {
	t.Helper()
	cfg, opts = onLink(t, cfg, opts)
	agent, e := node.New(cfg, Logger(t, "node "+cfg.NodeID), opts...)
	if e != nil {
		t.Fatal(e)
	}
	ctx, cancel := context.WithCancel(ctx)
	done, err = make(chan struct{}), new(error)
	go func() {
		*err = agent.Run(ctx)
		close(done)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		if *err != nil {
			t.Errorf("node %s: %v", cfg.NodeID, *err)
		}
	})
	return agent, done, err
}
