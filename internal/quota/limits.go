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
//	requests_per_minute: 60    # a sliding window (a key's own requests_per_minute is a token bucket)
//	requests_per_day: 5000
//	gpu_seconds_per_day: 3600  # slot-held seconds × the provider's cost_weight
//	gpu_seconds_per_month: 36000
//	budget_per_day: 5          # currency of the prices table
//	budget_per_month: 100
//	uncapped: clamp            # a key's request without max_tokens: clamp (default) | refuse
//	default_max_tokens: 1024   # a key's cap for a request without one; 0 = what fits
type Limits struct {
	TokensPerMinute    int64   `yaml:"tokens_per_minute" json:"tokens_per_minute,omitempty"`
	TokensPerDay       int64   `yaml:"tokens_per_day" json:"tokens_per_day,omitempty"`
	TokensCounted      string  `yaml:"tokens_counted" json:"tokens_counted,omitempty"`
	RequestsPerMinute  int64   `yaml:"requests_per_minute" json:"requests_per_minute,omitempty"`
	RequestsPerDay     int64   `yaml:"requests_per_day" json:"requests_per_day,omitempty"`
	GPUSecondsPerDay   float64 `yaml:"gpu_seconds_per_day" json:"gpu_seconds_per_day,omitempty"`
	GPUSecondsPerMonth float64 `yaml:"gpu_seconds_per_month" json:"gpu_seconds_per_month,omitempty"`
	BudgetPerDay       float64 `yaml:"budget_per_day" json:"budget_per_day,omitempty"`
	BudgetPerMonth     float64 `yaml:"budget_per_month" json:"budget_per_month,omitempty"`
	Uncapped           string  `yaml:"uncapped" json:"uncapped,omitempty"`
	DefaultMaxTokens   int64   `yaml:"default_max_tokens" json:"default_max_tokens,omitempty"`
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
// ErrInvalidLimits. A team's limits are checked by ValidateTeam.
func (l Limits) Validate() error {
	for _, f := range []struct {
		name string
		v    float64
	}{
		{"tokens_per_minute", float64(l.TokensPerMinute)}, {"tokens_per_day", float64(l.TokensPerDay)},
		{"requests_per_minute", float64(l.RequestsPerMinute)}, {"requests_per_day", float64(l.RequestsPerDay)},
		{"default_max_tokens", float64(l.DefaultMaxTokens)},
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

// Bounds converts l to Bounds.
func (l Limits) Bounds() Bounds {
	return Bounds{
		l.TokensPerMinute, l.TokensPerDay, l.RequestsPerMinute, l.RequestsPerDay,
		int64(math.Ceil(l.GPUSecondsPerDay * 1000)), int64(math.Ceil(l.GPUSecondsPerMonth * 1000)),
		int64(math.Ceil(l.BudgetPerDay * 1e6)), int64(math.Ceil(l.BudgetPerMonth * 1e6)),
	}
}

// Any reports whether l limits anything.
func (l Limits) Any() bool { return l.Bounds().Any() }

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

// ValidateTeam is Validate for a team's limits: uncapped and
// default_max_tokens belong to a key.
func (l Limits) ValidateTeam() error {
	if l.Uncapped != "" || l.DefaultMaxTokens != 0 {
		return fmt.Errorf("%w: uncapped and default_max_tokens are a key's, not a team's", ErrInvalidLimits)
	}
	return l.Validate()
}
