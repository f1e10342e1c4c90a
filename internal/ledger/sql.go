package ledger

import (
	"context"
	"database/sql"
	"fmt"
	"math"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" database/sql driver (PostgreSQL)
	_ "modernc.org/sqlite"             // registers the "sqlite" database/sql driver (pure Go, no cgo)

	"iop/internal/pgschema"
)

// SQL is a Store in an SQL database: SQLite or PostgreSQL, which differ
// here only in how query parameters are written. The table is
// usage_ledger; its statements are portable between the two.
type SQL struct {
	db      *sql.DB
	dialect string // "sqlite" or "postgres"

	mu    sync.Mutex               // guards the field below
	stmts [rowsPerInsert]*sql.Stmt // stmts[n-1] inserts n rows; prepared on first use, closed by Close
}

var _ Store = (*SQL)(nil)

var schema = []string{`CREATE TABLE IF NOT EXISTS usage_ledger (
	at_ns             BIGINT NOT NULL,
	day               TEXT   NOT NULL,
	key_name          TEXT   NOT NULL,
	model             TEXT   NOT NULL,
	run_id            TEXT   NOT NULL,
	node_id           TEXT   NOT NULL,
	provider_id       TEXT   NOT NULL,
	served_model      TEXT   NOT NULL,
	prompt_tokens     BIGINT NOT NULL,
	completion_tokens BIGINT NOT NULL,
	duration_ns       BIGINT NOT NULL,
	outcome           TEXT   NOT NULL,
	request_id        TEXT   NOT NULL DEFAULT '',
	error_code        TEXT   NOT NULL DEFAULT '',
	slot_ns           BIGINT NOT NULL DEFAULT 0,
	cost_weight       DOUBLE PRECISION NOT NULL DEFAULT 0,
	gpu_ns            BIGINT NOT NULL DEFAULT 0,
	batch             INTEGER NOT NULL DEFAULT 0
)`,
	`CREATE INDEX IF NOT EXISTS usage_ledger_at ON usage_ledger (at_ns)`,
	`CREATE INDEX IF NOT EXISTS usage_ledger_key ON usage_ledger (key_name, at_ns)`,
}

// addedColumns are the columns a table made by an earlier version lacks,
// added when the ledger opens it (migrate).
var addedColumns = []struct{ name, def string }{
	{"request_id", "TEXT NOT NULL DEFAULT ''"},
	{"error_code", "TEXT NOT NULL DEFAULT ''"},
	{"slot_ns", "BIGINT NOT NULL DEFAULT 0"},
	{"cost_weight", "DOUBLE PRECISION NOT NULL DEFAULT 0"},
	{"gpu_ns", "BIGINT NOT NULL DEFAULT 0"},
	{"batch", "INTEGER NOT NULL DEFAULT 0"}, // 1 for Entry.Batch
}

// columnsPerRow is the number of columns Insert writes per entry.
const columnsPerRow = 18

// OpenSQLite opens (creating if needed) the ledger table in the SQLite
// database at path, the edge's run database (its own table there), or a
// private in-memory database for ":memory:". WAL journaling and a busy
// timeout let it share the file with the run store's connection.
func OpenSQLite(path string) (*SQL, error) {
	dsn := "file:" + url.PathEscape(path) + "?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)&_pragma=cache_size(-256)"
	if path == ":memory:" {
		dsn = "file::memory:"
	}
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, fmt.Errorf("usage ledger %s: %w", path, err)
	}
	db.SetMaxOpenConns(1) // an in-memory database lives in its one connection
	return open(db, "sqlite", path)
}

// OpenPostgres connects to the PostgreSQL database dsn names (a URL,
// postgres://user@host:port/db?sslmode=..., or key=value pairs, as pgx
// takes them) and creates the ledger table if missing. Several edges may
// share one database.
func OpenPostgres(ctx context.Context, dsn string) (*SQL, error) {
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		return nil, fmt.Errorf("usage ledger (postgres): %w", err)
	}
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		// Not err's text alone: it names the host, never the password.
		return nil, fmt.Errorf("usage ledger (postgres): %w", err)
	}
	// The tables first, under the schema lock (edges starting at once take
	// turns); open's own CREATE ... IF NOT EXISTS then find them.
	if err := pgschema.Create(ctx, db, schema); err != nil {
		db.Close()
		return nil, fmt.Errorf("usage ledger (postgres): %w", err)
	}
	return open(db, "postgres", "postgres")
}

