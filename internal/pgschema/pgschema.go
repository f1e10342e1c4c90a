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
	"regexp"
)

// lockKey is the transaction-scoped advisory lock every iop edge takes
// while it creates its tables (an arbitrary constant, the same for every
// store, so the ledger and the run store also take turns).
const lockKey = 0x696f70 // "iop"

// Create runs stmts (CREATE ... IF NOT EXISTS, idempotent migrations) in
// one transaction holding pg_advisory_xact_lock(lockKey): an edge that
// starts while another creates the same tables waits for it, then finds
// them. When every statement's object is there already (present), it runs
// none: CREATE INDEX IF NOT EXISTS and ALTER TABLE ... ADD COLUMN IF NOT
// EXISTS lock their table even then, so an edge starting beside others
// that write those tables would wait for their transactions, or deadlock
// with one (SQLSTATE 40P01) and fail to start. It returns the first
// statement's error, the transaction rolled back.
func Create(ctx context.Context, db *sql.DB, stmts []string) error {
	if ok, err := allPresent(ctx, db, stmts); err != nil || ok {
		return err
	}
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

var (
	createRe = regexp.MustCompile(`(?is)^\s*CREATE\s+(?:UNIQUE\s+)?(?:TABLE|INDEX|SEQUENCE)\s+IF\s+NOT\s+EXISTS\s+([a-z_][a-z0-9_]*)\b`)
	addColRe = regexp.MustCompile(`(?is)^\s*ALTER\s+TABLE\s+([a-z_][a-z0-9_]*)\s+ADD\s+COLUMN\s+IF\s+NOT\s+EXISTS\s+([a-z_][a-z0-9_]*)\b`)
)

// allPresent reports whether every statement of stmts is a CREATE TABLE,
// INDEX or SEQUENCE IF NOT EXISTS of a relation that exists, or an ALTER
// TABLE ... ADD COLUMN IF NOT EXISTS of a column its table has; catalog
// reads only, no lock on the tables. Any other statement: false.
func allPresent(ctx context.Context, db *sql.DB, stmts []string) (bool, error) {
	for _, stmt := range stmts {
		var present bool
		if m := createRe.FindStringSubmatch(stmt); m != nil {
			if err := db.QueryRowContext(ctx, `SELECT to_regclass($1) IS NOT NULL`, m[1]).Scan(&present); err != nil {
				return false, err
			}
		} else if m := addColRe.FindStringSubmatch(stmt); m != nil {
			if err := db.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM information_schema.columns
				WHERE table_schema = current_schema() AND table_name = $1 AND column_name = $2)`, m[1], m[2]).Scan(&present); err != nil {
				return false, err
			}
		}
		if !present {
			return false, nil
		}
	}
	return true, nil
}
