package quota

import (
	"errors"
	"fmt"
	"time"
)

var (
	// ErrOverQuota: a reservation does not fit a window (*Refusal).
	ErrOverQuota = errors.New("over quota")
	// ErrInvalidLimits: a configured limit or price that cannot be used.
	ErrInvalidLimits = errors.New("invalid quota")
	// ErrUnknownScope: no key or team of that name has a quota entry.
	ErrUnknownScope = errors.New("no such key or team")
)

// Refusal is a reservation refused because one window of the key or of
// its team cannot hold it. It wraps ErrOverQuota.
type Refusal struct {
	// Scope is "key" or "team"; Name is the key's or the team's name.
	Scope, Name string
	// Window is the configuration field of the window ("tokens_per_minute").
	Window string
	// Limit, Asked and Used are in the window's unit: tokens, requests,
	// GPU milliseconds or currency micro-units (Window.Unit). Used counts
	// what is settled in the window and what is reserved now.
	Limit, Asked, Used int64
	// ResetAt is when the window is expected to hold the ask (see
	// Ledger.Reserve); zero when it never can (Never).
	ResetAt time.Time
	// RetryAfter is ResetAt less the instant of the refusal; 0 with Never.
	RetryAfter time.Duration
	// Never is set when the ask is larger than the limit itself.
	Never bool
}

func (r *Refusal) Error() string {
	if r.Never {
		return fmt.Sprintf("%s: %s %s: %s %d asked, limit %d", ErrOverQuota, r.Scope, r.Name, r.Window, r.Asked, r.Limit)
	}
	return fmt.Sprintf("%s: %s %s: %s %d asked, %d of %d used, resets at %s", ErrOverQuota, r.Scope, r.Name, r.Window,
		r.Asked, r.Used, r.Limit, r.ResetAt.UTC().Format(time.RFC3339))
}

func (r *Refusal) Unwrap() error { return ErrOverQuota }
