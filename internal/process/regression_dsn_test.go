package process

import "testing"

// TestRegression_CheckPassesADSNTheEdgeCannotConnectWith: iop check
// parsed ledger_dsn and runs_dsn with pgconn.ParseConfig alone, which keeps an unknown parameter as a server
// runtime parameter, so pgxpool's pool_max_conns (and any typo of a
// parameter name) passes the check; the edge then fails at start with
// FATAL: unrecognized configuration parameter "pool_max_conns" (SQLSTATE
// 42704), seen on a real PostgreSQL 15.
func TestRegression_CheckPassesADSNTheEdgeCannotConnectWith(t *testing.T) {
	t.Parallel()
	for _, dsn := range []string{
		"postgres://u@127.0.0.1/db?pool_max_conns=4",
		"host=127.0.0.1 dbname=db pool_max_conns=4",
	} {
		if err := (StoreConfig{LedgerDSN: dsn}).Validate(); err == nil {
			t.Errorf("ledger_dsn %q passes the check; the edge cannot connect with it", dsn)
		}
	}
}
