package edge

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"iop/internal/edge/contract"
	"iop/internal/scheduler"
	"iop/internal/wire/nodev1"
)

func TestReloadAppliesAliasesAndPolicies(t *testing.T) {
	cfg := testConfig()
	cfg.Models["old"] = ModelConfig{Targets: []string{"m-small"}}
	cfg.Queue.MaxQueue = 1
	e := startEdge(t, cfg)
	n := e.connect(t, hello("n1", prov("p1", normalized, 1, "m-small", "m-big")))
	held, _, _ := e.startRun(t, n, chatReq("chat"))
	defer held.Close("test")

	// One waiter fills chat's queue of 1.
	ctx, leave := context.WithCancel(context.Background())
	defer leave()
	first := e.dispatchAsync(ctx, chatReq("chat"))
	waitFor(t, func() bool { return e.svc.Snapshot().Waiters == 1 })
	if _, err := e.svc.Dispatch(context.Background(), chatReq("chat")); !errors.Is(err, scheduler.ErrQueueFull) {
		t.Fatalf("before reload: %v, want ErrQueueFull", err)
	}

	next := testConfig()
	next.Queue.MaxQueue = 2
	next.Models["chat"] = ModelConfig{Targets: []string{"m-big"}, QueueTimeout: time.Minute}
	next.Models["new"] = ModelConfig{Targets: []string{"m-big"}}
	next.DispatchTimeout = time.Minute
	res, err := e.svc.Reload(next)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(res.Added, res.Removed, res.Changed, res.Restart, res.QueueChanged) != "[new] [old] [chat] [dispatch_timeout] true" {
		t.Fatalf("result %+v", res)
	}
	// The next admission sees max_queue 2: a second waiter is taken.
	second := e.dispatchAsync(ctx, chatReq("chat"))
	waitFor(t, func() bool { return e.svc.Snapshot().Waiters == 2 })
	if _, err := e.svc.Dispatch(context.Background(), chatReq("chat")); !errors.Is(err, scheduler.ErrQueueFull) {
		t.Fatalf("third waiter: %v, want ErrQueueFull", err)
	}
	// chat's queue has its new policy; the new alias's is listed, empty,
	// with the new default's max_queue.
	snap := e.svc.Snapshot()
	if q, n := queueOf(snap, "chat"), queueOf(snap, "new"); len(snap.Queues) != 2 || q.MaxQueue != 2 || q.QueueTimeout != time.Minute ||
		n.MaxQueue != 2 || n.Queued != 0 || n.QueueTimeout != testQueueTimeout {
		t.Fatalf("queues %+v", snap.Queues)
	}
	// The removed alias is unknown; the new one resolves.
	if _, err := e.svc.Dispatch(context.Background(), chatReq("old")); !errors.Is(err, scheduler.ErrUnknownModel) {
		t.Fatalf("removed alias: %v", err)
	}
	if m := fmt.Sprint(e.svc.Models()); m != "[chat m-big m-small new]" {
		t.Fatalf("models %s", m)
	}

	// An invalid config changes nothing and names its problem.
	bad := testConfig()
	bad.Queue.MaxQueue = 5
	bad.Models["broken"] = ModelConfig{}
	if _, err := e.svc.Reload(bad); !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "models.broken: no targets") {
		t.Fatalf("invalid reload: %v", err)
	}
	if q := e.svc.Snapshot().Queues; q[0].MaxQueue != 2 {
		t.Fatalf("an invalid reload changed the policy: %+v", q)
	}
	leave()
	for _, ch := range []<-chan dispatched{first, second} {
		if r := wait(t, ch); !errors.Is(r.err, context.Canceled) {
			t.Fatalf("queued request: %v", r.err)
		}
	}
}

// TestReloadRemovingAModelWithRunsInFlight: a reload that drops
// an alias while runs of it are in flight lets them finish and release
// their slots; new requests for it are unknown (404); another model's run
// and counters are untouched.
func TestReloadRemovingAModelWithRunsInFlight(t *testing.T) {
	cfg := testConfig()
	cfg.Models["gone"] = ModelConfig{Targets: []string{"m-small"}}
	cfg.Models["kept"] = ModelConfig{Targets: []string{"m-big"}}
	e := startEdge(t, cfg)
	n := e.connect(t, hello("n1", prov("small", normalized, 2, "m-small"), prov("big", normalized, 2, "m-big")))
	goneRun, goneStream, _ := e.startRun(t, n, chatReq("gone"))
	keptRun, keptStream, _ := e.startRun(t, n, chatReq("kept"))
	before := e.svc.Snapshot()

	next := testConfig()
	next.Models["kept"] = ModelConfig{Targets: []string{"m-big"}}
	res, err := e.svc.Reload(next)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(res.Removed) != "[gone]" {
		t.Fatalf("removed %v", res.Removed)
	}
	if _, err := e.svc.Dispatch(context.Background(), chatReq("gone")); !errors.Is(err, scheduler.ErrUnknownModel) {
		t.Fatalf("a new request for the removed alias: %v, want ErrUnknownModel", err)
	}
	after := e.svc.Snapshot()
	for _, id := range []string{"small", "big"} {
		b, _ := providerOf(before, "n1", id)
		a, _ := providerOf(after, "n1", id)
		if a.InFlight != 1 || b.InFlight != 1 {
			t.Fatalf("provider %s in flight %d before, %d after the reload; want 1 and 1", id, b.InFlight, a.InFlight)
		}
	}

	// The removed alias's run goes on to its end and frees its slot.
	sendUp(t, goneStream, events(event(nodev1.RunEvent_TYPE_DELTA, "still here"), event(nodev1.RunEvent_TYPE_COMPLETE, "")))
	msgs, err := recvAll(goneRun)
	if !errors.Is(err, io.EOF) || len(msgs) != 1 || first(msgs[0]).Text != "still here" {
		t.Fatalf("the run in flight: %v %v", msgs, err)
	}
	e.waitUntil(t, "the removed alias's slot is free", func(s contract.Snapshot) bool {
		p, _ := providerOf(s, "n1", "small")
		return p.InFlight == 0
	})
	if got := e.inFlight("n1", "big"); got != 1 {
		t.Fatalf("the other model's provider in flight %d, want 1", got)
	}
	sendUp(t, keptStream, events(event(nodev1.RunEvent_TYPE_COMPLETE, "")))
	if _, err := recvAll(keptRun); !errors.Is(err, io.EOF) {
		t.Fatal(err)
	}
}

// TestRegression_ReloadNamesEveryRestartSetting: a reload that changes
// max_retries or circuit_breaker (read only at start) names each in ReloadResult.Restart, which the edge logs; they
// used to be neither applied nor named.
func TestRegression_ReloadNamesEveryRestartSetting(t *testing.T) {
	e := startEdge(t, testConfig())
	next := testConfig()
	two := 2
	next.MaxRetries = &two
	next.CircuitBreaker.CoolDown = time.Hour
	res, err := e.svc.Reload(next)
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(res.Restart); got != "[circuit_breaker max_retries]" {
		t.Fatalf("restart %s", got)
	}
	// The same settings again: nothing differs from the running ones.
	if res, err = e.svc.Reload(testConfig()); err != nil || len(res.Restart) != 0 {
		t.Fatalf("reload of the running config: %+v %v", res, err)
	}
}
