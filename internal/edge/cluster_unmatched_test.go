package edge

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"iop/internal/cluster"
	"iop/internal/edge/contract"
	"iop/internal/scheduler"
	"iop/internal/testenv/etcdtest"
)

// TestClusterFollowerNamesUnmatchedTargets: on several edges, a request
// for an alias whose targets no node serves, made through a follower, is
// refused by the leader as unknown, and the follower's error names the
// unmatched targets as a single edge's does.
func TestClusterFollowerNamesUnmatchedTargets(t *testing.T) {
	etcd := etcdtest.Start(t)
	var es []*testEdge
	for i := range 2 {
		cfg := testConfig()
		cfg.Models["typo"] = ModelConfig{Targets: []string{"m-bgi"}}
		cfg.Cluster = &cluster.Config{Etcd: etcd.Endpoints(), Name: fmt.Sprintf("edge-%d", i+1), SessionTTL: time.Second, ID: "test"}
		es = append(es, startEdge(t, cfg))
	}
	li := waitLeader(t, es, []bool{true, true}, 0)
	for _, e := range es {
		e.connect(t, hello("n1", prov("p1", normalized, 1, "m-big")))
	}
	follower := es[1-li]
	_, err := follower.svc.Dispatch(context.Background(), chatReq("typo"))
	var ua *contract.UnmatchedAliasError
	if !errors.Is(err, scheduler.ErrUnknownModel) || !errors.As(err, &ua) || fmt.Sprint(ua.Targets) != "[m-bgi]" {
		t.Fatalf("through the follower: %v, want ErrUnknownModel naming m-bgi", err)
	}
}
