package benchrun

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"iop/internal/loadgen"
)

// memory measures the edge's resident memory idle and with cfg.Waiters
// requests queued behind one in flight on the capacity-1 hanging provider,
// then cancels them all and waits until the queue is empty.
func (s *setup) memory(ctx context.Context) (Memory, error) {
	n := s.cfg.Waiters
	m := Memory{Waiters: n}
	var err error
	if m.IdleRSS, err = s.edge.rss(); err != nil {
		return m, err
	}
	if m.Idle, err = s.runtimeMem(ctx); err != nil {
		return m, err
	}
	fmt.Fprintf(s.cfg.Log, "memory: queueing %d requests at the edge...\n", n)
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	client := loadgen.NewClient(n + 1)
	defer client.CloseIdleConnections()
	done := make(chan loadgen.Result, 1)
	go func() {
		res, _ := loadgen.Run(lctx, loadgen.Config{URL: s.edgeURL, API: loadgen.APIOpenAI, Model: modelHang,
			Concurrency: n + 1, Requests: n + 1, Timeout: 10 * time.Minute, Client: client}, nil)
		done <- res
	}()
	queued := func(want int) func() error {
		return func() error {
			q, err := s.queued(ctx, modelHang)
			if err == nil && q != want {
				err = fmt.Errorf("%d requests queued for %s, want %d", q, modelHang, want)
			}
			return err
		}
	}
	if err := waitFor(ctx, 3*time.Minute, s.procs, queued(n)); err != nil {
		return m, err
	}
	if m.QueuedRSS, err = s.edge.rss(); err != nil {
		return m, err
	}
	// After the RSS: the GC this forces does not return memory to the OS
	// at once, but the RSS is the figure of a running edge.
	if m.Queued, err = s.runtimeMem(ctx); err != nil {
		return m, err
	}
	if s.cfg.ProfileDir != "" {
		// The heap profile (after the GC above: what is live), the
		// runtime's memory statistics (debug=1 ends with them: Stack
		// counts the goroutine stacks) and the goroutines, of the edge
		// holding the queued requests.
		for file, path := range map[string]string{
			"edge-queued-heap.pprof":     "/debug/pprof/heap",
			"edge-queued-heap.txt":       "/debug/pprof/heap?debug=1",
			"edge-queued-goroutines.txt": "/debug/pprof/goroutine?debug=1",
		} {
			b, err := get(ctx, s.edgePprof+path)
			if err == nil {
				err = os.WriteFile(filepath.Join(s.cfg.ProfileDir, file), b, 0o644)
			}
			if err != nil {
				fmt.Fprintf(s.cfg.Log, "heap profile: %v\n", err)
			}
		}
	}
	cancel()
	res := <-done
	if res.Requests != n+1 || res.Outcomes[loadgen.OutcomeCancelled] != n+1 {
		return m, fmt.Errorf("the queued requests ended %v, want all %d cancelled (errors %v)", res.Outcomes, n+1, res.Errors)
	}
	if err := waitFor(ctx, time.Minute, s.procs, queued(0)); err != nil {
		return m, fmt.Errorf("after cancelling: %w", err)
	}
	heap, stack, gs := m.PerWaiterRuntime()
	fmt.Fprintf(s.cfg.Log, "memory: edge RSS %.1f MB idle, %.1f MB with %d queued (%.0f B per waiter: live heap %.0f B, stacks %.0f B, %.2f goroutines)\n",
		mb(m.IdleRSS), mb(m.QueuedRSS), n, m.PerWaiter(), heap, stack, gs)
	return m, nil
}

// runtimeMem forces a GC in the edge and reads its runtime.MemStats
// (HeapAlloc, then live; Stack in use) and its number of goroutines,
// from its pprof endpoints (net/http/pprof: heap?debug=1 ends with the
// MemStats as "# Name = value" lines; gc=1 runs a GC first).
func (s *setup) runtimeMem(ctx context.Context) (RuntimeMem, error) {
	var r RuntimeMem
	b, err := get(ctx, s.edgePprof+"/debug/pprof/heap?debug=1&gc=1")
	if err != nil {
		return r, err
	}
	if r.HeapAlloc, err = memStat(b, "HeapAlloc"); err != nil {
		return r, err
	}
	// "# Stack = inuse / sys"
	if r.StackInuse, err = memStat(b, "Stack"); err != nil {
		return r, err
	}
	if b, err = get(ctx, s.edgePprof+"/debug/pprof/goroutine?debug=1"); err != nil {
		return r, err
	}
	// The first line: "goroutine profile: total N".
	line, _, _ := strings.Cut(string(b), "\n")
	total, ok := strings.CutPrefix(line, "goroutine profile: total ")
	if r.Goroutines, err = strconv.Atoi(total); !ok || err != nil {
		return r, fmt.Errorf("goroutine profile starts %q", line)
	}
	return r, nil
}

// memStat returns the first number of the "# name = value" line of a
// heap?debug=1 profile.
func memStat(profile []byte, name string) (int64, error) {
	for line := range strings.Lines(string(profile)) {
		rest, ok := strings.CutPrefix(line, "# "+name+" = ")
		if !ok {
			continue
		}
		v, _, _ := strings.Cut(strings.TrimSpace(rest), " ")
		return strconv.ParseInt(v, 10, 64)
	}
	return 0, fmt.Errorf("no %s in the heap profile's memory statistics", name)
}

// queued returns the number of requests queued for model, from the edge's
// /admin/v1/queues (0 when the model has no queue yet).
func (s *setup) queued(ctx context.Context, model string) (int, error) {
	b, err := get(ctx, s.edgeURL+"/admin/v1/queues")
	if err != nil {
		return 0, err
	}
	var qs []struct {
		Model  string `json:"model"`
		Queued int    `json:"queued"`
	}
	if err := json.Unmarshal(b, &qs); err != nil {
		return 0, err
	}
	for _, q := range qs {
		if q.Model == model {
			return q.Queued, nil
		}
	}
	return 0, nil
}

func mb(b int64) float64 { return float64(b) / (1 << 20) }
