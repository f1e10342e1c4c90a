package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"runtime"
	"runtime/pprof"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"iop/internal/e2e/harness"
	"iop/internal/edge"
	"iop/internal/edge/contract"
	"iop/internal/node"
	"iop/internal/sim"
	"iop/internal/testenv"
)

// stormOutcome is one storm client's answer.
type stormOutcome struct {
	status int
	err    error
	waited time.Duration
}

// TestStormAdmitsCapacityPlusQueue: 1,000 concurrent clients against one
// provider of capacity 8 whose model server holds every request (sim Hang),
// with max_queue 16. At the peak exactly 8 run and 16 wait; the other 976
// get 429 at once; the 16 waiting get 503 when the queue timeout passes;
// nobody waits past the queue timeout plus 1 s (the bound: a hang
// detector, generous on purpose, not a speed check; the 1 s absorbs the
// scheduling delays of 1,000 goroutines on a loaded machine). Afterwards no
// slot is held or queued and the goroutine count is back to its baseline.
//
// The 24 are let in first and the 976 sent once the edge's snapshot shows
// them running and queued, so the counts do not depend on how fast 1,000
// requests reach the edge; all 976 are connected beforehand and released
// together.
func TestStormAdmitsCapacityPlusQueue(t *testing.T) {
	const (
		clients  = 1000
		capacity = 8
		maxQueue = 16
		// Long enough that no waiter times out before the 976 are
		// answered (about 2 s under the race detector on an idle 2-core
		// machine, 11 s with other test binaries running beside it),
		// short enough for make test.
		queueTimeout = 20 * time.Second
		bound        = queueTimeout + time.Second
	)
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil || lim.Cur < 4*clients {
		t.Fatalf("open file limit %d (%v): the storm needs %d", lim.Cur, err, 4*clients)
	}

	sm, simURL := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOllama, Models: []string{"m"}, Faults: sim.Faults{Hang: true}})
	ctx, cancel := context.WithCancel(context.Background())
	e := harness.Edge(t, ctx, harness.EdgeConfig(map[string]edge.ModelConfig{"storm": {Targets: []string{"m"}, MaxQueue: maxQueue, QueueTimeout: queueTimeout}}))
	t.Cleanup(cancel)
	harness.Node(t, ctx, node.Config{
		NodeID:    "gpu-1",
		Edge:      e.NodeAddr,
		Providers: []node.ProviderConfig{{ID: "p", Type: node.TypeOllama, BaseURL: simURL, Models: []string{"m"}, Capacity: capacity}},
	})
	tr := &http.Transport{MaxIdleConnsPerHost: clients, MaxIdleConns: clients, IdleConnTimeout: time.Minute}
	t.Cleanup(tr.CloseIdleConnections)
	client := &http.Client{Transport: tr}
	url := "http://" + e.HTTPAddr

	// The baseline: the rig running idle, its node's warm run streams open.
	waitIdle(t, e)
	waitWarm(t, e)
	// And its node's first reading of the model server's /api/ps done, its
	// connection idle in the pool: a baseline taken while that reading
	// was dialing counted one goroutine fewer than the idle connection
	// holds (client read and write loops, the server's conn).
	testenv.Eventually(t, "the node's first /api/ps reading done", func() bool {
		if sm.Stats().PSReadings == 0 {
			return false
		}
		var dump strings.Builder
		_ = pprof.Lookup("goroutine").WriteTo(&dump, 1)
		return !strings.Contains(dump.String(), "readResidency")
	})
	baseline := runtime.NumGoroutine()
	var atBaseline strings.Builder
	_ = pprof.Lookup("goroutine").WriteTo(&atBaseline, 1)
	ignore := goleak.IgnoreCurrent()

	// Connections for every client, opened beforehand (and left idle in
	// the transport), so the burst is requests, not TCP handshakes.
	var warm sync.WaitGroup
	for range clients {
		warm.Go(func() {
			resp, err := client.Get(url + "/healthz")
			if err != nil {
				t.Error(err)
				return
			}
			resp.Body.Close()
		})
	}
	warm.Wait()

	body := `{"model":"storm","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`
	outcomes := make([]stormOutcome, clients)
	// The first capacity+maxQueue clients can be cancelled: those that
	// run are held by the model server until then.
	holdCtx, release := context.WithCancel(context.Background())
	defer release()
	send := func(i int, ctx context.Context) {
		start := time.Now()
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions", strings.NewReader(body))
		if err != nil {
			outcomes[i] = stormOutcome{err: err}
			return
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			outcomes[i] = stormOutcome{err: err, waited: time.Since(start)}
			return
		}
		resp.Body.Close()
		outcomes[i] = stormOutcome{status: resp.StatusCode, waited: time.Since(start)}
	}

	var first, rest sync.WaitGroup
	answered := make(chan int, capacity+maxQueue) // first-group clients that finished
	for i := range capacity + maxQueue {
		first.Go(func() {
			send(i, holdCtx)
			answered <- i
		})
	}
	waitSnapshot(t, e, func(s contract.Snapshot) bool {
		return s.Leases == capacity && s.Waiters == maxQueue
	})
	start := make(chan struct{})
	for i := capacity + maxQueue; i < clients; i++ {
		rest.Go(func() {
			<-start
			send(i, context.Background())
		})
	}
	burst := time.Now()
	close(start)
	rest.Wait()
	t.Logf("burst of %d answered in %v", clients-capacity-maxQueue, time.Since(burst))
	// Still the same peak: nobody timed out of the queue during the burst.
	if snap := e.Service.Snapshot(); snap.Leases != capacity || snap.Waiters != maxQueue {
		t.Fatalf("after the burst: %d leases, %d waiters; want %d and %d (raise queueTimeout)", snap.Leases, snap.Waiters, capacity, maxQueue)
	}

	// The queued ones time out (503); then the running ones are let go.
	for range maxQueue {
		select {
		case <-answered:
		case <-time.After(bound + 10*time.Second):
			t.Fatal("the queued clients were never answered")
		}
	}
	release()
	first.Wait()

	counts := map[string]int{}
	for i, o := range outcomes {
		key := fmt.Sprint(o.status)
		switch {
		case o.err != nil && errors.Is(o.err, context.Canceled) && i < capacity+maxQueue:
			key = "cancelled while running"
		case o.err != nil:
			t.Errorf("client %d: %v", i, o.err)
			key = "error"
		}
		counts[key]++
		if key != "cancelled while running" && o.waited > bound {
			t.Errorf("client %d (%s) waited %v, more than the queue timeout plus 1 s (%v)", i, key, o.waited, bound)
		}
	}
	want := map[string]int{"429": clients - capacity - maxQueue, "503": maxQueue, "cancelled while running": capacity}
	if fmt.Sprint(counts) != fmt.Sprint(want) {
		t.Fatalf("outcomes %v, want %v", counts, want)
	}

	// Nothing is left: no slot, no waiter, no goroutine.
	waitIdle(t, e)
	waitWarm(t, e)
	tr.CloseIdleConnections()
	// On failure the goroutines left are logged, grouped by stack.
	t.Cleanup(func() {
		if t.Failed() && runtime.NumGoroutine() > baseline {
			var dump strings.Builder
			_ = pprof.Lookup("goroutine").WriteTo(&dump, 1)
			t.Logf("goroutines above the baseline of %d:\n%s\nat the baseline:\n%s", baseline, dump.String(), atBaseline.String())
		}
	})
	testenv.Eventually(t, fmt.Sprintf("the goroutine count is back to its baseline of %d", baseline), func() bool {
		return runtime.NumGoroutine() <= baseline
	})
	// The warm run streams taken during the storm were replaced by new
	// ones (as many: the count above), whose goroutines (each side's, and
	// the gRPC client stream's context watcher) are not the baseline's.
	if err := goleak.Find(ignore, goleak.IgnoreAnyFunction("iop/internal/node.(*conn).serveWarm"),
		goleak.IgnoreAnyFunction("iop/internal/edge.(*Service).serveWarm"),
		goleak.IgnoreTopFunction("google.golang.org/grpc.newClientStreamWithParams.func4")); err != nil {
		t.Fatalf("goroutines left by the storm: %v", err)
	}
}
