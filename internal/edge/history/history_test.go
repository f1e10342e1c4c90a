package history

import (
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	"iop/internal/clock"
	"iop/internal/edge/adminwire"
	"iop/internal/edge/api/observe"
	"iop/internal/edge/contract"
)

// providers is a Snapshotter whose providers a test sets.
type providers struct {
	mu   sync.Mutex // guards list
	list []contract.ProviderSnapshot
}

func (p *providers) set(list ...contract.ProviderSnapshot) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.list = list
}

func (p *providers) Snapshot() contract.Snapshot {
	p.mu.Lock()
	defer p.mu.Unlock()
	return contract.Snapshot{Providers: append([]contract.ProviderSnapshot(nil), p.list...)}
}

// t0 is a second start: the tests' clocks begin there.
var t0 = time.Unix(1_800_000_000, 0)

// started is a History on a fake clock at t0 with its sampler running.
func started(t *testing.T) (*History, *clock.Fake, *providers) {
	t.Helper()
	c := clock.NewFake(t0)
	snap := &providers{}
	h := New(c, snap)
	h.Start()
	t.Cleanup(h.Stop)
	return h, c, snap
}

func completed(ttft time.Duration, tokens int) observe.RequestRecord {
	return observe.RequestRecord{Outcome: contract.OutcomeCompleted, Admission: contract.AdmissionImmediate, RunID: "run",
		TimeToFirstToken: ttft, OutputTokens: tokens, TokensKnown: true}
}

func refused(admission contract.Admission, code string) observe.RequestRecord {
	return observe.RequestRecord{Outcome: contract.OutcomeRefused, Admission: admission, ErrorCode: code}
}

// byTime indexes a history's seconds.
func byTime(h adminwire.History) map[int64]adminwire.Second {
	m := make(map[int64]adminwire.Second, len(h.Data))
	for _, s := range h.Data {
		m[s.Time] = s
	}
	return m
}

func TestSecondsAggregateWhatEndedInThem(t *testing.T) {
	h, c, snap := started(t)
	snap.set(contract.ProviderSnapshot{NodeID: "n1", ProviderID: "p", InFlight: 2, Queued: 1, Capacity: 4})
	sec := t0.Unix()

	c.Advance(300 * time.Millisecond) // within the first second
	h.RequestDone(completed(100*time.Millisecond, 10))
	h.RequestDone(completed(300*time.Millisecond, 30))
	h.RequestDone(observe.RequestRecord{Outcome: contract.OutcomeUpstreamError, RunID: "r"}) // no usage, no first token
	h.RequestDone(refused(contract.AdmissionQueueFull, "queue_full"))
	h.RequestDone(refused("", "concurrency_limit_exceeded")) // a key's limit: no admission
	h.RequestDone(refused(contract.AdmissionUnknownModel, "model_not_found"))
	if got := h.Since(0); got.Through != sec-1 || len(got.Data) != 0 {
		t.Fatalf("a second still going is listed: through %d, %d seconds", got.Through, len(got.Data))
	}
	c.Advance(time.Second) // the sampler sealed the first second; now in the second one
	h.RequestDone(completed(50*time.Millisecond, 5))
	snap.set()
	c.Advance(time.Second)

	got := h.Since(0)
	if got.Object != "history" || got.IntervalSeconds != 1 || got.WindowSeconds != 900 || got.Through != sec+1 || len(got.Data) != 2 {
		t.Fatalf("history %+v, want seconds %d and %d", got, sec, sec+1)
	}
	first, second := got.Data[0], got.Data[1]
	if first.Time != sec || second.Time != sec+1 {
		t.Fatalf("times %d, %d", first.Time, second.Time)
	}
	if want := map[string]int{"completed": 2, "upstream_error": 1, "refused": 3}; fmt.Sprint(first.Requests) != fmt.Sprint(want) {
		t.Errorf("first second's requests %v, want %v", first.Requests, want)
	}
	if want := map[string]int{"queue_full": 1, "concurrency_limit_exceeded": 1, "unknown_model": 1}; fmt.Sprint(first.Refusals) != fmt.Sprint(want) {
		t.Errorf("first second's refusals %v, want %v", first.Refusals, want)
	}
	if first.OutputTokens != 40 || second.OutputTokens != 5 {
		t.Errorf("output tokens %d, %d; want 40, 5", first.OutputTokens, second.OutputTokens)
	}
	// Two times: the median is the smaller (nearest rank), the 95th the
	// larger, each exact as a bucket's midpoint kept within [min, max].
	if q := first.TimeToFirstToken; q == nil || q.Count != 2 || q.P50 != 100 || q.P95 != 300 {
		t.Errorf("first second's time to first token %+v, want 2, 100 ms, 300 ms", q)
	}
	if q := second.TimeToFirstToken; q == nil || q.Count != 1 || q.P50 != 50 || q.P95 != 50 {
		t.Errorf("second second's time to first token %+v, want 1, 50 ms, 50 ms", q)
	}
	if want := []adminwire.ProviderSample{{NodeID: "n1", ProviderID: "p", InFlight: 2, Queued: 1, Capacity: 4}}; fmt.Sprint(first.Providers) != fmt.Sprint(want) {
		t.Errorf("first second's providers %+v, want %+v", first.Providers, want)
	}
	if second.Providers == nil || len(second.Providers) != 0 {
		t.Errorf("second second's providers %+v, want none (sampled, empty)", second.Providers)
	}
	if second.Requests["refused"] != 0 || len(second.Refusals) != 0 {
		t.Errorf("second second counts %v, %v", second.Requests, second.Refusals)
	}
}

