package benchrun

import (
	"slices"
	"testing"
	"time"
)

// TestResidencyTrace: the trace is the same for one seed, within its
// duration, in time order, and each client alternates between its two
// models, so every model is asked for.
func TestResidencyTrace(t *testing.T) {
	cfg := ResidencyConfig{Models: 3, Rate: 5, Duration: 20 * time.Second, Seed: 7}
	a, b := residencyTrace(cfg), residencyTrace(cfg)
	if !slices.Equal(a, b) || len(a) < 50 {
		t.Fatalf("traces differ or are short: %d, %d requests", len(a), len(b))
	}
	seen := map[string]int{}
	for i, tr := range a {
		if tr.at >= cfg.Duration || (i > 0 && tr.at < a[i-1].at) {
			t.Fatalf("request %d at %v", i, tr.at)
		}
		seen[tr.model]++
		if c := 2 * cfg.Models; i >= c && a[i-c].model == tr.model {
			t.Fatalf("request %d: client %d asked for %s twice in a row", i, i%c, tr.model)
		}
	}
	if len(seen) != cfg.Models {
		t.Fatalf("models asked for: %v", seen)
	}
}
