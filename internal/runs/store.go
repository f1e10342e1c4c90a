package runs

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"syscall"
	"time"

	_ "modernc.org/sqlite" // registers the "sqlite" database/sql driver (pure Go, no cgo)
)

// Store persists run records.
type Store interface {
	// Save inserts or replaces the record with rec.ID.
	Save(ctx context.Context, rec Record) error
	// Get returns the record with id, or an error wrapping ErrNotFound.
	Get(ctx context.Context, id string) (Record, error)
	// List returns up to f's limit records matching f, newest first,
	// without their Output, and whether more follow.
	List(ctx context.Context, f Filter) (recs []Record, more bool, err error)
	// Interrupt ends every queued or running record as error with reason,
	// at time now, and returns how many it changed. An edge calls it when
	// it opens the store, before it takes runs: records left unfinished
	// then were in flight when the previous edge process stopped.
	Interrupt(ctx context.Context, reason string, now time.Time) (int, error)
	Close() error
}

// SQLite is a Store in an SQLite database file (modernc.org/sqlite).
type SQLite struct {
	db   *sql.DB
	lock *os.File // holds the flock on path+".lock"; nil in memory
}

const schema = `
CREATE TABLE IF NOT EXISTS runs (
	id                TEXT PRIMARY KEY,
	state             TEXT NOT NULL,
	model             TEXT NOT NULL,
	session_id        TEXT NOT NULL DEFAULT '',
	background        INTEGER NOT NULL DEFAULT 0,
	metadata          TEXT NOT NULL DEFAULT '{}',
	created_at        INTEGER NOT NULL,
	started_at        INTEGER NOT NULL DEFAULT 0,
	first_token_at    INTEGER NOT NULL DEFAULT 0,
	finished_at       INTEGER NOT NULL DEFAULT 0,
	node_id           TEXT NOT NULL DEFAULT '',
	provider_id       TEXT NOT NULL DEFAULT '',
	served_model      TEXT NOT NULL DEFAULT '',
	path              TEXT NOT NULL DEFAULT '',
	queue_reason      TEXT NOT NULL DEFAULT '',
	queue_wait_ns     INTEGER NOT NULL DEFAULT 0,
	prompt_tokens     INTEGER NOT NULL DEFAULT 0,
	completion_tokens INTEGER NOT NULL DEFAULT 0,
	output            TEXT NOT NULL DEFAULT '',
	finish_reason     TEXT NOT NULL DEFAULT '',
	error             TEXT NOT NULL DEFAULT '',
	status            INTEGER NOT NULL DEFAULT 0,
	key_name          TEXT NOT NULL DEFAULT '',
	output_truncated  INTEGER NOT NULL DEFAULT 0,
	outcome           TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS runs_created ON runs (created_at DESC, id DESC);
CREATE INDEX IF NOT EXISTS runs_state ON runs (state);
CREATE INDEX IF NOT EXISTS runs_session ON runs (session_id);
`

const columns = `id, state, model, session_id, background, metadata, created_at, started_at,
	first_token_at, finished_at, node_id, provider_id, served_model, path, queue_reason,
	queue_wait_ns, prompt_tokens, completion_tokens, output, finish_reason, error, status, key_name, output_truncated, outcome`

// listColumns are the columns with an empty output.
var listColumns = strings.Replace(columns, "output,", "'' AS output,", 1)

