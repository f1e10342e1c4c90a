package api

import (
	"fmt"
	"net/http"
	"time"
)

// DefaultMaxBodyBytes is the request body limit when Config.MaxBodyBytes is 0.
const DefaultMaxBodyBytes int64 = 16 << 20 // 16 MiB

// Config configures the HTTP API. The zero value is valid and means the
// documented defaults.
type Config struct {
	// MaxBodyBytes caps a request body, in bytes; a larger body is answered
	// 413. 0 means DefaultMaxBodyBytes (16 MiB); negative is invalid.
	MaxBodyBytes int64
	// Ready reports whether the edge can serve traffic, for GET /readyz
	// (200 when true, 503 when false). nil means always ready. It is called
	// once per probe and must not block.
	Ready func() bool
	// Now stamps "created" fields (Unix seconds) and times requests; nil
	// means time.Now.
	Now func() time.Time
	// Observer gets a RequestRecord for every finished API request; nil
	// means none (each request is still logged).
	Observer Observer
	// Metrics, if set, serves GET /metrics (the Prometheus exposition).
	Metrics http.Handler
	// Events, if set, serves GET /admin/v1/events (events.go).
	Events Events
	// EventsKeepAlive is how often an idle events stream gets a comment
	// line; 0 means DefaultEventsKeepAlive (15s).
	EventsKeepAlive time.Duration
}

// Validate reports a configuration New cannot honour, wrapping
// ErrInvalidConfig.
func (c Config) Validate() error {
	if c.MaxBodyBytes < 0 {
		return fmt.Errorf("%w: max body bytes %d is negative", ErrInvalidConfig, c.MaxBodyBytes)
	}
	return nil
}

// withDefaults returns c with every zero (or invalid) field set to its default.
func (c Config) withDefaults() Config {
	if c.MaxBodyBytes <= 0 {
		c.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if c.Ready == nil {
		c.Ready = func() bool { return true }
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.EventsKeepAlive <= 0 {
		c.EventsKeepAlive = DefaultEventsKeepAlive
	}
	return c
}
