package responses

import (
	"context"
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

// TestRegression_TinySaveAmongBigSavesIsStored: the tester's input, five
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