// OpenSQLite opens (creating if needed) the database at path, or a private
// in-memory one for ":memory:", and creates the schema. It uses WAL
// journaling and one connection, so writers never see SQLITE_BUSY from each
// other, and holds an exclusive lock on path+".lock" until Close. Errors:
// ErrInUse when another process holds that lock; the file cannot be opened
// or is not an SQLite database.
func OpenSQLite(path string) (*SQLite, error) {
	var lock *os.File
	dsn := "file::memory:"
	if path != ":memory:" {
		var err error
		if lock, err = lockFile(path + ".lock"); err != nil {
			return nil, fmt.Errorf("run store %s: %w", path, err)
		}
		dsn = "file:" + url.PathEscape(path) + "?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)&_pragma=cache_size(-256)"
	}
	fail := func(err error) (*SQLite, error) {
		if lock != nil {
			lock.Close()
		}
		return nil, fmt.Errorf("run store %s: %w", path, err)
	}
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return fail(err)
	}
	// One connection: an in-memory database lives in it, and SQLite
	// serializes writers anyway.
	db.SetMaxOpenConns(1)
	if _, err := db.Exec(schema); err != nil {
		db.Close()
		return fail(err)
	}
	if err := migrate(db); err != nil {
		db.Close()
		return fail(err)
	}
	return &SQLite{db: db, lock: lock}, nil
}

// ErrInUse is returned by OpenSQLite for a database another process (an
// edge) has open: two edges on one file would mark each other's runs as
// interrupted.
var ErrInUse = errors.New("the database is in use by another process")

// lockFile takes an exclusive flock on path (created if missing), without
// waiting. The kernel drops it when the process ends, however it ends.
func lockFile(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w (%s is locked)", ErrInUse, path)
		}
		return nil, err
	}
	return f, nil
}

// migrate adds the columns a database made by an earlier version lacks.
func migrate(db *sql.DB) error {
	rows, err := db.Query(`SELECT name FROM pragma_table_info('runs')`)
	if err != nil {
		return err
	}
	have := map[string]bool{}
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			rows.Close()
			return err
		}
		have[name] = true
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	for _, c := range []struct{ name, def string }{
		{"key_name", "TEXT NOT NULL DEFAULT ''"},
		{"output_truncated", "INTEGER NOT NULL DEFAULT 0"},
		{"outcome", "TEXT NOT NULL DEFAULT ''"},
	} {
		if !have[c.name] {
			if _, err := db.Exec(`ALTER TABLE runs ADD COLUMN ` + c.name + ` ` + c.def); err != nil {
				return err
			}
		}
	}
	return nil
}

// Close closes the database and releases its lock.
func (s *SQLite) Close() error {
	err := s.db.Close()
	if s.lock != nil {
		s.lock.Close()
	}
	return err
}

