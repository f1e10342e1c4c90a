package api

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"iop/internal/auth"
	"iop/internal/clock"
	"iop/internal/edge/api/access"
	"iop/internal/quota"
)

// newQuotaEnv serves alice (with lim as her quota) and bob (none) over a
// quota ledger on a fake clock.
func newQuotaEnv(t *testing.T, lim quota.Limits) (*testEnv, keyFixture, *clock.Fake, *quota.Ledger) {
	t.Helper()
	f := newKeys(t, auth.Key{Quota: lim})
	clk := clock.NewFake(time.Unix(1700000000, 0))
	l := quota.New(quota.Config{Clock: clk})
	keys, teams := auth.QuotaScopes([]auth.Key{{Name: "alice", Quota: lim}, {Name: "bob"}}, nil)
	l.Configure(keys, teams, nil)
	gw := &fakeGateway{models: []string{"m"}, dispatch: okRun}
	env := newEnvWithGateway(t, Config{Keys: f.keys, Quota: l, Now: clk.Now}, gw, gw)
	return env, f, clk, l
}

// TestQuotaRefusesBeforeDispatch: a key's request reserves its body's
// bytes plus its max_tokens; the run settles to its reported usage (3 +
// 1 tokens); a request the window cannot hold then gets 429
// quota_exceeded naming the window, with a Retry-After of the seconds
// until the settled tokens leave the window, and is never dispatched;
// every answer carries x-ratelimit-*-tokens.
func TestQuotaRefusesBeforeDispatch(t *testing.T) {
	t.Parallel()
	body := `{"model":"m","max_tokens":500,"messages":[{"role":"user","content":"hello"}]}`
	ask := int64(len(body) + 500)
	env, f, clk, l := newQuotaEnv(t, quota.Limits{TokensPerMinute: ask + 3})
	resp := env.send(t, "POST", "/v1/chat/completions", body, bearer(f.alice))
	if resp.status != 200 {
		t.Fatalf("first request: %d %s", resp.status, resp.body)
	}
	if got := resp.header.Get("X-Ratelimit-Remaining-Tokens"); got != "3" {
		t.Errorf("x-ratelimit-remaining-tokens %q after reserving %d of %d, want 3", got, ask, ask+3)
	}
	if got := resp.header.Get("X-Ratelimit-Limit-Tokens"); got != strconv.FormatInt(ask+3, 10) {
		t.Errorf("x-ratelimit-limit-tokens %q", got)
	}
	if st := l.Stats(); st.Outstanding != 0 {
		t.Fatalf("stats after the answer: %+v", st)
	}
	clk.Advance(10 * time.Second)
	resp = env.send(t, "POST", "/v1/chat/completions", body, bearer(f.alice))
	if resp.status != 429 {
		t.Fatalf("second request: %d %s, want 429 (4 settled + %d > %d)", resp.status, resp.body, ask, ask+3)
	}
	// The 4 tokens were settled at 1700000000 s: they leave the window
	// at the end of their 1 s granule plus a minute, 51 s from now.
	if ra := resp.header.Get("Retry-After"); ra != "51" {
		t.Errorf("Retry-After %q, want 51", ra)
	}
	msg, typ, _, code := openAIError(t, resp.body)
	if typ != "rate_limit_error" || str(code) != "quota_exceeded" || !strings.Contains(msg, "tokens_per_minute") ||
		!strings.Contains(msg, "limit "+strconv.FormatInt(ask+3, 10)+" tokens") || !strings.Contains(msg, "asks "+strconv.FormatInt(ask, 10)) {
		t.Errorf("error %s %s: %s", typ, str(code), msg)
	}
	if got := resp.header.Get("X-Ratelimit-Remaining-Tokens"); got != strconv.FormatInt(ask-1, 10) {
		t.Errorf("x-ratelimit-remaining-tokens on the 429: %q, want %d", got, ask-1)
	}
	if got := resp.header.Get("X-Ratelimit-Reset-Tokens"); got != "51s" {
		t.Errorf("x-ratelimit-reset-tokens %q, want 51s", got)
	}
	if resp := env.send(t, "POST", "/v1/chat/completions", body, bearer(f.bob)); resp.status != 200 ||
		resp.header.Get("X-Ratelimit-Limit-Tokens") != "" {
		t.Errorf("bob, without a quota: %d, headers %v", resp.status, resp.header)
	}
	if n := len(env.gw.requests()); n != 2 {
		t.Fatalf("%d dispatches, want 2 (alice's first, bob's)", n)
	}
	clk.Advance(51 * time.Second)
	if resp := env.send(t, "POST", "/v1/chat/completions", body, bearer(f.alice)); resp.status != 200 {
		t.Fatalf("after Retry-After: %d %s", resp.status, resp.body)
	}
	if st := l.Stats(); st.Outstanding != 0 || st.DoubleSettles != 0 || st.Overruns != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// TestQuotaClampsOrRefusesAnUncappedRequest: a request with no cap on its
// answer gets max_tokens set to what the window holds (uncapped: clamp,
// the default; said in X-Iop-Max-Tokens-Clamped), or default_max_tokens
// when that fits; with uncapped: refuse it is answered 400.
func TestQuotaClampsOrRefusesAnUncappedRequest(t *testing.T) {
	t.Parallel()
	env, f, _, _ := newQuotaEnv(t, quota.Limits{TokensPerMinute: 1000})
	resp := env.send(t, "POST", "/v1/chat/completions", simpleChat, bearer(f.alice))
	want := 1000 - len(simpleChat)
	if resp.status != 200 || resp.header.Get(access.ClampedHeader) != strconv.Itoa(want) {
		t.Fatalf("%d %s, %s %q, want %d", resp.status, resp.body, access.ClampedHeader, resp.header.Get(access.ClampedHeader), want)
	}
	var sent struct {
		MaxTokens int `json:"max_tokens"`
	}
	if err := json.Unmarshal(env.gw.requests()[0].Body, &sent); err != nil || sent.MaxTokens != want {
		t.Fatalf("dispatched max_tokens %d (%v), want %d", sent.MaxTokens, err, want)
	}

	env2, f2, _, _ := newQuotaEnv(t, quota.Limits{TokensPerMinute: 1000, DefaultMaxTokens: 64})
	if resp := env2.send(t, "POST", "/v1/chat/completions", simpleChat, bearer(f2.alice)); resp.header.Get(access.ClampedHeader) != "64" {
		t.Fatalf("default_max_tokens: %d %q", resp.status, resp.header.Get(access.ClampedHeader))
	}

	env4, f4, _, _ := newQuotaEnv(t, quota.Limits{RequestsPerDay: 10, TokensPerMinute: 5000, TokensCounted: quota.CountInput})
	if resp := env4.send(t, "POST", "/v1/chat/completions", simpleChat, bearer(f4.alice)); resp.status != 200 ||
		resp.header.Get(access.ClampedHeader) != "" || string(env4.gw.requests()[0].Body) != simpleChat {
		t.Fatalf("no window counts answer tokens: %d %q, sent %s", resp.status, resp.header.Get(access.ClampedHeader), env4.gw.requests()[0].Body)
	}

	env3, f3, _, l3 := newQuotaEnv(t, quota.Limits{TokensPerMinute: 1000, Uncapped: quota.UncappedRefuse})
	resp = env3.send(t, "POST", "/v1/chat/completions", simpleChat, bearer(f3.alice))
	if msg, _, param, _ := openAIError(t, resp.body); resp.status != 400 || str(param) != "max_tokens" {
		t.Fatalf("uncapped: refuse: %d %s %s", resp.status, msg, str(param))
	}
	if n := len(env3.gw.requests()); n != 0 || l3.Stats().Outstanding != 0 {
		t.Fatalf("%d dispatched, stats %+v", n, l3.Stats())
	}
}

// TestQuotaRefusalIsRecordedRefused: a request refused by its key's
// quota is recorded (log, ledger) with the outcome refused, as a request
// over its key's requests_per_minute is.
func TestQuotaRefusalIsRecordedRefused(t *testing.T) {
	t.Parallel()
	f := newKeys(t, auth.Key{Quota: quota.Limits{TokensPerMinute: 10}})
	l := quota.New(quota.Config{})
	keys, teams := auth.QuotaScopes([]auth.Key{{Name: "alice", Quota: quota.Limits{TokensPerMinute: 10}}}, nil)
	l.Configure(keys, teams, nil)
	led := &recordingLedger{}
	gw := &fakeGateway{models: []string{"m"}, dispatch: okRun}
	env := newEnvWithGateway(t, Config{Keys: f.keys, Quota: l, Ledger: led}, gw, gw)
	if resp := env.send(t, "POST", "/v1/chat/completions", simpleChat, bearer(f.alice)); resp.status != 429 {
		t.Fatalf("%d %s", resp.status, resp.body)
	}
	led.mu.Lock()
	defer led.mu.Unlock()
	if len(led.entries) != 1 || led.entries[0].Outcome != "refused" || led.entries[0].ErrorCode != "quota_exceeded" {
		t.Fatalf("ledger %+v", led.entries)
	}
}
