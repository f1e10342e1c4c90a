package edge

import (
	"context"
	"fmt"
	"testing"
	"time"

	"iop/internal/edge/contract"
)

// TestQueuesListedFromTheFirstRequest: the snapshot's
// queues are every configured alias, with its policy, before any request,
// and every model a request asked for, from that request on, with queued 0
// while none waits; a name no one serves is not listed.
func TestQueuesListedFromTheFirstRequest(t *testing.T) {
	cfg := testConfig()
	cfg.Queue.MaxQueue = 7
	cfg.Models["slow"] = ModelConfig{Targets: []string{"m-big"}, MaxQueue: 3, QueueTimeout: 9 * time.Second}
	e := startEdge(t, cfg)
	queues := func() string {
		var out string
		for _, q := range e.svc.Snapshot().Queues {
			out += fmt.Sprintf("%s:%d/%d/%s ", q.Model, q.Queued, q.MaxQueue, q.QueueTimeout)
		}
		return out
	}
	if got, want := queues(), "chat:0/7/"+testQueueTimeout.String()+" slow:0/3/9s "; got != want {
		t.Fatalf("queues before any request %q, want %q", got, want)
	}
	n := e.connect(t, hello("n1", prov("p1", normalized, 1, "m-small")))
	run, _, _ := e.startRun(t, n, chatReq("m-small"))
	run.Close("completed")
	if _, err := e.svc.Dispatch(context.Background(), chatReq("no-such-model")); err == nil {
		t.Fatal("an unknown model was dispatched")
	}
	if got, want := queues(), "chat:0/7/"+testQueueTimeout.String()+" m-small:0/7/"+testQueueTimeout.String()+" slow:0/3/9s "; got != want {
		t.Fatalf("queues after a request for m-small %q, want %q", got, want)
	}
}

// queueOf is model's queue in snap (zero if it has none).
func queueOf(snap contract.Snapshot, model string) contract.QueueSnapshot {
	for _, q := range snap.Queues {
		if q.Model == model {
			return q
		}
	}
	return contract.QueueSnapshot{}
}
