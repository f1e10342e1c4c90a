package runs

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func openFile(t *testing.T, path string) *SQLite {
	t.Helper()
	s, err := OpenSQLite(path)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestStoreRoundTripAndReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "runs.db")
	s := openFile(t, path)
	ctx := context.Background()
	at := time.Unix(1_700_000_000, 123_456_789)
	want := Record{
		ID: "run_1", State: StateComplete, Model: "llama3", SessionID: "s1", Background: true,
		Metadata:  map[string]string{"team": "search"},
		CreatedAt: at, StartedAt: at.Add(time.Millisecond), FirstTokenAt: at.Add(2 * time.Millisecond), FinishedAt: at.Add(time.Second),
		NodeID: "gpu-1", ProviderID: "ollama-1", ServedModel: "llama3:8b", Path: "normalized",
		QueueReason: "queued", QueueWait: 42 * time.Millisecond,
		PromptTokens: 3, CompletionTokens: 7, Output: "héllo wörld", FinishReason: "stop", Status: 200,
		Outcome: "completed",
	}
	if err := s.Save(ctx, want); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openFile(t, path)
	defer s.Close()
	got, err := s.Get(ctx, "run_1")
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got) != fmt.Sprint(want) || !got.CreatedAt.Equal(want.CreatedAt) {
		t.Fatalf("after reopening:\n got %+v\nwant %+v", got, want)
	}
	if _, err := s.Get(ctx, "run_nope"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("unknown id: %v, want ErrNotFound", err)
	}
}

