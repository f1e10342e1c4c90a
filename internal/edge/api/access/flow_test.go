package access

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// TestRegression_FlowNameCutInsideACharacter: a client-given flow (a
// header's value, the body's "user") becomes a Prometheus label and a log
// field, so it must be valid UTF-8: cutting "a" + 40 × "ü" at 64 bytes split
// the 32nd "ü" and client_golang's label check panicked in the request's
// bookkeeping (no ledger row, the connection cut). FlowName cuts at a
// character boundary and replaces invalid bytes.
func TestRegression_FlowNameCutInsideACharacter(t *testing.T) {
	for _, v := range []string{"a" + strings.Repeat("ü", 40), "\xff", strings.Repeat("\xc3", 100), strings.Repeat("€", 30), "plain"} {
		got := FlowName(v)
		if !utf8.ValidString(got) || len(got) > maxFlowBytes || got == "" {
			t.Fatalf("FlowName(%q) = %q (%d bytes, valid %v)", v, got, len(got), utf8.ValidString(got))
		}
		if utf8.ValidString(v) && !strings.HasPrefix(v, got) {
			t.Fatalf("FlowName(%q) = %q: not a prefix of the valid value", v, got)
		}
	}
}
