package batch

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"strconv"
	"strings"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver (PostgreSQL)
	_ "modernc.org/sqlite"             // the "sqlite" database/sql driver (pure Go)

	"iop/internal/pgschema"
)

// SQL is a Store in an SQL database: SQLite (one edge; beside the edge's
// other tables, as package responses' are) or PostgreSQL (several edges
// sharing one database, which then also keeps the files' bytes: see
// Put). The statements are written once, with ? placeholders, and differ
// between the two only where marked.
type SQL struct {
	db      *sql.DB
	dialect string // "sqlite" or "postgres"
}

var _ Store = (*SQL)(nil)

// schema is the tables; {blob} is the dialect's byte-string type.
var schema = []string{
	`CREATE TABLE IF NOT EXISTS batch_files (
		id TEXT PRIMARY KEY, owner TEXT NOT NULL, purpose TEXT NOT NULL, filename TEXT NOT NULL,
		bytes BIGINT NOT NULL, created_at BIGINT NOT NULL, seq BIGINT NOT NULL)`,
	`CREATE INDEX IF NOT EXISTS batch_files_owner ON batch_files (owner, seq DESC)`,
	`CREATE TABLE IF NOT EXISTS batches (
		id TEXT PRIMARY KEY, owner TEXT NOT NULL, kind TEXT NOT NULL, seq BIGINT NOT NULL,
		status TEXT NOT NULL, doc TEXT NOT NULL,
		total INTEGER NOT NULL DEFAULT 0, completed INTEGER NOT NULL DEFAULT 0, failed INTEGER NOT NULL DEFAULT 0)`,
	`CREATE INDEX IF NOT EXISTS batches_owner ON batches (owner, kind, seq DESC)`,
	`CREATE INDEX IF NOT EXISTS batches_status ON batches (status)`,
	`CREATE TABLE IF NOT EXISTS batch_lines (
		batch_id TEXT NOT NULL, line_no INTEGER NOT NULL, custom_id TEXT NOT NULL, body {blob} NOT NULL,
		state TEXT NOT NULL, result {blob},
		PRIMARY KEY (batch_id, line_no))`,
}

// pgSchema is PostgreSQL's own: the order of creation, and the files'
// bytes in chunks of at most chunkBytes.
var pgSchema = []string{
	`CREATE SEQUENCE IF NOT EXISTS batch_seq`,
	`CREATE TABLE IF NOT EXISTS batch_contents (id TEXT PRIMARY KEY, bytes BIGINT NOT NULL, chunks INTEGER NOT NULL)`,
	`CREATE TABLE IF NOT EXISTS batch_chunks (id TEXT NOT NULL, no INTEGER NOT NULL, data BYTEA NOT NULL, PRIMARY KEY (id, no))`,
}

// leaseColumns are the batches columns of the lease, added to a table
// made before leases existed (migrate).
var leaseColumns = []struct{ name, def string }{
	{"runner", "TEXT NOT NULL DEFAULT ''"},
	{"lease_epoch", "BIGINT NOT NULL DEFAULT 0"},
	{"lease_until", "BIGINT NOT NULL DEFAULT 0"}, // milliseconds since 1970, the database's clock
	{"version", "BIGINT NOT NULL DEFAULT 0"},     // grows with every write of status or doc
}

// OpenSQLite opens (creating if needed) the batch tables in the database
// at path, or in a private in-memory one for ":memory:" or "". One edge
// owns the file: every lease a previous process held ends at open, so
// its batches resume at once.
func OpenSQLite(path string) (*SQL, error) {
	dsn := "file:" + url.PathEscape(path) + "?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)&_txlock=immediate"
	if path == "" || path == ":memory:" {
		dsn = "file::memory:?_txlock=immediate"
	}
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, fmt.Errorf("batch store %s: %w", path, err)
	}
	db.SetMaxOpenConns(1) // one writer; an in-memory database lives in its one connection
	s := &SQL{db: db, dialect: "sqlite"}
	if err := s.create(context.Background(), nil); err != nil {
		db.Close()
		return nil, fmt.Errorf("batch store %s: %w", path, err)
	}
	if _, err := db.Exec(`UPDATE batches SET lease_until = 0`); err != nil {
		db.Close()
		return nil, fmt.Errorf("batch store %s: %w", path, err)
	}
	return s, nil
}

