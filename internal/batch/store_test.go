package batch

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"iop/internal/testenv"
)

// database is one scenario's database: open opens a Store on it (again
// after a Close: a restarted edge), peer a second store on it beside
// the first (another edge; SQLite's one edge shares its store), dir the
// directory of file bytes when the store keeps none itself.
type database struct {
	open func(t *testing.T) Store
	peer func(t *testing.T, first Store) Store
	dir  string
}

// scenarios are the behaviours every Store gives a Service; TestSQLite
// and TestPostgres run each on a fresh database of theirs.
var scenarios = []struct {
	name string
	run  func(t *testing.T, db database)
}{
	{"ExpiresWithPartialResults", testExpiresWithPartialResults},
	{"MessageBatchExpiredAndCanceledResults", testMessageBatchExpiredAndCanceledResults},
	{"ResumesAfterClose", testResumesAfterClose},
	{"FinishLineRecordsOnce", testFinishLineRecordsOnce},
	{"FilesStreamAndPage", testFilesStreamAndPage},
	{"LeaseFencesTheEarlierRunner", testLeaseFencesTheEarlierRunner},
	{"CancelThroughAnotherService", testCancelThroughAnotherService},
	{"TakeoverDiscardsALateFirstResult", testTakeoverDiscardsALateFirstResult},
	{"DeleteOnlyAnEndedMessageBatch", testDeleteOnlyAnEndedMessageBatch},
}

// TestSQLite runs the scenarios on SQLite files, file bytes in a
// directory.
func TestSQLite(t *testing.T) {
	t.Parallel()
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			t.Parallel()
			path := filepath.Join(t.TempDir(), "iop.db")
			sc.run(t, database{
				open: func(t *testing.T) Store { return openStore(t, path) },
				peer: func(t *testing.T, first Store) Store { return nopClose{first} },
				dir:  t.TempDir(),
			})
		})
	}
}

// TestPostgres runs the scenarios on one real PostgreSQL server, a
// database each, file bytes in the database.
func TestPostgres(t *testing.T) {
	t.Parallel()
	dsn := testenv.Postgres(t)
	admin, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	for i, sc := range scenarios {
		name := fmt.Sprintf("s%d", i)
		if _, err := admin.Exec("CREATE DATABASE " + name); err != nil {
			t.Fatal(err)
		}
		dbDSN := strings.Replace(dsn, "dbname=postgres", "dbname="+name, 1)
		open := func(t *testing.T) Store {
			t.Helper()
			st, err := OpenPostgres(context.Background(), dbDSN)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { st.Close() })
			return st
		}
		t.Run(sc.name, func(t *testing.T) {
			t.Parallel()
			sc.run(t, database{open: open, peer: func(t *testing.T, _ Store) Store { return open(t) }})
		})
	}
}

// nopClose is a store shared by two services, closed by its opener.
type nopClose struct{ Store }

func (nopClose) Close() error { return nil }

// testFilesStreamAndPage: a file of several chunks reads back whole;
// lists page newest first; a deleted file has no content.
func testFilesStreamAndPage(t *testing.T, db database) {
	st := db.open(t)
	defer st.Close()
	s := newService(t, st, db.dir, Config{})
	ctx := context.Background()
	big := bytes.Repeat([]byte("0123456789abcdef"), (chunkBytes*5/2)/16+3) // two and a half chunks
	var ids []string
	for i, content := range [][]byte{big, nil, []byte("small\n")} {
		f, err := s.UploadFile(ctx, "alice", "batch", fmt.Sprintf("f%d", i), bytes.NewReader(content))
		if err != nil || f.Bytes != int64(len(content)) {
			t.Fatalf("upload %d: %+v %v", i, f, err)
		}
		_, rc, err := s.Content(ctx, "alice", f.ID)
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(rc)
		rc.Close()
		if err != nil || !bytes.Equal(got, content) {
			t.Fatalf("content %d: %d bytes, %v; want %d", i, len(got), err, len(content))
		}
		ids = append(ids, f.ID)
	}
	if _, _, err := s.Content(ctx, "bob", ids[0]); !errors.Is(err, ErrNotFound) {
		t.Fatalf("another owner's content: %v", err)
	}
	page, more, err := s.Files(ctx, "alice", "batch", "", 2)
	if err != nil || !more || len(page) != 2 || page[0].ID != ids[2] || page[1].ID != ids[1] {
		t.Fatalf("first page: %+v %v %v", page, more, err)
	}
	page, more, err = s.Files(ctx, "alice", "", ids[1], 2)
	if err != nil || more || len(page) != 1 || page[0].ID != ids[0] {
		t.Fatalf("second page: %+v %v %v", page, more, err)
	}
	if err := s.DeleteFile(ctx, "alice", ids[0]); err != nil {
		t.Fatal(err)
	}
	if _, err := s.contents.Open(ctx, ids[0]); !errors.Is(err, ErrNotFound) {
		t.Fatalf("deleted file's bytes: %v", err)
	}
	if err := s.DeleteFile(ctx, "alice", ids[0]); !errors.Is(err, ErrNotFound) {
		t.Fatalf("second delete: %v", err)
	}
}