func open(db *sql.DB, dialect, name string) (*SQL, error) {
	for _, stmt := range schema {
		if _, err := db.Exec(stmt); err != nil {
			db.Close()
			return nil, fmt.Errorf("usage ledger %s: %w", name, err)
		}
	}
	if err := migrate(db, dialect); err != nil {
		db.Close()
		return nil, fmt.Errorf("usage ledger %s: %w", name, err)
	}
	return &SQL{db: db, dialect: dialect}, nil
}

// migrate adds the addedColumns the table lacks: PostgreSQL adds a column
// only if it does not exist; SQLite has no such clause, so the columns it
// has are read first.
func migrate(db *sql.DB, dialect string) error {
	have := map[string]bool{}
	if dialect == "sqlite" {
		rows, err := db.Query(`SELECT name FROM pragma_table_info('usage_ledger')`)
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
		if err := rows.Err(); err != nil {
			return err
		}
	}
	for _, c := range addedColumns {
		stmt := `ALTER TABLE usage_ledger ADD COLUMN ` + c.name + ` ` + c.def
		switch {
		case have[c.name]:
			continue
		case dialect == "postgres":
			stmt = `ALTER TABLE usage_ledger ADD COLUMN IF NOT EXISTS ` + c.name + ` ` + c.def
		}
		if _, err := db.Exec(stmt); err != nil {
			return err
		}
	}
	return nil
}

// Close closes the prepared statements and the database.
func (s *SQL) Close() error {
	s.mu.Lock()
	for i, stmt := range s.stmts {
		if stmt != nil {
			stmt.Close()
			s.stmts[i] = nil
		}
	}
	s.mu.Unlock()
	return s.db.Close()
}

// param returns the n-th (from 1) query parameter's placeholder.
func (s *SQL) param(n int) string {
	if s.dialect == "postgres" {
		return "$" + strconv.Itoa(n)
	}
	return "?"
}

// rowsPerInsert is the most rows one INSERT statement carries
// (columnsPerRow parameters each: 1,152, far below SQLite's 32,766 and
// PostgreSQL's 65,535).
const rowsPerInsert = 64

