package scheduler

import "time"

// Clock is the scheduler's source of time. Tests inject a fake one and drive
// it; production uses RealClock.
type Clock interface {
	Now() time.Time
	// AfterFunc calls f in its own goroutine after d (tstime.Clock's shape).
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is a pending AfterFunc call.
type Timer interface {
	// Stop prevents the call; it reports whether the call was still pending.
	Stop() bool
}

// RealClock returns a Clock backed by package time.
func RealClock() Clock { return realClock{} }

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

func (realClock) AfterFunc(d time.Duration, f func()) Timer { return time.AfterFunc(d, f) }
