package loadgen

import (
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"strings"
	"time"
)

// API names the wire protocol of the endpoint under load.
type API string

// The APIs loadgen speaks.
const (
	// APIOpenAI is OpenAI's chat completions API: POST {URL}/v1/chat/completions,
	// streamed as Server-Sent Events ending "data: [DONE]" (OpenAI API
	// reference, "Create chat completion").
	APIOpenAI API = "openai"
	// APIOllama is Ollama's chat API: POST {URL}/api/chat, streamed as
	// NDJSON ending with an object whose done is true (Ollama API doc,
	// "Generate a chat completion").
	APIOllama API = "ollama"
)

// Defaults applied by Run to zero fields of Config.
const (
	DefaultPromptChars = 64
	DefaultTimeout     = 60 * time.Second
	DefaultMaxInFlight = 10000
)

// Config is one load run.
type Config struct {
	// URL is the server's root, "http://host:port" (no path): the API's
	// path is appended to it. Required.
	URL string
	// API is "openai" or "ollama". Required.
	API API
	// Model is the model every request names. Required.
	Model string
	// Stream asks for streamed answers.
	Stream bool
	// PromptChars is the length, in bytes (ASCII), of the one user message
	// of every request; default 64.
	PromptChars int
	// MaxTokens, when > 0, caps every answer's length in tokens: OpenAI's
	// "max_tokens", Ollama's "options.num_predict". 0 leaves it to the server.
	MaxTokens int
	// Concurrency is the number of closed-loop workers; used when Rate is 0.
	Concurrency int
	// Rate, when > 0, selects open loop: requests start at this many per
	// second on a fixed schedule.
	Rate float64
	// MaxInFlight bounds the requests in flight in open loop; a scheduled
	// request that finds this many in flight is not sent and counted in
	// Result.Dropped. Default 10,000.
	MaxInFlight int
	// Requests, when > 0, ends the run after this many requests were issued
	// (sent, or dropped in open loop).
	Requests int
	// Duration, when > 0, ends the run when it has passed: no request is
	// started after it, those in flight finish (each within Timeout). At
	// least one of Requests and Duration must be set; with both, the first
	// reached ends the run.
	Duration time.Duration
	// Timeout bounds one request, headers and body; default 60 s.
	Timeout time.Duration
	// Header holds extra request headers (e.g. Authorization).
	Header http.Header
	// Client sends the requests; nil means NewClient(Concurrency or
	// MaxInFlight connections).
	Client *http.Client
	// Workload is WorkloadFixed ("" too) or WorkloadSessions; sessions run
	// in closed loop only, and end when every session had its turns (or
	// at Duration).
	Workload string
	// Sessions, Turns, SharedPrefixTokens and TurnTokens shape the sessions
	// workload (WorkloadSessions): conversations, turns of each, the words
	// of the system prompt they share and of each user message (default
	// 64). A word is one token of iop sim (about 1.3 of a real tokenizer).
	Sessions, Turns, SharedPrefixTokens, TurnTokens int
}

// ErrInvalidConfig wraps every error of Config.Validate.
var ErrInvalidConfig = errors.New("invalid load config")

// Validate reports every invalid field of c, wrapped in ErrInvalidConfig.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if !strings.HasPrefix(c.URL, "http://") && !strings.HasPrefix(c.URL, "https://") {
		bad("url %q: want http://host:port", c.URL)
	}
	if c.API != APIOpenAI && c.API != APIOllama {
		bad("api %q: want %q or %q", c.API, APIOpenAI, APIOllama)
	}
	if c.Model == "" {
		bad("model: required")
	}
	if c.PromptChars < 0 || c.MaxTokens < 0 || c.Concurrency < 0 || c.MaxInFlight < 0 || c.Requests < 0 {
		bad("prompt chars, max tokens, concurrency, max in flight and requests must not be negative")
	}
	if c.Rate < 0 || math.IsNaN(c.Rate) || math.IsInf(c.Rate, 0) {
		bad("rate %v: must be a finite number >= 0", c.Rate)
	}
	if c.Rate == 0 && c.Concurrency == 0 {
		bad("set a concurrency (closed loop) or a rate (open loop)")
	}
	if c.Rate > 0 && c.Concurrency > 0 {
		bad("set either a concurrency (closed loop) or a rate (open loop), not both")
	}
	if c.Duration < 0 || c.Timeout < 0 {
		bad("duration and timeout must not be negative")
	}
	switch c.Workload {
	case "", WorkloadFixed:
		if c.Requests == 0 && c.Duration == 0 {
			bad("set a request count or a duration")
		}
	case WorkloadSessions:
		if c.Sessions < 1 || c.Turns < 1 {
			bad("the sessions workload needs sessions and turns of at least 1")
		}
		if c.SharedPrefixTokens < 0 || c.TurnTokens < 0 {
			bad("shared prefix tokens and turn tokens must not be negative")
		}
		if c.Rate > 0 {
			bad("the sessions workload runs in closed loop: set a concurrency, not a rate")
		}
	default:
		bad("workload %q: want %q or %q", c.Workload, WorkloadFixed, WorkloadSessions)
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %w", ErrInvalidConfig, errors.Join(errs...))
}

func (c Config) withDefaults() Config {
	if c.PromptChars == 0 {
		c.PromptChars = DefaultPromptChars
	}
	if c.MaxInFlight == 0 {
		c.MaxInFlight = DefaultMaxInFlight
	}
	if c.Timeout == 0 {
		c.Timeout = DefaultTimeout
	}
	if c.TurnTokens == 0 {
		c.TurnTokens = DefaultTurnTokens
	}
	if c.Client == nil {
		conns := c.Concurrency
		if c.Rate > 0 {
			conns = c.MaxInFlight
		}
		c.Client = NewClient(conns)
	}
	return c
}

// NewClient returns an HTTP client tuned so the generator is not what
// limits a benchmark: keep-alive connections, as many idle connections per
// host as conns (the most requests in flight), no compression, no HTTP/2
// (one TCP connection per concurrent request, as most clients of an
// inference server use), no overall timeout (Config.Timeout bounds each
// request).
func NewClient(conns int) *http.Client {
	conns = max(conns, 1)
	dialer := &net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}
	return &http.Client{Transport: &http.Transport{
		Proxy:                 nil,
		DialContext:           dialer.DialContext,
		MaxIdleConns:          conns,
		MaxIdleConnsPerHost:   conns,
		IdleConnTimeout:       90 * time.Second,
		DisableCompression:    true,
		ForceAttemptHTTP2:     false,
		ResponseHeaderTimeout: 0,
		WriteBufferSize:       16 << 10,
		ReadBufferSize:        16 << 10,
	}}
}
