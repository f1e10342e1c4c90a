package access

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"time"

	"iop/internal/auth"
	"iop/internal/quota"
)

// Quota is what a request's reservation needs of the quota ledger (package quota);
// *quota.Ledger is one.
type Quota interface {
	// Limited reports whether the key or its team has a quota.
	Limited(key string) bool
	// ReserveUpTo reserves ask, its output tokens clamped down to no less
	// than minOutput; a refusal is a *quota.Refusal.
	ReserveUpTo(key string, ask quota.Usage, minOutput int64) (*quota.Reservation, error)
	// Status is the key's and its team's limited windows now.
	Status(key string) []quota.WindowStatus
}

var _ Quota = (*quota.Ledger)(nil)

// ClampedHeader says a request without a cap on its answer was given one
// (quota.Limits.Uncapped "clamp"): the output tokens reserved for it.
const ClampedHeader = "X-Iop-Max-Tokens-Clamped"

// uncappedAsk is the output tokens asked for a request without a cap and
// no default_max_tokens: as many as the windows hold.
const uncappedAsk = math.MaxInt32

// quotaBody is what a reservation reads of a request body.
type quotaBody struct {
	Model               string   `json:"model"`
	MaxTokens           *float64 `json:"max_tokens"`
	MaxCompletionTokens *float64 `json:"max_completion_tokens"`
	MaxOutputTokens     *float64 `json:"max_output_tokens"`
	Options             struct {
		NumPredict *float64 `json:"num_predict"`
	} `json:"options"`
	NPredict *float64 `json:"n_predict"`
}

// llamaPath reports whether path is one of llama.cpp's own routes, whose
// answer length is n_predict (default -1: until the context ends) and
// which ignore max_tokens (llama.cpp's server README).
func llamaPath(path string) bool { return path == "/completion" || path == "/infill" }

// noOutputTokens reports whether path's answer is no generated text
// counted in tokens (embeddings, rerank scores, speech, images): its
// worst case is its prompt alone, and it is never clamped.
func noOutputTokens(path string) bool {
	switch path {
	case "/v1/embeddings", "/api/embed", "/api/embeddings", "/v1/rerank", "/rerank", "/v1/audio/speech", "/v1/images/generations":
		return true
	}
	return false
}

// capField is the body field that caps the answer of path's API: where a
// clamp is written.
func capField(path string) string {
	switch path {
	case "/api/chat", "/api/generate":
		return "options.num_predict"
	case "/v1/responses":
		return "max_output_tokens"
	}
	if llamaPath(path) {
		return "n_predict"
	}
	return "max_tokens"
}

// quotaAsk is the worst case of a request body of path: its prompt tokens
// estimated as the body's length in bytes (an upper bound for byte-level
// BPE tokenizers, whose every token covers at least one byte, and for
// `iop sim`, which counts words; the JSON framing pays for the chat
// template's tokens), its output tokens the smallest cap it sets
// (max_tokens, max_completion_tokens, max_output_tokens, Ollama's
// options.num_predict ≥ 0; on llama.cpp's routes n_predict ≥ 0 alone);
// capped is false when it sets none. An embedding, a rerank, speech and
// images produce no output tokens. A body that is no JSON object is
// a *BodyError.
func quotaAsk(path string, body []byte) (ask quota.Usage, capped bool, err error) {
	var b quotaBody
	if err := json.Unmarshal(body, &b); err != nil {
		return ask, false, &BodyError{Message: "The request body is not a JSON object with numeric token caps"}
	}
	ask = quota.Usage{Model: b.Model, InputTokens: int64(len(body)), SlotTime: time.Millisecond}
	if noOutputTokens(path) {
		return ask, true, nil
	}
	ask.OutputTokens = math.MaxInt64
	caps := []*float64{b.MaxTokens, b.MaxCompletionTokens, b.MaxOutputTokens, b.Options.NumPredict}
	if llamaPath(path) {
		caps = []*float64{b.NPredict}
	}
	for _, c := range caps {
		if c != nil && *c >= 0 {
			ask.OutputTokens, capped = min(ask.OutputTokens, int64(math.Ceil(*c))), true
		}
	}
	if !capped {
		ask.OutputTokens = 0
	}
	return ask, capped, nil
}

// setCap writes n as the cap of the answer into body (capField).
func setCap(path string, body []byte, n int64) ([]byte, error) {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(body, &obj); err != nil {
		return nil, &BodyError{Message: "The request body is not a JSON object"}
	}
	num := json.RawMessage(strconv.FormatInt(n, 10))
	if field := capField(path); field == "options.num_predict" {
		opts := map[string]json.RawMessage{}
		if raw, ok := obj["options"]; ok && !bytes.Equal(bytes.TrimSpace(raw), []byte("null")) {
			if err := json.Unmarshal(raw, &opts); err != nil {
				return nil, &BodyError{Param: "options", Message: "options is not an object"}
			}
		}
		opts["num_predict"] = num
		raw, _ := json.Marshal(opts)
		obj["options"] = raw
	} else {
		obj[field] = num
	}
	return json.Marshal(obj)
}