// OpenPostgres connects to the PostgreSQL database dsn names (as pgx
// takes it) and creates the batch tables if missing. Several edges may
// share it: each batch runs on the edge holding its lease.
func OpenPostgres(ctx context.Context, dsn string) (*SQL, error) {
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		return nil, fmt.Errorf("batch store (postgres): %w", err)
	}
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("batch store (postgres): %w", err)
	}
	db.SetMaxOpenConns(16)
	s := &SQL{db: db, dialect: "postgres"}
	if err := s.create(ctx, pgSchema); err != nil {
		db.Close()
		return nil, fmt.Errorf("batch store (postgres): %w", err)
	}
	return s, nil
}

// create makes the tables and adds the lease columns a table lacks:
// PostgreSQL under the schema lock (edges starting at once take turns),
// SQLite after reading the columns it has (it has no ADD COLUMN IF NOT
// EXISTS).
func (s *SQL) create(ctx context.Context, extra []string) error {
	blob := "BLOB"
	if s.dialect == "postgres" {
		blob = "BYTEA"
	}
	var stmts []string
	for _, st := range schema {
		stmts = append(stmts, strings.ReplaceAll(st, "{blob}", blob))
	}
	stmts = append(stmts, extra...)
	if s.dialect == "postgres" {
		for _, c := range leaseColumns {
			stmts = append(stmts, `ALTER TABLE batches ADD COLUMN IF NOT EXISTS `+c.name+` `+c.def)
		}
		return pgschema.Create(ctx, s.db, stmts)
	}
	for _, st := range stmts {
		if _, err := s.db.ExecContext(ctx, st); err != nil {
			return err
		}
	}
	have := map[string]bool{}
	rows, err := s.db.QueryContext(ctx, `SELECT name FROM pragma_table_info('batches')`)
	if err != nil {
		return err
	}
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			rows.Close()
			return err
		}
		have[name] = true
	}
	rows.Close()
	for _, c := range leaseColumns {
		if have[c.name] {
			continue
		}
		if _, err := s.db.ExecContext(ctx, `ALTER TABLE batches ADD COLUMN `+c.name+` `+c.def); err != nil {
			return err
		}
	}
	return rows.Err()
}

func (s *SQL) Close() error { return s.db.Close() }