func TestQuantilesWithinBucketError(t *testing.T) {
	h, c, _ := started(t)
	// 1..200 ms, one request each: the median is 100 ms, the 95th 190 ms.
	for ms := 1; ms <= 200; ms++ {
		h.RequestDone(completed(time.Duration(ms)*time.Millisecond, 1))
	}
	c.Advance(time.Second + tickLag)
	got := h.Since(0).Data
	if len(got) != 1 || got[0].TimeToFirstToken == nil {
		t.Fatalf("seconds %+v", got)
	}
	q := got[0].TimeToFirstToken
	limit := math.Exp2(1.0/bucketsPerStep) - 1 // a bucket's relative width
	for _, c := range []struct {
		name      string
		got, want float64
	}{{"p50", q.P50, 100}, {"p95", q.P95, 190}} {
		if math.Abs(c.got-c.want)/c.want > limit {
			t.Errorf("%s %v ms, want %v ms within %.0f%%", c.name, c.got, c.want, 100*limit)
		}
	}
	if q.Count != 200 {
		t.Errorf("count %d", q.Count)
	}
	for _, d := range []time.Duration{0, time.Microsecond, time.Millisecond, time.Second, time.Hour} {
		if k := bucketOf(d); k < 0 || k >= numBuckets || (k < numBuckets-1 && d >= bucketUpper[k]) || (k > 0 && d < bucketUpper[k-1]) {
			t.Errorf("bucketOf(%v) = %d", d, k)
		}
	}
}

// TestWindowRollsOverAt900Seconds runs the history for more than its window
// with a different count each second: it lists exactly the last 900
// seconds, each with its own count, none of the overwritten ones.
func TestWindowRollsOverAt900Seconds(t *testing.T) {
	h, c, _ := started(t)
	const seconds = Window + 137
	for i := range seconds {
		for range i%5 + 1 {
			h.RequestDone(completed(0, i))
		}
		c.Advance(time.Second)
	}
	c.Advance(tickLag)
	got := h.Since(0)
	last := t0.Unix() + seconds - 1
	if got.Through != last || len(got.Data) != Window {
		t.Fatalf("through %d with %d seconds, want %d with %d", got.Through, len(got.Data), last, Window)
	}
	for j, s := range got.Data {
		i := int(s.Time - t0.Unix())
		if want := last - Window + 1 + int64(j); s.Time != want {
			t.Fatalf("second %d is %d, want %d", j, s.Time, want)
		}
		if n := i%5 + 1; s.Requests["completed"] != n || s.OutputTokens != int64(n*i) {
			t.Errorf("second %d: %v, %d tokens; want %d, %d", i, s.Requests, s.OutputTokens, n, n*i)
		}
	}
}

