package node

import (
	"errors"
	"fmt"
	"sync"

	"iop/internal/wire/nodev1"
)

// ErrStaleEpoch refuses a Dispatch admitted by a scheduler leader older
// than one this node has heard from (several edges: a deposed leader's).
var ErrStaleEpoch = errors.New("stale epoch")

// staleEpochError is ErrStaleEpoch for a Dispatch of epoch when this node
// has seen seen.
type staleEpochError struct{ epoch, seen int64 }

func (e *staleEpochError) Error() string {
	return fmt.Sprintf("%v: dispatch of epoch %d, the leader's is %d", ErrStaleEpoch, e.epoch, e.seen)
}

func (e *staleEpochError) Unwrap() error { return ErrStaleEpoch }

// staleEpochOf is the epoch a refusal for err names in
// DispatchRefused.stale_epoch: the highest seen when err is a stale epoch,
// else 0.
func staleEpochOf(err error) int64 {
	var se *staleEpochError
	if errors.As(err, &se) {
		return se.seen
	}
	return 0
}

// inFlight is the node-wide set of runs in flight, over every edge
// connection, with the epoch and lease that admitted each (several edges,
// package cluster): the node reports it in every heartbeat and in answer to
// a new leader's RunsRequest, so the leader counts every run once. It also
// holds the highest epoch seen, below which a Dispatch is refused.
//
// Concurrency: mu guards everything; it is a leaf lock, taken under a
// connection's mu (conn.acceptDispatch) and nothing is called under it.
type inFlight struct {
	mu    sync.Mutex
	runs  map[*run]*nodev1.RunInFlight
	epoch int64
}

func newInFlight() *inFlight { return &inFlight{runs: make(map[*run]*nodev1.RunInFlight)} }

// add records r, dispatched by d, or refuses d: ErrStaleEpoch when its
// non-zero epoch is below the highest seen (which it raises otherwise). A
// run outside a cluster (epoch 0) is not recorded: no leader counts it,
// and a single edge's dispatch costs nothing more.
func (f *inFlight) add(r *run, d *nodev1.Dispatch) error {
	if d.GetEpoch() == 0 {
		return nil
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if e := d.GetEpoch(); e != 0 {
		if e < f.epoch {
			return &staleEpochError{epoch: e, seen: f.epoch}
		}
		f.epoch = e
	}
	r.counted = true
	f.runs[r] = &nodev1.RunInFlight{RunId: d.GetRunId(), ProviderId: d.GetProviderId(), Epoch: d.GetEpoch(), LeaseId: d.GetLeaseId(), Long: d.GetLong(), Key: d.GetKey()}
	return nil
}

// remove forgets r (no-op when absent).
func (f *inFlight) remove(r *run) {
	if !r.counted {
		return
	}
	f.mu.Lock()
	delete(f.runs, r)
	f.mu.Unlock()
}

// raise lifts the highest epoch seen to epoch (a new leader's RunsRequest).
func (f *inFlight) raise(epoch int64) {
	f.mu.Lock()
	f.epoch = max(f.epoch, epoch)
	f.mu.Unlock()
}

// list returns every run in flight (messages shared read-only).
func (f *inFlight) list() []*nodev1.RunInFlight {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]*nodev1.RunInFlight, 0, len(f.runs))
	for _, ri := range f.runs {
		out = append(out, ri)
	}
	return out
}
