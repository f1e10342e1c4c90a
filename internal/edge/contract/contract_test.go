package contract

import "testing"

// TestOutcomeStrings: the outcome strings are read by clients of the runs
// API, the ledger's rows, the log lines and the metrics' labels; they are
// these bytes (DESIGN.md, the ledger and the runs API's docs).
func TestOutcomeStrings(t *testing.T) {
	for o, want := range map[Outcome]string{
		OutcomeCompleted:      "completed",
		OutcomeInvalidRequest: "invalid_request",
		OutcomeRefused:        "refused",
		OutcomeUpstreamError:  "upstream_error",
		OutcomeClientGone:     "client_gone",
		OutcomeWriteFailed:    "write_failed",
		OutcomeError:          "error",
		OutcomeEdgeStopped:    "edge_stopped",
	} {
		if string(o) != want {
			t.Errorf("outcome %q, want %q", o, want)
		}
	}
}

// TestPathString: the path's name in records is "tunnel" or "normalized",
// "" when unknown.
func TestPathString(t *testing.T) {
	for p, want := range map[Path]string{PathTunnel: "tunnel", PathNormalized: "normalized", PathUnknown: "", Path(9): ""} {
		if got := p.String(); got != want {
			t.Errorf("Path(%d).String() = %q, want %q", p, got, want)
		}
	}
}

// TestTagAlternative: Ollama's rule, a name without a tag is name:latest
// (Ollama API doc, "Model names"); a name with another tag has no other
// spelling; a tag is what follows ':' in the last path element.
func TestTagAlternative(t *testing.T) {
	for name, want := range map[string]string{
		"qwen3":              "qwen3:latest",
		"qwen3:latest":       "qwen3",
		"qwen3:8b":           "",
		"ns/qwen3":           "ns/qwen3:latest",
		"host:5000/ns/qwen3": "host:5000/ns/qwen3:latest",
		"host:5000/ns/q:1b":  "",
		":latest":            "",
		"":                   ":latest",
		"a/b:latest":         "a/b",
	} {
		if got := TagAlternative(name); got != want {
			t.Errorf("TagAlternative(%q) = %q, want %q", name, got, want)
		}
	}
}
