package auth

import (
	"errors"
	"testing"
	"time"
)

// TestAdoptAndExhaustRate: an adopted slot counts against max_concurrent
// even above it, and is given back once; ExhaustRate leaves nothing of
// the minute's allowance, which then refills at the steady rate.
func TestAdoptAndExhaustRate(t *testing.T) {
	now := time.Unix(1000, 0)
	k, err := NewKeyring("keys", []Key{{Name: "a", Hash: Hash("s"), MaxConcurrent: 1, RequestsPerMinute: 3}}, func() time.Time { return now })
	if err != nil {
		t.Fatal(err)
	}
	c := k.ByName("a")
	p1, p2 := c.Adopt(), c.Adopt()
	if c.InFlight() != 2 {
		t.Fatalf("in flight %d after two adoptions, want 2", c.InFlight())
	}
	var le *LimitError
	if _, err := c.Admit(); !errors.As(err, &le) || le.Limit != "max_concurrent" {
		t.Fatalf("Admit above max_concurrent: %v", err)
	}
	p1.Release()
	p1.Release()
	p2.Release()
	if c.InFlight() != 0 {
		t.Fatalf("in flight %d after the releases, want 0", c.InFlight())
	}
	k.ExhaustRates()
	if _, err := c.Admit(); !errors.As(err, &le) || le.Limit != "requests_per_minute" {
		t.Fatalf("Admit after ExhaustRate: %v, want requests_per_minute", err)
	}
	now = now.Add(20 * time.Second) // one request's worth at 3 per minute
	p, err := c.Admit()
	if err != nil {
		t.Fatalf("Admit 20 s later: %v", err)
	}
	p.Release()
	if _, err := c.Admit(); err == nil {
		t.Fatal("a second request within the same 20 s was admitted")
	}
}
