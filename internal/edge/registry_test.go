package edge

import (
	"errors"
	"testing"
	"time"

	"iop/internal/scheduler"
	"iop/internal/wire/nodev1"
)

func TestOutboxOverflowBreaksConn(t *testing.T) {
	c, err := parseHello(hello("n1", prov("p1", normalized, 1, "m1")), time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	m := &nodev1.EdgeMessage{Msg: &nodev1.EdgeMessage_Heartbeat{Heartbeat: &nodev1.Heartbeat{}}}
	for i := 0; i < maxOutbox; i++ {
		if !c.enqueue(m) {
			t.Fatalf("enqueue %d failed", i)
		}
	}
	if c.enqueue(m) {
		t.Fatal("enqueue past the backlog limit succeeded")
	}
	select {
	case <-c.broken:
	default:
		t.Fatal("overflow did not mark the connection broken")
	}
	if got := len(c.takeOutbox()); got != maxOutbox {
		t.Fatalf("outbox %d, want %d", got, maxOutbox)
	}
	c.close()
	if c.enqueue(m) {
		t.Fatal("enqueue on a closed connection succeeded")
	}
}

func TestProviderUpdateIgnored(t *testing.T) {
	reg := newRegistry(time.Now)
	c, err := parseHello(hello("n1", prov("p1", normalized, 2, "m1")), time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	reg.add(c)
	for _, u := range []*nodev1.ProviderUpdate{
		{ProviderId: "nope", Healthy: true, Capacity: 3},
		{ProviderId: "p1", Healthy: true, Capacity: -1},
		{ProviderId: "p1", Healthy: true, LongCapacity: -1},
	} {
		if _, ok := reg.update(c, u); ok {
			t.Errorf("update %v applied", u)
		}
	}
	ch, ok := reg.update(c, &nodev1.ProviderUpdate{ProviderId: "p1", Healthy: true, Capacity: 5})
	if !ok || !ch.capacityChanged || ch.healthChanged || ch.capacity != 5 || ch.longCapacity != 0 {
		t.Errorf("update = %+v, %v; want capacity 5 with long following it", ch, ok)
	}
	reg.remove(c)
	if _, ok := reg.update(c, &nodev1.ProviderUpdate{ProviderId: "p1", Capacity: 4}); ok {
		t.Error("update of a removed connection applied")
	}
}

func TestCatalogPrefersAliasOrder(t *testing.T) {
	reg := newRegistry(time.Now)
	c, err := parseHello(hello("n1", prov("both", normalized, 1, "small", "big"), prov("small-only", normalized, 1, "small")), time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	reg.add(c)
	cat := newCatalog(map[string]ModelConfig{"m": {Targets: []string{"big", "small"}}}, reg)
	cands, _, err := cat.resolve("m", nil)
	if err != nil {
		t.Fatal(err)
	}
	// One candidate per target a provider serves, in alias order within
	// a provider: the scheduler takes the first unless another is loaded.
	if len(cands) != 3 || cands[0].ProviderID != "both" || cands[0].Target != "big" || cands[1].ProviderID != "both" || cands[1].Target != "small" ||
		cands[2].ProviderID != "small-only" || cands[2].Target != "small" {
		t.Fatalf("candidates %+v", cands)
	}
	if _, _, err := cat.resolve("nothing", nil); !errors.Is(err, scheduler.ErrUnknownModel) {
		t.Fatalf("resolve(unknown) = %v, want ErrUnknownModel", err)
	}
}
