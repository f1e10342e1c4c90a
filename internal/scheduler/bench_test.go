package scheduler

import (
	"context"
	"fmt"
	"testing"
	"time"

	"iop/internal/clock"
)

// benchScheduler returns a scheduler over 1,000 providers on 100 nodes:
// group "busy" lists the first 500 (all full, with waiters queued on them)
// and group "m" lists 4 of the others (free).
func benchScheduler(b *testing.B, waiters int) (*Scheduler, Request) {
	b.Helper()
	clk := clock.NewFake(time.Unix(0, 0))
	s, err := New(Config{Default: Policy{MaxQueue: waiters + 1, QueueTimeout: time.Hour}, Clock: clk})
	if err != nil {
		b.Fatal(err)
	}
	w := newWorld()
	var busy, free []Candidate
	for n := range 100 {
		node := fmt.Sprintf("node-%03d", n)
		var specs []ResourceSpec
		for p := range 10 {
			id := fmt.Sprintf("prov-%d", p)
			specs = append(specs, ResourceSpec{ProviderID: id, Capacity: 1})
			c := cand(node, 1, id)
			if n < 50 {
				busy = append(busy, c)
			} else if len(free) < 4 {
				free = append(free, c)
			}
		}
		if err := s.Activate(node, 1, specs, nil); err != nil {
			b.Fatal(err)
		}
	}
	w.set("busy", busy...)
	w.set("m", free...)
	for _, c := range busy {
		w.set("one", c)
		if _, err := s.Admit(context.Background(), Request{Group: "one", Resolve: w.resolver("one")}); err != nil {
			b.Fatal(err)
		}
	}
	for i := range waiters {
		// Each waiter lists one busy provider, spread over all of them.
		g := fmt.Sprintf("busy-%d", i%len(busy))
		w.set(g, busy[i%len(busy)])
		if _, q, err := s.enqueue(Request{Group: g, Resolve: w.resolver(g)}); err != nil || q == nil {
			b.Fatalf("enqueue: %v", err)
		}
	}
	return s, Request{Group: "m", Resolve: w.resolver("m")}
}

// BenchmarkAdmitRelease is an uncontended admit + release with waiters
// queued elsewhere: its cost must not grow with them.
func BenchmarkAdmitRelease(b *testing.B) {
	for _, waiters := range []int{10, 10000} {
		b.Run(fmt.Sprintf("waiters=%d", waiters), func(b *testing.B) {
			s, req := benchScheduler(b, waiters)
			ctx := context.Background()
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				l, err := s.Admit(ctx, req)
				if err != nil {
					b.Fatal(err)
				}
				l.Release("done")
			}
		})
	}
}

// BenchmarkHandover releases a slot that a queued waiter takes over, then
// queues a new waiter, keeping the queue at its size: release + handover +
// enqueue, O(log waiters).
func BenchmarkHandover(b *testing.B) {
	for _, waiters := range []int{10, 10000} {
		b.Run(fmt.Sprintf("waiters=%d", waiters), func(b *testing.B) {
			clk := clock.NewFake(time.Unix(0, 0))
			s, err := New(Config{Default: Policy{MaxQueue: waiters + 1, QueueTimeout: time.Hour}, Clock: clk})
			if err != nil {
				b.Fatal(err)
			}
			if err := s.Activate("n", 1, []ResourceSpec{{ProviderID: "p", Capacity: 1}}, nil); err != nil {
				b.Fatal(err)
			}
			w := newWorld()
			w.set("m", cand("n", 1, "p"))
			req := Request{Group: "m", Resolve: w.resolver("m")}
			held, err := s.Admit(context.Background(), req)
			if err != nil {
				b.Fatal(err)
			}
			queue := make([]*waiter, 0, waiters)
			for range waiters {
				_, q, err := s.enqueue(req)
				if err != nil {
					b.Fatal(err)
				}
				queue = append(queue, q)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				held.Release("done")
				r := <-queue[0].ch
				held = r.lease
				queue = queue[1:]
				_, q, err := s.enqueue(req)
				if err != nil {
					b.Fatal(err)
				}
				queue = append(queue, q)
			}
		})
	}
}

// BenchmarkHandoverFair is BenchmarkHandover with fairness on and the
// waiters spread over 100 flows of weights 1 to 4, a tenth of them
// critical and a tenth sheddable: release + fair handover + enqueue, still
// O(log waiters).
func BenchmarkHandoverFair(b *testing.B) {
	for _, waiters := range []int{10, 10000} {
		b.Run(fmt.Sprintf("waiters=%d", waiters), func(b *testing.B) {
			clk := clock.NewFake(time.Unix(0, 0))
			s, err := New(Config{Default: Policy{MaxQueue: waiters + 1, QueueTimeout: time.Hour, Fairness: FairnessOn}, Clock: clk})
			if err != nil {
				b.Fatal(err)
			}
			if err := s.Activate("n", 1, []ResourceSpec{{ProviderID: "p", Capacity: 1}}, nil); err != nil {
				b.Fatal(err)
			}
			w := newWorld()
			w.set("m", cand("n", 1, "p"))
			reqs := make([]Request, 100)
			for i := range reqs {
				prio := PriorityStandard
				switch i % 10 {
				case 0:
					prio = PriorityCritical
				case 1:
					prio = PrioritySheddable
				}
				reqs[i] = Request{Group: "m", Resolve: w.resolver("m"), Flow: fmt.Sprintf("flow-%d", i), Weight: 1 + i%4, Priority: prio}
			}
			held, err := s.Admit(context.Background(), reqs[0])
			if err != nil {
				b.Fatal(err)
			}
			r := s.resources[resourceKey{"n", "p"}]
			for i := range waiters {
				if _, q, err := s.enqueue(reqs[i%len(reqs)]); err != nil || q == nil {
					b.Fatal(err)
				}
			}
			next := waiters
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				held.Release("done")
				held = r.leases.head // the lease the handover reserved
				if _, q, err := s.enqueue(reqs[next%len(reqs)]); err != nil || q == nil {
					b.Fatal(err)
				}
				next++
			}
		})
	}
}
