package contract

import (
	"context"
	"sync/atomic"
	"time"
)

// LeaderBound is one request's bound on waiting for a scheduler leader
// (several edges): its key's admission at the leader and every admission
// of the request share one deadline, fixed by the first of them. The
// HTTP API attaches one to a request's context before the key's
// admission (WithLeaderBound); the edge fixes and reads it (Deadline).
type LeaderBound struct {
	deadline atomic.Int64 // unix ns; 0: not fixed yet
}

type leaderBoundKey struct{}

// WithLeaderBound returns ctx carrying a new LeaderBound, not fixed yet.
func WithLeaderBound(ctx context.Context) context.Context {
	return context.WithValue(ctx, leaderBoundKey{}, &LeaderBound{})
}

// LeaderBoundOf returns the LeaderBound ctx carries, or nil.
func LeaderBoundOf(ctx context.Context) *LeaderBound {
	b, _ := ctx.Value(leaderBoundKey{}).(*LeaderBound)
	return b
}

// Deadline returns the bound's deadline, fixing it at now + wait on the
// first call; on a nil bound it returns now + wait (a bound of its own).
// Safe for concurrent use.
func (b *LeaderBound) Deadline(now time.Time, wait time.Duration) time.Time {
	if b == nil {
		return now.Add(wait)
	}
	b.deadline.CompareAndSwap(0, now.Add(wait).UnixNano())
	return time.Unix(0, b.deadline.Load())
}
