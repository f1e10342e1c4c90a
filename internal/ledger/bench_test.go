package ledger

import (
	"context"
	"fmt"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// BenchmarkLedgerPaced records entries one every 100 µs (10,000/s, the
// pace of a busy edge) into a SQLite file in WAL mode, as the edge's
// default ledger, and reports the process's CPU time per entry (user +
// system, from getrusage: the writer's transactions included) and the
// entries per transaction; linger=0 is the writer without the wait for a
// batch to fill (every transaction takes what is already waiting).
func BenchmarkLedgerPaced(b *testing.B) {
	for _, linger := range []time.Duration{0, defaultLinger} {
		b.Run("linger="+linger.String(), func(b *testing.B) {
			s, err := OpenSQLite(filepath.Join(b.TempDir(), "ledger.db"))
			if err != nil {
				b.Fatal(err)
			}
			cs := &countingStore{Store: s}
			l := New(cs, nil)
			l.linger = linger
			defer l.Close()
			e := Entry{Time: day1, Key: "k", Model: "m", RunID: "run_0123456789abcdef", NodeID: "n", ProviderID: "p",
				ServedModel: "m", PromptTokens: 10, CompletionTokens: 16, Duration: time.Millisecond, Outcome: OutcomeCompleted}
			before := cpuTime()
			b.ResetTimer()
			// Paced at 10,000 entries/s: the rate is what is measured.
			pace := time.NewTicker(100 * time.Microsecond)
			for range b.N {
				l.Record(e)
				<-pace.C
			}
			pace.Stop()
			l.Flush()
			b.StopTimer()
			b.ReportMetric(float64((cpuTime()-before).Microseconds())/float64(b.N), "cpu-µs/entry")
			b.ReportMetric(float64(b.N)/float64(cs.txs), "entries/tx")
		})
	}
}

// countingStore counts Insert calls (transactions).
type countingStore struct {
	Store
	txs int // only the writer goroutine touches it
}

func (c *countingStore) Insert(ctx context.Context, entries []Entry) error {
	c.txs++
	return c.Store.Insert(ctx, entries)
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkSQLiteInsert measures Store.Insert of a batch of 256 entries (a
// full batch of the writer) into a WAL SQLite file; one op is one entry.
func BenchmarkSQLiteInsert(b *testing.B) {
	s, err := OpenSQLite(filepath.Join(b.TempDir(), "ledger.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	batch := make([]Entry, batchEntries)
	for i := range batch {
		batch[i] = Entry{Time: day1, Key: "k", Model: "m", RunID: "run_0123456789abcdef", NodeID: "n", ProviderID: "p",
			ServedModel: "m", PromptTokens: 10, CompletionTokens: 16, Duration: time.Millisecond, Outcome: OutcomeCompleted}
	}
	b.ReportAllocs()
	ctx := context.Background()
	for i := 0; i < b.N; i += len(batch) {
		if err := s.Insert(ctx, batch[:min(len(batch), b.N-i)]); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSQLiteInsertBatch measures Store.Insert of batches of the sizes
// the writer sees under load (a few entries at c=1, tens to a couple of
// hundred at c=32: BenchmarkLedgerPaced's entries/tx) into a WAL SQLite
// file; one op is one entry.
func BenchmarkSQLiteInsertBatch(b *testing.B) {
	for _, size := range []int{1, 10, 100} {
		b.Run(fmt.Sprintf("entries=%d", size), func(b *testing.B) {
			s, err := OpenSQLite(filepath.Join(b.TempDir(), "ledger.db"))
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			batch := make([]Entry, size)
			for i := range batch {
				batch[i] = Entry{Time: day1, Key: "k", Model: "m", RunID: "run_0123456789abcdef", NodeID: "n", ProviderID: "p",
					ServedModel: "m", PromptTokens: 10, CompletionTokens: 16, Duration: time.Millisecond, Outcome: OutcomeCompleted}
			}
			b.ReportAllocs()
			ctx := context.Background()
			for i := 0; i < b.N; i += len(batch) {
				if err := s.Insert(ctx, batch[:min(len(batch), b.N-i)]); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
