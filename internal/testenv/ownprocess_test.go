package testenv

import (
	"os"
	"testing"
)

// TestRunInOwnProcess: the body runs in a child process of the test
// binary that was told which test it runs, never in the parent.
func TestRunInOwnProcess(t *testing.T) {
	if RunInOwnProcess(t) {
		return
	}
	if os.Getenv(ownProcessEnv) != t.Name() {
		t.Fatalf("the body runs with %s=%q, want %q", ownProcessEnv, os.Getenv(ownProcessEnv), t.Name())
	}
}