// Reserve takes the quota reservation of body, a request to path of
// caller, a key with a quota in q, before anything is queued: its worst
// case (quotaAsk) is reserved, its answer's output tokens clamped down as
// far as the windows need when the body caps none (body is then returned
// with the cap written, and clamp is the cap; else clamp is 0). Errors:
// a *quota.Refusal (429), a *BodyError (400) for a body that is no JSON
// object, or for an uncapped request of a key whose quota says uncapped:
// refuse.
func Reserve(q Quota, caller *auth.Caller, path string, body []byte) (res *quota.Reservation, out []byte, clamp int64, err error) {
	ask, capped, err := quotaAsk(path, body)
	if err != nil {
		return nil, nil, 0, err
	}
	lim := caller.Quota()
	minOutput := ask.OutputTokens
	if !capped {
		if lim.Uncapped == quota.UncappedRefuse {
			return nil, nil, 0, &BodyError{Param: capField(path),
				Message: fmt.Sprintf("This API key's quota needs a cap on the answer: set %s", capField(path))}
		}
		ask.OutputTokens, minOutput = uncappedAsk, 1
		if lim.DefaultMaxTokens > 0 {
			ask.OutputTokens = lim.DefaultMaxTokens
		}
	}
	res, err = q.ReserveUpTo(caller.Name(), ask, minOutput)
	if err != nil {
		return nil, nil, 0, err
	}
	if n := res.Ask().OutputTokens; !capped && n < uncappedAsk {
		// (A quota none of whose windows counts answer tokens leaves
		// the request uncapped.)
		if body, err = setCap(path, body, n); err != nil {
			res.Cancel()
			return nil, nil, 0, err
		}
		clamp = n
	}
	return res, body, clamp, nil
}

// RateLimitHeaders sets in hdr the rate-limit headers of an answer to
// caller, a key with limits, at now, its quotas in q (nil: none): OpenAI's x-ratelimit-{limit,remaining,reset}-{requests,tokens}
// (reset as a Go duration, "1s", "6m0s") or, when anthropic (the route
// is Anthropic's),
// anthropic-ratelimit-{requests,tokens}-{limit,remaining,reset} (reset as
// an RFC 3339 instant). Requests are the key's requests_per_minute
// bucket when it has one, else its tightest requests window (key or
// team); tokens the tightest tokens window. The tightest is the one with
// the least remaining.
func RateLimitHeaders(hdr http.Header, now time.Time, caller *auth.Caller, q Quota, anthropic bool) {
	type line struct {
		limit, remaining int64
		reset            time.Duration
		ok               bool
	}
	var req, tok line
	if limit, remaining, full := caller.RateStatus(); limit > 0 {
		req = line{int64(limit), int64(remaining), full, true}
	}
	if q != nil {
		for _, s := range q.Status(caller.Name()) {
			l := line{s.Limit, s.Remaining(), max(0, s.ResetAt.Sub(now)), true}
			switch s.Window.Unit {
			case "tokens":
				if !tok.ok || l.remaining < tok.remaining {
					tok = l
				}
			case "requests":
				if !req.ok || l.remaining < req.remaining {
					req = l
				}
			}
		}
	}
	set := func(kind string, l line) {
		if !l.ok {
			return
		}
		if anthropic {
			hdr.Set("Anthropic-Ratelimit-"+kind+"-Limit", strconv.FormatInt(l.limit, 10))
			hdr.Set("Anthropic-Ratelimit-"+kind+"-Remaining", strconv.FormatInt(l.remaining, 10))
			hdr.Set("Anthropic-Ratelimit-"+kind+"-Reset", now.Add(l.reset).UTC().Format(time.RFC3339))
			return
		}
		hdr.Set("X-Ratelimit-Limit-"+kind, strconv.FormatInt(l.limit, 10))
		hdr.Set("X-Ratelimit-Remaining-"+kind, strconv.FormatInt(l.remaining, 10))
		hdr.Set("X-Ratelimit-Reset-"+kind, l.reset.Round(time.Millisecond).String())
	}
	set("Requests", req)
	set("Tokens", tok)
}

// QuotaMessage is the message of a refused reservation: the scope, the
// window, its limit, what was asked and used, and when it resets; or, when
// it never can hold the request (ref.Never), that the ask is larger than
// the limit. The frame answers it 429 rate_limit_error "quota_exceeded",
// with a Retry-After of ref.RetryAfter (RetryAfterSeconds) unless Never.
func QuotaMessage(ref *quota.Refusal) string {
	unit := quotaUnits[ref.Window]
	if ref.Never {
		return fmt.Sprintf("This request asks %s, more than the %s limit of %s of %s %q; ask for fewer tokens",
			amount(ref.Asked, unit), ref.Window, amount(ref.Limit, unit), ref.Scope, ref.Name)
	}
	return fmt.Sprintf("Quota %s of %s %q exceeded: limit %s, used %s, this request asks %s; it resets at %s",
		ref.Window, ref.Scope, ref.Name, amount(ref.Limit, unit), amount(ref.Used, unit), amount(ref.Asked, unit),
		ref.ResetAt.UTC().Format(time.RFC3339))
}

// quotaUnits names each window's unit in messages.
var quotaUnits = func() map[string]string {
	m := make(map[string]string, quota.NumWindows)
	for _, w := range quota.Windows {
		m[w.Name] = w.Unit
	}
	return m
}()

// amount renders n of unit for a client: GPU milliseconds as seconds,
// currency micro-units as currency.
func amount(n int64, unit string) string {
	switch unit {
	case "gpu_ms":
		return strconv.FormatFloat(float64(n)/1000, 'f', -1, 64) + " GPU-seconds"
	case "micros":
		return strconv.FormatFloat(float64(n)/1e6, 'f', -1, 64) + " (currency)"
	}
	return strconv.FormatInt(n, 10) + " " + unit
}
