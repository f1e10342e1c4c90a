package node

import (
	"errors"
	"testing"

	"iop/internal/wire/nodev1"
)

// TestInFlightFencesOlderEpochs: runs of a cluster are listed with their
// epoch and lease until removed; a Dispatch of an epoch below the highest
// seen (from a dispatch or a new leader's RunsRequest) is refused with
// ErrStaleEpoch; runs outside a cluster (epoch 0) are never refused nor
// listed.
func TestInFlightFencesOlderEpochs(t *testing.T) {
	f := newInFlight()
	a, b, c, single := &run{id: "a"}, &run{id: "b"}, &run{id: "c"}, &run{id: "s"}
	if err := f.add(a, &nodev1.Dispatch{RunId: "a", ProviderId: "p", Epoch: 5, LeaseId: 1, Long: true}); err != nil {
		t.Fatal(err)
	}
	if err := f.add(single, &nodev1.Dispatch{RunId: "s", ProviderId: "p"}); err != nil {
		t.Fatal(err)
	}
	f.raise(7)
	if err := f.add(b, &nodev1.Dispatch{RunId: "b", ProviderId: "p", Epoch: 5, LeaseId: 2}); !errors.Is(err, ErrStaleEpoch) || staleEpochOf(err) != 7 {
		t.Fatalf("dispatch of epoch 5 after epoch 7's RunsRequest: %v (stale_epoch %d), want ErrStaleEpoch naming 7", err, staleEpochOf(err))
	}
	if err := f.add(c, &nodev1.Dispatch{RunId: "c", ProviderId: "p", Epoch: 7, LeaseId: 1}); err != nil {
		t.Fatal(err)
	}
	got := map[string]*nodev1.RunInFlight{}
	for _, ri := range f.list() {
		got[ri.GetRunId()] = ri
	}
	if len(got) != 2 || got["a"].GetEpoch() != 5 || got["a"].GetLeaseId() != 1 || !got["a"].GetLong() || got["c"].GetEpoch() != 7 {
		t.Fatalf("listed %v, want a (epoch 5, lease 1, long) and c (epoch 7)", got)
	}
	f.remove(a)
	f.remove(single)
	f.remove(b) // refused: never added
	if l := f.list(); len(l) != 1 || l[0].GetRunId() != "c" {
		t.Fatalf("after removing a: %v, want c alone", l)
	}
}
