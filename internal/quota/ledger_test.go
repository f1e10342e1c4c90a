package quota

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"iop/internal/clock"
)

func newLedger(t *testing.T, key Scope, team *Scope, prices map[string]Price) (*Ledger, *clock.Fake) {
	t.Helper()
	clk := clock.NewFake(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	l := New(Config{Clock: clk})
	teams := map[string]Scope{}
	if team != nil {
		key.Team = "t"
		teams["t"] = *team
	}
	l.Configure(map[string]Scope{"k": key}, teams, prices)
	return l, clk
}

func TestReserveRefusesWithTheWindowAndWhenItFits(t *testing.T) {
	t.Parallel()
	l, clk := newLedger(t, Scope{Bounds: Limits{TokensPerMinute: 1000}.Bounds()}, nil, nil)
	r1, err := l.Reserve("k", Usage{InputTokens: 100, OutputTokens: 500})
	if err != nil {
		t.Fatal(err)
	}
	clk.Advance(10 * time.Second)
	r1.Settle(Usage{InputTokens: 100, OutputTokens: 300}) // 400 settled at 12:00:10
	r2, err := l.Reserve("k", Usage{InputTokens: 100, OutputTokens: 400})
	if err != nil {
		t.Fatal(err)
	}
	_, err = l.Reserve("k", Usage{InputTokens: 100, OutputTokens: 100})
	var ref *Refusal
	if !errors.As(err, &ref) || !errors.Is(err, ErrOverQuota) {
		t.Fatalf("err %v, want a *Refusal", err)
	}
	want := Refusal{Scope: "key", Name: "k", Window: "tokens_per_minute", Limit: 1000, Asked: 200, Used: 900,
		ResetAt: time.Date(2026, 3, 1, 12, 1, 11, 0, time.UTC), RetryAfter: 61 * time.Second} // the 400 leave at 12:00:10 + 1s granule + 1m
	if *ref != want {
		t.Fatalf("refusal %+v\nwant    %+v", *ref, want)
	}
	_, err = l.Reserve("k", Usage{InputTokens: 1001})
	if !errors.As(err, &ref) || !ref.Never {
		t.Fatalf("an ask above the limit: %v, want Never", err)
	}
	r2.Cancel()
	r2.Settle(Usage{InputTokens: 5})
	if st := l.Stats(); st.Outstanding != 0 || st.DoubleSettles != 1 {
		t.Fatalf("stats %+v", st)
	}
	clk.Advance(61 * time.Second)
	if _, err := l.Reserve("k", Usage{InputTokens: 1000}); err != nil {
		t.Fatalf("after the window: %v", err)
	}
}

func TestReserveUpToClampsToTheRoomOfKeyAndTeam(t *testing.T) {
	t.Parallel()
	team := Scope{Bounds: Limits{TokensPerDay: 700}.Bounds()}
	l, _ := newLedger(t, Scope{Bounds: Limits{TokensPerMinute: 1000}.Bounds()}, &team, nil)
	r, err := l.ReserveUpTo("k", Usage{InputTokens: 200, OutputTokens: 4096}, 1)
	if err != nil {
		t.Fatal(err)
	}
	if got := r.Ask().OutputTokens; got != 500 {
		t.Fatalf("clamped to %d output tokens, want the team's room 500", got)
	}
	if _, err := l.ReserveUpTo("k", Usage{InputTokens: 1, OutputTokens: 4096}, 1); !errors.Is(err, ErrOverQuota) {
		t.Fatalf("a full team: %v", err)
	}
	var ref *Refusal
	if _, err := l.Reserve("k", Usage{OutputTokens: 1}); !errors.As(err, &ref) || ref.Scope != "team" || ref.Window != "tokens_per_day" {
		t.Fatalf("err %v, want the team's tokens_per_day", err)
	}
}

func TestBudgetCountsPricesAndAnUnknownPriceNeverBlocks(t *testing.T) {
	t.Parallel()
	var logs bytes.Buffer
	clk := clock.NewFake(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	l := New(Config{Clock: clk, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	// 0.5 currency a day; 2 per million input tokens, 8 per million output.
	l.Configure(map[string]Scope{"k": {Bounds: Limits{BudgetPerDay: 0.5}.Bounds()}}, nil,
		map[string]Price{"big": {Input: 2, Output: 8}})
	r, err := l.Reserve("k", Usage{Model: "big", InputTokens: 10_000, OutputTokens: 50_000}) // 0.02 + 0.4
	if err != nil {
		t.Fatal(err)
	}
	var ref *Refusal
	if _, err := l.Reserve("k", Usage{Model: "big", InputTokens: 10_000, OutputTokens: 10_000}); !errors.As(err, &ref) ||
		ref.Window != "budget_per_day" || ref.Used != 420_000 || ref.Asked != 100_000 {
		t.Fatalf("err %v, want budget_per_day 420000 used 100000 asked (micros)", err)
	}
	r.Settle(Usage{Model: "big", InputTokens: 10_000, OutputTokens: 1_000}) // 0.028
	for range 3 {
		if _, err := l.Reserve("k", Usage{Model: "mystery", InputTokens: 1 << 30}); err != nil {
			t.Fatalf("an unpriced model was refused: %v", err)
		}
	}
	if n := strings.Count(logs.String(), "no price for model"); n != 1 {
		t.Fatalf("logged %d times, want once:\n%s", n, logs.String())
	}
}

func TestGPUSecondsWeightAndStatus(t *testing.T) {
	t.Parallel()
	l, clk := newLedger(t, Scope{Bounds: Limits{GPUSecondsPerDay: 100}.Bounds()}, nil, nil)
	r, err := l.Reserve("k", Usage{SlotTime: 30 * time.Second, CostWeight: 2})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Reserve("k", Usage{SlotTime: 41 * time.Second}); !errors.Is(err, ErrOverQuota) {
		t.Fatalf("60 of 100 GPU-seconds reserved, 41 more: %v", err)
	}
	clk.Advance(time.Minute)
	r.Settle(Usage{SlotTime: 10 * time.Second, CostWeight: 2})
	st := l.Status("k")
	if len(st) != 1 || st[0].Window.Name != "gpu_seconds_per_day" || st[0].Used != 20_000 || st[0].Remaining() != 80_000 {
		t.Fatalf("status %+v", st)
	}
	if want := time.Date(2026, 3, 2, 12, 24, 0, 0, time.UTC); !st[0].ResetAt.Equal(want) {
		t.Fatalf("reset at %s, want %s (the 24-minute granule's end + a day)", st[0].ResetAt, want)
	}
}

func TestConfigureKeepsUsageByName(t *testing.T) {
	t.Parallel()
	l, _ := newLedger(t, Scope{Bounds: Limits{RequestsPerDay: 2}.Bounds()}, nil, nil)
	r, _ := l.Reserve("k", Usage{})
	r.Settle(Usage{})
	l.Configure(map[string]Scope{"k": {Bounds: Limits{RequestsPerDay: 3}.Bounds()}}, nil, nil)
	if st := l.Status("k"); len(st) != 1 || st[0].Used != 1 || st[0].Limit != 3 {
		t.Fatalf("after Configure: %+v", st)
	}
	if !l.Limited("k") || l.Limited("other") {
		t.Fatal("Limited")
	}
}

func TestCollectorExportsRemaining(t *testing.T) {
	t.Parallel()
	l, _ := newLedger(t, Scope{Bounds: Limits{TokensPerMinute: 1000}.Bounds()}, nil, nil)
	if _, err := l.Reserve("k", Usage{InputTokens: 300}); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(NewCollector(l))
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			got = append(got, fmt.Sprintf("%s %v", mf.GetName(), m.GetGauge().GetValue()))
		}
	}
	if want := []string{"iop_quota_limit 1000", "iop_quota_remaining 700"}; !slices.Equal(got, want) {
		t.Fatalf("gathered %q, want %q", got, want)
	}
}

// TestFillRefusesTheMinuteOnly: a new leader's Fill of the minute windows
// refuses every reservation that counts in one of them until a minute
// (and a granule) has passed, names when it fits, and leaves the day
// windows as they were.
func TestFillRefusesTheMinuteOnly(t *testing.T) {
	t.Parallel()
	l, clk := newLedger(t, Scope{Bounds: Limits{TokensPerMinute: 1000, TokensPerDay: 5000, RequestsPerMinute: 10}.Bounds()}, nil, nil)
	r, err := l.Reserve("k", Usage{InputTokens: 100, OutputTokens: 200})
	if err != nil {
		t.Fatal(err)
	}
	l.Fill(time.Minute)
	_, err = l.Reserve("k", Usage{InputTokens: 1})
	var ref *Refusal
	if !errors.As(err, &ref) || ref.Window != "tokens_per_minute" || ref.Never || ref.RetryAfter != 61*time.Second {
		t.Fatalf("after Fill: %v, want a tokens_per_minute refusal for 61s", err)
	}
	day := l.Status("k")[1]
	if day.Window.Name != "tokens_per_day" || day.Used != 300 {
		t.Fatalf("the day window after Fill: %+v, want only the 300 reserved", day)
	}
	r.Settle(Usage{InputTokens: 100, OutputTokens: 100})
	clk.Advance(61 * time.Second)
	if _, err := l.Reserve("k", Usage{InputTokens: 100, OutputTokens: 600}); err != nil {
		t.Fatalf("a minute after Fill: %v", err)
	}
}

// TestResetForgetsAndOldReservationsSettleAsNoOps: Reset empties every
// window; a reservation taken before settles as a no-op (it is counted
// anew by Restore or Adopt), and Restore counts its requests.
func TestResetForgetsAndOldReservationsSettleAsNoOps(t *testing.T) {
	t.Parallel()
	l, clk := newLedger(t, Scope{Bounds: Limits{TokensPerMinute: 1000, RequestsPerDay: 5}.Bounds()}, nil, nil)
	old, err := l.Reserve("k", Usage{InputTokens: 900})
	if err != nil {
		t.Fatal(err)
	}
	l.Reset()
	if st := l.Stats(); st.Outstanding != 0 {
		t.Fatalf("stats after Reset %+v", st)
	}
	l.Restore("k", clk.Now(), Usage{InputTokens: 400}, 3)
	adopted := l.Adopt("k", old.Ask())
	old.Settle(Usage{InputTokens: 900})
	ws := l.Status("k")
	if ws[0].Used != 1300 || ws[1].Used != 4 {
		t.Fatalf("windows %+v, want 400 restored + 900 adopted tokens, 3 + 1 requests", ws)
	}
	adopted.Settle(Usage{InputTokens: 50})
	if ws := l.Status("k"); ws[0].Used != 450 || ws[1].Used != 4 {
		t.Fatalf("windows after the adopted settled: %+v", ws)
	}
}

// TestHeldSettlesOnce: a reservation another ledger holds calls its end
// once, with the usage (Settle) or ran false (Cancel).
func TestHeldSettlesOnce(t *testing.T) {
	t.Parallel()
	var calls []string
	r := Held(Usage{OutputTokens: 10}, func(used Usage, ran bool) { calls = append(calls, fmt.Sprint(used.OutputTokens, ran)) })
	if r.Ask().OutputTokens != 10 {
		t.Fatalf("ask %+v", r.Ask())
	}
	r.Settle(Usage{OutputTokens: 7})
	r.Cancel()
	r.Settle(Usage{OutputTokens: 9})
	c := Held(Usage{}, func(used Usage, ran bool) { calls = append(calls, fmt.Sprint(used.OutputTokens, ran)) })
	c.Cancel()
	c.Settle(Usage{})
	if got := strings.Join(calls, ","); got != "7 true,0 false" {
		t.Fatalf("ends %q", got)
	}
}