// testLeaseFencesTheEarlierRunner: one runner holds a batch's lease at a
// time; after a release (or a lapse) another claims it with a higher
// epoch, and the earlier runner's writes are refused: its status
// (ErrLeaseLost), its line results (false), its renewal (false).
func testLeaseFencesTheEarlierRunner(t *testing.T, db database) {
	st := db.open(t)
	defer st.Close()
	other := db.peer(t, st)
	defer other.Close()
	ctx := context.Background()
	if err := st.CreateBatch(ctx, Batch{ID: "b", Kind: KindOpenAI, Status: StatusInProgress}); err != nil {
		t.Fatal(err)
	}
	if err := st.AddLines(ctx, "b", []Line{{No: 1, CustomID: "x", Body: []byte(`{}`)}, {No: 2, CustomID: "y", Body: []byte(`{}`)}}); err != nil {
		t.Fatal(err)
	}
	a, ok, err := st.Claim(ctx, "b", "a", time.Minute)
	if err != nil || !ok || a.Epoch < 1 || a.Runner != "a" {
		t.Fatalf("a's claim: %+v %v %v", a, ok, err)
	}
	if _, ok, err := other.Claim(ctx, "b", "b", time.Minute); err != nil || ok {
		t.Fatalf("b's claim of a live lease: %v %v", ok, err)
	}
	if ok, err := st.FinishLine(ctx, "b", a.Epoch, 1, LineDone, []byte(`"a1"`)); err != nil || !ok {
		t.Fatalf("a's line 1: %v %v", ok, err)
	}
	active, err := other.ActiveBatches(ctx)
	if err != nil || len(active) != 1 || !active[0].Leased || active[0].Runner != "a" {
		t.Fatalf("active: %+v %v", active, err)
	}
	if err := st.Release(ctx, "b", a.Epoch); err != nil {
		t.Fatal(err)
	}
	b, ok, err := other.Claim(ctx, "b", "b", 200*time.Millisecond)
	if err != nil || !ok || b.Epoch <= a.Epoch {
		t.Fatalf("b's claim after the release: %+v %v %v", b, ok, err)
	}
	if ok, err := st.FinishLine(ctx, "b", a.Epoch, 2, LineDone, []byte(`"a2"`)); err != nil || ok {
		t.Fatalf("a's late line 2: %v %v, want refused", ok, err)
	}
	a.Status = StatusFinalizing
	if err := st.UpdateBatch(ctx, a); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("a's status: %v, want ErrLeaseLost", err)
	}
	if _, ok, err := st.Renew(ctx, "b", a.Epoch, time.Minute); err != nil || ok {
		t.Fatalf("a's renewal: %v %v", ok, err)
	}
	if ok, err := other.FinishLine(ctx, "b", b.Epoch, 2, LineDone, []byte(`"b2"`)); err != nil || !ok {
		t.Fatalf("b's line 2: %v %v", ok, err)
	}
	// b's lease lapses unrenewed: a may claim again, higher still.
	var again Batch
	testenv.Eventually(t, "b's lease to lapse", func() bool {
		again, ok, err = st.Claim(ctx, "b", "a", time.Minute)
		return err == nil && ok
	})
	if again.Epoch <= b.Epoch {
		t.Fatalf("claim after the lapse: epoch %d after %d", again.Epoch, b.Epoch)
	}
	var got []string
	_ = st.Results(ctx, "b", func(l Line) error { got = append(got, string(l.Result)); return nil })
	stored, _ := st.GetBatch(ctx, "", "b")
	if strings.Join(got, ",") != `"a1","b2"` || stored.Completed != 2 || stored.Status != StatusInProgress {
		t.Fatalf("results %v, batch %+v", got, stored)
	}
}

