// Package pgschema creates the tables of iop's PostgreSQL stores (run
// records, run events, the usage ledger) so that edges starting at the
// same moment on one database take turns: CREATE TABLE IF NOT EXISTS is
// not safe against a concurrent one, and the second gets "duplicate key
// value violates unique constraint pg_type_typname_nsp_index" (SQLSTATE
// 23505; PostgreSQL's own documentation of IF NOT EXISTS makes no promise
// under concurrency): an edge started beside others would crash on it.
package pgschema

import (
	"context"
	"database/sql"
	"fmt"
)

// lockKey is the transaction-scoped advisory lock every iop edge takes
// while it creates its tables (an arbitrary constant, the same for every
// store, so the ledger and the run store also take turns).
const lockKey = 0x696f70 // "iop"

// Create runs stmts (CREATE ... IF NOT EXISTS, idempotent migrations) in
// one transaction holding pg_advisory_xact_lock(lockKey): an edge that
// starts while another creates the same tables waits for it, then finds
// them. It returns the first statement's error, the transaction rolled
// back.
func Create(ctx context.Context, db *sql.DB, stmts []string) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback() //nolint:errcheck // after Commit it does nothing
	if _, err := tx.ExecContext(ctx, "SELECT pg_advisory_xact_lock($1)", lockKey); err != nil {
		return fmt.Errorf("schema lock: %w", err)
	}
	for _, stmt := range stmts {
		if _, err := tx.ExecContext(ctx, stmt); err != nil {
			return err
		}
	}
	return tx.Commit()
}
