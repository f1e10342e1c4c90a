package edge

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"

	"iop/internal/edge/contract"
	"iop/internal/scheduler"
)

// TestAliasUnmatchedTargets: an alias whose targets no node serves (a
// typo) is unknown (404) with a reason naming them, once a node connected;
// before any did, it has no provider (503); its queue lists the unmatched
// targets, and a reload and the start (aliasCheckDelay after) log a
// warning per such alias. An alias with one target served is served; one
// whose target a gone node served stays unavailable (503), not unknown.
func TestAliasUnmatchedTargets(t *testing.T) {
	cfg := testConfig()
	cfg.Models["orphan"] = ModelConfig{Targets: []string{"nobody-a", "nobody-b"}}
	cfg.Models["half"] = ModelConfig{Targets: []string{"tiny", "typo"}}
	logs := newLogRecords()
	e := startLoggedEdge(t, cfg, logs)

	// No node yet: nothing is unmatched, the alias has no provider.
	if _, err := e.svc.Dispatch(context.Background(), chatReq("orphan")); !errors.Is(err, scheduler.ErrNoProvider) {
		t.Fatalf("before any node: %v, want ErrNoProvider", err)
	}
	if q := queueOf(e.svc.Snapshot(), "orphan"); q.UnmatchedTargets != nil || !slices.Equal(q.Targets, []string{"nobody-a", "nobody-b"}) {
		t.Fatalf("before any node: %+v", q)
	}
	e.clk.waitArmed(t, aliasCheckDelay, 1)
	e.clk.Advance(aliasCheckDelay) // no node: no warning, checked again later
	if got := logs.find(unmatchedSomeMsg); len(got) != 0 {
		t.Fatalf("warned before any node connected: %v", got)
	}

	n := e.connect(t, hello("n1", prov("p1", normalized, 1, "m-big", "tiny:latest")))
	_, err := e.svc.Dispatch(context.Background(), chatReq("orphan"))
	var ua *contract.UnmatchedAliasError
	if !errors.Is(err, scheduler.ErrUnknownModel) || !errors.As(err, &ua) ||
		ua.Error() != "alias orphan: no configured target is served by any node: nobody-a, nobody-b" {
		t.Fatalf("orphan: %v, want ErrUnknownModel with the unmatched targets", err)
	}
	snap := e.svc.Snapshot()
	for model, want := range map[string][]string{"orphan": {"nobody-a", "nobody-b"}, "half": {"typo"}, "chat": {"m-small"}} {
		if got := queueOf(snap, model).UnmatchedTargets; !slices.Equal(got, want) {
			t.Errorf("queue %s unmatched %v, want %v", model, got, want)
		}
	}
	// The start's check runs now that a node is there: one line per alias.
	e.clk.waitArmed(t, aliasCheckDelay, 2)
	e.clk.Advance(aliasCheckDelay)
	if got := fmt.Sprint(warned(logs)); got != "[chat:[m-small] half:[typo] orphan:[nobody-a nobody-b]]" {
		t.Fatalf("warnings at start %s", got)
	}
	// half serves through tiny:latest.
	run, _, d := e.startRun(t, n, chatReq("half"))
	if d.GetServedModel() != "tiny:latest" {
		t.Fatalf("half dispatched as %q", d.GetServedModel())
	}
	run.Close("test")

	// A reload warns again, for its own aliases.
	next := testConfig()
	next.Models["chat"] = ModelConfig{Targets: []string{"m-big"}}
	next.Models["typo"] = ModelConfig{Targets: []string{"m-bgi"}}
	if _, err := e.svc.Reload(next); err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(warned(logs)); got != "[chat:[m-small] half:[typo] orphan:[nobody-a nobody-b] typo:[m-bgi]]" {
		t.Fatalf("warnings after reload %s", got)
	}
	if got := logs.find(unmatchedAllMsg); len(got) != 2 { // orphan at start, typo at reload
		t.Fatalf("all-unmatched warnings %v", got)
	}

	// The node goes: its models are remembered, so chat is unavailable
	// (503), not unknown; typo is still unknown.
	n.cancel()
	e.waitUntil(t, "node gone", func(s contract.Snapshot) bool { return len(s.Nodes) == 0 })
	if _, err := e.svc.Dispatch(context.Background(), chatReq("chat")); !errors.Is(err, scheduler.ErrNoProvider) || errors.As(err, &ua) {
		t.Fatalf("chat with its node gone: %v, want ErrNoProvider", err)
	}
	if _, err := e.svc.Dispatch(context.Background(), chatReq("typo")); !errors.As(err, &ua) {
		t.Fatalf("typo with the node gone: %v, want the unmatched alias", err)
	}
}

const (
	unmatchedSomeMsg = "alias targets match no model any node serves; check their spelling"
	unmatchedAllMsg  = "alias matches no model any node serves: its requests get 404; check its targets' spelling"
)

// warned lists the unmatched-target warnings logged, as "alias:[targets]".
func warned(logs logRecords) []string {
	var out []string
	for _, r := range append(logs.find(unmatchedSomeMsg), logs.find(unmatchedAllMsg)...) {
		out = append(out, fmt.Sprintf("%v:%v", r["alias"], r["unmatched"]))
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// TestRegression_RemovedAliasLeavesQueues: a reload that removes an alias
// whose queue the scheduler holds (a request waited in it) drops it from
// the queues (Snapshot, GET /admin/v1/queues) once it is empty; while a
// request still waits in it, it is listed.
func TestRegression_RemovedAliasLeavesQueues(t *testing.T) {
	cfg := testConfig()
	cfg.Models["old"] = ModelConfig{Targets: []string{"m-small"}}
	e := startEdge(t, cfg)
	n := e.connect(t, hello("n1", prov("p1", normalized, 1, "m-small")))
	held, _, _ := e.startRun(t, n, chatReq("old"))
	ctx, leave := context.WithCancel(context.Background())
	defer leave()
	queued := e.dispatchAsync(ctx, chatReq("old"))
	waitFor(t, func() bool { return queueOf(e.svc.Snapshot(), "old").Queued == 1 })

	next := testConfig()
	if _, err := e.svc.Reload(next); err != nil {
		t.Fatal(err)
	}
	if q := queueOf(e.svc.Snapshot(), "old"); q.Queued != 1 {
		t.Fatalf("removed alias with a waiter: %+v, want it listed", q)
	}
	leave()
	if r := wait(t, queued); !errors.Is(r.err, context.Canceled) {
		t.Fatalf("queued request: %v", r.err)
	}
	held.Close("test")
	waitFor(t, func() bool { return e.svc.Snapshot().Waiters == 0 })
	for _, q := range e.svc.Snapshot().Queues {
		if q.Model == "old" {
			t.Fatalf("the removed alias's empty queue is still listed: %+v", q)
		}
	}
}
