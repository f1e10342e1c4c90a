package cluster

import (
	"context"
	"testing"
	"time"

	"iop/internal/testenv/etcdtest"
)

// TestRegression_SecondDeploymentOwnElection: an edge of another
// deployment pointed at the same etcd, with the default prefix, joined the
// first deployment's election and was elected its leader. With the
// deployment's id in the election's key prefix, each deployment elects
// its own leader: the second never shows in the first's state nor in its
// campaigners, and the first's leader keeps its epoch.
func TestRegression_SecondDeploymentOwnElection(t *testing.T) {
	etcd := etcdtest.Start(t)
	startID := func(id, name, addr string) *Elector {
		e, err := Start(Config{Etcd: etcd.Endpoints(), Name: name, Advertise: addr, SessionTTL: time.Second, ID: id}, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = e.Close() })
		return e
	}
	a1 := startID("alpha", "a-1", "127.0.0.1:1")
	a2 := startID("alpha", "a-2", "127.0.0.1:2")
	first := waitState(t, "one leader of alpha", []*Elector{a1, a2}, oneLeader)
	b1 := startID("beta", "b-1", "127.0.0.1:3")
	waitState(t, "beta leads its own election", []*Elector{b1}, oneLeader)
	for _, e := range []*Elector{a1, a2} {
		if st := e.State(); st.Epoch != first[0].Epoch || st.LeaderAddr == "127.0.0.1:3" {
			t.Errorf("%s: state %+v after beta started, want the leader of epoch %d", e.Name(), st, first[0].Epoch)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	got, err := a1.Campaigners(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 {
		t.Errorf("alpha's campaigners = %v, want its two edges only", got)
	}
	for _, a := range got {
		if a == "127.0.0.1:3" {
			t.Errorf("beta's edge campaigns in alpha's election: %v", got)
		}
	}
}

func TestIdentity(t *testing.T) {
	if got := (Config{ID: "prod", Token: "x"}).Identity(); got != "prod" {
		t.Errorf("Identity with id = %q", got)
	}
	a, b := (Config{Token: "one"}).Identity(), (Config{Token: "two"}).Identity()
	if a == b || a != DeriveID("one") || len(a) != 18 || !validID(a) {
		t.Errorf("derived ids %q %q", a, b)
	}
}
