package batch

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"time"

	_ "modernc.org/sqlite" // the "sqlite" database/sql driver (pure Go)
)

// File is one stored file's record; its bytes live in the service's
// directory under its id.
type File struct {
	ID, Owner, Purpose, Filename string
	Bytes                        int64
	CreatedAt                    time.Time
}

// Kinds of batch: which API created it and so how its results read.
const (
	KindOpenAI    = "openai"
	KindAnthropic = "anthropic"
)

// Statuses of a batch (OpenAI's names; Anthropic's processing_status is
// derived from them).
const (
	StatusValidating = "validating"
	StatusFailed     = "failed"
	StatusInProgress = "in_progress"
	StatusFinalizing = "finalizing"
	StatusCompleted  = "completed"
	StatusExpired    = "expired"
	StatusCancelling = "cancelling"
	StatusCancelled  = "cancelled"
)

// Batch is one batch's record.
type Batch struct {
	ID, Owner, Kind            string
	Endpoint, InputFileID      string
	CompletionWindow           string
	Metadata                   map[string]string
	Status                     string
	Errors                     []LineError // why validation failed
	OutputFileID, ErrorFileID  string
	Total, Completed, Failed   int
	CreatedAt, ExpiresAt       time.Time
	InProgressAt, FinalizingAt time.Time
	CompletedAt, FailedAt      time.Time
	ExpiredAt, CancellingAt    time.Time
	CancelledAt                time.Time
	ResultsFileID              string // Anthropic: every result, in line order
	Canceled, ExpiredCount     int    // Anthropic: lines ended unrun
}

// active reports whether the batch still has work: a job runs for it.
func (b Batch) active() bool {
	switch b.Status {
	case StatusValidating, StatusInProgress, StatusFinalizing, StatusCancelling:
		return true
	}
	return false
}

// LineError is one validation error of an input file (OpenAI's
// errors.data[]): Line is 1-based, 0 for the file as a whole.
type LineError struct {
	Code    string  `json:"code"`
	Message string  `json:"message"`
	Param   *string `json:"param"`
	Line    *int    `json:"line"`
}

// Line is one request of a batch. State is pending until its result is
// recorded (done or failed), exactly once.
type Line struct {
	No       int
	CustomID string
	Body     []byte
	State    string
	Result   []byte
}

// Line states.
const (
	LinePending = "pending"
	LineDone    = "done"
	LineFailed  = "failed"
)

// Store persists files, batches and their lines. A line's result is
// recorded once: FinishLine changes only a pending line.
type Store interface {
	CreateFile(ctx context.Context, f File) error
	// GetFile returns owner's file id, or ErrNotFound.
	GetFile(ctx context.Context, owner, id string) (File, error)
	// ListFiles returns up to limit of owner's files (of purpose, unless
	// ""), newest first, created before the file after (unless "").
	ListFiles(ctx context.Context, owner, purpose, after string, limit int) ([]File, bool, error)
	DeleteFile(ctx context.Context, owner, id string) error

	CreateBatch(ctx context.Context, b Batch) error
	GetBatch(ctx context.Context, owner, id string) (Batch, error)
	ListBatches(ctx context.Context, owner, kind, after string, limit int) ([]Batch, bool, error)
	// UpdateBatch saves b's status, times, errors, file ids and counts.
	UpdateBatch(ctx context.Context, b Batch) error
	// ActiveBatches lists every batch still being worked on (validating,
	// in_progress, finalizing, cancelling), for a restarted edge.
	ActiveBatches(ctx context.Context) ([]Batch, error)

	// AddLines inserts lines of batch id and sets its total to n, in one
	// transaction.
	AddLines(ctx context.Context, id string, lines []Line) error
	// PendingLines returns batch id's lines without a result, in order.
	PendingLines(ctx context.Context, id string) ([]Line, error)
	// FinishLine records the result of a pending line and counts it in
	// the batch (completed or failed); it reports false, changing
	// nothing, when the line already has one.
	FinishLine(ctx context.Context, id string, no int, state string, result []byte) (bool, error)
	// Results calls fn for each line of batch id, in order.
	Results(ctx context.Context, id string, fn func(Line) error) error
	Close() error
}

