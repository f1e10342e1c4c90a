package auth

import (
	"errors"
	"fmt"
	"time"
)

var (
	// ErrInvalidKey: a configured key or hash that cannot be used.
	ErrInvalidKey = errors.New("invalid key")
	// ErrLimited: a key is over one of its limits (LimitError).
	ErrLimited = errors.New("key over its limit")
)

// LimitError is a request refused because its key is over a limit.
type LimitError struct {
	// Limit is the configuration field: "max_concurrent" or
	// "requests_per_minute".
	Limit string
	// Max is the limit's value.
	Max int
	// RetryAfter is when a retry can first succeed (for max_concurrent a
	// guess: whenever one of the key's requests ends).
	RetryAfter time.Duration
}

// LimitDetails returns Limit, Max and RetryAfter (for callers that see the
// error through an interface, such as the scheduler leader's answer to
// another edge).
func (e *LimitError) LimitDetails() (limit string, max int, retryAfter time.Duration) {
	return e.Limit, e.Max, e.RetryAfter
}

func (e *LimitError) Error() string {
	return fmt.Sprintf("%s: %s %d", ErrLimited, e.Limit, e.Max)
}

func (e *LimitError) Unwrap() error { return ErrLimited }
