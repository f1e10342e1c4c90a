package testenv

import (
	"testing"
	"time"
)

// WaitDeadline bounds Eventually: far longer than anything a test waits for
// takes on an idle machine, so reaching it means a hang, not a slow host
// (tests run in parallel on two shared cores).
const WaitDeadline = 60 * time.Second

// pollEvery is how often Eventually asks its condition again.
const pollEvery = 5 * time.Millisecond

// Eventually calls cond every 5ms until it returns true, and fails t with
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
	tick := time.NewTicker(pollEvery)
	defer tick.Stop()
	for range tick.C {
		if cond() {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting until %s", within, what)
		}
	}
}
