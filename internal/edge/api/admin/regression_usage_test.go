package admin

import (
	"testing"

	"iop/internal/edge/api"
	"iop/internal/ledger"
)

// TestRegression_UsageFromAfterTo: from after to selects no
// time at all; the API answers 400 naming the range, as for any other bad
// parameter, rather than a 200 with zero usage that reads as "nothing was
// used".
func TestRegression_UsageFromAfterTo(t *testing.T) {
	t.Parallel()
	store, err := ledger.OpenSQLite(":memory:")
	if err != nil {
		t.Fatal(err)
	}
	led := ledger.New(store, nil)
	t.Cleanup(func() { led.Close() })
	f := newKeys(t)
	env := newEnv(t, api.Config{Keys: f.keys, AdminKeys: f.admin}, Config{Usage: led})
	for _, q := range []string{
		"?from=2026-12-06&to=2026-12-01",
		"?from=2026-12-06T15:00:00Z&to=2026-12-06T14:00:00Z&group_by=key",
		"?from=1772409600&to=1772323200",
	} {
		if resp := env.send(t, "GET", "/admin/v1/usage"+q, bearer(f.adminKey)); resp.status != 400 {
			t.Errorf("%s: %d %s, want 400", q, resp.status, resp.body)
		}
	}
}
