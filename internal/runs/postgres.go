package runs

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" database/sql driver (PostgreSQL)

	"iop/internal/pgschema"
)

// Shared is a Store that several edges share: besides the records it
// keeps every run's event log and carries requests to cancel a run from
// any edge to the one that holds it, so a run submitted through one edge
// is read, streamed and cancelled through any other. Postgres is one.
type Shared interface {
	Store
	// AppendEvents adds events (whole SSE events, possibly several) to
	// run id's log as its entry seq (1, 2, ...; an entry already there is
	// left alone), or its end when last (data empty), and wakes the
	// edges that follow the run (Watch).
	AppendEvents(ctx context.Context, id string, seq int64, data []byte, last bool) error
	// Events returns up to limit entries of run id's log after seq, in
	// order.
	Events(ctx context.Context, id string, after int64, limit int) ([]Event, error)
	// RequestCancel records that run id is to be cancelled with reason and
	// wakes the edge that holds it (OnCancel there). It reports whether the
	// run was still queued or running.
	RequestCancel(ctx context.Context, id, reason string) (bool, error)
	// Watch returns a channel that receives (one slot, never blocking the
	// sender) whenever run id's log or record may have changed; stop
	// forgets it.
	Watch(id string) (ch <-chan struct{}, stop func())
	// OnCancel sets what is called, on a goroutine of the store's, with
	// the id and reason of each cancel request for a run this edge holds.
	// Set once, before the first run starts.
	OnCancel(func(id, reason string))
	// DeleteEvents drops run id's log (its record stays).
	DeleteEvents(ctx context.Context, id string) error
	// DeleteEventsFinishedBefore drops the logs of this edge's runs that
	// finished before t (their records stay).
	DeleteEventsFinishedBefore(ctx context.Context, t time.Time) error
}

// Event is one entry of a run's shared log.
type Event struct {
	Seq  int64
	Data []byte
	Last bool // the log's end: no entry follows
}

// Postgres is a Store in a PostgreSQL database that several edges share
// (Shared): the tables runs and run_events, and the notification channel
// iop_runs ("e:<id>": run id's log grew or ended, "c:<id>": run id is to
// be cancelled). Each record carries the name of the edge that holds it,
// so Interrupt ends only this edge's runs, never another live edge's.
//
// Concurrency: safe for concurrent use. OpenPostgres starts one goroutine
// (listen) that holds a pgx connection of its own LISTENing on iop_runs,
// wakes watchers and calls the cancel callback; every second without a
// notification (and after each reconnection, which may have missed some)
// it also reads this edge's pending cancel requests and wakes every
// watcher, so a lost notification delays an event or a cancel by at most
// about a second. Close stops it and waits. mu guards watchers and
// onCancel.
type Postgres struct {
	db   *sql.DB
	dsn  string
	edge string
	log  *slog.Logger

	mu       sync.Mutex
	watchers map[string]map[chan struct{}]struct{}
	onCancel func(id, reason string)

	stop context.CancelFunc
	done chan struct{}
}

var _ Shared = (*Postgres)(nil)

// pgPollInterval is how long the listener waits for a notification before
// it reads the pending cancel requests and wakes every watcher anyway.
const pgPollInterval = time.Second

