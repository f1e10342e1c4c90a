package benchrun

import (
	"testing"
	"time"
)

// TestLlamaSwapPhase checks the simulated llama-swap policy on small
// traces: requests for one model load it once; alternating models on a
// host that holds one swap every time they alternate, each waiting for
// the other's requests to end; requests for the loaded model are served
// past a queued request for another (A B A → A A B).
func TestLlamaSwapPhase(t *testing.T) {
	t.Parallel()
	cfg := ResidencyConfig{MaxLoaded: 1, Capacity: 2, LoadTime: 2 * time.Second, Service: 250 * time.Millisecond}
	cfg.setDefaults()
	at := func(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
	for _, tc := range []struct {
		name         string
		trace        []traced
		loads        int64
		p50, maxWait time.Duration
	}{
		{"one model", []traced{{at(0), "a"}, {at(3), "a"}, {at(4), "a"}}, 1, 250 * time.Millisecond, 2 * time.Second},
		// Sequential alternation: every request loads its model.
		{"alternating", []traced{{at(0), "a"}, {at(3), "b"}, {at(6), "a"}, {at(9), "b"}}, 4, 2250 * time.Millisecond, 2 * time.Second},
		// b arrives while a loads: it waits for a's load and a's
		// requests (a's second one is served at once past it), then
		// loads: 2 loads.
		{"loaded model first", []traced{{at(0), "a"}, {at(0.5), "b"}, {at(1), "a"}}, 2, 2250 * time.Millisecond, 4 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := llamaSwapPhase(cfg, tc.trace)
			if p.Loads != tc.loads || p.Latency.P50 != tc.p50 || p.QueueWait.Max > tc.maxWait || p.OK != len(tc.trace) {
				t.Fatalf("loads %d, p50 %s, longest wait %s, ok %d; want %d, %s, ≤ %s, %d", p.Loads, p.Latency.P50, p.QueueWait.Max, p.OK,
					tc.loads, tc.p50, tc.maxWait, len(tc.trace))
			}
		})
	}
}