// Save implements Store.
func (s *SQLite) Save(ctx context.Context, r Record) error {
	meta, err := json.Marshal(r.Metadata)
	if err != nil {
		return err
	}
	_, err = s.db.ExecContext(ctx, `INSERT OR REPLACE INTO runs (`+columns+`)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		r.ID, string(r.State), r.Model, r.SessionID, r.Background, string(meta),
		nanos(r.CreatedAt), nanos(r.StartedAt), nanos(r.FirstTokenAt), nanos(r.FinishedAt),
		r.NodeID, r.ProviderID, r.ServedModel, r.Path, r.QueueReason, int64(r.QueueWait),
		r.PromptTokens, r.CompletionTokens, r.Output, r.FinishReason, r.Error, r.Status, r.KeyName, r.OutputTruncated, r.Outcome)
	if err != nil {
		return fmt.Errorf("saving run %s: %w", r.ID, err)
	}
	return nil
}

// Get implements Store.
func (s *SQLite) Get(ctx context.Context, id string) (Record, error) {
	return getRecord(ctx, s.db, sameQuery, id)
}

// List implements Store, without the records' Output (a page of long
// answers would be huge). A Filter.After that names no run is ErrNotFound.
func (s *SQLite) List(ctx context.Context, f Filter) ([]Record, bool, error) {
	return listRecords(ctx, s.db, sameQuery, f)
}

// sameQuery leaves a query's ? placeholders as they are (SQLite's).
func sameQuery(q string) string { return q }

// getRecord is Get on db, whose placeholders ph writes.
func getRecord(ctx context.Context, db *sql.DB, ph func(string) string, id string) (Record, error) {
	rows, err := db.QueryContext(ctx, ph(`SELECT `+columns+` FROM runs WHERE id = ?`), id)
	if err != nil {
		return Record{}, err
	}
	recs, err := scan(rows)
	if err != nil {
		return Record{}, err
	}
	if len(recs) == 0 {
		return Record{}, fmt.Errorf("%w: %q", ErrNotFound, id)
	}
	return recs[0], nil
}

// listRecords is List on db, whose placeholders ph writes.
func listRecords(ctx context.Context, db *sql.DB, ph func(string) string, f Filter) ([]Record, bool, error) {
	q := `SELECT ` + listColumns + ` FROM runs WHERE 1=1`
	var args []any
	if f.State != "" {
		q += ` AND state = ?`
		args = append(args, string(f.State))
	}
	if f.Model != "" {
		q += ` AND model = ?`
		args = append(args, f.Model)
	}
	if f.SessionID != "" {
		q += ` AND session_id = ?`
		args = append(args, f.SessionID)
	}
	if f.KeyName != "" {
		q += ` AND key_name = ?`
		args = append(args, f.KeyName)
	}
	if f.After != "" {
		var created int64
		err := db.QueryRowContext(ctx, ph(`SELECT created_at FROM runs WHERE id = ?`), f.After).Scan(&created)
		if errors.Is(err, sql.ErrNoRows) {
			return nil, false, fmt.Errorf("%w: %q", ErrNotFound, f.After)
		}
		if err != nil {
			return nil, false, err
		}
		q += ` AND (created_at < ? OR (created_at = ? AND id < ?))`
		args = append(args, created, created, f.After)
	}
	limit := f.limit()
	q += ` ORDER BY created_at DESC, id DESC LIMIT ?`
	args = append(args, limit+1)
	rows, err := db.QueryContext(ctx, ph(q), args...)
	if err != nil {
		return nil, false, err
	}
	recs, err := scan(rows)
	if err != nil {
		return nil, false, err
	}
	if len(recs) > limit {
		return recs[:limit], true, nil
	}
	return recs, false, nil
}

// Interrupt implements Store.
func (s *SQLite) Interrupt(ctx context.Context, reason string, now time.Time) (int, error) {
	res, err := s.db.ExecContext(ctx, `UPDATE runs SET state = ?, error = ?, finished_at = ?, outcome = ?
		WHERE state IN (?, ?)`, string(StateError), reason, nanos(now), OutcomeEdgeStopped, string(StateQueued), string(StateRunning))
	if err != nil {
		return 0, err
	}
	n, err := res.RowsAffected()
	return int(n), err
}

func scan(rows *sql.Rows) ([]Record, error) {
	defer rows.Close()
	var out []Record
	for rows.Next() {
		var (
			r                                       Record
			state, meta                             string
			created, started, first, finished, wait int64
		)
		if err := rows.Scan(&r.ID, &state, &r.Model, &r.SessionID, &r.Background, &meta,
			&created, &started, &first, &finished, &r.NodeID, &r.ProviderID, &r.ServedModel,
			&r.Path, &r.QueueReason, &wait, &r.PromptTokens, &r.CompletionTokens, &r.Output,
			&r.FinishReason, &r.Error, &r.Status, &r.KeyName, &r.OutputTruncated, &r.Outcome); err != nil {
			return nil, err
		}
		r.State = State(state)
		r.CreatedAt, r.StartedAt, r.FirstTokenAt, r.FinishedAt = fromNanos(created), fromNanos(started), fromNanos(first), fromNanos(finished)
		r.QueueWait = time.Duration(wait)
		if err := json.Unmarshal([]byte(meta), &r.Metadata); err != nil {
			return nil, fmt.Errorf("run %s: metadata: %w", r.ID, err)
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// nanos stores a time as Unix nanoseconds, the zero time as 0.
func nanos(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

func fromNanos(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n)
}