var pgSchema = []string{`CREATE TABLE IF NOT EXISTS runs (
	id                TEXT PRIMARY KEY,
	state             TEXT NOT NULL,
	model             TEXT NOT NULL,
	session_id        TEXT NOT NULL DEFAULT '',
	background        BOOLEAN NOT NULL DEFAULT false,
	metadata          TEXT NOT NULL DEFAULT '{}',
	created_at        BIGINT NOT NULL,
	started_at        BIGINT NOT NULL DEFAULT 0,
	first_token_at    BIGINT NOT NULL DEFAULT 0,
	finished_at       BIGINT NOT NULL DEFAULT 0,
	node_id           TEXT NOT NULL DEFAULT '',
	provider_id       TEXT NOT NULL DEFAULT '',
	served_model      TEXT NOT NULL DEFAULT '',
	path              TEXT NOT NULL DEFAULT '',
	queue_reason      TEXT NOT NULL DEFAULT '',
	queue_wait_ns     BIGINT NOT NULL DEFAULT 0,
	prompt_tokens     BIGINT NOT NULL DEFAULT 0,
	completion_tokens BIGINT NOT NULL DEFAULT 0,
	output            TEXT NOT NULL DEFAULT '',
	finish_reason     TEXT NOT NULL DEFAULT '',
	error             TEXT NOT NULL DEFAULT '',
	status            INTEGER NOT NULL DEFAULT 0,
	key_name          TEXT NOT NULL DEFAULT '',
	output_truncated  BOOLEAN NOT NULL DEFAULT false,
	outcome           TEXT NOT NULL DEFAULT '',
	edge              TEXT NOT NULL DEFAULT '',
	cancel_requested  TEXT NOT NULL DEFAULT ''
)`,
	`CREATE INDEX IF NOT EXISTS runs_created ON runs (created_at DESC, id DESC)`,
	`CREATE INDEX IF NOT EXISTS runs_state ON runs (state)`,
	`CREATE INDEX IF NOT EXISTS runs_session ON runs (session_id)`,
	`CREATE INDEX IF NOT EXISTS runs_edge_live ON runs (edge) WHERE state IN ('queued', 'running')`,
	`CREATE TABLE IF NOT EXISTS run_events (
	run_id TEXT NOT NULL,
	seq    BIGINT NOT NULL,
	data   BYTEA NOT NULL,
	last   BOOLEAN NOT NULL DEFAULT false,
	PRIMARY KEY (run_id, seq)
)`,
}

// OpenPostgres connects to the PostgreSQL database dsn names (a URL,
// postgres://user@host:port/db?sslmode=..., or key=value pairs, as pgx
// takes them), creates the tables if missing and starts listening for
// notifications. edge names this edge among those sharing the database
// (the records it saves carry it; Interrupt ends only its own): it must
// be the same across the edge's restarts and differ between edges.
// Errors: an empty edge, the database cannot be reached (the error names
// the host, never the password) or refuses the schema.
func OpenPostgres(ctx context.Context, dsn, edge string, logger *slog.Logger) (*Postgres, error) {
	if edge == "" {
		return nil, errors.New("run store (postgres): the edge's name is required")
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		return nil, fmt.Errorf("run store (postgres): %w", err)
	}
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("run store (postgres): %w", err)
	}
	if err := pgschema.Create(ctx, db, pgSchema); err != nil { // edges starting at once take turns
		db.Close()
		return nil, fmt.Errorf("run store (postgres): %w", err)
	}
	lctx, stop := context.WithCancel(context.Background())
	s := &Postgres{db: db, dsn: dsn, edge: edge, log: logger, watchers: map[string]map[chan struct{}]struct{}{}, stop: stop, done: make(chan struct{})}
	go s.listen(lctx)
	return s, nil
}

// Edge is the name this store saves records under.
func (s *Postgres) Edge() string { return s.edge }

// Close stops the listener and closes the database.
func (s *Postgres) Close() error {
	s.stop()
	<-s.done
	return s.db.Close()
}

