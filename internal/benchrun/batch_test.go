package benchrun

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	iopprocess "iop/internal/process"
)

// syncBuffer is a bytes.Buffer safe for the edge's logger and the test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestBatchJobThroughTheEdge runs the bench's batch client against a real
// edge (iop dev on its simulator): the input uploaded, the batch created,
// polled to completed, its output downloaded and checked, and its lines
// found in the edge's request log at the batch priority, each holding a
// slot.
func TestBatchJobThroughTheEdge(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var log syncBuffer
	d, err := iopprocess.Start(ctx, iopprocess.Config{Mode: iopprocess.ModeDev, Dev: iopprocess.DevConfig{Listen: "127.0.0.1:0", NodeListen: "127.0.0.1:0", ForceSim: true,
		SimCapacity: 4, SimTokensPerSecond: 200, SimTTFT: 5 * time.Millisecond}},
		iopprocess.Deps{Logger: slog.New(slog.NewJSONHandler(&log, &slog.HandlerOptions{Level: slog.LevelInfo}))})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		cancel()
		if err := d.Wait(); err != nil {
			t.Errorf("iop dev: %v", err)
		}
	}()
	const lines = 25
	from := time.Now()
	job := &batchJob{url: "http://" + d.HTTPAddr}
	if err := job.submit(ctx, batchInput(d.Dev.Model, lines, 3)); err != nil {
		t.Fatal(err)
	}
	var b batchObject
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if b, err = job.get(ctx); err != nil {
			t.Fatal(err)
		}
		if terminal(b.Status) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("batch still %s after 60s: %+v", b.Status, b.RequestCounts)
		}
	}
	if b.Status != "completed" || b.RequestCounts.Completed != lines {
		t.Fatalf("batch %s with counts %+v, want completed with %d", b.Status, b.RequestCounts, lines)
	}
	out, err := job.checkOutput(ctx, b, lines)
	if err != nil {
		t.Fatal(err)
	}
	if !out.Complete(lines) {
		t.Fatalf("output %+v: want each of %d lines once, answered 200", out, lines)
	}
	// The edge logs each line when it ends, before the runner records it.
	reqs, err := readRequests(strings.NewReader(log.String()))
	if err != nil {
		t.Fatal(err)
	}
	to := time.Now()
	done, failed := reqs.batchEnded(from, to)
	if done != lines || failed != 0 {
		t.Fatalf("the edge's log has %d batch lines done and %d failed, want %d and 0", done, failed, lines)
	}
	if n := len(reqs.interactive(from, to)); n != 0 {
		t.Fatalf("%d interactive requests in the log, want none", n)
	}
	if all, batch := reqs.slots(from, to); batch <= 0 || all != batch {
		t.Fatalf("slots from the log: all %v, batch %v; want batch > 0 and all of them", all, batch)
	}
}

// TestBatchOutputCountsEachCustomID checks the output check: a line
// missing, one twice, one failed and an error file line are each counted.
func TestBatchOutputCountsEachCustomID(t *testing.T) {
	seen := map[string]int{}
	output := `{"id":"r0","custom_id":"line-0","response":{"status_code":200,"body":{}},"error":null}
{"id":"r1","custom_id":"line-1","response":{"status_code":200,"body":{}},"error":null}
{"id":"r1b","custom_id":"line-1","response":{"status_code":200,"body":{}},"error":null}
{"id":"r2","custom_id":"line-2","response":{"status_code":500,"body":{}},"error":null}
`
	n, ok, err := countResults([]byte(output), seen)
	if err != nil || n != 4 || ok != 3 {
		t.Fatalf("countResults = %d, %d, %v; want 4, 3, nil", n, ok, err)
	}
	errs := `{"id":"r4","custom_id":"line-4","response":null,"error":{"code":"x","message":"y"}}` + "\n"
	if n, ok, err := countResults([]byte(errs), seen); err != nil || n != 1 || ok != 0 {
		t.Fatalf("countResults of the error file = %d, %d, %v; want 1, 0, nil", n, ok, err)
	}
	if seen["line-1"] != 2 || seen["line-3"] != 0 || seen["line-4"] != 1 {
		t.Fatalf("seen %v", seen)
	}
	if (BatchOutput{Lines: 5, OK: 5}).Complete(5) != true || (BatchOutput{Lines: 5, OK: 5, Duplicated: 1}).Complete(5) {
		t.Fatal("Complete: want true for 5 of 5 once, false with a duplicate")
	}
	if _, _, err := countResults([]byte("not json\n"), map[string]int{}); err == nil {
		t.Fatal("countResults of a line that is not JSON: want an error")
	}
}

// TestBatchSlotsFromTheLog checks the log's slot arithmetic: a request
// holds its slot from its arrival plus its queue wait to its end, cut to
// the window.
func TestBatchSlotsFromTheLog(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(d time.Duration) string { return t0.Add(d).Format(time.RFC3339Nano) }
	log := strings.Join([]string{
		// interactive: arrives at 1s, waits 1s, ends at 4s: holds [2s, 4s).
		`{"time":"` + at(4*time.Second) + `","msg":"request","status":200,"duration":3000000000,"queue_wait":1000000000,"priority":"standard"}`,
		// batch: arrives at -2s, no wait, ends at 6s: holds [0, 6s) of the window.
		`{"time":"` + at(6*time.Second) + `","msg":"request","status":200,"duration":8000000000,"priority":"batch"}`,
		// batch, failed: holds [8s, 9s).
		`{"time":"` + at(9*time.Second) + `","msg":"request","status":502,"duration":1000000000,"queue_wait":0,"priority":"batch"}`,
		// interactive, after the window.
		`{"time":"` + at(12*time.Second) + `","msg":"request","status":200,"duration":1000000000,"priority":"standard"}`,
		`{"time":"` + at(5*time.Second) + `","msg":"something else","status":200,"duration":1000000000}`,
		`not json`,
	}, "\n")
	reqs, err := readRequests(strings.NewReader(log))
	if err != nil {
		t.Fatal(err)
	}
	from, to := t0, t0.Add(10*time.Second)
	all, batch := reqs.slots(from, to)
	if all != 0.9 || batch != 0.7 {
		t.Fatalf("slots = %v, %v; want 0.9 (9 slot-seconds over 10 s), 0.7", all, batch)
	}
	if n := len(reqs.interactive(from, to)); n != 1 {
		t.Fatalf("%d interactive requests arrived in the window, want 1", n)
	}
	if done, failed := reqs.batchEnded(from, to); done != 1 || failed != 1 {
		t.Fatalf("batch lines ended: %d done, %d failed; want 1, 1", done, failed)
	}
}

// TestWaitListeningWaitsForTheListener checks the wait the bench does
// before it starts the node: it returns only once the address accepts
// connections, and fails when nothing listens within its timeout.
func TestWaitListeningWaitsForTheListener(t *testing.T) {
	addr, err := freeAddr()
	if err != nil {
		t.Fatal(err)
	}
	if err := waitListening(context.Background(), addr, 100*time.Millisecond, nil); err == nil {
		t.Fatal("waitListening with nothing listening: want an error")
	}
	listening := make(chan net.Listener, 1)
	go func() {
		time.Sleep(200 * time.Millisecond)
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			t.Error(err)
			ln = nil
		}
		listening <- ln
	}()
	if err := waitListening(context.Background(), addr, 30*time.Second, nil); err != nil {
		t.Fatal(err)
	}
	ln := <-listening
	if ln == nil {
		t.Fatal("the port was taken: retry")
	}
	ln.Close()
}