// SQLite is a Store in an SQLite database file, beside the edge's other
// tables (they share the file, as package responses' do).
type SQLite struct{ db *sql.DB }

var _ Store = (*SQLite)(nil)

var schema = []string{
	`CREATE TABLE IF NOT EXISTS batch_files (
		id TEXT PRIMARY KEY, owner TEXT NOT NULL, purpose TEXT NOT NULL, filename TEXT NOT NULL,
		bytes INTEGER NOT NULL, created_at INTEGER NOT NULL, seq INTEGER NOT NULL)`,
	`CREATE INDEX IF NOT EXISTS batch_files_owner ON batch_files (owner, seq DESC)`,
	`CREATE TABLE IF NOT EXISTS batches (
		id TEXT PRIMARY KEY, owner TEXT NOT NULL, kind TEXT NOT NULL, seq INTEGER NOT NULL,
		status TEXT NOT NULL, doc TEXT NOT NULL,
		total INTEGER NOT NULL DEFAULT 0, completed INTEGER NOT NULL DEFAULT 0, failed INTEGER NOT NULL DEFAULT 0)`,
	`CREATE INDEX IF NOT EXISTS batches_owner ON batches (owner, kind, seq DESC)`,
	`CREATE INDEX IF NOT EXISTS batches_status ON batches (status)`,
	`CREATE TABLE IF NOT EXISTS batch_lines (
		batch_id TEXT NOT NULL, line_no INTEGER NOT NULL, custom_id TEXT NOT NULL, body BLOB NOT NULL,
		state TEXT NOT NULL, result BLOB,
		PRIMARY KEY (batch_id, line_no))`,
}

// OpenSQLite opens (creating if needed) the batch tables in the database
// at path, or in a private in-memory one for ":memory:" or "".
func OpenSQLite(path string) (*SQLite, error) {
	dsn := "file:" + url.PathEscape(path) + "?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)&_txlock=immediate"
	if path == "" || path == ":memory:" {
		dsn = "file::memory:?_txlock=immediate"
	}
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, fmt.Errorf("batch store %s: %w", path, err)
	}
	db.SetMaxOpenConns(1) // one writer; an in-memory database lives in its one connection
	for _, stmt := range schema {
		if _, err := db.Exec(stmt); err != nil {
			db.Close()
			return nil, fmt.Errorf("batch store %s: %w", path, err)
		}
	}
	return &SQLite{db: db}, nil
}

func (s *SQLite) Close() error { return s.db.Close() }

// seq is a strictly increasing order of creation (nanoseconds, bumped
// past the last one used) so lists page stably.
func (s *SQLite) nextSeq(ctx context.Context, table string) (int64, error) {
	var last sql.NullInt64
	if err := s.db.QueryRowContext(ctx, `SELECT MAX(seq) FROM `+table).Scan(&last); err != nil {
		return 0, err
	}
	return max(time.Now().UnixNano(), last.Int64+1), nil
}

func (s *SQLite) CreateFile(ctx context.Context, f File) error {
	seq, err := s.nextSeq(ctx, "batch_files")
	if err != nil {
		return err
	}
	_, err = s.db.ExecContext(ctx, `INSERT INTO batch_files (id, owner, purpose, filename, bytes, created_at, seq) VALUES (?,?,?,?,?,?,?)`,
		f.ID, f.Owner, f.Purpose, f.Filename, f.Bytes, f.CreatedAt.Unix(), seq)
	return err
}

func (s *SQLite) GetFile(ctx context.Context, owner, id string) (File, error) {
	f := File{ID: id, Owner: owner}
	var created int64
	err := s.db.QueryRowContext(ctx, `SELECT purpose, filename, bytes, created_at FROM batch_files WHERE id = ? AND owner = ?`, id, owner).
		Scan(&f.Purpose, &f.Filename, &f.Bytes, &created)
	if errors.Is(err, sql.ErrNoRows) {
		return File{}, fmt.Errorf("%w: no file %s", ErrNotFound, id)
	}
	f.CreatedAt = time.Unix(created, 0)
	return f, err
}