// pg rewrites the ? placeholders of q as $1, $2, ...
func pg(q string) string {
	var b strings.Builder
	n := 0
	for _, r := range q {
		if r == '?' {
			n++
			b.WriteString("$" + strconv.Itoa(n))
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

// Save implements Store: an upsert that leaves a pending cancel request
// in place.
func (s *Postgres) Save(ctx context.Context, r Record) error {
	meta, err := json.Marshal(r.Metadata)
	if err != nil {
		return err
	}
	var set []string
	for _, c := range strings.Split(columns, ",") {
		if c = strings.TrimSpace(c); c != "id" {
			set = append(set, c+" = EXCLUDED."+c)
		}
	}
	_, err = s.db.ExecContext(ctx, pg(`INSERT INTO runs (`+columns+`, edge)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (id) DO UPDATE SET `+strings.Join(set, ", ")+`, edge = EXCLUDED.edge`),
		r.ID, string(r.State), r.Model, r.SessionID, r.Background, string(meta),
		nanos(r.CreatedAt), nanos(r.StartedAt), nanos(r.FirstTokenAt), nanos(r.FinishedAt),
		r.NodeID, r.ProviderID, r.ServedModel, r.Path, r.QueueReason, int64(r.QueueWait),
		r.PromptTokens, r.CompletionTokens, r.Output, r.FinishReason, r.Error, r.Status, r.KeyName, r.OutputTruncated, r.Outcome, s.edge)
	if err != nil {
		return fmt.Errorf("saving run %s: %w", r.ID, err)
	}
	return nil
}

// Get implements Store.
func (s *Postgres) Get(ctx context.Context, id string) (Record, error) {
	return getRecord(ctx, s.db, pg, id)
}

// List implements Store (see SQLite.List).
func (s *Postgres) List(ctx context.Context, f Filter) ([]Record, bool, error) {
	return listRecords(ctx, s.db, pg, f)
}

// Interrupt implements Store for this edge's records only: those of other
// edges, which may be running them now, are left alone.
func (s *Postgres) Interrupt(ctx context.Context, reason string, now time.Time) (int, error) {
	res, err := s.db.ExecContext(ctx, `UPDATE runs SET state = $1, error = $2, finished_at = $3, outcome = $4, cancel_requested = ''
		WHERE state IN ($5, $6) AND edge = $7`, string(StateError), reason, nanos(now), OutcomeEdgeStopped, string(StateQueued), string(StateRunning), s.edge)
	if err != nil {
		return 0, err
	}
	n, err := res.RowsAffected()
	return int(n), err
}

// AppendEvents implements Shared.
func (s *Postgres) AppendEvents(ctx context.Context, id string, seq int64, data []byte, last bool) error {
	if data == nil {
		data = []byte{}
	}
	_, err := s.db.ExecContext(ctx, `WITH ins AS (
		INSERT INTO run_events (run_id, seq, data, last) VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING RETURNING 1)
		SELECT pg_notify('iop_runs', $5) FROM ins`, id, seq, data, last, "e:"+id)
	if err != nil {
		return fmt.Errorf("run %s: event log: %w", id, err)
	}
	return nil
}

// Events implements Shared.
func (s *Postgres) Events(ctx context.Context, id string, after int64, limit int) ([]Event, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT seq, data, last FROM run_events WHERE run_id = $1 AND seq > $2 ORDER BY seq LIMIT $3`, id, after, limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Event
	for rows.Next() {
		var e Event
		if err := rows.Scan(&e.Seq, &e.Data, &e.Last); err != nil {
			return nil, err
		}
		out = append(out, e)
	}
	return out, rows.Err()
}

// RequestCancel implements Shared.
func (s *Postgres) RequestCancel(ctx context.Context, id, reason string) (bool, error) {
	if reason == "" {
		reason = "cancelled"
	}
	rows, err := s.db.QueryContext(ctx, `WITH u AS (
		UPDATE runs SET cancel_requested = $2 WHERE id = $1 AND state IN ('queued', 'running') RETURNING 1)
		SELECT pg_notify('iop_runs', $3) FROM u`, id, reason, "c:"+id)
	if err != nil {
		return false, err
	}
	defer rows.Close()
	live := rows.Next()
	return live, rows.Err()
}

// DeleteEvents implements Shared.
func (s *Postgres) DeleteEvents(ctx context.Context, id string) error {
	_, err := s.db.ExecContext(ctx, `DELETE FROM run_events WHERE run_id = $1`, id)
	return err
}

// DeleteEventsFinishedBefore drops the logs of this edge's runs finished
// before t (an edge that stopped left them; their records stay).
func (s *Postgres) DeleteEventsFinishedBefore(ctx context.Context, t time.Time) error {
	_, err := s.db.ExecContext(ctx, `DELETE FROM run_events WHERE run_id IN (
		SELECT id FROM runs WHERE edge = $1 AND finished_at > 0 AND finished_at < $2)`, s.edge, nanos(t))
	return err
}

// Watch implements Shared.
func (s *Postgres) Watch(id string) (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	s.mu.Lock()
	if s.watchers[id] == nil {
		s.watchers[id] = map[chan struct{}]struct{}{}
	}
	s.watchers[id][ch] = struct{}{}
	s.mu.Unlock()
	return ch, func() {
		s.mu.Lock()
		delete(s.watchers[id], ch)
		if len(s.watchers[id]) == 0 {
			delete(s.watchers, id)
		}
		s.mu.Unlock()
	}
}

// OnCancel implements Shared.
func (s *Postgres) OnCancel(f func(id, reason string)) {
	s.mu.Lock()
	s.onCancel = f
	s.mu.Unlock()
}

// wake wakes the watchers of id, or every watcher for "".
func (s *Postgres) wake(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for wid, set := range s.watchers {
		if id != "" && wid != id {
			continue
		}
		for ch := range set {
			select {
			case ch <- struct{}{}:
			default:
			}
		}
	}
}

// cancelPending calls the cancel callback for every pending cancel
// request of this edge's live runs (the callback ignores a run it does
// not hold).
func (s *Postgres) cancelPending(ctx context.Context) {
	s.mu.Lock()
	f := s.onCancel
	s.mu.Unlock()
	if f == nil {
		return
	}
	rows, err := s.db.QueryContext(ctx, `SELECT id, cancel_requested FROM runs
		WHERE edge = $1 AND cancel_requested <> '' AND state IN ('queued', 'running')`, s.edge)
	if err != nil {
		if ctx.Err() == nil {
			s.log.Warn("reading the runs' cancel requests failed", "err", err)
		}
		return
	}
	var ids, reasons []string
	for rows.Next() {
		var id, reason string
		if rows.Scan(&id, &reason) == nil {
			ids, reasons = append(ids, id), append(reasons, reason)
		}
	}
	rows.Close()
	for i := range ids {
		f(ids[i], reasons[i])
	}
}

// listen keeps a connection LISTENing on iop_runs until ctx ends,
// reconnecting (after a second) when it breaks.
func (s *Postgres) listen(ctx context.Context) {
	defer close(s.done)
	for ctx.Err() == nil {
		if err := s.listenOnce(ctx); err != nil && ctx.Err() == nil {
			s.log.Warn("listening for run notifications failed; reconnecting", "err", err, "retry_in", pgPollInterval)
		}
		select {
		case <-ctx.Done():
		case <-time.After(pgPollInterval):
		}
	}
}

func (s *Postgres) listenOnce(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, s.dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "LISTEN iop_runs"); err != nil {
		return err
	}
	for {
		// Notifications sent while not listening are lost: catch up.
		s.cancelPending(ctx)
		s.wake("")
		for {
			wctx, cancel := context.WithTimeout(ctx, pgPollInterval)
			n, err := conn.WaitForNotification(wctx)
			cancel()
			if ctx.Err() != nil {
				return nil
			}
			if err != nil {
				if wctx.Err() != nil && !conn.PgConn().IsClosed() {
					break // a quiet second: poll
				}
				return err
			}
			kind, id, _ := strings.Cut(n.Payload, ":")
			switch kind {
			case "e":
				s.wake(id)
			case "c":
				s.mu.Lock()
				f := s.onCancel
				s.mu.Unlock()
				if f != nil {
					s.cancelPending(ctx)
				}
				s.wake(id)
			}
		}
	}
}
