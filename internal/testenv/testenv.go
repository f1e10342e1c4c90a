// Package testenv decides what a test does when a tool it needs from
// outside Go (Node.js and the JavaScript clients' npm packages, Chromium,
// PostgreSQL, a real Ollama) is missing on the machine.
//
// `make test` installs every such tool first and sets IOP_TEST_STRICT=1,
// so there a missing tool fails the test: make test skips nothing. A plain
// `go test ./...` on a machine without the tools skips those tests with a
// message that says what is missing and how to get it. It also gives
// tests addresses for child processes to listen on (ProcessAddr) and the
// one wait on a condition (Eventually). Only tests import this package.
package testenv

import (
	"fmt"
	"os"
	"testing"
)

// StrictEnv names the environment variable that turns a missing tool from
// a skip into a failure; `make test` sets it to "1".
const StrictEnv = "IOP_TEST_STRICT"

// Strict reports whether missing tools fail tests (StrictEnv is "1").
func Strict() bool { return os.Getenv(StrictEnv) == "1" }

// Missing ends t because a tool it needs is missing, with the message
// format and args (say what is missing and how to get it): t.Fatal under
// Strict, else t.Skip.
func Missing(t testing.TB, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if Strict() {
		t.Fatal(msg + " (" + StrictEnv + "=1: make test installs it, so it must be there)")
	}
	t.Skip(msg)
}
