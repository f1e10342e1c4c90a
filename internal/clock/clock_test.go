package clock

import (
	"fmt"
	"testing"
	"time"
)

func TestFakeRunsDueTimersInDeadlineOrder(t *testing.T) {
	c := NewFake(time.Unix(100, 0))
	var got []string
	c.AfterFunc(3*time.Second, func() { got = append(got, fmt.Sprint("c@", c.Now().Unix())) })
	c.AfterFunc(time.Second, func() { got = append(got, fmt.Sprint("a@", c.Now().Unix())) })
	stopped := c.AfterFunc(2*time.Second, func() { got = append(got, "stopped") })
	c.AfterFunc(time.Second, func() {
		got = append(got, fmt.Sprint("b@", c.Now().Unix()))
		// A callback may schedule more; it runs in the same Advance if due.
		c.AfterFunc(time.Second, func() { got = append(got, fmt.Sprint("d@", c.Now().Unix())) })
	})
	if !stopped.Stop() || stopped.Stop() {
		t.Fatal("Stop should report true once, then false")
	}
	c.Advance(2 * time.Second)
	if want := "[a@101 b@101 d@102]"; fmt.Sprint(got) != want {
		t.Fatalf("fired %v, want %s", got, want)
	}
	if c.Pending() != 1 || c.Now() != time.Unix(102, 0) {
		t.Fatalf("pending %d at %v", c.Pending(), c.Now())
	}
	c.Advance(time.Second)
	if len(got) != 4 || got[3] != "c@103" {
		t.Fatalf("fired %v", got)
	}
}
