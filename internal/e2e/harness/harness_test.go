package harness

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"iop/internal/edge"
	"iop/internal/node"
	"iop/internal/sim"
)

func TestMain(m *testing.M) { Main(m) }

// cleanupRecorder is a testing.TB that keeps its cleanups and log lines,
// and says it failed when failed is set.
type cleanupRecorder struct {
	testing.TB
	failed   bool
	mu       sync.Mutex
	cleanups []func()
	logs     []string
}

func (r *cleanupRecorder) Helper()          {}
func (r *cleanupRecorder) Failed() bool     { return r.failed }
func (r *cleanupRecorder) Cleanup(f func()) { r.cleanups = append(r.cleanups, f) }
func (r *cleanupRecorder) Logf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.logs = append(r.logs, fmt.Sprintf(format, args...))
}

func (r *cleanupRecorder) cleanup() {
	for i := len(r.cleanups) - 1; i >= 0; i-- {
		r.cleanups[i]()
	}
}

func TestLoggerPrintsOnlyOnFailure(t *testing.T) {
	Parallel(t)
	for _, failed := range []bool{false, true} {
		r := &cleanupRecorder{TB: t, failed: failed}
		Logger(r, "edge").Info("node connected", "node", "n1")
		r.cleanup()
		printed := strings.Join(r.logs, "")
		if failed != strings.Contains(printed, `msg="node connected" node=n1`) || failed != strings.HasPrefix(printed, "edge log:") {
			t.Errorf("failed %v: printed %q", failed, printed)
		}
	}
}

func TestCommandKeepsOutputAndExit(t *testing.T) {
	Parallel(t)
	c := StartProgram(t, nil, "sh", "/bin/sh", "-c", "echo out; echo err >&2; exit 3")
	err := c.Wait(t, time.Minute)
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 3 {
		t.Fatalf("exit %v, want status 3", err)
	}
	if c.Out.String() != "out\n" || c.Log.String() != "err\n" {
		t.Fatalf("stdout %q stderr %q", c.Out.String(), c.Log.String())
	}
	if c.Running() || c.Err() != err || <-c.Done() != err {
		t.Fatal("Running, Err and Done disagree with Wait")
	}
}

func TestCommandGetsSIGTERMWhenItsContextEnds(t *testing.T) {
	Parallel(t)
	ctx, cancel := context.WithCancel(context.Background())
	c := StartProgram(t, ctx, "sleep", "sleep", "600")
	if !c.Running() {
		t.Fatal("sleep exited at once")
	}
	cancel()
	var exit *exec.ExitError
	if err := c.Wait(t, time.Minute); !errors.As(err, &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGTERM {
		t.Fatalf("exit %v, want SIGTERM", err)
	}
}

func TestCommandWaitLog(t *testing.T) {
	Parallel(t)
	c := StartProgram(t, nil, "sh", "/bin/sh", "-c", `echo '{"msg":"starting"}' >&2; echo '{"msg":"ready","port":7}' >&2; exec sleep 600`)
	if l := c.WaitLog(t, "ready"); l["port"] != float64(7) {
		t.Fatalf("line %v", l)
	}
}

func TestJSONLinesLeavesOutAPartialLastLine(t *testing.T) {
	Parallel(t)
	lines := JSONLines(t, "{\"msg\":\"a\"}\n{\"msg\":\"b\"}\n{\"msg\":")
	if len(lines) != 2 || lines[1]["msg"] != "b" {
		t.Fatalf("lines %v", lines)
	}
}

// TestEdgeNodeSim: the in-process parts start on ports of their own and
// serve a request from the node's simulator through the edge.
func TestEdgeNodeSim(t *testing.T) {
	Parallel(t)
	_, url := Sim(t, sim.Config{Protocol: sim.ProtocolOpenAI, Models: []string{"m"}, DefaultMaxTokens: 3})
	e := Edge(t, context.Background(), EdgeConfig(map[string]edge.ModelConfig{"alias": {Targets: []string{"m"}}}))
	Node(t, context.Background(), node.Config{NodeID: "n1", Edge: e.NodeAddr,
		Providers: []node.ProviderConfig{{ID: "p", Type: node.TypeOpenAI, BaseURL: url + "/v1", Models: []string{"m"}}}})
	if got := len(e.Service.Snapshot().Providers); got != 1 {
		t.Fatalf("%d providers in the edge's snapshot, want 1", got)
	}
}
