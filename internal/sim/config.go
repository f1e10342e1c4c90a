package sim

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"iop/internal/clock"
)

// Protocol names the wire format a Server speaks.
type Protocol string

// The protocols a Server can speak.
const (
	// ProtocolOllama is Ollama's native API (Ollama API doc, /api/*).
	ProtocolOllama Protocol = "ollama"
	// ProtocolOpenAI is the OpenAI-compatible API served by vLLM and others
	// (OpenAI API reference, /v1/*).
	ProtocolOpenAI Protocol = "openai"
)

// Defaults applied by New to zero fields of Config.
const (
	DefaultModel       = "sim-model"
	DefaultMaxTokens   = 16
	DefaultErrorStatus = 500
)

// Config describes one simulated model server. The zero value of every field
// except Protocol is valid and means the documented default.
type Config struct {
	// Protocol is the wire format: "ollama" or "openai". Required.
	Protocol Protocol
	// Models are the model names served; default ["sim-model"]. A request
	// naming another model is answered 404 in the protocol's error shape.
	// Server.AddModel and Server.RemoveModel change them at run time.
	Models []string
	// Capabilities are the Ollama capabilities (/api/show "capabilities":
	// completion, tools, vision, embedding, thinking, insert) of single
	// models of Models; a model without an entry reports
	// DefaultCapabilities. They only change what /api/show says: the
	// simulator answers every request to a served model alike.
	Capabilities map[string][]string
	// TTFT is the delay before the first token of an answer (and before a
	// non-streamed answer's generation starts). 0 means none.
	TTFT time.Duration
	// TokensPerSecond paces the tokens after the first; 0 means unlimited
	// (no delay between tokens).
	TokensPerSecond float64
	// MaxConcurrent caps the inference requests served at once; one more is
	// answered 429. 0 means unlimited.
	MaxConcurrent int
	// Seed makes output deterministic: the same (Seed, prompt) always gets
	// the same text, and the same (Seed, input) the same embedding.
	Seed int64
	// DefaultMaxTokens is the length, in tokens, of every answer whose
	// request sets no lower limit; default 16.
	DefaultMaxTokens int
	// APIKey, when set, is required on every request as
	// "Authorization: Bearer <key>"; others are answered 401.
	APIKey string
	// Thinking makes the served models thinking (reasoning) models: an
	// answer starts with reasoning text, in each protocol's real format
	// (see thinking.go). Without it, a model cannot think, and an Ollama
	// request asking it to is answered 400, as Ollama answers.
	Thinking bool
	// ThinkLevels makes a thinking model take Ollama's think levels
	// ("low", "medium", "high"), as Ollama takes them from a model it
	// parses with its harmony parser (gpt-oss). Without it an Ollama
	// request's think level is answered 400 "think value %q is not
	// supported for this model", as Ollama answers for every other model
	// (v0.17.4, server/routes.go).
	ThinkLevels bool
	// ReasoningField is the field of an OpenAI answer's message or delta
	// that carries its reasoning: "reasoning_content" (vLLM, DeepSeek; the
	// default) or "reasoning" (Ollama's OpenAI API, OpenRouter).
	ReasoningField string
	// PrefixCacheTokens, when > 0, gives the server a prefix (KV) cache of
	// this many prompt tokens: an LRU of blocks of PrefixBlockTokens tokens
	// with chained hashes (cache.go). Tokens are the simulator's: the
	// whitespace-separated words of the prompt as it renders it (message
	// contents joined by newlines; a completion's prompt). A request's
	// answer is cached after its prompt (an engine keeps the KV of the
	// tokens it generated), so a conversation's next turn hits it too. Hits
	// and misses are counted in Stats (GET /stats) and logged at debug
	// level.
	PrefixCacheTokens int
	// PrefillTokensPerSecond, when > 0, adds the prefill of every uncached
	// prompt token to the time to first token: TTFT + uncached tokens / R.
	// Without a cache every prompt token is uncached. 0 means prefill is
	// free (the TTFT alone).
	PrefillTokensPerSecond float64
	// CountRepeats makes the server remember the prompt of every admitted
	// inference request and count, in Stats.Repeated, each one whose prompt
	// an earlier admitted request had: a client that makes every prompt
	// unique (a request id in it) sees any request that ran twice. The
	// memory grows with the requests admitted; meant for test runs.
	CountRepeats bool
	// MaxLoadedModels, when > 0, is how many models the server holds
	// loaded at once (Ollama's OLLAMA_MAX_LOADED_MODELS): a request for
	// another model evicts the least recently used idle one, or waits for
	// one to be idle. Set it, LoadTime or LoadTimes, and models start
	// unloaded and load on demand; otherwise every served model is always
	// loaded. Loads and evictions are counted in Stats (GET /stats).
	MaxLoadedModels int
	// LoadTime is how long loading a model takes (on Clock); LoadTimes
	// overrides it per model. A request that waited for a load reports the
	// wait as load_duration in Ollama's answers.
	LoadTime  time.Duration
	LoadTimes map[string]time.Duration
	// Faults injects failures; the zero value injects none.
	Faults Faults
	// Clock paces output and stamps timestamps; nil means clock.Real().
	// Tests inject a clock.Fake.
	Clock clock.Clock
}

