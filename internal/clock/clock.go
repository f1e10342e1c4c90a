// Package clock is iop's injectable source of time: Real for production,
// Fake for tests that drive time instead of sleeping (tailscale tstime.Clock).
//
// # Concurrency
//
// Real is stateless. Fake guards its time and timers with one mutex and
// calls due timer functions synchronously from Advance, in deadline order,
// without holding that mutex, so a callback may use the Fake again.
package clock

import (
	"sort"
	"sync"
	"time"
)

// Clock tells time and schedules calls.
type Clock interface {
	Now() time.Time
	// AfterFunc calls f after d. Real calls it in its own goroutine; Fake
	// from Advance.
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is a pending AfterFunc call.
type Timer interface {
	// Stop prevents the call and reports whether it was still pending.
	Stop() bool
}

// Real returns the Clock of package time.
func Real() Clock { return realClock{} }

type realClock struct{}

func (realClock) Now() time.Time                            { return time.Now() }
func (realClock) AfterFunc(d time.Duration, f func()) Timer { return time.AfterFunc(d, f) }

// Fake is a Clock that moves only when Advance is called.
type Fake struct {
	mu     sync.Mutex // guards the fields below
	now    time.Time
	seq    uint64
	timers map[*fakeTimer]struct{}
}

// NewFake returns a Fake reading start.
func NewFake(start time.Time) *Fake {
	return &Fake{now: start, timers: make(map[*fakeTimer]struct{})}
}

type fakeTimer struct {
	c   *Fake
	at  time.Time
	seq uint64
	f   func()
}

// Now returns the fake time.
func (c *Fake) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// AfterFunc schedules f at Now()+d; it runs during the Advance that reaches it.
func (c *Fake) AfterFunc(d time.Duration, f func()) Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seq++
	t := &fakeTimer{c: c, at: c.now.Add(d), seq: c.seq, f: f}
	c.timers[t] = struct{}{}
	return t
}

// Stop cancels the timer if it has not fired.
func (t *fakeTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	_, ok := t.c.timers[t]
	delete(t.c.timers, t)
	return ok
}

// Pending returns the number of timers not yet fired or stopped.
func (c *Fake) Pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.timers)
}

// Advance moves time forward by d and runs every timer due by then, earliest
// first (ties in creation order), each with Now() at its deadline.
func (c *Fake) Advance(d time.Duration) {
	c.mu.Lock()
	end := c.now.Add(d)
	c.mu.Unlock()
	for {
		c.mu.Lock()
		var due []*fakeTimer
		for t := range c.timers {
			if !t.at.After(end) {
				due = append(due, t)
			}
		}
		if len(due) == 0 {
			c.now = end
			c.mu.Unlock()
			return
		}
		sort.Slice(due, func(i, j int) bool {
			if !due[i].at.Equal(due[j].at) {
				return due[i].at.Before(due[j].at)
			}
			return due[i].seq < due[j].seq
		})
		t := due[0]
		delete(c.timers, t)
		if t.at.After(c.now) {
			c.now = t.at
		}
		c.mu.Unlock()
		t.f()
	}
}
