package responses

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"time"

	_ "modernc.org/sqlite" // the "sqlite" database/sql driver
)

// ErrNotFound is returned for a response id (or item id) the owner has
// no stored response (item) of.
var ErrNotFound = errors.New("no such stored response")

// Record is one stored response.
type Record struct {
	// ID is the response's id ("resp_…").
	ID string
	// Owner is the name of the API key that created it, "" for an open
	// API.
	Owner string
	// CreatedAt is when it was created.
	CreatedAt time.Time
	// Status is the response's status (queued, in_progress, completed,
	// incomplete, failed, cancelled).
	Status string
	// Response is the response object, as GET /v1/responses/{id}
	// answers it.
	Response json.RawMessage
	// History is the conversation before this response's input: the
	// items of the response it continued (its History, Input and Output),
	// in order; nil for none.
	History []Item
	// Input and Output are its input and output items, in order.
	Input, Output []Item
}

// Item is one stored item: its id and its JSON object.
type Item struct {
	ID   string
	JSON json.RawMessage
}

// Conversation is the items a response continuing rec starts from: its
// History, Input and Output, in order.
func (rec Record) Conversation() []Item {
	out := make([]Item, 0, len(rec.History)+len(rec.Input)+len(rec.Output))
	out = append(out, rec.History...)
	out = append(out, rec.Input...)
	return append(out, rec.Output...)
}

// Item kinds in response_items.
const (
	kindHistory = "history"
	kindInput   = "input"
	kindOutput  = "output"
)

var schema = []string{
	`CREATE TABLE IF NOT EXISTS responses (
	id         TEXT PRIMARY KEY,
	owner      TEXT NOT NULL,
	created_at INTEGER NOT NULL,
	status     TEXT NOT NULL,
	response   TEXT NOT NULL
)`,
	`CREATE TABLE IF NOT EXISTS response_items (
	response_id TEXT NOT NULL,
	kind        TEXT NOT NULL,
	seq         INTEGER NOT NULL,
	item_id     TEXT NOT NULL,
	owner       TEXT NOT NULL,
	item        TEXT NOT NULL,
	PRIMARY KEY (response_id, kind, seq)
)`,
	`CREATE INDEX IF NOT EXISTS response_items_item ON response_items (owner, item_id)`,
}

// SQLite is a Store in an SQLite database file.
//
// Writes go through one connection (db) and take a FIFO turn first
// (wturn), so concurrent saves are served in the order they came and a
// small save never starves behind bigger ones (database/sql hands its
// free connection to a random waiter); each write transaction begins
// IMMEDIATE (it takes SQLite's write lock at once, so a busy database
// is waited for by the busy timeout rather than failing at the first
// write). Reads use their own pool (rd): in WAL mode SQLite's readers
// do not block the writer nor each other ("Write-Ahead Logging",
// sqlite.org/wal.html). An in-memory database lives in its one
// connection, so there rd is db.
type SQLite struct {
	db    *sql.DB
	rd    *sql.DB
	wturn chan struct{}
}

// readConns is the number of connections of a file database's read pool.
const readConns = 4

// turn waits for the write turn (FIFO: goroutines blocked sending on a
// channel are served in order) or ctx's end; the returned func gives it
// back.
func (s *SQLite) turn(ctx context.Context) (func(), error) {
	select {
	case s.wturn <- struct{}{}:
		return func() { <-s.wturn }, nil
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
}

// OpenSQLite opens (creating if needed) the responses tables in the
// SQLite database at path, the edge's run database (their own tables
// there; WAL journaling and a busy timeout let it share the file with the
// run store and the ledger), or a private in-memory database for
// ":memory:".
func OpenSQLite(path string) (*SQLite, error) {
	memory := path == ":memory:" || path == ""
	dsn := "file:" + url.PathEscape(path) + "?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)&_txlock=immediate"
	if memory {
		dsn = "file::memory:?_txlock=immediate"
	}
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, fmt.Errorf("response store %s: %w", path, err)
	}
	db.SetMaxOpenConns(1) // the one writer; an in-memory database lives in its one connection
	for _, stmt := range schema {
		if _, err := db.Exec(stmt); err != nil {
			db.Close()
			return nil, fmt.Errorf("response store %s: %w", path, err)
		}
	}
	s := &SQLite{db: db, rd: db, wturn: make(chan struct{}, 1)}
	if !memory {
		rd, err := sql.Open("sqlite", "file:"+url.PathEscape(path)+"?_pragma=busy_timeout(10000)&_pragma=query_only(1)")
		if err != nil {
			db.Close()
			return nil, fmt.Errorf("response store %s: %w", path, err)
		}
		rd.SetMaxOpenConns(readConns)
		s.rd = rd
	}
	return s, nil
}

// Close closes the database.
func (s *SQLite) Close() error {
	err := s.db.Close()
	if s.rd != s.db {
		err = errors.Join(err, s.rd.Close())
	}
	return err
}

