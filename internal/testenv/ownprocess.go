package testenv

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"
)

// ownProcessEnv names the environment variable that tells a test binary
// started by RunInOwnProcess which test it runs alone.
const ownProcessEnv = "IOP_TEST_OWN_PROCESS"

// RunInOwnProcess runs the top-level test t alone in a process of its
// own: a child of the test binary that runs t and nothing else, for a
// test that needs the whole process (it counts the goroutines, changes
// the working directory, waits for every child process). Meanwhile t
// runs in parallel with the other tests (t.Parallel) and only waits.
//
// It returns true in the parent, where t's body must not run: the
// child's result is t's (a failure prints the child's output). In the
// child it returns false and t's body runs there. Use:
//
//	if testenv.RunInOwnProcess(t) {
//		return
//	}
//
// The child gets the test binary's environment, -test.short and the
// time left before t's deadline as its -test.timeout.
func RunInOwnProcess(t *testing.T) bool {
	t.Helper()
	if os.Getenv(ownProcessEnv) == t.Name() {
		return false
	}
	if strings.Contains(t.Name(), "/") {
		t.Fatalf("RunInOwnProcess: %s is a subtest; only a top-level test runs alone", t.Name())
	}
	t.Parallel()
	args := []string{"-test.run=^" + regexp.QuoteMeta(t.Name()) + "$", "-test.count=1", "-test.v=true"}
	if testing.Short() {
		args = append(args, "-test.short")
	}
	ctx := context.Background()
	if deadline, ok := t.Deadline(); ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, deadline)
		defer cancel()
		args = append(args, "-test.timeout="+time.Until(deadline).Round(time.Second).String())
	}
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, os.Args[0], args...)
	cmd.Env = append(os.Environ(), ownProcessEnv+"="+t.Name())
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	switch passed := "--- PASS: " + t.Name() + " "; {
	case err != nil:
		t.Errorf("%s in its own process: %v; its output:\n%s", t.Name(), err, quoted(out.String()))
	case !strings.Contains(out.String(), passed):
		t.Errorf("%s in its own process did not pass; its output:\n%s", t.Name(), quoted(out.String()))
	}
	return true
}

// quoted is s with each line after "| ", so a child's "--- FAIL" lines do
// not read as the parent's own.
func quoted(s string) string {
	return "| " + strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n| ")
}
