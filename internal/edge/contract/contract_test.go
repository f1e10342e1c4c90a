package contract

import (
	"context"
	"fmt"
	"testing"
)

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

// TestAdmissionStrings: the admission strings are the metrics' reason
// label (iop_admissions_total), the log line's queue_reason and the events
// stream's refusal reason; they are these bytes, and an Outcome's and an
// Admission's String is that label.
func TestAdmissionStrings(t *testing.T) {
	for a, want := range map[Admission]string{
		AdmissionNone:           "",
		AdmissionImmediate:      "immediate",
		AdmissionQueued:         "queued",
		AdmissionQueueFull:      "queue_full",
		AdmissionQueueTimeout:   "queue_timeout",
		AdmissionRejected:       "rejected",
		AdmissionUnavailable:    "unavailable",
		AdmissionUnknownModel:   "unknown_model",
		AdmissionDispatchFailed: "dispatch_failed",
		AdmissionCancelled:      "cancelled",
	} {
		if a.String() != want {
			t.Errorf("admission String %q, want %q", a.String(), want)
		}
	}
	if OutcomeClientGone.String() != "client_gone" {
		t.Errorf("OutcomeClientGone.String() = %q", OutcomeClientGone.String())
	}
}

// TestAdmissionOf: each dispatch error, wrapped as the edge wraps it,
// names its admission (DESIGN.md status codes: queue full 429, queue
// timeout 503, rejected 400, unknown model 404, ...); a client gone is
// cancelled, anything else none.
func TestAdmissionOf(t *testing.T) {
	for _, c := range []struct {
		err  error
		want Admission
	}{
		{fmt.Errorf("%w: 16 waiting", ErrQueueFull), AdmissionQueueFull},
		{fmt.Errorf("%w: 30s", ErrQueueTimeout), AdmissionQueueTimeout},
		{fmt.Errorf("%w: tools", ErrCandidatesRejected), AdmissionRejected},
		{ErrNoProvider, AdmissionUnavailable},
		{ErrProviderUnavailable, AdmissionUnavailable},
		{ErrShuttingDown, AdmissionUnavailable},
		{fmt.Errorf("%w: x", ErrUnknownModel), AdmissionUnknownModel},
		{ErrDispatchTimeout, AdmissionDispatchFailed},
		{ErrDispatchRefused, AdmissionDispatchFailed},
		{ErrStaleGeneration, AdmissionDispatchFailed},
		{ErrNodeGone, AdmissionDispatchFailed},
		{context.Canceled, AdmissionCancelled},
		{fmt.Errorf("wait: %w", context.DeadlineExceeded), AdmissionCancelled},
		{fmt.Errorf("something else"), AdmissionNone},
	} {
		if got := AdmissionOf(c.err); got != c.want {
			t.Errorf("AdmissionOf(%v) = %q, want %q", c.err, got, c.want)
		}
	}
}
