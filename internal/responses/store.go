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
	// Previous is the id of the response it continued
	// (previous_response_id), "" for none. The conversation before its
	// input is that response's (SQLite.Conversation walks the chain); it
	// is not stored again with this one.
	Previous string
	// History is conversation items stored with the response itself, in
	// order: only a response saved by an edge before chains were linked
	// (those stored the whole conversation before their input); nil for
	// the others.
	History []Item
	// Input and Output are its input and output items, in order.
	Input, Output []Item
}

// Limits of a conversation's chain (Conversation): a response continued
// through more than MaxChainDepth responses, or whose conversation holds
// more than MaxChainItems items, is refused with ErrChainTooLong.
const (
	MaxChainDepth = 1000
	MaxChainItems = 100_000
)

// ErrChainTooLong is a conversation over MaxChainDepth responses or
// MaxChainItems items.
var ErrChainTooLong = fmt.Errorf("the conversation is longer than %d responses or %d items", MaxChainDepth, MaxChainItems)

// Item is one stored item: its id and its JSON object.
type Item struct {
	ID   string
	JSON json.RawMessage
}

// Conversation is rec's own items: its History (only of a response
// stored before chains were linked), Input and Output, in order. The
// whole conversation a response continuing rec starts from is
// SQLite.Conversation's.
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

// columns are the responses columns added after the first schema, added
// to a database made before them: previous_id, the response continued
// ("" for none); deleted, set on a response deleted while a later one
// continues it (its row and items stay for that one's conversation, but
// it is not found any more).
var columns = []struct{ name, decl string }{
	{"previous_id", `TEXT NOT NULL DEFAULT ''`},
	{"deleted", `INTEGER NOT NULL DEFAULT 0`},
}

// migrate adds the missing columns and their index.
func migrate(db *sql.DB) error {
	have := map[string]bool{}
	rows, err := db.Query(`SELECT name FROM pragma_table_info('responses')`)
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
	for _, c := range columns {
		if !have[c.name] {
			if _, err := db.Exec(`ALTER TABLE responses ADD COLUMN ` + c.name + ` ` + c.decl); err != nil {
				return err
			}
		}
	}
	_, err = db.Exec(`CREATE INDEX IF NOT EXISTS responses_previous ON responses (previous_id)`)
	return err
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
	if err := migrate(db); err != nil {
		db.Close()
		return nil, fmt.Errorf("response store %s: %w", path, err)
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
// too), in one transaction. It writes rec's own items only (its History,
// Input and Output), never those of the responses it continues, so a
// conversation of N responses is O(N) rows, not O(N²).
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
	if _, err = tx.ExecContext(ctx, `INSERT OR REPLACE INTO responses (id, owner, created_at, status, response, previous_id)
		VALUES (?, ?, ?, ?, ?, ?)`, rec.ID, rec.Owner, rec.CreatedAt.UnixNano(), rec.Status, string(rec.Response), rec.Previous); err != nil {
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
	res, err := s.db.ExecContext(ctx, `UPDATE responses SET status = ?, response = ? WHERE id = ? AND owner = ? AND deleted = 0`,
		status, string(response), id, owner)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("%w: %q", ErrNotFound, id)
	}
	return nil
}

// Get returns owner's stored response id with its own items (not those
// of the responses it continues: Conversation). Errors: ErrNotFound (also
// for another owner's response, or a deleted one).
func (s *SQLite) Get(ctx context.Context, owner, id string) (rec Record, err error) {
	tx, err := s.rd.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return Record{}, err
	}
	defer tx.Rollback() //nolint:errcheck // read only
	rec = Record{ID: id, Owner: owner}
	var created int64
	var response string
	err = tx.QueryRowContext(ctx, `SELECT created_at, status, response, previous_id FROM responses
		WHERE id = ? AND owner = ? AND deleted = 0`, id, owner).Scan(&created, &rec.Status, &response, &rec.Previous)
	if errors.Is(err, sql.ErrNoRows) {
		return Record{}, fmt.Errorf("%w: %q", ErrNotFound, id)
	}
	if err != nil {
		return Record{}, err
	}
	rec.CreatedAt, rec.Response = time.Unix(0, created), json.RawMessage(response)
	if err := items(ctx, tx, &rec); err != nil {
		return Record{}, err
	}
	return rec, nil
}

