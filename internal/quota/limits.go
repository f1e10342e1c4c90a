package quota

import (
	"fmt"
	"math"
	"time"
)

// Month is the length of the "per month" windows: 30 days.
const Month = 30 * 24 * time.Hour

// Window is one kind of bound: what it counts (Unit) over a sliding
// window of Length ending now.
type Window struct {
	// Name is its configuration field.
	Name string
	// Unit is what it counts: "tokens", "requests", "gpu_ms" (milliseconds
	// a provider slot was held, times the provider's cost_weight) or
	// "micros" (millionths of the price table's currency).
	Unit string
	// Length is the window: a minute, a day or a Month.
	Length time.Duration
}

// Windows is every window a Bounds has, in Bounds order.
var Windows = [NumWindows]Window{
	{"tokens_per_minute", "tokens", time.Minute},
	{"tokens_per_day", "tokens", 24 * time.Hour},
	{"requests_per_minute", "requests", time.Minute},
	{"requests_per_day", "requests", 24 * time.Hour},
	{"gpu_seconds_per_day", "gpu_ms", 24 * time.Hour},
	{"gpu_seconds_per_month", "gpu_ms", Month},
	{"budget_per_day", "micros", 24 * time.Hour},
	{"budget_per_month", "micros", Month},
}

// NumWindows is the number of windows.
const NumWindows = 8

// Bounds are one scope's limits, one per window of Windows in that order,
// in the window's Unit; 0 means no limit.
type Bounds [NumWindows]int64

// Any reports whether some window is limited.
func (b Bounds) Any() bool { return b != Bounds{} }

// Limits are a key's or a team's quotas as configured (YAML, inline in a
// key or a team). Every field 0 means no limit.
//
//	tokens_per_minute: 10000   # counted as tokens_counted says
//	tokens_per_day: 2000000
//	tokens_counted: total      # total (default) | input | output
//	requests_per_day: 5000
//	gpu_seconds_per_day: 3600  # slot-held seconds × the provider's cost_weight
//	gpu_seconds_per_month: 36000
//	budget_per_day: 5          # currency of the prices table
//	budget_per_month: 100
//	uncapped: clamp            # a request without max_tokens: clamp (default) | refuse
type Limits struct {
	TokensPerMinute    int64   `yaml:"tokens_per_minute,omitempty" json:"tokens_per_minute,omitempty"`
	TokensPerDay       int64   `yaml:"tokens_per_day,omitempty" json:"tokens_per_day,omitempty"`
	TokensCounted      string  `yaml:"tokens_counted,omitempty" json:"tokens_counted,omitempty"`
	RequestsPerDay     int64   `yaml:"requests_per_day,omitempty" json:"requests_per_day,omitempty"`
	GPUSecondsPerDay   float64 `yaml:"gpu_seconds_per_day,omitempty" json:"gpu_seconds_per_day,omitempty"`
	GPUSecondsPerMonth float64 `yaml:"gpu_seconds_per_month,omitempty" json:"gpu_seconds_per_month,omitempty"`
	BudgetPerDay       float64 `yaml:"budget_per_day,omitempty" json:"budget_per_day,omitempty"`
	BudgetPerMonth     float64 `yaml:"budget_per_month,omitempty" json:"budget_per_month,omitempty"`
	Uncapped           string  `yaml:"uncapped,omitempty" json:"uncapped,omitempty"`
}

// Token kinds of Limits.TokensCounted.
const (
	CountTotal  = "total"
	CountInput  = "input"
	CountOutput = "output"
)

// Uncapped policies of Limits.Uncapped.
const (
	UncappedClamp  = "clamp"
	UncappedRefuse = "refuse"
)

// Validate reports the first problem of l: a negative or non-finite
// limit, an unknown tokens_counted or uncapped. Errors wrap
// ErrInvalidLimits.
func (l Limits) Validate() error {
	for _, f := range []struct {
		name string
		v    float64
	}{
		{"tokens_per_minute", float64(l.TokensPerMinute)}, {"tokens_per_day", float64(l.TokensPerDay)},
		{"requests_per_day", float64(l.RequestsPerDay)},
		{"gpu_seconds_per_day", l.GPUSecondsPerDay}, {"gpu_seconds_per_month", l.GPUSecondsPerMonth},
		{"budget_per_day", l.BudgetPerDay}, {"budget_per_month", l.BudgetPerMonth},
	} {
		if f.v < 0 || math.IsNaN(f.v) || math.IsInf(f.v, 0) || f.v > 1e15 {
			return fmt.Errorf("%w: %s %v is not a limit (0 = none)", ErrInvalidLimits, f.name, f.v)
		}
	}
	switch l.TokensCounted {
	case "", CountTotal, CountInput, CountOutput:
	default:
		return fmt.Errorf("%w: tokens_counted %q is none of total, input, output", ErrInvalidLimits, l.TokensCounted)
	}
	switch l.Uncapped {
	case "", UncappedClamp, UncappedRefuse:
	default:
		return fmt.Errorf("%w: uncapped %q is none of clamp, refuse", ErrInvalidLimits, l.Uncapped)
	}
	return nil
}

// Bounds converts l to Bounds, with requestsPerMinute (a team's; a key's
// is its token bucket in package auth, not a window here).
func (l Limits) Bounds(requestsPerMinute int64) Bounds {
	return Bounds{
		l.TokensPerMinute, l.TokensPerDay, requestsPerMinute, l.RequestsPerDay,
		int64(math.Ceil(l.GPUSecondsPerDay * 1000)), int64(math.Ceil(l.GPUSecondsPerMonth * 1000)),
		int64(math.Ceil(l.BudgetPerDay * 1e6)), int64(math.Ceil(l.BudgetPerMonth * 1e6)),
	}
}

// Any reports whether l limits anything.
func (l Limits) Any() bool { return l.Bounds(0).Any() }

// Price is one model's price, in currency per million tokens (so also
// currency micro-units per token).
type Price struct {
	Input  float64 `yaml:"input" json:"input"`
	Output float64 `yaml:"output" json:"output"`
}

// Validate reports a negative or non-finite price (ErrInvalidLimits).
func (p Price) Validate() error {
	for _, v := range []float64{p.Input, p.Output} {
		if v < 0 || math.IsNaN(v) || math.IsInf(v, 0) || v > 1e9 {
			return fmt.Errorf("%w: price %v per million tokens", ErrInvalidLimits, v)
		}
	}
	return nil
}
