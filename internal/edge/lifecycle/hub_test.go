package lifecycle

import (
	"fmt"
	"testing"
	"time"
)

func TestHubDeliversInOrderToEverySubscriber(t *testing.T) {
	h := NewHub(nil)
	a, b := h.Subscribe(8), h.Subscribe(8)
	if !h.Active() {
		t.Fatal("Active false with two subscribers")
	}
	for i := range 3 {
		h.Publish(Event{Type: RunAdmitted, RunID: fmt.Sprint(i)})
	}
	for _, s := range []*Subscription{a, b} {
		for i := range 3 {
			e := <-s.Events()
			if e.RunID != fmt.Sprint(i) || e.Time.IsZero() {
				t.Fatalf("event %d: %+v", i, e)
			}
		}
	}
	a.Close()
	a.Close() // idempotent
	if _, open := <-a.Events(); open {
		t.Fatal("closed subscription's channel is open")
	}
	b.Close()
	if h.Active() {
		t.Fatal("Active true with no subscriber")
	}
}

// A subscriber that does not read is dropped when its buffer fills; the
// publisher never blocks and the other subscriber keeps getting events.
func TestHubDropsASlowSubscriber(t *testing.T) {
	h := NewHub(nil)
	slow, fast := h.Subscribe(2), h.Subscribe(100)
	for i := range 5 {
		h.Publish(Event{Type: RunEnded, RunID: fmt.Sprint(i), QueueWait: 1500 * time.Millisecond})
	}
	var got []string
	for e := range slow.Events() {
		got = append(got, e.RunID)
	}
	if fmt.Sprint(got) != "[0 1]" || !slow.Dropped() {
		t.Fatalf("slow subscriber got %v, dropped %v; want the 2 it had room for, then dropped", got, slow.Dropped())
	}
	for i := range 5 {
		e := <-fast.Events()
		if e.RunID != fmt.Sprint(i) || e.QueueWaitSeconds != 1.5 {
			t.Fatalf("fast subscriber event %d: %+v", i, e)
		}
	}
	if fast.Dropped() {
		t.Fatal("fast subscriber dropped")
	}
	fast.Close()
	slow.Close() // no-op after the drop
}

func TestHubCloseEndsSubscriptions(t *testing.T) {
	h := NewHub(func() time.Time { return time.Unix(7, 0) })
	s := h.Subscribe(0)
	h.Publish(Event{Type: NodeConnected, NodeID: "n"})
	h.Close()
	h.Close()
	e, ok := <-s.Events()
	if !ok || e.NodeID != "n" || !e.Time.Equal(time.Unix(7, 0)) {
		t.Fatalf("buffered event %+v, %v", e, ok)
	}
	if _, ok := <-s.Events(); ok {
		t.Fatal("channel open after Hub.Close")
	}
	if s.Dropped() {
		t.Fatal("closed counted as dropped")
	}
	late := h.Subscribe(1)
	if _, ok := <-late.Events(); ok {
		t.Fatal("subscription to a closed hub is open")
	}
	h.Publish(Event{Type: NodeFenced}) // nobody left: no panic
}

func TestObservers(t *testing.T) {
	var got []Type
	o := Observers{ObserverFunc(func(e Event) { got = append(got, e.Type) }), ObserverFunc(func(e Event) { got = append(got, e.Type+"!") })}
	o.Observe(Event{Type: RunQueued})
	if fmt.Sprint(got) != "[run_queued run_queued!]" {
		t.Fatal(got)
	}
}
