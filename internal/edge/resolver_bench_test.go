package edge

import (
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"iop/internal/clock"
	"iop/internal/wire/nodev1"
)

// benchService is a Service with only what its resolver reads: a registry
// with nodes nodes of two providers each (one normalized, one tunnel),
// all serving "m", a catalog and circuit breakers, one of them open.
func benchService(b *testing.B, nodes int) (*Service, []*conn) {
	b.Helper()
	clk := clock.NewFake(time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC))
	reg := newRegistry(clk.Now)
	s := &Service{reg: reg, cat: newCatalog(nil, reg), breakers: newBreakers(BreakerConfig{Failures: 1, CoolDown: time.Hour, MaxCoolDown: time.Hour}, clk, slog.New(slog.NewTextHandler(io.Discard, nil)))}
	var conns []*conn
	for i := range nodes {
		c, err := parseHello(hello(fmt.Sprintf("node-%03d", i), prov("p", normalized, 4, "m", "other"), prov("q", tunnel, 4, "m")), clk.Now())
		if err != nil {
			b.Fatal(err)
		}
		reg.add(c)
		conns = append(conns, c)
	}
	tk, ok := s.breakers.acquire(providerKey{"node-000", "q"})
	if !ok {
		b.Fatal("out of rotation")
	}
	tk.done(outcomeFailed) // opens it
	return s, conns
}

// BenchmarkResolver measures one call of the request-local resolver the
// scheduler calls under its lock (catalog lookup, needs filter, circuit
// check): one op is one resolution of a model served by 2 providers of
// each of 16 nodes. "parallel" resolves on every core; "with_writer"
// does so while one goroutine keeps changing a provider's health (a
// ProviderUpdate each time), as a fleet's updates do.
func BenchmarkResolver(b *testing.B) {
	needs := []string{NeedCompletion}
	b.Run("serial", func(b *testing.B) {
		s, _ := benchService(b, 16)
		resolve := s.resolver("m", needs, nil)
		b.ReportAllocs()
		for b.Loop() {
			if c, err := resolve(); err != nil || len(c) != 31 {
				b.Fatalf("resolve = %d candidates, %v", len(c), err)
			}
		}
	})
	b.Run("parallel", func(b *testing.B) {
		s, _ := benchService(b, 16)
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			resolve := s.resolver("m", needs, nil)
			for pb.Next() {
				if c, err := resolve(); err != nil || len(c) != 31 {
					b.Errorf("resolve = %d candidates, %v", len(c), err)
					return
				}
			}
		})
	})
	b.Run("with_writer", func(b *testing.B) {
		s, conns := benchService(b, 16)
		kick, done := make(chan struct{}, 1), make(chan struct{})
		go func() {
			defer close(done)
			i := 0
			for range kick {
				i++
				u := &nodev1.ProviderUpdate{ProviderId: "p", Healthy: i%2 == 0}
				if _, ok := s.reg.update(conns[15], u); !ok {
					panic("update refused")
				}
			}
		}()
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			resolve := s.resolver("m", needs, nil)
			for n := 0; pb.Next(); n++ {
				if n%64 == 0 {
					select { // one update per 64 resolutions, at most one pending
					case kick <- struct{}{}:
					default:
					}
				}
				if c, err := resolve(); err != nil || len(c) < 30 {
					b.Errorf("resolve = %d candidates, %v", len(c), err)
					return
				}
			}
		})
		close(kick)
		<-done
	})
}

// BenchmarkRegistryUpdate measures one writer of the registry: a
// ProviderUpdate that flips a provider's health, on a registry of 16 live
// nodes of 2 providers and gone nodes gone (each with its own model name,
// remembered for ForgetAfter). One op is one update.
func BenchmarkRegistryUpdate(b *testing.B) {
	for _, gone := range []int{0, 10_000} {
		b.Run(fmt.Sprintf("gone=%d", gone), func(b *testing.B) {
			s, conns := benchService(b, 16)
			for i := range gone {
				c, err := parseHello(hello(fmt.Sprintf("gone-%05d", i), prov("p", normalized, 1, fmt.Sprintf("m-%05d", i))), time.Time{})
				if err != nil {
					b.Fatal(err)
				}
				s.reg.add(c)
				s.reg.remove(c)
			}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				i++
				if _, ok := s.reg.update(conns[15], &nodev1.ProviderUpdate{ProviderId: "p", Healthy: i%2 == 0}); !ok {
					b.Fatal("update refused")
				}
			}
		})
	}
}
