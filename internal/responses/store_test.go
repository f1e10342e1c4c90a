package responses

import (
	"context"
	"encoding/json"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"iop/internal/runs"
)

func item(id string) Item {
	return Item{ID: id, JSON: json.RawMessage(`{"type":"message","id":"` + id + `"}`)}
}

// TestStore: a saved response reads back with its items in order, only for
// its owner; Save replaces one of the same id (its items too); Item finds
// the owner's input and output items, not history; Delete removes it.
func TestStore(t *testing.T) {
	ctx := context.Background()
	s, err := OpenSQLite(":memory:")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	rec := Record{ID: "resp_1", Owner: "alice", CreatedAt: time.Unix(100, 5), Status: "completed",
		Response: json.RawMessage(`{"id":"resp_1"}`), History: []Item{item("h1")}, Input: []Item{item("i1"), item("i2")}, Output: []Item{item("o1")}}
	if err := s.Save(ctx, rec); err != nil {
		t.Fatal(err)
	}
	got, err := s.Get(ctx, "alice", "resp_1")
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != "completed" || !got.CreatedAt.Equal(rec.CreatedAt) || string(got.Response) != `{"id":"resp_1"}` ||
		len(got.History) != 1 || len(got.Input) != 2 || got.Input[1].ID != "i2" || len(got.Output) != 1 {
		t.Fatalf("got %+v", got)
	}
	if conv := got.Conversation(); len(conv) != 4 || conv[0].ID != "h1" || conv[3].ID != "o1" {
		t.Errorf("conversation %+v", conv)
	}
	for _, op := range []func() error{
		func() error { _, err := s.Get(ctx, "bob", "resp_1"); return err },
		func() error { _, err := s.Item(ctx, "bob", "o1"); return err },
		func() error { return s.Delete(ctx, "bob", "resp_1") },
		func() error { return s.SetStatus(ctx, "bob", "resp_1", "failed", nil) },
		func() error { _, err := s.Item(ctx, "alice", "h1"); return err },
	} {
		if err := op(); !errors.Is(err, ErrNotFound) {
			t.Errorf("another owner's (or a history item): %v, want ErrNotFound", err)
		}
	}
	if doc, err := s.Item(ctx, "alice", "o1"); err != nil || string(doc) != string(item("o1").JSON) {
		t.Errorf("Item: %s %v", doc, err)
	}
	rec.Status, rec.Output = "failed", nil
	if err := s.Save(ctx, rec); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.Get(ctx, "alice", "resp_1"); got.Status != "failed" || len(got.Output) != 0 {
		t.Errorf("after replace %+v", got)
	}
	if err := s.Delete(ctx, "alice", "resp_1"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, "alice", "resp_1"); !errors.Is(err, ErrNotFound) {
		t.Errorf("after delete: %v", err)
	}
	if _, err := s.Item(ctx, "alice", "i1"); !errors.Is(err, ErrNotFound) {
		t.Errorf("an item of a deleted response: %v", err)
	}
}

// TestStoreSharesTheRunDatabase: the responses tables live in the edge's
// run database file beside the run store (which holds the file's lock)
// and survive a reopen.
func TestStoreSharesTheRunDatabase(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "iop.db")
	runStore, err := runs.OpenSQLite(path)
	if err != nil {
		t.Fatal(err)
	}
	defer runStore.Close()
	s, err := OpenSQLite(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Save(ctx, Record{ID: "resp_1", Status: "completed", CreatedAt: time.Unix(1, 0), Response: json.RawMessage(`{}`)}); err != nil {
		t.Fatal(err)
	}
	if err := runStore.Save(ctx, runs.Record{ID: "run_1", State: runs.StateComplete, Model: "m", CreatedAt: time.Unix(1, 0)}); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s, err = OpenSQLite(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Get(ctx, "", "resp_1"); err != nil {
		t.Errorf("after reopen: %v", err)
	}
	if _, err := runStore.Get(ctx, "run_1"); err != nil {
		t.Errorf("run store: %v", err)
	}
}
