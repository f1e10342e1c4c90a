package loadgen

import (
	"strings"
	"testing"
)

// TestRegression_FractionalRateIsPrinted: --rate 2.5 printed "rate 2/s".
func TestRegression_FractionalRateIsPrinted(t *testing.T) {
	var b strings.Builder
	Result{Rate: 2.5}.WriteText(&b)
	if !strings.Contains(b.String(), "rate 2.5/s") {
		t.Fatalf("report header %q, want rate 2.5/s", strings.SplitN(b.String(), "\n", 2)[0])
	}
}