// testCancelThroughAnotherService: a cancel asked of a service that does
// not run the batch reaches the one that does (at its lease renewal):
// its lines in flight end and the batch ends cancelled.
func testCancelThroughAnotherService(t *testing.T, db database) {
	st := db.open(t)
	defer st.Close()
	peer := db.peer(t, st)
	defer peer.Close()
	cfg := Config{LeaseTTL: 300 * time.Millisecond, Concurrency: 4}
	runner := newService(t, st, db.dir, cfg)
	defer runner.Close()
	if err := runner.Start(context.Background(), &executor{}); err != nil {
		t.Fatal(err)
	}
	b := create(t, runner, input("ok-1", "hold-1", "hold-2"))
	asker := newService(t, peer, db.dir, cfg)
	defer asker.Close()
	if err := asker.Start(context.Background(), &executor{}); err != nil {
		t.Fatal(err)
	}
	waitStatus(t, asker, KindOpenAI, b.ID, StatusInProgress)
	got, err := asker.Cancel(context.Background(), "", KindOpenAI, b.ID)
	if err != nil || got.Status != StatusCancelling {
		t.Fatalf("cancel: %+v %v", got, err)
	}
	done := waitStatus(t, asker, KindOpenAI, b.ID, StatusCancelled)
	if done.CancellingAt.IsZero() || done.CancelledAt.IsZero() || done.Total != 3 {
		t.Fatalf("cancelled: %+v", done)
	}
	if _, err := asker.Cancel(context.Background(), "", KindOpenAI, b.ID); !errors.Is(err, ErrState) {
		t.Fatalf("cancel of a cancelled batch: %v", err)
	}
}

// gatedExecutor answers "slow" lines only when gate closes, whatever
// their context (a late answer), the rest at once; each body names from.
type gatedExecutor struct {
	from    string
	gate    chan struct{}
	mu      sync.Mutex
	started int // slow lines begun
}

func (g *gatedExecutor) Execute(ctx context.Context, owner, path string, body []byte) (Response, error) {
	id := string(body[len(`{"id":"`) : len(body)-2])
	if strings.HasPrefix(id, "slow") && g.gate != nil {
		g.mu.Lock()
		g.started++
		g.mu.Unlock()
		<-g.gate
	}
	return Response{Status: 200, Body: []byte(`{"id":"` + id + `","from":"` + g.from + `"}`)}, nil
}

// frozenStore is a runner's store seen from a frozen process: while
// frozen, its lease calls wait (no renewal reaches the database). It
// records what FinishLine answered.
type frozenStore struct {
	Store
	frozen   atomic.Bool
	thaw     chan struct{}
	mu       sync.Mutex
	finishes []bool
}

func (f *frozenStore) Renew(ctx context.Context, id string, epoch int64, ttl time.Duration) (string, bool, error) {
	if f.frozen.Load() {
		<-f.thaw
	}
	return f.Store.Renew(ctx, id, epoch, ttl)
}

func (f *frozenStore) FinishLine(ctx context.Context, id string, epoch int64, no int, state string, result []byte) (bool, error) {
	ok, err := f.Store.FinishLine(ctx, id, epoch, no, state, result)
	f.mu.Lock()
	f.finishes = append(f.finishes, ok)
	f.mu.Unlock()
	return ok, err
}

func (f *frozenStore) Close() error { return nil }