func (s *SQLite) ListFiles(ctx context.Context, owner, purpose, after string, limit int) ([]File, bool, error) {
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
	rows, err := s.db.QueryContext(ctx, q, args...)
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

func (s *SQLite) DeleteFile(ctx context.Context, owner, id string) error {
	res, err := s.db.ExecContext(ctx, `DELETE FROM batch_files WHERE id = ? AND owner = ?`, id, owner)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("%w: no file %s", ErrNotFound, id)
	}
	return nil
}

func (s *SQLite) CreateBatch(ctx context.Context, b Batch) error {
	doc, err := json.Marshal(docOf(b))
	if err != nil {
		return err
	}
	seq, err := s.nextSeq(ctx, "batches")
	if err != nil {
		return err
	}
	_, err = s.db.ExecContext(ctx, `INSERT INTO batches (id, owner, kind, seq, status, doc, total, completed, failed) VALUES (?,?,?,?,?,?,?,?,?)`,
		b.ID, b.Owner, b.Kind, seq, b.Status, doc, b.Total, b.Completed, b.Failed)
	return err
}

func (s *SQLite) UpdateBatch(ctx context.Context, b Batch) error {
	doc, err := json.Marshal(docOf(b))
	if err != nil {
		return err
	}
	_, err = s.db.ExecContext(ctx, `UPDATE batches SET status = ?, doc = ? WHERE id = ?`, b.Status, doc, b.ID)
	return err
}

const batchColumns = `id, owner, kind, status, doc, total, completed, failed`

func scanBatch(row interface{ Scan(...any) error }) (Batch, error) {
	var b Batch
	var doc []byte
	if err := row.Scan(&b.ID, &b.Owner, &b.Kind, &b.Status, &doc, &b.Total, &b.Completed, &b.Failed); err != nil {
		return Batch{}, err
	}
	var d batchDoc
	if err := json.Unmarshal(doc, &d); err != nil {
		return Batch{}, fmt.Errorf("batch %s: %w", b.ID, err)
	}
	d.into(&b)
	return b, nil
}

func (s *SQLite) GetBatch(ctx context.Context, owner, id string) (Batch, error) {
	b, err := scanBatch(s.db.QueryRowContext(ctx, `SELECT `+batchColumns+` FROM batches WHERE id = ? AND owner = ?`, id, owner))
	if errors.Is(err, sql.ErrNoRows) {
		return Batch{}, fmt.Errorf("%w: no batch %s", ErrNotFound, id)
	}
	return b, err
}