// q rewrites a statement's ? placeholders for the dialect ($1, $2, ...
// for PostgreSQL) and {now} as the database's clock in milliseconds.
func (s *SQL) q(stmt string) string {
	if s.dialect != "postgres" {
		return strings.ReplaceAll(stmt, "{now}", `CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)`)
	}
	stmt = strings.ReplaceAll(stmt, "{now}", `CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)`)
	var b strings.Builder
	n := 0
	for _, r := range stmt {
		if r == '?' {
			n++
			b.WriteString("$" + strconv.Itoa(n))
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

// seqExpr is the order of creation of a new row: a sequence shared by
// every edge on PostgreSQL; on SQLite nanoseconds, bumped past the last
// one used (its one writer makes that safe), so lists page stably.
func (s *SQL) seqExpr(table string) string {
	if s.dialect == "postgres" {
		return `nextval('batch_seq')`
	}
	return `(SELECT MAX(CAST((julianday('now') - 2440587.5) * 86400000000000 AS INTEGER), COALESCE(MAX(seq), 0) + 1) FROM ` + table + `)`
}

func (s *SQL) CreateFile(ctx context.Context, f File) error {
	_, err := s.db.ExecContext(ctx, s.q(`INSERT INTO batch_files (id, owner, purpose, filename, bytes, created_at, seq) VALUES (?,?,?,?,?,?,`+s.seqExpr("batch_files")+`)`),
		f.ID, f.Owner, f.Purpose, f.Filename, f.Bytes, f.CreatedAt.Unix())
	return err
}

func (s *SQL) GetFile(ctx context.Context, owner, id string) (File, error) {
	f := File{ID: id, Owner: owner}
	var created int64
	err := s.db.QueryRowContext(ctx, s.q(`SELECT purpose, filename, bytes, created_at FROM batch_files WHERE id = ? AND owner = ?`), id, owner).
		Scan(&f.Purpose, &f.Filename, &f.Bytes, &created)
	if errors.Is(err, sql.ErrNoRows) {
		return File{}, fmt.Errorf("%w: no file %s", ErrNotFound, id)
	}
	f.CreatedAt = time.Unix(created, 0)
	return f, err
}

func (s *SQL) ListFiles(ctx context.Context, owner, purpose, after string, limit int) ([]File, bool, error) {
	q := `SELECT id, purpose, filename, bytes, created_at FROM batch_files WHERE owner = ?`
	args := []any{owner}
	if purpose != "" {
		q += ` AND purpose = ?`
		args = append(args, purpose)
	}
	if after != "" {
		q += ` AND seq < (SELECT seq FROM batch_files WHERE id = ?)`
		args = append(args, after)
	}
	q += ` ORDER BY seq DESC LIMIT ?`
	args = append(args, limit+1)
	rows, err := s.db.QueryContext(ctx, s.q(q), args...)
	if err != nil {
		return nil, false, err
	}
	defer rows.Close()
	var out []File
	for rows.Next() {
		f := File{Owner: owner}
		var created int64
		if err := rows.Scan(&f.ID, &f.Purpose, &f.Filename, &f.Bytes, &created); err != nil {
			return nil, false, err
		}
		f.CreatedAt = time.Unix(created, 0)
		out = append(out, f)
	}
	more := len(out) > limit
	if more {
		out = out[:limit]
	}
	return out, more, rows.Err()
}

func (s *SQL) DeleteFile(ctx context.Context, owner, id string) error {
	res, err := s.db.ExecContext(ctx, s.q(`DELETE FROM batch_files WHERE id = ? AND owner = ?`), id, owner)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("%w: no file %s", ErrNotFound, id)
	}
	return nil
}

func (s *SQL) CreateBatch(ctx context.Context, b Batch) error {
	doc, err := json.Marshal(docOf(b))
	if err != nil {
		return err
	}
	_, err = s.db.ExecContext(ctx, s.q(`INSERT INTO batches (id, owner, kind, seq, status, doc, total, completed, failed) VALUES (?,?,?,`+s.seqExpr("batches")+`,?,?,?,?,?)`),
		b.ID, b.Owner, b.Kind, b.Status, string(doc), b.Total, b.Completed, b.Failed)
	return err
}

func (s *SQL) UpdateBatch(ctx context.Context, b Batch) error {
	doc, err := json.Marshal(docOf(b))
	if err != nil {
		return err
	}
	res, err := s.db.ExecContext(ctx, s.q(`UPDATE batches SET status = ?, doc = ?, version = version + 1
		WHERE id = ? AND lease_epoch = ? AND (status <> ? OR ? = ?)`),
		b.Status, string(doc), b.ID, b.Epoch, StatusCancelling, b.Status, StatusCancelled)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n == 1 {
		return nil
	}
	var epoch int64
	var status string
	err = s.db.QueryRowContext(ctx, s.q(`SELECT lease_epoch, status FROM batches WHERE id = ?`), b.ID).Scan(&epoch, &status)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return fmt.Errorf("%w: no batch %s", ErrNotFound, b.ID)
	case err != nil:
		return err
	case epoch != b.Epoch:
		return fmt.Errorf("%w: batch %s has lease epoch %d, not %d", ErrLeaseLost, b.ID, epoch, b.Epoch)
	}
	return fmt.Errorf("%w: batch %s is %s", ErrState, b.ID, status)
}

const batchColumns = `id, owner, kind, status, doc, total, completed, failed, runner, lease_epoch, lease_until > {now}`

// scanBatch scans a row of batchColumns, then into extra.
func scanBatch(row interface{ Scan(...any) error }, extra ...any) (Batch, error) {
	var b Batch
	var doc string
	dest := append([]any{&b.ID, &b.Owner, &b.Kind, &b.Status, &doc, &b.Total, &b.Completed, &b.Failed, &b.Runner, &b.Epoch, &b.Leased}, extra...)
	if err := row.Scan(dest...); err != nil {
		return Batch{}, err
	}
	var d batchDoc
	if err := json.Unmarshal([]byte(doc), &d); err != nil {
		return Batch{}, fmt.Errorf("batch %s: %w", b.ID, err)
	}
	d.into(&b)
	return b, nil
}

func (s *SQL) GetBatch(ctx context.Context, owner, id string) (Batch, error) {
	b, err := scanBatch(s.db.QueryRowContext(ctx, s.q(`SELECT `+batchColumns+` FROM batches WHERE id = ? AND owner = ?`), id, owner))
	if errors.Is(err, sql.ErrNoRows) {
		return Batch{}, fmt.Errorf("%w: no batch %s", ErrNotFound, id)
	}
	return b, err
}

func (s *SQL) ListBatches(ctx context.Context, owner, kind, after string, limit int) ([]Batch, bool, error) {
	q := `SELECT ` + batchColumns + ` FROM batches WHERE owner = ? AND kind = ?`
	args := []any{owner, kind}
	if after != "" {
		q += ` AND seq < (SELECT seq FROM batches WHERE id = ?)`
		args = append(args, after)
	}
	q += ` ORDER BY seq DESC LIMIT ?`
	args = append(args, limit+1)
	return s.queryBatches(ctx, limit, q, args...)
}

func (s *SQL) ActiveBatches(ctx context.Context) ([]Batch, error) {
	out, _, err := s.queryBatches(ctx, -1, `SELECT `+batchColumns+` FROM batches WHERE status IN (?,?,?,?) ORDER BY seq`,
		StatusValidating, StatusInProgress, StatusFinalizing, StatusCancelling)
	return out, err
}

// queryBatches runs q; limit >= 0 cuts the result to limit and reports
// whether more followed.
func (s *SQL) queryBatches(ctx context.Context, limit int, q string, args ...any) ([]Batch, bool, error) {
	rows, err := s.db.QueryContext(ctx, s.q(q), args...)
	if err != nil {
		return nil, false, err
	}
	defer rows.Close()
	var out []Batch
	for rows.Next() {
		b, err := scanBatch(rows)
		if err != nil {
			return nil, false, err
		}
		out = append(out, b)
	}
	more := limit >= 0 && len(out) > limit
	if more {
		out = out[:limit]
	}
	return out, more, rows.Err()
}

func (s *SQL) CountBatches(ctx context.Context) (map[string]int, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT status, COUNT(*) FROM batches GROUP BY status`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var status string
		var n int
		if err := rows.Scan(&status, &n); err != nil {
			return nil, err
		}
		out[status] = n
	}
	return out, rows.Err()
}

// maxCancelTries bounds RequestCancel's read-modify-write rounds against
// a runner writing the same batch.
const maxCancelTries = 16

func (s *SQL) DropLines(ctx context.Context, id string) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, s.q(`DELETE FROM batch_lines WHERE batch_id = ?`), id); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, s.q(`UPDATE batches SET total = 0 WHERE id = ?`), id); err != nil {
		return err
	}
	return tx.Commit()
}

func (s *SQL) DeleteBatch(ctx context.Context, owner, id string) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	res, err := tx.ExecContext(ctx, s.q(`DELETE FROM batches WHERE id = ? AND owner = ? AND status IN (?, ?, ?, ?)`),
		id, owner, StatusCompleted, StatusFailed, StatusExpired, StatusCancelled)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		var status string
		err := tx.QueryRowContext(ctx, s.q(`SELECT status FROM batches WHERE id = ? AND owner = ?`), id, owner).Scan(&status)
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("%w: no batch %s", ErrNotFound, id)
		}
		if err != nil {
			return err
		}
		return fmt.Errorf("%w: batch %s is %s", ErrState, id, status)
	}
	if _, err := tx.ExecContext(ctx, s.q(`DELETE FROM batch_lines WHERE batch_id = ?`), id); err != nil {
		return err
	}
	return tx.Commit()
}

func (s *SQL) RequestCancel(ctx context.Context, owner, id string, at time.Time) (Batch, error) {
	for range maxCancelTries {
		var version int64
		b, err := scanBatch(s.db.QueryRowContext(ctx, s.q(`SELECT `+batchColumns+`, version FROM batches WHERE id = ? AND owner = ?`), id, owner), &version)
		if errors.Is(err, sql.ErrNoRows) {
			return Batch{}, fmt.Errorf("%w: no batch %s", ErrNotFound, id)
		}
		if err != nil {
			return Batch{}, err
		}
		switch b.Status {
		case StatusCancelling:
			return b, nil
		case StatusValidating, StatusInProgress:
		default:
			return Batch{}, fmt.Errorf("%w: batch %s is %s", ErrState, id, b.Status)
		}
		prev := b.Status
		b.Status, b.CancellingAt = StatusCancelling, at
		doc, err := json.Marshal(docOf(b))
		if err != nil {
			return Batch{}, err
		}
		res, err := s.db.ExecContext(ctx, s.q(`UPDATE batches SET status = ?, doc = ?, version = version + 1 WHERE id = ? AND status = ? AND version = ?`),
			b.Status, string(doc), id, prev, version)
		if err != nil {
			return Batch{}, err
		}
		if n, _ := res.RowsAffected(); n == 1 {
			return b, nil
		}
	}
	return Batch{}, fmt.Errorf("%w: batch %s changed %d times while cancelling", ErrState, id, maxCancelTries)
}

func (s *SQL) Claim(ctx context.Context, id, runner string, ttl time.Duration) (Batch, bool, error) {
	res, err := s.db.ExecContext(ctx, s.q(`UPDATE batches SET runner = ?, lease_epoch = lease_epoch + 1, lease_until = {now} + ?
		WHERE id = ? AND status IN (?,?,?,?) AND (lease_until <= {now} OR runner = ?)`),
		runner, ttl.Milliseconds(), id, StatusValidating, StatusInProgress, StatusFinalizing, StatusCancelling, runner)
	if err != nil {
		return Batch{}, false, err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return Batch{}, false, nil
	}
	b, err := scanBatch(s.db.QueryRowContext(ctx, s.q(`SELECT `+batchColumns+` FROM batches WHERE id = ?`), id))
	if err != nil {
		return Batch{}, false, err
	}
	// Another claim may have followed this one already: the caller then
	// runs with a stale epoch and its first write is refused.
	return b, b.Runner == runner, nil
}

func (s *SQL) Renew(ctx context.Context, id string, epoch int64, ttl time.Duration) (string, bool, error) {
	res, err := s.db.ExecContext(ctx, s.q(`UPDATE batches SET lease_until = {now} + ? WHERE id = ? AND lease_epoch = ?`), ttl.Milliseconds(), id, epoch)
	if err != nil {
		return "", false, err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return "", false, nil
	}
	var status string
	err = s.db.QueryRowContext(ctx, s.q(`SELECT status FROM batches WHERE id = ?`), id).Scan(&status)
	return status, err == nil, err
}

func (s *SQL) Release(ctx context.Context, id string, epoch int64) error {
	_, err := s.db.ExecContext(ctx, s.q(`UPDATE batches SET lease_until = 0 WHERE id = ? AND lease_epoch = ?`), id, epoch)
	return err
}

func (s *SQL) AddLines(ctx context.Context, id string, lines []Line) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	stmt, err := tx.PrepareContext(ctx, s.q(`INSERT INTO batch_lines (batch_id, line_no, custom_id, body, state) VALUES (?,?,?,?,?) ON CONFLICT DO NOTHING`))
	if err != nil {
		return err
	}
	defer stmt.Close()
	for _, l := range lines {
		if _, err := stmt.ExecContext(ctx, id, l.No, l.CustomID, l.Body, LinePending); err != nil {
			return err
		}
	}
	if _, err := tx.ExecContext(ctx, s.q(`UPDATE batches SET total = (SELECT COUNT(*) FROM batch_lines WHERE batch_id = ?) WHERE id = ?`), id, id); err != nil {
		return err
	}
	return tx.Commit()
}

func (s *SQL) PendingLines(ctx context.Context, id string) ([]Line, error) {
	rows, err := s.db.QueryContext(ctx, s.q(`SELECT line_no, custom_id, body FROM batch_lines WHERE batch_id = ? AND state = ? ORDER BY line_no`), id, LinePending)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Line
	for rows.Next() {
		l := Line{State: LinePending}
		if err := rows.Scan(&l.No, &l.CustomID, &l.Body); err != nil {
			return nil, err
		}
		out = append(out, l)
	}
	return out, rows.Err()
}

func (s *SQL) FinishLine(ctx context.Context, id string, epoch int64, no int, state string, result []byte) (bool, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return false, err
	}
	defer tx.Rollback()
	// The batch's row first, locked on PostgreSQL against a concurrent
	// Claim until the commit (an SQLite transaction holds the database).
	lock := ""
	if s.dialect == "postgres" {
		lock = " FOR UPDATE"
	}
	var have int64
	if err := tx.QueryRowContext(ctx, s.q(`SELECT lease_epoch FROM batches WHERE id = ?`+lock), id).Scan(&have); err != nil {
		return false, err
	}
	if have != epoch {
		return false, nil
	}
	res, err := tx.ExecContext(ctx, s.q(`UPDATE batch_lines SET state = ?, result = ? WHERE batch_id = ? AND line_no = ? AND state = ?`),
		state, result, id, no, LinePending)
	if err != nil {
		return false, err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return false, nil
	}
	counter := "completed"
	if state == LineFailed {
		counter = "failed"
	}
	if _, err := tx.ExecContext(ctx, s.q(`UPDATE batches SET `+counter+` = `+counter+` + 1 WHERE id = ?`), id); err != nil {
		return false, err
	}
	return true, tx.Commit()
}

func (s *SQL) Results(ctx context.Context, id string, fn func(Line) error) error {
	rows, err := s.db.QueryContext(ctx, s.q(`SELECT line_no, custom_id, state, result FROM batch_lines WHERE batch_id = ? ORDER BY line_no`), id)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var l Line
		if err := rows.Scan(&l.No, &l.CustomID, &l.State, &l.Result); err != nil {
			return err
		}
		if err := fn(l); err != nil {
			return err
		}
	}
	return rows.Err()
}

// chunkBytes is the most bytes of a file one chunk row holds: Put and
// Open hold one chunk in memory at a time.
const chunkBytes = 1 << 20

// Contents keeps the files' bytes, by file id: a directory (Dir, beside
// an SQLite database) or the PostgreSQL store itself (SQL, shared by
// every edge).
type Contents interface {
	// Put stores r's bytes under id, whole or not at all, and returns
	// their count.
	Put(ctx context.Context, id string, r io.Reader) (int64, error)
	// Open reads id's bytes; ErrNotFound when there are none.
	Open(ctx context.Context, id string) (io.ReadCloser, error)
	// Remove removes id's bytes; none is no error.
	Remove(ctx context.Context, id string) error
}

var _ Contents = (*SQL)(nil)

// Put stores r in chunks of chunkBytes in one transaction (PostgreSQL
// only): a failure or a crash leaves nothing under id.
func (s *SQL) Put(ctx context.Context, id string, r io.Reader) (int64, error) {
	if s.dialect != "postgres" {
		return 0, fmt.Errorf("batch store: file bytes are kept in PostgreSQL only")
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback()
	buf := make([]byte, chunkBytes)
	var total int64
	chunks := 0
	for {
		n, rerr := io.ReadFull(r, buf)
		if n > 0 {
			if _, err := tx.ExecContext(ctx, `INSERT INTO batch_chunks (id, no, data) VALUES ($1, $2, $3)`, id, chunks, buf[:n]); err != nil {
				return 0, err
			}
			chunks++
			total += int64(n)
		}
		if rerr == io.EOF || rerr == io.ErrUnexpectedEOF {
			break
		}
		if rerr != nil {
			return 0, rerr
		}
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO batch_contents (id, bytes, chunks) VALUES ($1, $2, $3)`, id, total, chunks); err != nil {
		return 0, err
	}
	return total, tx.Commit()
}

