package edge

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"iop/internal/scheduler"
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
	q := e.svc.Snapshot().Queues
	if len(q) != 1 || q[0].MaxQueue != 2 || q[0].QueueTimeout != time.Minute {
		t.Fatalf("queues %+v", q)
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