// testTakeoverDiscardsALateFirstResult: the runner of a batch freezes
// with two lines in flight; its lease lapses and another service claims
// the batch, runs those two lines again and completes it. When the
// frozen runner thaws, the first answers of the two lines reach the
// store late and are discarded: every custom_id has exactly one result,
// the second runner's.
func testTakeoverDiscardsALateFirstResult(t *testing.T, db database) {
	st := db.open(t)
	defer st.Close()
	frozen := &frozenStore{Store: st, thaw: make(chan struct{})}
	cfg := Config{LeaseTTL: 300 * time.Millisecond, Concurrency: 8}
	first := newService(t, frozen, db.dir, cfg)
	slow := &gatedExecutor{from: "first", gate: make(chan struct{})}
	if err := first.Start(context.Background(), slow); err != nil {
		t.Fatal(err)
	}
	b := create(t, first, input("ok-1", "slow-1", "ok-2", "slow-2", "ok-3"))
	testenv.Eventually(t, "the first runner's ok lines done, its slow ones begun", func() bool {
		got, _ := first.Batch(context.Background(), "", KindOpenAI, b.ID)
		slow.mu.Lock()
		defer slow.mu.Unlock()
		return got.Completed == 3 && slow.started == 2
	})
	frozen.frozen.Store(true)

	peer := db.peer(t, st)
	defer peer.Close()
	second := newService(t, peer, db.dir, cfg)
	defer second.Close()
	if err := second.Start(context.Background(), &gatedExecutor{from: "second"}); err != nil {
		t.Fatal(err)
	}
	done := waitStatus(t, second, KindOpenAI, b.ID, StatusCompleted)

	close(slow.gate) // the first runner's answers arrive, late
	testenv.Eventually(t, "the late answers to reach the store", func() bool {
		frozen.mu.Lock()
		defer frozen.mu.Unlock()
		return len(frozen.finishes) == 5
	})
	close(frozen.thaw)
	first.Close()
	frozen.mu.Lock()
	late := frozen.finishes[3:]
	frozen.mu.Unlock()
	if late[0] || late[1] {
		t.Fatalf("the first runner's late results were recorded: %v", late)
	}
	out := lines(t, second, done.OutputFileID)
	if done.Completed != 5 || len(out) != 5 {
		t.Fatalf("completed %+v, output %v", done, out)
	}
	for _, id := range []string{"slow-1", "slow-2"} {
		if from := out[id]["response"].(map[string]any)["body"].(map[string]any)["from"]; from != "second" {
			t.Fatalf("%s answered by %v, want the second runner", id, from)
		}
	}
}

// testDeleteOnlyAnEndedMessageBatch: a message batch still processing is
// not deleted (ErrState); once it ended (here cancelled), its record, its
// lines and its results file go, and a second delete finds nothing.
func testDeleteOnlyAnEndedMessageBatch(t *testing.T, db database) {
	st := db.open(t)
	defer st.Close()
	s := newService(t, st, db.dir, Config{})
	defer s.Close()
	if err := s.Start(context.Background(), &executor{}); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	b, err := s.CreateMessageBatch(ctx, "", []MessageRequest{
		{CustomID: "a", Params: []byte(`{"id":"ok-1"}`)}, {CustomID: "b", Params: []byte(`{"id":"hold-1"}`)}})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteMessageBatch(ctx, "", b.ID); !errors.Is(err, ErrState) {
		t.Fatalf("delete while processing: %v, want ErrState", err)
	}
	if _, err := s.Cancel(ctx, "", KindAnthropic, b.ID); err != nil {
		t.Fatal(err)
	}
	ended := waitStatus(t, s, KindAnthropic, b.ID, StatusCancelled)
	if ended.ResultsFileID == "" {
		t.Fatalf("ended batch %+v has no results file", ended)
	}
	if err := s.DeleteMessageBatch(ctx, "", b.ID); err != nil {
		t.Fatalf("delete ended: %v", err)
	}
	if _, err := s.Batch(ctx, "", KindAnthropic, b.ID); !errors.Is(err, ErrNotFound) {
		t.Errorf("batch after delete: %v, want ErrNotFound", err)
	}
	if _, _, err := s.Content(ctx, "", ended.ResultsFileID); !errors.Is(err, ErrNotFound) {
		t.Errorf("results file after delete: %v, want ErrNotFound", err)
	}
	lines := 0
	if err := st.Results(ctx, b.ID, func(Line) error { lines++; return nil }); err != nil || lines != 0 {
		t.Errorf("lines after delete: %d %v, want none", lines, err)
	}
	if err := s.DeleteMessageBatch(ctx, "", b.ID); !errors.Is(err, ErrNotFound) {
		t.Errorf("second delete: %v, want ErrNotFound", err)
	}
}