// Insert implements Store: one transaction, one multi-row INSERT per
// rowsPerInsert entries (the last one with the rows left). The INSERT of
// each row count is prepared once, on the database, the first time a
// batch needs it (insertStmt), and reused by every later transaction
// (Tx.StmtContext: a connection that prepared it already is not asked
// again), so a batch costs no statement parsing.
func (s *SQL) Insert(ctx context.Context, entries []Entry) error {
	if len(entries) == 0 {
		return nil
	}
	// Prepared before the transaction takes a connection (SQLite has one):
	// full for the first INSERT, last for the rows left after the full ones.
	full, err := s.insertStmt(ctx, min(len(entries), rowsPerInsert))
	if err != nil {
		return err
	}
	last := full
	if rest := len(entries) % rowsPerInsert; rest != 0 && len(entries) > rowsPerInsert {
		if last, err = s.insertStmt(ctx, rest); err != nil {
			return err
		}
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	// The transaction's copies of the statements are closed with it.
	if last == full {
		full = tx.StmtContext(ctx, full)
		last = full
	} else {
		full, last = tx.StmtContext(ctx, full), tx.StmtContext(ctx, last)
	}
	args := make([]any, 0, columnsPerRow*min(len(entries), rowsPerInsert))
	for len(entries) > 0 {
		n := min(len(entries), rowsPerInsert)
		stmt := full
		if n < rowsPerInsert {
			stmt = last
		}
		args = args[:0]
		for _, e := range entries[:n] {
			args = append(args, e.Time.UnixNano(), e.Time.UTC().Format(time.DateOnly), e.Key, e.Model,
				e.RunID, e.NodeID, e.ProviderID, e.ServedModel, e.PromptTokens, e.CompletionTokens,
				int64(e.Duration), e.Outcome, e.RequestID, e.ErrorCode,
				int64(e.SlotTime), e.CostWeight, int64(e.GPUTime()), batchFlag(e.Batch))
		}
		if _, err := stmt.ExecContext(ctx, args...); err != nil {
			return err
		}
		entries = entries[n:]
	}
	return tx.Commit()
}

// insertStmt returns the prepared INSERT of rows rows (1..rowsPerInsert),
// preparing it on the database on first use.
func (s *SQL) insertStmt(ctx context.Context, rows int) (*sql.Stmt, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if stmt := s.stmts[rows-1]; stmt != nil {
		return stmt, nil
	}
	stmt, err := s.db.PrepareContext(ctx, s.insertSQL(rows))
	if err != nil {
		return nil, err
	}
	s.stmts[rows-1] = stmt
	return stmt, nil
}

// insertSQL is the INSERT of rows rows, its placeholders in s's dialect.
func (s *SQL) insertSQL(rows int) string {
	var b strings.Builder
	b.WriteString(`INSERT INTO usage_ledger (at_ns, day, key_name, model, run_id, node_id,
		provider_id, served_model, prompt_tokens, completion_tokens, duration_ns, outcome, request_id, error_code,
		slot_ns, cost_weight, gpu_ns, batch) VALUES `)
	for r := range rows {
		if r > 0 {
			b.WriteString(", ")
		}
		b.WriteByte('(')
		for c := range columnsPerRow {
			if c > 0 {
				b.WriteString(", ")
			}
			b.WriteString(s.param(r*columnsPerRow + c + 1))
		}
		b.WriteByte(')')
	}
	return b.String()
}

// minNanoTime and maxNanoTime are the first and last instants int64
// nanoseconds since the Unix epoch hold.
var (
	minNanoTime = time.Unix(0, math.MinInt64)
	maxNanoTime = time.Unix(0, math.MaxInt64)
)

// groupColumns maps a GroupBy to the expression grouped on. GroupTeam
// and GroupDay in a zone other than UTC are grouped in Go (Aggregate).
var groupColumns = map[string]string{
	GroupKey:      "key_name",
	GroupModel:    "model",
	GroupProvider: "CASE WHEN node_id = '' AND provider_id = '' THEN '' ELSE node_id || '/' || provider_id END",
	GroupNode:     "node_id",
	GroupDay:      "day",
	GroupBatch:    "CASE WHEN batch = 1 THEN 'batch' ELSE 'interactive' END",
}

// batchFlag is the batch column's value of Entry.Batch.
func batchFlag(batch bool) int {
	if batch {
		return 1
	}
	return 0
}

// dayBucket is the span of the rows summed together for GroupDay in a zone
// other than UTC: a quarter hour, so each bucket lies within one local
// date of any zone whose offsets are whole quarter hours.
const dayBucket = 15 * time.Minute

// bucketExpr is the quarter hour of a row, as the number of quarter hours
// since 1970 (integer division in both dialects).
var bucketExpr = "CAST(at_ns / " + strconv.FormatInt(int64(dayBucket), 10) + " AS TEXT)"

// Aggregate implements Store. The database sums; what it cannot group
// by (a team, a local date) it returns finer — by key, by quarter hour
// — and Go merges those sums into the query's groups.
func (s *SQL) Aggregate(ctx context.Context, q Query) ([]Group, error) {
	col := "''"
	if q.GroupBy != GroupNone && q.GroupBy != GroupTeam {
		var ok bool
		if col, ok = groupColumns[q.GroupBy]; !ok {
			return nil, fmt.Errorf("%w: group_by %q", ErrInvalidQuery, q.GroupBy)
		}
	}
	local := q.GroupBy == GroupDay && q.Location != nil && q.Location.String() != time.UTC.String()
	if local {
		col = bucketExpr
	}
	teams := q.GroupBy == GroupTeam || q.Team != ""
	keyCol := "''"
	if teams {
		keyCol = "key_name"
	}
	rows, err := s.sums(ctx, q, keyCol, col)
	if err != nil {
		return nil, err
	}
	if !teams && !local {
		out := make([]Group, len(rows))
		for i, r := range rows {
			out[i] = r.sum
		}
		return out, nil
	}
	teamOf := q.TeamOf
	if teamOf == nil {
		teamOf = func(string) string { return "" }
	}
	merged := map[string]*Group{}
	for _, r := range rows {
		name := r.sum.Group
		if teams {
			team := teamOf(r.key)
			if q.Team != "" && team != q.Team {
				continue
			}
			if q.GroupBy == GroupTeam {
				name = team
			}
		}
		if local {
			name = localDay(r.sum.Group, q.Location)
		}
		m := merged[name]
		if m == nil {
			m = &Group{Group: name}
			merged[name] = m
		}
		m.add(r.sum)
	}
	if q.GroupBy == GroupNone && len(merged) == 0 {
		merged[""] = &Group{}
	}
	out := make([]Group, 0, len(merged))
	for _, g := range merged {
		out = append(out, *g)
	}
	slices.SortFunc(out, func(a, b Group) int { return strings.Compare(a.Group, b.Group) })
	return out, nil
}

// keyedGroup is a row of sums: a Group and the key it is of ("" when
// not grouped by key).
type keyedGroup struct {
	key string
	sum Group
}

// add adds g's sums to m's.
func (m *Group) add(g Group) {
	m.Requests += g.Requests
	m.Completed += g.Completed
	m.PromptTokens += g.PromptTokens
	m.CompletionTokens += g.CompletionTokens
	m.Duration += g.Duration
	m.GPUTime += g.GPUTime
}

// localDay is the date in loc of the quarter hour bucket names
// (bucketExpr's value).
func localDay(bucket string, loc *time.Location) string {
	n, err := strconv.ParseInt(bucket, 10, 64)
	if err != nil {
		return bucket
	}
	return time.Unix(0, n*int64(dayBucket)).In(loc).Format(time.DateOnly)
}

// sums selects the sums of the entries q selects, grouped by keyCol and
// col (each a column expression, or an empty SQL string for none).
func (s *SQL) sums(ctx context.Context, q Query, keyCol, col string) ([]keyedGroup, error) {
	var (
		where []string
		args  []any
	)
	cond := func(expr string, v any) {
		args = append(args, v)
		where = append(where, fmt.Sprintf(expr, s.param(len(args))))
	}
	if q.Key != "" {
		cond("key_name = %s", q.Key)
	}
	if q.Model != "" {
		cond("model = %s", q.Model)
	}
	switch q.Batch {
	case BatchAll:
	case BatchOnly:
		cond("batch = %s", 1)
	case BatchInteractive:
		cond("batch = %s", 0)
	default:
		return nil, fmt.Errorf("%w: batch %q", ErrInvalidQuery, q.Batch)
	}
	// at_ns holds int64 nanoseconds (1677-09-21 to 2262-04-11): a bound
	// beyond them bounds nothing, and UnixNano would overflow it.
	if !q.From.IsZero() && q.From.After(minNanoTime) {
		cond("at_ns >= %s", q.From.UnixNano())
	}
	if !q.To.IsZero() && q.To.Before(maxNanoTime) {
		cond("at_ns < %s", q.To.UnixNano())
	}
	query := `SELECT ` + keyCol + ` AS k, ` + col + ` AS g, COUNT(*),
		CAST(COALESCE(SUM(CASE WHEN outcome = 'completed' THEN 1 ELSE 0 END), 0) AS BIGINT),
		CAST(COALESCE(SUM(prompt_tokens), 0) AS BIGINT),
		CAST(COALESCE(SUM(completion_tokens), 0) AS BIGINT),
		CAST(COALESCE(SUM(duration_ns), 0) AS BIGINT),
		CAST(COALESCE(SUM(gpu_ns), 0) AS BIGINT)
		FROM usage_ledger`
	if len(where) > 0 {
		query += ` WHERE ` + strings.Join(where, " AND ")
	}
	var by []string
	for _, c := range []string{keyCol, col} {
		if c != "''" {
			by = append(by, c)
		}
	}
	if len(by) > 0 {
		// Ordered by the group, then the key: without a team or a local
		// date this is the answer's order.
		query += ` GROUP BY ` + strings.Join(by, ", ") + ` ORDER BY g, k`
	}
	rows, err := s.db.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []keyedGroup{}
	for rows.Next() {
		var (
			g        keyedGroup
			dur, gpu int64
		)
		if err := rows.Scan(&g.key, &g.sum.Group, &g.sum.Requests, &g.sum.Completed, &g.sum.PromptTokens, &g.sum.CompletionTokens, &dur, &gpu); err != nil {
			return nil, err
		}
		g.sum.Duration, g.sum.GPUTime = time.Duration(dur), time.Duration(gpu)
		out = append(out, g)
	}
	return out, rows.Err()
}
