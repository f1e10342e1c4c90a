package responses

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// bigRecord is a response with n input items of about 1 KiB each.
func bigRecord(id string, n int) Record {
	rec := Record{ID: id, Owner: "alice", CreatedAt: time.Unix(1700000000, 0), Status: "completed", Response: json.RawMessage(`{"id":"` + id + `"}`)}
	pad := fmt.Sprintf("%01000d", 0)
	for i := range n {
		rec.Input = append(rec.Input, Item{ID: fmt.Sprintf("msg_%s_%d", id, i), JSON: json.RawMessage(`{"type":"message","text":"` + pad + `"}`)})
	}
	return rec
}

// TestRegression_TinySaveAmongBigSavesIsStored: the input that broke it, five
// concurrent big saves (here 500 items of 1 KiB each) and a tiny unrelated
// one, in a database file: every save succeeds (no deadline but the
// test's) and the tiny response is there afterwards, while reads go on
// beside the writes.
func TestRegression_TinySaveAmongBigSavesIsStored(t *testing.T) {
	s, err := OpenSQLite(filepath.Join(t.TempDir(), "edge.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, 32)
	for g := range 5 {
		wg.Go(func() {
			for round := range 1 {
				if err := s.Save(ctx, bigRecord(fmt.Sprintf("resp_big%d_%d", g, round), 500)); err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Go(func() {
		if err := s.Save(ctx, bigRecord("resp_tiny", 1)); err != nil {
			errs <- err
		}
	})
	wg.Go(func() {
		for range 20 {
			if _, err := s.Get(ctx, "alice", "resp_big0_0"); err != nil && !isNotFound(err) {
				errs <- err
			}
		}
	})
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	rec, err := s.Get(ctx, "alice", "resp_tiny")
	if err != nil || len(rec.Input) != 1 {
		t.Fatalf("the tiny response: %+v %v", rec, err)
	}
}

func isNotFound(err error) bool { return err != nil && errors.Is(err, ErrNotFound) }

// TestRegression_WriteTurnsAreFIFO: saves take the write turn in the
// order they asked for it (database/sql gives its free connection to a
// random waiter, which let a small save starve behind big ones).
func TestRegression_WriteTurnsAreFIFO(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &SQLite{wturn: make(chan struct{}, 1)}
		release, err := s.turn(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		var mu sync.Mutex
		var order []int
		var wg sync.WaitGroup
		for i := range 8 {
			wg.Go(func() {
				done, err := s.turn(context.Background())
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				order = append(order, i)
				mu.Unlock()
				done()
			})
			synctest.Wait() // goroutine i waits for its turn before i+1 asks
		}
		release()
		wg.Wait()
		if want := []int{0, 1, 2, 3, 4, 5, 6, 7}; !slices.Equal(order, want) {
			t.Errorf("turns taken in the order %v, want %v", order, want)
		}
	})
}

// hop is response i of a chain: one input and one output item,
// continuing response i-1.
func hop(i int) Record {
	rec := Record{ID: fmt.Sprintf("resp_%d", i), Owner: "alice", CreatedAt: time.Unix(1700000000, 0), Status: "completed",
		Response: json.RawMessage(`{}`), Input: []Item{item(fmt.Sprintf("in%d", i))}, Output: []Item{item(fmt.Sprintf("out%d", i))}}
	if i > 0 {
		rec.Previous = fmt.Sprintf("resp_%d", i-1)
	}
	return rec
}

func itemRows(t *testing.T, s *SQLite) int {
	t.Helper()
	var n int
	if err := s.db.QueryRow(`SELECT COUNT(*) FROM response_items`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func ids(items []Item) []string {
	out := make([]string, 0, len(items))
	for _, it := range items {
		out = append(out, it.ID)
	}
	return out
}

// TestRegression_ChainStoresEachItemOnce: each previous_response_id hop
// re-stored the whole earlier conversation (25,000 items re-written per
// hop, the database 11 MB → 114 MB after a few tiny
// follow-ups). N hops of one input and one output item store 2N item
// rows, and the last one's conversation is all of them in order.
func TestRegression_ChainStoresEachItemOnce(t *testing.T) {
	ctx := context.Background()
	s, err := OpenSQLite(filepath.Join(t.TempDir(), "edge.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const n = 30
	var want []string
	for i := range n {
		if err := s.Save(ctx, hop(i)); err != nil {
			t.Fatal(err)
		}
		want = append(want, fmt.Sprintf("in%d", i), fmt.Sprintf("out%d", i))
	}
	if got := itemRows(t, s); got != 2*n {
		t.Errorf("%d hops stored %d item rows, want %d", n, got, 2*n)
	}
	conv, err := s.Conversation(ctx, "alice", fmt.Sprintf("resp_%d", n-1))
	if err != nil || !slices.Equal(ids(conv), want) {
		t.Fatalf("conversation %v %v\nwant %v", ids(conv), err, want)
	}
	if _, err := s.Conversation(ctx, "bob", fmt.Sprintf("resp_%d", n-1)); !errors.Is(err, ErrNotFound) {
		t.Errorf("another owner's conversation: %v", err)
	}
}

// TestRegression_DeleteInTheMiddleOfAChain: deleting a response that a
// later one continues leaves the later one its whole conversation (as
// OpenAI keeps later responses usable), while the deleted one is not
// found any more (Get, Item, Conversation); its rows go with the last
// response continuing it.
func TestRegression_DeleteInTheMiddleOfAChain(t *testing.T) {
	ctx := context.Background()
	s, err := OpenSQLite(":memory:")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for i := range 3 {
		if err := s.Save(ctx, hop(i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Delete(ctx, "alice", "resp_1"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, "alice", "resp_1"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Get of the deleted one: %v", err)
	}
	if _, err := s.Conversation(ctx, "alice", "resp_1"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Conversation of the deleted one: %v", err)
	}
	if _, err := s.Item(ctx, "alice", "out1"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Item of the deleted one: %v", err)
	}
	if err := s.Delete(ctx, "alice", "resp_1"); !errors.Is(err, ErrNotFound) {
		t.Errorf("deleting it again: %v", err)
	}
	conv, err := s.Conversation(ctx, "alice", "resp_2")
	if want := []string{"in0", "out0", "in1", "out1", "in2", "out2"}; err != nil || !slices.Equal(ids(conv), want) {
		t.Fatalf("the later one's conversation %v %v, want %v", ids(conv), err, want)
	}
	if err := s.Delete(ctx, "alice", "resp_2"); err != nil {
		t.Fatal(err)
	}
	if got := itemRows(t, s); got != 2 {
		t.Errorf("%d item rows after deleting the last two, want resp_0's 2", got)
	}
	conv, err = s.Conversation(ctx, "alice", "resp_0")
	if want := []string{"in0", "out0"}; err != nil || !slices.Equal(ids(conv), want) {
		t.Errorf("the first one's conversation %v %v", ids(conv), err)
	}
}

// TestRegression_ChainOverTheLimitIsRefused: a chain longer than
// MaxChainDepth responses is ErrChainTooLong, one of exactly
// MaxChainDepth is served.
func TestRegression_ChainOverTheLimitIsRefused(t *testing.T) {
	ctx := context.Background()
	s, err := OpenSQLite(":memory:")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for i := range MaxChainDepth + 1 {
		if err := s.Save(ctx, hop(i)); err != nil {
			t.Fatal(err)
		}
	}
	if conv, err := s.Conversation(ctx, "alice", fmt.Sprintf("resp_%d", MaxChainDepth-1)); err != nil || len(conv) != 2*MaxChainDepth {
		t.Errorf("a chain of %d: %d items, %v", MaxChainDepth, len(conv), err)
	}
	if _, err := s.Conversation(ctx, "alice", fmt.Sprintf("resp_%d", MaxChainDepth)); !errors.Is(err, ErrChainTooLong) {
		t.Errorf("a chain of %d: %v", MaxChainDepth+1, err)
	}
}

// TestRegression_OlderDatabaseStillServes: a database made before chains
// were linked (no previous_id nor deleted column; a response stored with
// its whole earlier conversation as history items) opens, and a response
// continuing one of its responses starts from all of that.
func TestRegression_OlderDatabaseStillServes(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "old.db")
	old, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	for _, stmt := range append(slices.Clone(schema),
		`INSERT INTO responses VALUES ('resp_old', 'alice', 1, 'completed', '{}')`,
		`INSERT INTO response_items VALUES ('resp_old', 'history', 0, 'h0', 'alice', '{}'),
			('resp_old', 'input', 0, 'in', 'alice', '{}'), ('resp_old', 'output', 0, 'out', 'alice', '{}')`) {
		if _, err := old.Exec(stmt); err != nil {
			t.Fatal(err)
		}
	}
	old.Close()
	s, err := OpenSQLite(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Save(ctx, Record{ID: "resp_new", Owner: "alice", Status: "completed", Response: json.RawMessage(`{}`),
		Previous: "resp_old", Input: []Item{item("in2")}}); err != nil {
		t.Fatal(err)
	}
	conv, err := s.Conversation(ctx, "alice", "resp_new")
	if want := []string{"h0", "in", "out", "in2"}; err != nil || !slices.Equal(ids(conv), want) {
		t.Errorf("conversation %v %v, want %v", ids(conv), err, want)
	}
}