func (s *SQLite) ListBatches(ctx context.Context, owner, kind, after string, limit int) ([]Batch, bool, error) {
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

func (s *SQLite) ActiveBatches(ctx context.Context) ([]Batch, error) {
	out, _, err := s.queryBatches(ctx, -1, `SELECT `+batchColumns+` FROM batches WHERE status IN (?,?,?,?) ORDER BY seq`,
		StatusValidating, StatusInProgress, StatusFinalizing, StatusCancelling)
	return out, err
}

// queryBatches runs q; limit >= 0 cuts the result to limit and reports
// whether more followed.
func (s *SQLite) queryBatches(ctx context.Context, limit int, q string, args ...any) ([]Batch, bool, error) {
	rows, err := s.db.QueryContext(ctx, q, args...)
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

func (s *SQLite) AddLines(ctx context.Context, id string, lines []Line) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	stmt, err := tx.PrepareContext(ctx, `INSERT OR IGNORE INTO batch_lines (batch_id, line_no, custom_id, body, state) VALUES (?,?,?,?,?)`)
	if err != nil {
		return err
	}
	defer stmt.Close()
	for _, l := range lines {
		if _, err := stmt.ExecContext(ctx, id, l.No, l.CustomID, l.Body, LinePending); err != nil {
			return err
		}
	}
	if _, err := tx.ExecContext(ctx, `UPDATE batches SET total = (SELECT COUNT(*) FROM batch_lines WHERE batch_id = ?) WHERE id = ?`, id, id); err != nil {
		return err
	}
	return tx.Commit()
}

func (s *SQLite) PendingLines(ctx context.Context, id string) ([]Line, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT line_no, custom_id, body FROM batch_lines WHERE batch_id = ? AND state = ? ORDER BY line_no`, id, LinePending)
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

func (s *SQLite) FinishLine(ctx context.Context, id string, no int, state string, result []byte) (bool, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return false, err
	}
	defer tx.Rollback()
	res, err := tx.ExecContext(ctx, `UPDATE batch_lines SET state = ?, result = ? WHERE batch_id = ? AND line_no = ? AND state = ?`,
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
	if _, err := tx.ExecContext(ctx, `UPDATE batches SET `+counter+` = `+counter+` + 1 WHERE id = ?`, id); err != nil {
		return false, err
	}
	return true, tx.Commit()
}

func (s *SQLite) Results(ctx context.Context, id string, fn func(Line) error) error {
	rows, err := s.db.QueryContext(ctx, `SELECT line_no, custom_id, state, result FROM batch_lines WHERE batch_id = ? ORDER BY line_no`, id)
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

// batchDoc is the part of a Batch kept as one JSON document.
type batchDoc struct {
	Endpoint         string            `json:"endpoint"`
	InputFileID      string            `json:"input_file_id"`
	CompletionWindow string            `json:"completion_window"`
	Metadata         map[string]string `json:"metadata,omitempty"`
	Errors           []LineError       `json:"errors,omitempty"`
	OutputFileID     string            `json:"output_file_id,omitempty"`
	ErrorFileID      string            `json:"error_file_id,omitempty"`
	ResultsFileID    string            `json:"results_file_id,omitempty"`
	Canceled         int               `json:"canceled,omitempty"`
	Expired          int               `json:"expired,omitempty"`
	Times            map[string]int64  `json:"times"`
}

func docOf(b Batch) batchDoc {
	d := batchDoc{Endpoint: b.Endpoint, InputFileID: b.InputFileID, CompletionWindow: b.CompletionWindow,
		Metadata: b.Metadata, Errors: b.Errors, OutputFileID: b.OutputFileID, ErrorFileID: b.ErrorFileID,
		ResultsFileID: b.ResultsFileID, Canceled: b.Canceled, Expired: b.ExpiredCount, Times: map[string]int64{}}
	for name, t := range b.times() {
		if !t.IsZero() {
			d.Times[name] = t.Unix()
		}
	}
	return d
}

func (d batchDoc) into(b *Batch) {
	b.Endpoint, b.InputFileID, b.CompletionWindow = d.Endpoint, d.InputFileID, d.CompletionWindow
	b.Metadata, b.Errors, b.OutputFileID, b.ErrorFileID = d.Metadata, d.Errors, d.OutputFileID, d.ErrorFileID
	b.ResultsFileID, b.Canceled, b.ExpiredCount = d.ResultsFileID, d.Canceled, d.Expired
	for name, p := range b.times() {
		if s, ok := d.Times[name]; ok {
			*p = time.Unix(s, 0)
		}
	}
}

// times names the batch's time fields (pointers into b).
func (b *Batch) times() map[string]*time.Time {
	return map[string]*time.Time{
		"created_at": &b.CreatedAt, "expires_at": &b.ExpiresAt, "in_progress_at": &b.InProgressAt,
		"finalizing_at": &b.FinalizingAt, "completed_at": &b.CompletedAt, "failed_at": &b.FailedAt,
		"expired_at": &b.ExpiredAt, "cancelling_at": &b.CancellingAt, "cancelled_at": &b.CancelledAt,
	}
}