func TestStoreListFiltersAndPages(t *testing.T) {
	s := openFile(t, ":memory:")
	defer s.Close()
	ctx := context.Background()
	base := time.Unix(1_700_000_000, 0)
	for i := range 7 {
		r := Record{ID: fmt.Sprintf("run_%d", i), State: StateComplete, Model: "a", CreatedAt: base.Add(time.Duration(i) * time.Second)}
		if i%2 == 1 {
			r.State, r.Model, r.SessionID = StateError, "b", "s"
		}
		if err := s.Save(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	ids := func(recs []Record) string {
		out := ""
		for _, r := range recs {
			out += r.ID[4:]
		}
		return out
	}
	var pages []string
	f := Filter{Limit: 3}
	for {
		recs, more, err := s.List(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		pages = append(pages, ids(recs))
		if !more {
			break
		}
		f.After = recs[len(recs)-1].ID
	}
	if fmt.Sprint(pages) != "[654 321 0]" {
		t.Fatalf("pages %v, want newest first in threes", pages)
	}
	for _, tc := range []struct {
		f    Filter
		want string
	}{
		{Filter{State: StateError}, "531"},
		{Filter{Model: "a"}, "6420"},
		{Filter{SessionID: "s", Limit: 2}, "53"},
		{Filter{Model: "a", After: "run_4"}, "20"},
	} {
		recs, _, err := s.List(ctx, tc.f)
		if err != nil {
			t.Fatal(err)
		}
		if got := ids(recs); got != tc.want {
			t.Errorf("List(%+v) = %s, want %s", tc.f, got, tc.want)
		}
	}
	if _, _, err := s.List(ctx, Filter{After: "run_missing"}); !errors.Is(err, ErrNotFound) {
		t.Fatalf("unknown cursor: %v", err)
	}
}

// TestNewManagerMarksRunsLeftInFlight is the crash case: records a previous
// process left queued or running end error "edge restarted"; finished ones
// stay as they were.
func TestNewManagerMarksRunsLeftInFlight(t *testing.T) {
	path := filepath.Join(t.TempDir(), "runs.db")
	s := openFile(t, path)
	ctx := context.Background()
	for id, st := range map[string]State{"run_q": StateQueued, "run_r": StateRunning, "run_c": StateComplete, "run_x": StateCancelled} {
		if err := s.Save(ctx, Record{ID: id, State: st, Model: "m", CreatedAt: time.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	s.Close()

	m, err := NewManager(ctx, Config{Store: openFile(t, path)})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	for id, want := range map[string]State{"run_q": StateError, "run_r": StateError, "run_c": StateComplete, "run_x": StateCancelled} {
		rec, err := m.Get(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if rec.State != want {
			t.Errorf("%s: state %s, want %s", id, rec.State, want)
		}
		if want == StateError && (rec.Error != "edge restarted" || rec.FinishedAt.IsZero() || rec.Outcome != "edge_stopped") {
			t.Errorf("%s: error %q finished %v outcome %q, want edge restarted, a time, edge_stopped", id, rec.Error, rec.FinishedAt, rec.Outcome)
		}
		if want != StateError && rec.Outcome != "" {
			t.Errorf("%s: outcome %q of a finished run changed", id, rec.Outcome)
		}
	}
}

func newManager(t *testing.T) *Manager {
	t.Helper()
	m, err := NewManager(context.Background(), Config{Store: openFile(t, ":memory:")})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestLateReaderReplaysFromTheStart checks the event log: a reader that
// starts after events were appended gets them all, then the live ones, and
// sees the end; the record is saved at each step.
func TestLateReaderReplaysFromTheStart(t *testing.T) {
	m := newManager(t)
	defer m.Close()
	ctx := context.Background()
	step := make(chan string)
	run, err := m.Start(ctx, Record{ID: "run_a", Model: "m", SessionID: "s"}, func(ctx context.Context, r *Run) {
		r.Dispatched(Record{NodeID: "n", ProviderID: "p", Path: "tunnel", QueueReason: "immediate"})
		for ev := range step {
			r.Append([]byte(ev), ev[:1])
		}
		r.Finish(Outcome{State: StateComplete, FinishReason: "stop", PromptTokens: 1, CompletionTokens: 2})
	})
	if err != nil {
		t.Fatal(err)
	}
	step <- "a1"
	step <- "b2"
	p, done, err := run.Next(ctx, 0)
	for len(p) < 4 && err == nil { // the second append may not have landed yet
		var more []byte
		more, done, err = run.Next(ctx, len(p))
		p = append(p, more...)
	}
	if err != nil || string(p) != "a1b2" || done {
		t.Fatalf("late read %q done=%v err=%v", p, done, err)
	}
	got := make(chan string, 1)
	go func() {
		q, _, _ := run.Next(ctx, 4)
		got <- string(q)
	}()
	step <- "c3"
	if q := <-got; q != "c3" {
		t.Fatalf("live read %q", q)
	}
	close(step)
	rec, err := run.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if rec.State != StateComplete || rec.Output != "abc" || rec.NodeID != "n" || rec.FirstTokenAt.IsZero() {
		t.Fatalf("record %+v", rec)
	}
	if _, done, _ := run.Next(ctx, 6); !done {
		t.Fatal("the log does not end")
	}
	stored, err := m.store.Get(ctx, "run_a")
	if err != nil || stored.State != StateComplete || stored.Output != "abc" || stored.CompletionTokens != 2 {
		t.Fatalf("stored %+v, %v", stored, err)
	}
	if n, p := m.Affinity("s"); n != "n" || p != "p" {
		t.Fatalf("affinity %s/%s", n, p)
	}
}

// TestCancelAndClose: Cancel ends the execution's context with the reason;
// Close ends the live ones with ErrStopping and waits for them.
func TestCancelAndClose(t *testing.T) {
	m := newManager(t)
	ctx := context.Background()
	exec := func(ctx context.Context, r *Run) {
		<-ctx.Done()
		r.Finish(Outcome{State: StateCancelled, Error: context.Cause(ctx).Error()})
	}
	a, err := m.Start(ctx, Record{ID: "run_a", Model: "m"}, exec)
	if err != nil {
		t.Fatal(err)
	}
	b, err := m.Start(ctx, Record{ID: "run_b", Model: "m"}, exec)
	if err != nil {
		t.Fatal(err)
	}
	a.Cancel("by test")
	if rec, _ := a.Wait(ctx); rec.State != StateCancelled || rec.Error != "by test" {
		t.Fatalf("cancelled run %+v", rec)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if rec := b.Record(); rec.Error != ErrStopping.Error() {
		t.Fatalf("run live at Close: %+v", rec)
	}
	if _, err := m.Start(ctx, Record{ID: "run_c"}, exec); err == nil {
		t.Fatal("Start after Close succeeded")
	}
}

// TestExecutionWithoutOutcomeEndsError: an exec that returns without
// Finish leaves no run hanging.
func TestExecutionWithoutOutcomeEndsError(t *testing.T) {
	m := newManager(t)
	defer m.Close()
	run, err := m.Start(context.Background(), Record{ID: "run_a", Model: "m"}, func(context.Context, *Run) {})
	if err != nil {
		t.Fatal(err)
	}
	if rec, _ := run.Wait(context.Background()); rec.State != StateError {
		t.Fatalf("record %+v", rec)
	}
}

// TestRegression_OpensADatabaseWithoutKeyName: a database made before runs
// had key_name (this morning's iop.db files) opens, gains the column and
// keeps its records.
func TestRegression_OpensADatabaseWithoutKeyName(t *testing.T) {
	path := filepath.Join(t.TempDir(), "old.db")
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	old := strings.Replace(schema, ",\n\tkey_name          TEXT NOT NULL DEFAULT ''", "", 1)
	if old == schema {
		t.Fatal("the schema has no key_name column to leave out")
	}
	if _, err := db.Exec(old); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`INSERT INTO runs (id, state, model, created_at) VALUES ('run_old', 'complete', 'm', 1)`); err != nil {
		t.Fatal(err)
	}
	db.Close()
	s := openFile(t, path)
	defer s.Close()
	ctx := context.Background()
	if rec, err := s.Get(ctx, "run_old"); err != nil || rec.State != StateComplete || rec.KeyName != "" {
		t.Fatalf("old record: %+v %v", rec, err)
	}
	if err := s.Save(ctx, Record{ID: "run_new", State: StateQueued, Model: "m", KeyName: "alice", CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if recs, _, err := s.List(ctx, Filter{KeyName: "alice"}); err != nil || len(recs) != 1 || recs[0].ID != "run_new" {
		t.Fatalf("by key: %+v %v", recs, err)
	}
}

// TestOpensADatabaseWithoutOutcome: a database made before records kept
// their request's outcome opens, gains the column (empty for its old
// records) and keeps outcomes from then on.
func TestOpensADatabaseWithoutOutcome(t *testing.T) {
	path := filepath.Join(t.TempDir(), "old.db")
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	old := strings.Replace(schema, ",\n\toutcome           TEXT NOT NULL DEFAULT ''", "", 1)
	if old == schema {
		t.Fatal("the schema has no outcome column to leave out")
	}
	if _, err := db.Exec(old); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`INSERT INTO runs (id, state, model, created_at) VALUES ('run_old', 'complete', 'm', 1)`); err != nil {
		t.Fatal(err)
	}
	db.Close()
	s := openFile(t, path)
	defer s.Close()
	ctx := context.Background()
	if rec, err := s.Get(ctx, "run_old"); err != nil || rec.Outcome != "" {
		t.Fatalf("old record: %+v %v", rec, err)
	}
	if err := s.Save(ctx, Record{ID: "run_new", State: StateError, Model: "m", CreatedAt: time.Now(), Outcome: "upstream_error"}); err != nil {
		t.Fatal(err)
	}
	if rec, err := s.Get(ctx, "run_new"); err != nil || rec.Outcome != "upstream_error" {
		t.Fatalf("new record: %+v %v", rec, err)
	}
}

// TestRegression_SecondOpenerIsRefused: a second edge on the same database
// file marked the first one's live runs "edge restarted". Now the second
// opener gets ErrInUse until the first closes.
func TestRegression_SecondOpenerIsRefused(t *testing.T) {
	path := filepath.Join(t.TempDir(), "runs.db")
	first := openFile(t, path)
	if _, err := OpenSQLite(path); !errors.Is(err, ErrInUse) {
		t.Fatalf("second open: %v, want ErrInUse", err)
	}
	first.Close()
	second := openFile(t, path)
	second.Close()
}

// TestRegression_OutputIsCapped: a run keeps at most MaxOutputBytes of
// output, saying so (a 50 MB answer took the edge to 900 MB). The output
// is built in a strings.Builder: appending to a string, each chunk copied
// all before it (a 256k-token run spent 81% of its 52 s there).
func TestRegression_OutputIsCapped(t *testing.T) {
	m := newManager(t)
	defer m.Close()
	chunk := strings.Repeat("x", 1000)
	run, err := m.Start(context.Background(), Record{ID: "run_big", Model: "m"}, func(ctx context.Context, r *Run) {
		for range MaxOutputBytes/len(chunk) + 10 {
			r.Append([]byte("data: {}\n\n"), chunk)
		}
		r.Finish(Outcome{State: StateComplete})
	})
	if err != nil {
		t.Fatal(err)
	}
	rec, _ := run.Wait(context.Background())
	if len(rec.Output) > MaxOutputBytes || len(rec.Output) < MaxOutputBytes-len(chunk) || !rec.OutputTruncated {
		t.Fatalf("output %d bytes, truncated %v", len(rec.Output), rec.OutputTruncated)
	}
	stored, err := m.store.Get(context.Background(), "run_big")
	if err != nil || !stored.OutputTruncated || len(stored.Output) != len(rec.Output) {
		t.Fatalf("stored: %d bytes, truncated %v, %v", len(stored.Output), stored.OutputTruncated, err)
	}
}

// TestNewManagerNeedsOneStore: a Manager persists through exactly one of
// Config.Store (this edge's) and Config.Shared (several edges').
func TestNewManagerNeedsOneStore(t *testing.T) {
	t.Parallel()
	if _, err := NewManager(context.Background(), Config{}); err == nil {
		t.Error("no store: no error")
	}
	s := openFile(t, ":memory:")
	defer s.Close()
	if _, err := NewManager(context.Background(), Config{Store: s, Shared: sharedStub{s}}); err == nil {
		t.Error("both a store and a shared store: no error")
	}
}

// sharedStub is a Shared that is only ever passed, never used.
type sharedStub struct{ *SQLite }

func (sharedStub) AppendEvents(context.Context, string, int64, []byte, bool) error { return nil }
func (sharedStub) Events(context.Context, string, int64, int) ([]Event, error)     { return nil, nil }
func (sharedStub) RequestCancel(context.Context, string, string) (bool, error)     { return false, nil }
func (sharedStub) Watch(string) (<-chan struct{}, func())                          { return nil, func() {} }
func (sharedStub) OnCancel(func(id, reason string))                                {}
func (sharedStub) DeleteEvents(context.Context, string) error                      { return nil }
func (sharedStub) DeleteEventsFinishedBefore(context.Context, time.Time) error     { return nil }
