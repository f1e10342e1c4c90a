package harness

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"iop/internal/testenv"
)

// binary is the iop command IOP built for this test binary; Main removes
// its directory.
var binary struct {
	once      sync.Once
	dir, path string
	out       []byte
	err       error
}

// Version is the version IOP's binary is stamped with (-X main.version,
// as make build stamps a release), which its nodes report to the edge.
const Version = "9.9.9-e2e"

// IOP builds the iop command (package iop/cmd/iop) once per test binary,
// stamped with Version, and returns the path of the executable; a failed
// build fails t. In a run of every test Main has started the build
// already.
func IOP(t testing.TB) string {
	t.Helper()
	buildBinary()
	if binary.err != nil {
		t.Fatalf("go build iop/cmd/iop: %v\n%s", binary.err, binary.out)
	}
	return binary.path
}

// buildBinary builds the iop command into a temporary directory, once.
func buildBinary() {
	binary.once.Do(func() {
		binary.dir, binary.err = os.MkdirTemp("", "iop-test-")
		if binary.err != nil {
			return
		}
		binary.path = filepath.Join(binary.dir, "iop")
		binary.out, binary.err = exec.Command("go", "build", "-ldflags", "-X main.version="+Version, "-o", binary.path, "iop/cmd/iop").CombinedOutput()
	})
}

func removeBinary() {
	if binary.dir != "" {
		os.RemoveAll(binary.dir)
	}
}

// waitDelay is how long Wait waits for a command's output pipes to close
// after it exited.
const waitDelay = 5 * time.Second

// Command is a child process of the test: the iop command (StartCommand)
// or another program (StartProgram). Its stdout and stderr are kept
// (iop logs to stderr); both are printed if the test fails. It is killed
// at cleanup if it still runs.
type Command struct {
	Name string
	Cmd  *exec.Cmd
	// Out is its stdout, Log its stderr.
	Out, Log *Buffer

	exited chan struct{} // closed when it has exited; err is then set
	err    error
}

// StartCommand runs `iop args...` (the binary IOP builds) as a child
// process named "iop " and its first argument. When ctx ends (ctx may be
// nil) it gets SIGTERM, as from a service manager.
func StartCommand(t testing.TB, ctx context.Context, args ...string) *Command {
	t.Helper()
	name := "iop"
	if len(args) > 0 {
		name += " " + args[0]
	}
	return StartProgram(t, ctx, name, IOP(t), args...)
}

// StartProgram runs bin with args as a child process named name, as
// StartCommand does.
func StartProgram(t testing.TB, ctx context.Context, name, bin string, args ...string) *Command {
	t.Helper()
	return StartCmd(t, ctx, name, exec.Command(bin, args...))
}

// StartCmd starts cmd (its Stdout and Stderr must be unset; its Env, Dir
// and the like are kept) as StartProgram does.
func StartCmd(t testing.TB, ctx context.Context, name string, cmd *exec.Cmd) *Command {
	t.Helper()
	c := &Command{Name: name, Cmd: cmd, Out: &Buffer{}, Log: &Buffer{}, exited: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = c.Out, c.Log
	// A child of the command (a CLI provider's program, a shell's) may
	// hold its output pipes open after it exited: Wait then returns
	// waitDelay after the exit, not when that child ends.
	cmd.WaitDelay = waitDelay
	if err := cmd.Start(); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	go func() {
		c.err = cmd.Wait()
		close(c.exited)
	}()
	if ctx != nil {
		go func() {
			select {
			case <-ctx.Done():
				_ = cmd.Process.Signal(syscall.SIGTERM)
			case <-c.exited:
			}
		}()
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-c.exited
		if t.Failed() {
			t.Logf("%s stdout:\n%s\n%s stderr:\n%s", name, c.Out.String(), name, c.Log.String())
		}
	})
	return c
}

// Signal sends sig to the command, failing t if it cannot.
func (c *Command) Signal(t testing.TB, sig syscall.Signal) {
	t.Helper()
	if err := c.Cmd.Process.Signal(sig); err != nil {
		t.Fatalf("%s: signal %v: %v", c.Name, sig, err)
	}
}

// Exited is closed when the command has exited; Err then says how.
func (c *Command) Exited() <-chan struct{} { return c.exited }

// Err is how the command exited (nil: status 0); call it after Exited.
func (c *Command) Err() error {
	<-c.exited
	return c.err
}

// Done returns a channel that gets Err once the command has exited.
func (c *Command) Done() <-chan error {
	ch := make(chan error, 1)
	go func() {
		<-c.exited
		ch <- c.err
	}()
	return ch
}

// Wait waits until the command exits, failing t if it still runs within
// later, and returns Err.
func (c *Command) Wait(t testing.TB, within time.Duration) error {
	t.Helper()
	select {
	case <-c.exited:
		return c.err
	case <-time.After(within):
		t.Fatalf("%s still running %v later", c.Name, within)
		return nil
	}
}

// Running reports whether the command has not exited yet.
func (c *Command) Running() bool {
	select {
	case <-c.exited:
		return false
	default:
		return true
	}
}

// WaitLog waits (testenv.Eventually) for a line of the command's JSON log
// (--log-format json) whose msg is msg and returns it; it fails t if the
// command exits first.
func (c *Command) WaitLog(t testing.TB, msg string) map[string]any {
	t.Helper()
	var found map[string]any
	testenv.Eventually(t, c.Name+" logs "+msg, func() bool {
		for _, l := range JSONLines(t, c.Log.String()) {
			if l["msg"] == msg {
				found = l
				return true
			}
		}
		if !c.Running() {
			t.Fatalf("%s ended (%v) before logging %q", c.Name, c.err, msg)
		}
		return false
	})
	return found
}

// JSONLines decodes every whole line of a JSON log (a last line still
// being written is left out), failing t on a line that is not JSON.
func JSONLines(t testing.TB, log string) []map[string]any {
	t.Helper()
	log = log[:strings.LastIndexByte(log, '\n')+1]
	var out []map[string]any
	sc := bufio.NewScanner(strings.NewReader(log))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("log line is not JSON: %q: %v", sc.Text(), err)
		}
		out = append(out, m)
	}
	return out
}