// Faults are failures the simulator injects into admitted inference
// requests (chat, generate, completions, embeddings).
type Faults struct {
	// ErrorRate is the fraction, in [0, 1], of admitted requests answered
	// with ErrorStatus and an error body. Which requests fail is
	// pseudo-random but deterministic: it depends only on Config.Seed and
	// the order in which requests were admitted.
	ErrorRate float64
	// ErrorStatus is the HTTP status of injected errors, 400-599; default 500.
	ErrorStatus int
	// DropAfter, when > 0, makes every generation close the connection
	// abruptly after sending min(DropAfter, answer length) tokens, without
	// the final chunk (no done:true, no [DONE]). A non-streamed answer is
	// dropped before any byte of it is written.
	DropAfter int
	// StreamErrorAfter, when > 0, makes every streamed generation report an
	// error inside its 2xx stream after min(StreamErrorAfter, answer length)
	// steps of output, as vLLM does when generation fails mid-way: OpenAI
	// `data: {"error":{"message","type","param","code"}}` then
	// `data: [DONE]`; Ollama a line {"error":"..."} and the end of the body.
	// Non-streamed answers are unaffected.
	StreamErrorAfter int
	// Hang makes every admitted request wait, holding its in-flight slot and
	// writing nothing, until the client goes away or Serve's context ends;
	// then its connection is closed. (An httptest.Server serving Handler
	// waits for hung requests in Close: cancel the clients first.)
	Hang bool
}

// Validate reports every invalid field of c, wrapped in ErrInvalidConfig.
// Zero values are valid (they select defaults) except for Protocol.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }

	if c.Protocol != ProtocolOllama && c.Protocol != ProtocolOpenAI {
		bad("protocol %q: want %q or %q", c.Protocol, ProtocolOllama, ProtocolOpenAI)
	}
	seen := make(map[string]bool, len(c.Models))
	for _, m := range c.Models {
		switch {
		case m == "":
			bad("models: empty model name")
		case seen[m]:
			bad("models: %q listed twice", m)
		}
		seen[m] = true
	}
	for m, caps := range c.Capabilities {
		if !seen[m] {
			bad("capabilities: %q is not one of models", m)
		}
		if slices.Contains(caps, "") {
			bad("capabilities of %q: empty capability", m)
		}
	}
	if c.TTFT < 0 {
		bad("ttft %v: must not be negative", c.TTFT)
	}
	if c.TokensPerSecond < 0 || math.IsNaN(c.TokensPerSecond) || math.IsInf(c.TokensPerSecond, 0) {
		bad("tokens per second %v: must be a finite number >= 0", c.TokensPerSecond)
	}
	if c.PrefixCacheTokens < 0 {
		bad("prefix cache tokens %d: must not be negative", c.PrefixCacheTokens)
	}
	if r := c.PrefillTokensPerSecond; r < 0 || math.IsNaN(r) || math.IsInf(r, 0) {
		bad("prefill tokens per second %v: must be a finite number >= 0", r)
	}
	if c.MaxConcurrent < 0 {
		bad("max concurrent %d: must not be negative", c.MaxConcurrent)
	}
	if c.MaxLoadedModels < 0 {
		bad("max loaded models %d: must not be negative", c.MaxLoadedModels)
	}
	if c.LoadTime < 0 {
		bad("load time %v: must not be negative", c.LoadTime)
	}
	for m, d := range c.LoadTimes {
		if d < 0 || m == "" {
			bad("load time of %q %v: want a model name and a duration >= 0", m, d)
		}
	}
	if c.DefaultMaxTokens < 0 {
		bad("default max tokens %d: must not be negative", c.DefaultMaxTokens)
	}
	switch c.ReasoningField {
	case "", ReasoningContent, ReasoningPlain:
	default:
		bad("reasoning field %q: want %q or %q", c.ReasoningField, ReasoningContent, ReasoningPlain)
	}
	if !(c.Faults.ErrorRate >= 0 && c.Faults.ErrorRate <= 1) { // also rejects NaN
		bad("error rate %v: must be in [0, 1]", c.Faults.ErrorRate)
	}
	if s := c.Faults.ErrorStatus; s != 0 && (s < 400 || s > 599) {
		bad("error status %d: must be in 400-599", s)
	}
	if c.Faults.DropAfter < 0 {
		bad("drop after %d: must not be negative", c.Faults.DropAfter)
	}
	if c.Faults.StreamErrorAfter < 0 {
		bad("stream error after %d: must not be negative", c.Faults.StreamErrorAfter)
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %w", ErrInvalidConfig, errors.Join(errs...))
}

// withDefaults returns c with zero fields replaced by their defaults.
func (c Config) withDefaults() Config {
	if len(c.Models) == 0 {
		c.Models = []string{DefaultModel}
	} else {
		c.Models = append([]string(nil), c.Models...)
	}
	if c.DefaultMaxTokens == 0 {
		c.DefaultMaxTokens = DefaultMaxTokens
	}
	if c.ReasoningField == "" {
		c.ReasoningField = ReasoningContent
	}
	if c.Faults.ErrorStatus == 0 {
		c.Faults.ErrorStatus = DefaultErrorStatus
	}
	if c.Clock == nil {
		c.Clock = clock.Real()
	}
	return c
}

// tokenInterval is the delay between two tokens after the first.
func (c Config) tokenInterval() time.Duration {
	if c.TokensPerSecond == 0 {
		return 0
	}
	return time.Duration(float64(time.Second) / c.TokensPerSecond)
}
