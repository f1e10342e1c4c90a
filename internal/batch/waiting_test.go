package batch

import "testing"

// TestQuotaRefusalShapes: a 429 of the key's quota or request rate, in
// the OpenAI and the Anthropic shape, is a quota refusal; a refusal for
// load, the key's concurrency or a provider's rate limit is not.
func TestQuotaRefusalShapes(t *testing.T) {
	for _, c := range []struct {
		name   string
		status int
		body   string
		want   bool
	}{
		{"openai quota", 429, `{"error":{"message":"Quota tokens_per_day of key \"b\" exceeded: limit 1, used 1, this request asks 1; it resets at 2026-12-07T00:00:00Z","type":"rate_limit_error","param":null,"code":"quota_exceeded"}}`, true},
		{"openai rate", 429, `{"error":{"message":"This API key is over its limit of 10 requests per minute; retry later","type":"rate_limit_error","param":null,"code":"rate_limit_exceeded"}}`, true},
		{"anthropic quota", 429, `{"type":"error","error":{"type":"rate_limit_error","message":"Quota tokens_per_day of key \"b\" exceeded: limit 1, used 1, this request asks 1; it resets at 2026-12-07T00:00:00Z"}}`, true},
		{"anthropic rate", 429, `{"type":"error","error":{"type":"rate_limit_error","message":"This API key is over its limit of 10 requests per minute; retry later"}}`, true},
		{"concurrency", 429, `{"error":{"message":"This API key is over its limit of 2 requests at once; retry later","type":"rate_limit_error","param":null,"code":"concurrency_limit_exceeded"}}`, false},
		{"queue full", 429, `{"error":{"message":"queue full","type":"rate_limit_error","param":null,"code":"queue_full"}}`, false},
		{"provider", 429, `{"error":{"message":"Quota of the provider exceeded","type":"rate_limit_error","param":null,"code":"upstream_rate_limited"}}`, false},
		{"not 429", 503, `{"error":{"message":"Quota x","code":"quota_exceeded"}}`, false},
	} {
		if got := quotaRefusal(Response{Status: c.status, Body: []byte(c.body)}); got != c.want {
			t.Errorf("%s: quotaRefusal = %v, want %v", c.name, got, c.want)
		}
	}
}
