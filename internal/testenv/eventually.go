package testenv

import (
	"testing"
	"time"
)

// WaitDeadline bounds Eventually: far longer than anything a test waits for
// takes on an idle machine, so reaching it means a hang, not a slow host
// (tests run in parallel on two shared cores).
const WaitDeadline = 60 * time.Second

// Eventually asks its condition again after pollFirst, then after twice
// the last pause, up to pollMax: a condition true within milliseconds is
// seen within milliseconds, and one that takes a minute (a batch, a lease
// expiry) is asked 20 times a second, not 200 (each ask may be an HTTP
// request and a database query: CPU the other tests of make test share).
const (
	pollFirst = 5 * time.Millisecond
	pollMax   = 50 * time.Millisecond
)

// Eventually calls cond every 5 to 50 ms (the pause doubling) until it
// returns true, and fails t with
// "timed out after 1m0s waiting until <what>" (t.Fatalf) if it has not by
// WaitDeadline. cond runs on the caller's goroutine; it may call t.Fatal.
func Eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	EventuallyWithin(t, WaitDeadline, what, cond)
}

// EventuallyWithin is Eventually bounded by within instead of WaitDeadline,
// for a test that checks a bound the code promises (a drain timeout, a
// heartbeat), not for speed.
func EventuallyWithin(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	if cond() {
		return
	}
	deadline := time.Now().Add(within)
	pause := pollFirst
	tick := time.NewTicker(pause)
	defer tick.Stop()
	for range tick.C {
		if cond() {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting until %s", within, what)
		}
		if pause < pollMax {
			pause = min(2*pause, pollMax)
			tick.Reset(pause)
		}
	}
}
