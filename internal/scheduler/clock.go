package scheduler

import "iop/internal/clock"

// Clock is the scheduler's source of time (see package clock); tests inject
// clock.Fake and drive it.
type Clock = clock.Clock

// Timer is a pending Clock.AfterFunc call.
type Timer = clock.Timer

// RealClock returns a Clock backed by package time.
func RealClock() Clock { return clock.Real() }