// Save inserts rec, or replaces the stored response of rec.ID (its items
// too), in one transaction.
func (s *SQLite) Save(ctx context.Context, rec Record) (err error) {
	done, err := s.turn(ctx)
	if err != nil {
		return fmt.Errorf("saving response %s: %w", rec.ID, err)
	}
	defer done()
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("saving response %s: %w", rec.ID, err)
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback()
			err = fmt.Errorf("saving response %s: %w", rec.ID, err)
		}
	}()
	if _, err = tx.ExecContext(ctx, `INSERT OR REPLACE INTO responses (id, owner, created_at, status, response)
		VALUES (?, ?, ?, ?, ?)`, rec.ID, rec.Owner, rec.CreatedAt.UnixNano(), rec.Status, string(rec.Response)); err != nil {
		return err
	}
	if _, err = tx.ExecContext(ctx, `DELETE FROM response_items WHERE response_id = ?`, rec.ID); err != nil {
		return err
	}
	for _, group := range []struct {
		kind  string
		items []Item
	}{{kindHistory, rec.History}, {kindInput, rec.Input}, {kindOutput, rec.Output}} {
		for i, it := range group.items {
			if _, err = tx.ExecContext(ctx, `INSERT INTO response_items (response_id, kind, seq, item_id, owner, item)
				VALUES (?, ?, ?, ?, ?, ?)`, rec.ID, group.kind, i, it.ID, rec.Owner, string(it.JSON)); err != nil {
				return err
			}
		}
	}
	return tx.Commit()
}

// SetStatus changes the status and object of owner's stored response id,
// without touching its items. Errors: ErrNotFound.
func (s *SQLite) SetStatus(ctx context.Context, owner, id, status string, response json.RawMessage) error {
	done, err := s.turn(ctx)
	if err != nil {
		return err
	}
	defer done()
	res, err := s.db.ExecContext(ctx, `UPDATE responses SET status = ?, response = ? WHERE id = ? AND owner = ?`,
		status, string(response), id, owner)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("%w: %q", ErrNotFound, id)
	}
	return nil
}

// Get returns owner's stored response id with its items. Errors:
// ErrNotFound (also for another owner's response).
func (s *SQLite) Get(ctx context.Context, owner, id string) (Record, error) {
	rec := Record{ID: id, Owner: owner}
	var created int64
	var response string
	err := s.rd.QueryRowContext(ctx, `SELECT created_at, status, response FROM responses WHERE id = ? AND owner = ?`,
		id, owner).Scan(&created, &rec.Status, &response)
	if errors.Is(err, sql.ErrNoRows) {
		return Record{}, fmt.Errorf("%w: %q", ErrNotFound, id)
	}
	if err != nil {
		return Record{}, err
	}
	rec.CreatedAt, rec.Response = time.Unix(0, created), json.RawMessage(response)
	rows, err := s.rd.QueryContext(ctx, `SELECT kind, item_id, item FROM response_items WHERE response_id = ?
		ORDER BY kind, seq`, id)
	if err != nil {
		return Record{}, err
	}
	defer rows.Close()
	for rows.Next() {
		var kind, itemID, item string
		if err := rows.Scan(&kind, &itemID, &item); err != nil {
			return Record{}, err
		}
		it := Item{ID: itemID, JSON: json.RawMessage(item)}
		switch kind {
		case kindHistory:
			rec.History = append(rec.History, it)
		case kindInput:
			rec.Input = append(rec.Input, it)
		case kindOutput:
			rec.Output = append(rec.Output, it)
		}
	}
	return rec, rows.Err()
}

// Delete removes owner's stored response id and its items. Errors:
// ErrNotFound.
func (s *SQLite) Delete(ctx context.Context, owner, id string) (err error) {
	done, err := s.turn(ctx)
	if err != nil {
		return err
	}
	defer done()
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback()
		}
	}()
	res, err := tx.ExecContext(ctx, `DELETE FROM responses WHERE id = ? AND owner = ?`, id, owner)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("%w: %q", ErrNotFound, id)
	}
	if _, err = tx.ExecContext(ctx, `DELETE FROM response_items WHERE response_id = ?`, id); err != nil {
		return err
	}
	return tx.Commit()
}

// Item returns the latest stored input or output item of owner with
// itemID (an item_reference's target). Errors: ErrNotFound.
func (s *SQLite) Item(ctx context.Context, owner, itemID string) (json.RawMessage, error) {
	var item string
	err := s.rd.QueryRowContext(ctx, `SELECT item FROM response_items WHERE owner = ? AND item_id = ? AND kind != ?
		ORDER BY rowid DESC LIMIT 1`, owner, itemID, kindHistory).Scan(&item)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("%w: item %q", ErrNotFound, itemID)
	}
	if err != nil {
		return nil, err
	}
	return json.RawMessage(item), nil
}