func TestSinceListsOnlyNewerSeconds(t *testing.T) {
	h, c, _ := started(t)
	for range 10 {
		h.RequestDone(completed(0, 1))
		c.Advance(time.Second)
	}
	c.Advance(tickLag)
	all := h.Since(0)
	if len(all.Data) != 10 {
		t.Fatalf("%d seconds, want 10", len(all.Data))
	}
	mid := all.Data[6].Time
	after := h.Since(mid)
	if after.Since != mid || len(after.Data) != 3 || after.Data[0].Time != mid+1 || after.Data[2].Time != all.Through {
		t.Errorf("since %d: %+v, want the 3 seconds after it", mid, after)
	}
	if got := h.Since(all.Through); len(got.Data) != 0 || got.Through != all.Through {
		t.Errorf("since through: %+v, want nothing", got)
	}
	// Seconds listed once do not change: a later answer agrees.
	c.Advance(time.Second)
	again := byTime(h.Since(0))
	for _, s := range all.Data {
		if fmt.Sprint(again[s.Time]) != fmt.Sprint(s) {
			t.Errorf("second %d changed: %+v, then %+v", s.Time, s, again[s.Time])
		}
	}
	if got := h.Since(-5); len(got.Data) != 11 {
		t.Errorf("since -5: %d seconds, want 11", len(got.Data))
	}
	// TestRegression: ?since=9223372036854775807 listed the whole window
	// (since+1 overflowed to the smallest int64).
	if got := h.Since(math.MaxInt64); len(got.Data) != 0 {
		t.Errorf("since MaxInt64: %d seconds, want none", len(got.Data))
	}
}

// TestRequestInSealedSecondCountsInNext: a request whose second was sealed
// (listed) while it got there counts in the next second, so a listed
// second never changes and nothing is lost.
func TestRequestInSealedSecondCountsInNext(t *testing.T) {
	h, c, _ := started(t)
	sec := t0.Unix()
	c.Advance(time.Second + tickLag) // sealed sec
	for range 3 {
		h.count(sec, outcomeIndex["completed"], -1, -1, 0, 7) // the clock read sec, its slot was sealed since
	}
	h.RequestDone(completed(0, 7)) // the clock reads sec+1
	h.count(sec+1, outcomeIndex["completed"], -1, -1, 0, 7)
	if h.add(sec, 0, -1, -1, 0, 0) {
		t.Fatalf("sealed second %d took a request", sec)
	}
	before := fmt.Sprint(h.Since(0).Data)
	if len(h.Since(0).Data) != 1 {
		t.Fatalf("listed %s, want one second", before)
	}
	c.Advance(time.Second)
	got := byTime(h.Since(0))
	if fmt.Sprint(h.Since(0).Data[:1]) != before {
		t.Errorf("listed second changed: %s, then %v", before, got[sec])
	}
	if got[sec+1].Requests["completed"] != 5 || got[sec+1].OutputTokens != 35 {
		t.Errorf("next second %+v, want 5 requests, 35 tokens", got[sec+1])
	}
}

