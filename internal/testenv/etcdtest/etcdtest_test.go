package etcdtest

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestClusterSurvivesOneMember: the three members form one cluster; with
// one killed the other two still commit writes (after a raft election when
// it led), and the killed one comes back with them.
func TestClusterSurvivesOneMember(t *testing.T) {
	c := Start(t)
	cli, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints(), DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := cli.Put(ctx, "k", "1"); err != nil {
		t.Fatal(err)
	}
	mr, err := cli.MemberList(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(mr.Members) != Members {
		t.Fatalf("members = %d, want %d", len(mr.Members), Members)
	}
	// With one member killed the other two commit: at once, or (when the
	// killed one led the raft group) once they elected another, which an
	// etcd client waits out by retrying, as every client of etcd does.
	c.Kill(0)
	var err2 error
	for {
		pctx, pcancel := context.WithTimeout(ctx, 2*time.Second)
		_, err2 = cli.Put(pctx, "k", "2")
		pcancel()
		if err2 == nil || ctx.Err() != nil {
			break
		}
	}
	if err2 != nil {
		t.Fatalf("put with one member killed, retried for 30s: %v", err2)
	}
	c.Restart(0)
	one, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints()[:1], DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer one.Close()
	got, err := one.Get(ctx, "k") // linearizable: through the cluster's leader
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Kvs) != 1 || string(got.Kvs[0].Value) != "2" {
		t.Fatalf("restarted member reads %v, want k=2", got.Kvs)
	}
}
