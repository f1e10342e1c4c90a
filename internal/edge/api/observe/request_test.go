package observe

import (
	"iop/internal/edge/contract"
	"testing"
	"time"
)

// record's derived times, on a hand-driven clock.
func TestRecordTimes(t *testing.T) {
	base := time.Unix(100, 0)
	now := base
	o := Detached(func() time.Time { return now }, "chat.completions", NewRequestID(), "")
	o.Dispatched(contract.DispatchInfo{})
	o.Ended("completed", contract.OutcomeCompleted)
	now = base.Add(2 * time.Second)
	o.Content(1)
	now = base.Add(3 * time.Second)
	o.Content(2)
	now = base.Add(4 * time.Second)
	rec := o.Record(200)
	// 3 content events over 1s: 0.5s apart.
	if rec.TimeToFirstToken != 2*time.Second || rec.Duration != 4*time.Second || rec.InterTokenLatency != 500*time.Millisecond {
		t.Fatalf("ttft %s duration %s inter-token %s", rec.TimeToFirstToken, rec.Duration, rec.InterTokenLatency)
	}
	// Known usage counts the tokens instead of the events.
	o.Tokens(5, 11)
	if rec := o.Record(200); rec.InterTokenLatency != 100*time.Millisecond {
		t.Fatalf("inter-token with 11 output tokens: %s", rec.InterTokenLatency)
	}
}