// TestCountsNothingLostWhileSealing: requests on many goroutines while the
// sampler seals second after second all count, each once.
func TestCountsNothingLostWhileSealing(t *testing.T) {
	h, c, _ := started(t)
	const workers, each = 4, 2000
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for range each {
				h.RequestDone(completed(time.Millisecond, 1))
			}
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	// At most half the window, so that no second counted leaves it.
	for ticks := 0; ticks < Window/2; ticks++ {
		select {
		case <-done:
			ticks = Window
		default:
			c.Advance(time.Second)
		}
	}
	<-done
	c.Advance(time.Second + tickLag) // seals the second the last ones counted in
	var requests, tokens, ttft int
	for _, s := range h.Since(0).Data {
		requests += s.Requests["completed"]
		tokens += int(s.OutputTokens)
		if s.TimeToFirstToken != nil {
			ttft += s.TimeToFirstToken.Count
		}
	}
	if requests != workers*each || tokens != workers*each || ttft != workers*each {
		t.Errorf("counted %d requests, %d tokens, %d times to first token; want %d each", requests, tokens, ttft, workers*each)
	}
}

// TestProviderNamesForgottenAfterWindow: providers that come and go do not
// grow the history: a name whose last sample left the window is dropped
// and its place reused, and the memory stays within its bound.
func TestProviderNamesForgottenAfterWindow(t *testing.T) {
	h, c, snap := started(t)
	const live = 10
	for round := range 4 * Window / 100 {
		list := make([]contract.ProviderSnapshot, live)
		for i := range list {
			list[i] = contract.ProviderSnapshot{NodeID: fmt.Sprintf("node-%d", round), ProviderID: fmt.Sprint("p", i), Capacity: 1}
		}
		snap.set(list...)
		c.Advance(100 * time.Second)
	}
	h.mu.Lock()
	names, ids := len(h.names), len(h.ids)
	h.mu.Unlock()
	// The window spans 10 rounds of 100 s: at most 10 sets of names at once.
	if ids > 10*live || names > 11*live {
		t.Errorf("%d names known, %d slots for them after %d rounds; want at most %d", ids, names, 4*Window/100, 10*live)
	}
	// The bound the package doc states: 380 KiB, and 16 bytes a provider
	// a second, plus the names.
	if limit := 380<<10 + 16*Window*live + names*128; h.Bytes() > limit {
		t.Errorf("history holds %d bytes, want at most %d", h.Bytes(), limit)
	}
	got := h.Since(0)
	lastRound := fmt.Sprintf("node-%d", 4*Window/100-1)
	if s := got.Data[len(got.Data)-1]; len(s.Providers) != live || s.Providers[0].NodeID != lastRound {
		t.Errorf("last second's providers %+v, want %d of %s", s.Providers, live, lastRound)
	}
	for _, s := range got.Data {
		for _, p := range s.Providers {
			if p.NodeID == "" {
				t.Fatalf("second %d lists a forgotten provider: %+v", s.Time, s.Providers)
			}
		}
	}
}

func TestStopEndsSampling(t *testing.T) {
	h, c, _ := started(t)
	c.Advance(3 * time.Second)
	h.Stop()
	if c.Pending() != 0 {
		t.Errorf("%d timers pending after Stop", c.Pending())
	}
	through := h.Since(0).Through
	c.Advance(3 * time.Second)
	if got := h.Since(0).Through; got != through {
		t.Errorf("sealed through %d after Stop, was %d", got, through)
	}
}

// BenchmarkRequestDone is the history's cost per finished request, on the
// request's goroutine: one clock read and one slot's mutex.
func BenchmarkRequestDone(b *testing.B) {
	h := New(clock.Real(), &providers{})
	rec := completed(120*time.Millisecond, 64)
	b.ReportAllocs()
	for b.Loop() {
		h.RequestDone(rec)
	}
}

// BenchmarkRequestDoneParallel is the same with every core finishing
// requests at once (all in the same second's slot).
func BenchmarkRequestDoneParallel(b *testing.B) {
	h := New(clock.Real(), &providers{})
	rec := completed(120*time.Millisecond, 64)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			h.RequestDone(rec)
		}
	})
}
