package ledger

import (
	"context"
	"path/filepath"
	"testing"
	"time"
)

// TestRegression_UsageRangeBeyondNanosecondTimes: a range that reaches
// past what int64 nanoseconds hold (to=9999-12-31 for "all time", from
// before 1677-09-22) still selects the entries inside it. Asking the
// admin API for ?to=9999-12-31 answered zero usage, silently.
func TestRegression_UsageRangeBeyondNanosecondTimes(t *testing.T) {
	s, err := OpenSQLite(filepath.Join(t.TempDir(), "iop.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	if err := s.Insert(ctx, sample()); err != nil {
		t.Fatal(err)
	}
	for _, q := range []Query{
		{To: time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC)},
		{From: time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC)},
		{From: time.Date(1600, 1, 1, 0, 0, 0, 0, time.UTC), To: time.Date(2300, 1, 1, 0, 0, 0, 0, time.UTC)},
	} {
		got, err := s.Aggregate(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 1 || got[0].Requests != int64(len(sample())) {
			t.Errorf("from %v to %v: %+v, want one total of %d requests", q.From, q.To, got, len(sample()))
		}
	}
}