// items reads rec.ID's own items into rec.
func items(ctx context.Context, tx *sql.Tx, rec *Record) error {
	rows, err := tx.QueryContext(ctx, `SELECT kind, item_id, item FROM response_items WHERE response_id = ?
		ORDER BY kind, seq`, rec.ID)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var kind, itemID, item string
		if err := rows.Scan(&kind, &itemID, &item); err != nil {
			return err
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
	return rows.Err()
}

// Conversation returns the items a response continuing owner's stored
// response id starts from: those of every response of its chain (id, the
// one it continued, and so on), oldest first, each one's History, Input
// and Output in order. A response deleted while a later one continued it
// still gives its items here (Delete). Errors: ErrNotFound for id (as
// Get), ErrChainTooLong past MaxChainDepth responses or MaxChainItems
// items.
func (s *SQLite) Conversation(ctx context.Context, owner, id string) ([]Item, error) {
	tx, err := s.rd.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return nil, err
	}
	defer tx.Rollback() //nolint:errcheck // read only
	var chain []Record
	n := 0
	for cur, first := id, true; cur != ""; first = false {
		if len(chain) == MaxChainDepth {
			return nil, ErrChainTooLong
		}
		rec := Record{ID: cur}
		var deleted bool
		err := tx.QueryRowContext(ctx, `SELECT previous_id, deleted FROM responses WHERE id = ? AND owner = ?`,
			cur, owner).Scan(&rec.Previous, &deleted)
		if errors.Is(err, sql.ErrNoRows) || first && deleted {
			if first {
				return nil, fmt.Errorf("%w: %q", ErrNotFound, id)
			}
			break // an older edge's broken chain: what is left
		}
		if err != nil {
			return nil, err
		}
		if err := items(ctx, tx, &rec); err != nil {
			return nil, err
		}
		if n += len(rec.History) + len(rec.Input) + len(rec.Output); n > MaxChainItems {
			return nil, ErrChainTooLong
		}
		chain = append(chain, rec)
		cur = rec.Previous
	}
	out := make([]Item, 0, n)
	for i := len(chain) - 1; i >= 0; i-- {
		out = append(out, chain[i].Conversation()...)
	}
	return out, nil
}

// Delete removes owner's stored response id. Its row and items stay, the
// response marked deleted (not found any more but by Conversation), while
// a later response continues it, so that one keeps its conversation (as
// OpenAI keeps later responses usable); they go with the last response
// continuing them. Errors: ErrNotFound.
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
	var prev string
	err = tx.QueryRowContext(ctx, `SELECT previous_id FROM responses WHERE id = ? AND owner = ? AND deleted = 0`,
		id, owner).Scan(&prev)
	if errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("%w: %q", ErrNotFound, id)
	}
	if err != nil {
		return err
	}
	// id, then each deleted response it continued that nothing else
	// continues any more.
	for cur, first := id, true; cur != ""; first = false {
		var children int
		if err = tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM responses WHERE previous_id = ?`, cur).Scan(&children); err != nil {
			return err
		}
		if children > 0 {
			if first {
				if _, err = tx.ExecContext(ctx, `UPDATE responses SET deleted = 1 WHERE id = ?`, cur); err != nil {
					return err
				}
			}
			break
		}
		if _, err = tx.ExecContext(ctx, `DELETE FROM responses WHERE id = ?`, cur); err != nil {
			return err
		}
		if _, err = tx.ExecContext(ctx, `DELETE FROM response_items WHERE response_id = ?`, cur); err != nil {
			return err
		}
		if cur = prev; cur == "" {
			break
		}
		var deleted bool
		err = tx.QueryRowContext(ctx, `SELECT previous_id, deleted FROM responses WHERE id = ?`, cur).Scan(&prev, &deleted)
		if errors.Is(err, sql.ErrNoRows) || err == nil && !deleted {
			err = nil
			break
		}
		if err != nil {
			return err
		}
	}
	return tx.Commit()
}

// Item returns the latest stored input or output item of owner with
// itemID (an item_reference's target). Errors: ErrNotFound.
func (s *SQLite) Item(ctx context.Context, owner, itemID string) (json.RawMessage, error) {
	var item string
	err := s.rd.QueryRowContext(ctx, `SELECT item FROM response_items WHERE owner = ? AND item_id = ? AND kind != ?
		AND response_id IN (SELECT id FROM responses WHERE deleted = 0)
		ORDER BY rowid DESC LIMIT 1`, owner, itemID, kindHistory).Scan(&item)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("%w: item %q", ErrNotFound, itemID)
	}
	if err != nil {
		return nil, err
	}
	return json.RawMessage(item), nil
}
