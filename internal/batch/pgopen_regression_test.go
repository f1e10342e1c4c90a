package batch

import (
	"context"
	"database/sql"
	"strings"
	"testing"
	"time"

	"iop/internal/testenv"
)

// TestRegression_PostgresOpenBesideARunningBatch: an edge starting on a
// PostgreSQL that other edges already use (the batch tables exist) while
// one of them is inside a transaction writing a batch (as FinishLine is)
// must open its store without waiting for that transaction. Before, its
// schema step ran CREATE INDEX IF NOT EXISTS and ALTER TABLE ... ADD
// COLUMN IF NOT EXISTS on batches, which lock the table even when the
// index and columns exist: it waited behind the writers, and in the e2e
// restart of an edge (TestBatchSurvivesAnEdgeRestartAndALeaderKill) it
// deadlocked with one and the edge exited ("batch store (postgres): ERROR:
// deadlock detected (SQLSTATE 40P01)").
func TestRegression_PostgresOpenBesideARunningBatch(t *testing.T) {
	t.Parallel()
	dsn := testenv.Postgres(t)
	admin, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	if _, err := admin.Exec("CREATE DATABASE pgopen"); err != nil {
		t.Fatal(err)
	}
	dbDSN := strings.Replace(dsn, "dbname=postgres", "dbname=pgopen", 1)
	first, err := OpenPostgres(context.Background(), dbDSN)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()

	writer, err := sql.Open("pgx", dbDSN)
	if err != nil {
		t.Fatal(err)
	}
	defer writer.Close()
	tx, err := writer.Begin()
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback() //nolint:errcheck
	if _, err := tx.Exec(`INSERT INTO batches (id, owner, kind, seq, status, doc) VALUES ('b1', 'k', 'openai', 1, 'in_progress', '{}')`); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(`UPDATE batches SET completed = completed + 1 WHERE id = 'b1'`); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	second, err := OpenPostgres(ctx, dbDSN)
	if err != nil {
		t.Fatalf("a second edge's store did not open beside a batch write in progress: %v", err)
	}
	second.Close()
}
