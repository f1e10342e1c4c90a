package runs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"iop/internal/ledger"
	"iop/internal/testenv"
)

func openPostgres(t *testing.T, dsn, edge string) *Postgres {
	t.Helper()
	s, err := OpenPostgres(context.Background(), dsn, edge, nil)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestPostgresStoreRoundTripAndLists: a record saved by one edge reads back
// whole through another edge's store of the same database; lists filter and
// page as SQLite's do.
func TestPostgresStoreRoundTripAndLists(t *testing.T) {
	dsn := testenv.Postgres(t)
	a, b := openPostgres(t, dsn, "edge-a"), openPostgres(t, dsn, "edge-b")
	defer a.Close()
	defer b.Close()
	ctx := context.Background()
	at := time.Unix(1_700_000_000, 123_456_789)
	want := Record{
		ID: "run_1", State: StateComplete, Model: "llama3", SessionID: "s1", Background: true,
		Metadata:  map[string]string{"team": "search"},
		CreatedAt: at, StartedAt: at.Add(time.Millisecond), FirstTokenAt: at.Add(2 * time.Millisecond), FinishedAt: at.Add(time.Second),
		NodeID: "gpu-1", ProviderID: "ollama-1", ServedModel: "llama3:8b", Path: "normalized",
		QueueReason: "queued", QueueWait: 42 * time.Millisecond, KeyName: "team-a",
		PromptTokens: 3, CompletionTokens: 7, Output: "héllo wörld", OutputTruncated: true, FinishReason: "stop", Status: 200,
		Outcome: "completed",
	}
	if err := a.Save(ctx, want); err != nil {
		t.Fatal(err)
	}
	got, err := b.Get(ctx, "run_1")
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got) != fmt.Sprint(want) || !got.CreatedAt.Equal(want.CreatedAt) {
		t.Fatalf("through the other edge:\n got %+v\nwant %+v", got, want)
	}
	if _, err := b.Get(ctx, "run_nope"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("unknown id: %v, want ErrNotFound", err)
	}

	base := time.Unix(1_800_000_000, 0)
	for i := range 7 {
		r := Record{ID: fmt.Sprintf("lst_%d", i), State: StateComplete, Model: "a", CreatedAt: base.Add(time.Duration(i) * time.Second)}
		if i%2 == 1 {
			r.State, r.Model, r.SessionID = StateError, "b", "s"
		}
		if err := []*Postgres{a, b}[i%2].Save(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	var pages []string
	f := Filter{Limit: 3, Model: "a"}
	for {
		recs, more, err := b.List(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		page := ""
		for _, r := range recs {
			page += r.ID[4:]
			if r.Output != "" {
				t.Errorf("listed %s with its output", r.ID)
			}
		}
		pages = append(pages, page)
		if !more {
			break
		}
		f.After = recs[len(recs)-1].ID
	}
	if fmt.Sprint(pages) != "[642 0]" {
		t.Fatalf("pages %v, want model a's runs newest first in threes", pages)
	}
	if recs, _, err := a.List(ctx, Filter{SessionID: "s", State: StateError}); err != nil || len(recs) != 3 {
		t.Fatalf("session s, state error: %d records, %v; want 3", len(recs), err)
	}
	if _, _, err := a.List(ctx, Filter{After: "run_missing"}); !errors.Is(err, ErrNotFound) {
		t.Fatalf("unknown cursor: %v", err)
	}
}

// TestRegression_PostgresInterruptSparesOtherEdges: an edge that starts
// again ends as interrupted only the runs it left unfinished; those of
// another edge sharing the database, which is running them, stay as they
// are.
func TestRegression_PostgresInterruptSparesOtherEdges(t *testing.T) {
	dsn := testenv.Postgres(t)
	ctx := context.Background()
	a, b := openPostgres(t, dsn, "edge-a"), openPostgres(t, dsn, "edge-b")
	defer b.Close()
	for _, x := range []struct {
		s  *Postgres
		id string
	}{{a, "run_a"}, {b, "run_b"}} {
		if err := x.s.Save(ctx, Record{ID: x.id, State: StateRunning, Model: "m", CreatedAt: time.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	a.Close()
	m, err := NewManager(ctx, Config{Shared: openPostgres(t, dsn, "edge-a")})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if rec, _ := m.Get(ctx, "run_a"); rec.State != StateError || rec.Outcome != OutcomeEdgeStopped {
		t.Errorf("edge a's own run: %s %q, want error edge_stopped", rec.State, rec.Outcome)
	}
	if rec, _ := m.Get(ctx, "run_b"); rec.State != StateRunning {
		t.Errorf("edge b's run: %s, want running (edge b holds it)", rec.State)
	}
}

// TestSharedRunFollowedAndCancelledFromAnotherEdge: a run executing on
// edge A is followed from edge B from its first event, live, and
// cancelled through B: A's execution sees the cancel, the run ends
// cancelled, and B's reader gets exactly A's log and its end.
func TestSharedRunFollowedAndCancelledFromAnotherEdge(t *testing.T) {
	dsn := testenv.Postgres(t)
	ctx := context.Background()
	ma, err := NewManager(ctx, Config{Shared: openPostgres(t, dsn, "edge-a")})
	if err != nil {
		t.Fatal(err)
	}
	defer ma.Close()
	mb, err := NewManager(ctx, Config{Shared: openPostgres(t, dsn, "edge-b")})
	if err != nil {
		t.Fatal(err)
	}
	defer mb.Close()
	if !mb.Shared() {
		t.Fatal("a Postgres store is not shared")
	}
	first, more := make(chan struct{}), make(chan struct{})
	cancelled := make(chan error, 1)
	run, err := ma.Start(ctx, Record{ID: "run_x", Model: "m"}, func(ctx context.Context, r *Run) {
		r.Dispatched(Record{NodeID: "n", ProviderID: "p"})
		r.Append([]byte("data: one\n\n"), "one")
		close(first)
		<-more
		r.Append([]byte("data: two\n\n"), "two")
		<-ctx.Done()
		cancelled <- context.Cause(ctx)
		r.Append([]byte("data: {\"error\":\"cancelled\"}\n\n"), "")
		r.Finish(Outcome{State: StateCancelled, Error: context.Cause(ctx).Error()})
	})
	if err != nil {
		t.Fatal(err)
	}
	<-first
	var got bytes.Buffer
	chunks := make(chan []byte, 16)
	followed := make(chan error, 1)
	go func() {
		_, err := mb.Follow(ctx, "run_x", func(p []byte) error {
			chunks <- bytes.Clone(p)
			return nil
		})
		close(chunks)
		followed <- err
	}()
	deadline := time.After(time.Minute)
	read := func(want string) {
		t.Helper()
		for !bytes.Contains(got.Bytes(), []byte(want)) {
			select {
			case p := <-chunks:
				got.Write(p)
			case <-deadline:
				t.Fatalf("B read %q, waiting for %q", got.String(), want)
			}
		}
	}
	read("data: one\n\n")
	close(more)
	read("data: two\n\n") // live: written after B began to follow

	rec, err := mb.CancelRemote(ctx, "run_x", "cancelled by DELETE through edge b")
	if err != nil {
		t.Fatal(err)
	}
	if rec.State != StateCancelled || rec.Error != "cancelled by DELETE through edge b" {
		t.Errorf("record after CancelRemote: %s %q, want cancelled with B's reason", rec.State, rec.Error)
	}
	if cause := <-cancelled; cause == nil || cause.Error() != "cancelled by DELETE through edge b" {
		t.Errorf("A's execution cancelled with %v", cause)
	}
	for p := range chunks {
		got.Write(p)
	}
	if err := <-followed; err != nil {
		t.Fatalf("Follow: %v", err)
	}
	want, _, _ := run.Next(ctx, 0)
	if got.String() != string(want) {
		t.Errorf("B's copy of the log:\n%q\nA's:\n%q", got.String(), want)
	}
	if local, _ := mb.Follow(ctx, "run_x", func([]byte) error { return nil }); !local {
		t.Error("a late reader on B found no log")
	}
}

// TestSharedFollowOfARunWithoutLog: a finished run whose log is gone (its
// edge dropped it after its retention) is not followed (the caller
// replays its record); one no edge knows is ErrNotFound.
func TestSharedFollowOfARunWithoutLog(t *testing.T) {
	dsn := testenv.Postgres(t)
	ctx := context.Background()
	s := openPostgres(t, dsn, "edge-a")
	m, err := NewManager(ctx, Config{Shared: s})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if err := s.Save(ctx, Record{ID: "run_old", State: StateComplete, Model: "m", CreatedAt: time.Now(), FinishedAt: time.Now(), Output: "hi"}); err != nil {
		t.Fatal(err)
	}
	if followed, err := m.Follow(ctx, "run_old", func([]byte) error { return nil }); followed || err != nil {
		t.Errorf("Follow of a finished run without a log: %v %v, want false, nil", followed, err)
	}
	if _, err := m.Follow(ctx, "run_nope", func([]byte) error { return nil }); !errors.Is(err, ErrNotFound) {
		t.Errorf("Follow of an unknown run: %v, want ErrNotFound", err)
	}
}

// TestRegression_EdgesStartingAtOnceCreateTheTables: three edges started
// at the same moment on a fresh database (a deploy tool's way): one
// crashed with "duplicate key value violates unique constraint
// pg_type_typname_nsp_index" (SQLSTATE 23505), its CREATE TABLE IF NOT
// EXISTS racing another's. The schema is created under an advisory lock,
// so every store opens; the ledger's tables in the same database too.
func TestRegression_EdgesStartingAtOnceCreateTheTables(t *testing.T) {
	dsn := testenv.Postgres(t)
	const edges = 6
	start := make(chan struct{})
	errs := make(chan error, 2*edges)
	for i := range edges {
		go func() {
			<-start
			s, err := OpenPostgres(context.Background(), dsn, fmt.Sprintf("edge-%d", i), nil)
			if err == nil {
				s.Close()
			}
			errs <- err
		}()
		go func() {
			<-start
			l, err := ledger.OpenPostgres(context.Background(), dsn)
			if err == nil {
				l.Close()
			}
			errs <- err
		}()
	}
	close(start)
	for range 2 * edges {
		if err := <-errs; err != nil {
			t.Errorf("a store of an edge starting at once: %v", err)
		}
	}
}