// Open reads id's chunks one query at a time.
func (s *SQL) Open(ctx context.Context, id string) (io.ReadCloser, error) {
	var chunks int
	err := s.db.QueryRowContext(ctx, `SELECT chunks FROM batch_contents WHERE id = $1`, id).Scan(&chunks)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("%w: file %s has no content", ErrNotFound, id)
	}
	if err != nil {
		return nil, err
	}
	return &chunkReader{s: s, ctx: context.WithoutCancel(ctx), id: id, chunks: chunks}, nil
}

func (s *SQL) Remove(ctx context.Context, id string) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, `DELETE FROM batch_chunks WHERE id = $1`, id); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, `DELETE FROM batch_contents WHERE id = $1`, id); err != nil {
		return err
	}
	return tx.Commit()
}

// chunkReader reads a file's chunks in order, one held at a time.
type chunkReader struct {
	s          *SQL
	ctx        context.Context
	id         string
	chunks, no int
	buf        []byte
}

func (c *chunkReader) Read(p []byte) (int, error) {
	for len(c.buf) == 0 {
		if c.no >= c.chunks {
			return 0, io.EOF
		}
		if err := c.s.db.QueryRowContext(c.ctx, `SELECT data FROM batch_chunks WHERE id = $1 AND no = $2`, c.id, c.no).Scan(&c.buf); err != nil {
			if errors.Is(err, sql.ErrNoRows) {
				err = fmt.Errorf("%w: file %s lost chunk %d", ErrNotFound, c.id, c.no)
			}
			return 0, err
		}
		c.no++
	}
	n := copy(p, c.buf)
	c.buf = c.buf[n:]
	return n, nil
}

func (c *chunkReader) Close() error { return nil }
