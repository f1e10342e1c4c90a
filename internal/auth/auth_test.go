package auth

import (
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"iop/internal/quota"
)

func TestGeneratedKeyAuthenticatesByItsHashOnly(t *testing.T) {
	secret, hash := Generate()
	if !strings.HasPrefix(secret, KeyPrefix) || len(secret) < len(KeyPrefix)+43 {
		t.Fatalf("secret %q: want %q and 256 bits of base64url", secret, KeyPrefix)
	}
	if strings.Contains(hash, secret) || hash != Hash(secret) {
		t.Fatalf("hash %q of %q", hash, secret)
	}
	other, _ := Generate()
	if other == secret {
		t.Fatal("two generated keys are equal")
	}
	kr, err := NewKeyring("keys", []Key{{Name: "a", Hash: hash}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if c := kr.Authenticate(secret); c == nil || c.Name() != "a" {
		t.Fatalf("Authenticate(secret) = %v", c)
	}
	for _, wrong := range []string{"", other, hash, secret + "x", secret[:len(secret)-1], strings.ToUpper(secret)} {
		if c := kr.Authenticate(wrong); c != nil {
			t.Errorf("Authenticate(%q) = %s, want nil", wrong, c.Name())
		}
	}
	var none *Keyring
	if none.Authenticate(secret) != nil || none.Len() != 0 {
		t.Error("a nil keyring authenticated a key")
	}
}

func TestValidateRejectsBadKeys(t *testing.T) {
	_, h1 := Generate()
	_, h2 := Generate()
	for name, keys := range map[string][]Key{
		"empty name":      {{Hash: h1}},
		"repeated name":   {{Name: "a", Hash: h1}, {Name: "a", Hash: h2}},
		"repeated hash":   {{Name: "a", Hash: h1}, {Name: "b", Hash: h1}},
		"no prefix":       {{Name: "a", Hash: strings.TrimPrefix(h1, HashPrefix)}},
		"short hash":      {{Name: "a", Hash: h1[:20]}},
		"not hex":         {{Name: "a", Hash: HashPrefix + strings.Repeat("z", 64)}},
		"plaintext key":   {{Name: "a", Hash: "iop-secret"}},
		"negative limit":  {{Name: "a", Hash: h1, MaxConcurrent: -1}},
		"negative rpm":    {{Name: "a", Hash: h1, RequestsPerMinute: -1}},
		"empty model":     {{Name: "a", Hash: h1, Models: []string{""}}},
		"name line break": {{Name: "a\r\nX-Evil: 1", Hash: h1}},
		"negative weight": {{Name: "a", Hash: h1, Weight: -1}},
		"huge weight":     {{Name: "a", Hash: h1, Weight: MaxWeight + 1}},
		"bad priority":    {{Name: "a", Hash: h1, Priority: "urgent"}},
		"bad header max":  {{Name: "a", Hash: h1, PriorityHeader: "yes"}},
	} {
		if err := Validate("keys", keys); !errors.Is(err, ErrInvalidKey) {
			t.Errorf("%s: Validate = %v, want ErrInvalidKey", name, err)
		}
	}
	if err := Validate("keys", []Key{{Name: "a", Hash: strings.ToUpper(h1[:len(HashPrefix)]) + h1[len(HashPrefix):]}}); err == nil {
		t.Error("an upper-case prefix was accepted")
	}
	if err := Validate("keys", []Key{{Name: "a", Hash: h1, Models: []string{"m"}, MaxConcurrent: 2, RequestsPerMinute: 10}, {Name: "b", Hash: h2}}); err != nil {
		t.Errorf("valid keys: %v", err)
	}
}

func TestCredentialHeaders(t *testing.T) {
	for _, tc := range []struct {
		header map[string]string
		want   string
	}{
		{map[string]string{"Authorization": "Bearer k1"}, "k1"},
		{map[string]string{"Authorization": "bearer   k1 "}, "k1"},
		{map[string]string{"X-Api-Key": "k2"}, "k2"},
		{map[string]string{"Authorization": "Bearer k1", "X-Api-Key": "k2"}, "k1"},
		// Basic: the password is the key (the dashboard's browser login).
		{map[string]string{"Authorization": "Basic dXNlcjpwYXNz"}, "pass"},
		{map[string]string{"Authorization": "Basic dXNlcjpwYXNz", "X-Api-Key": "k2"}, "pass"},
		{map[string]string{"Authorization": "Basic !!notbase64", "X-Api-Key": "k2"}, "k2"},
		{map[string]string{"Authorization": "Basic bm9jb2xvbg=="}, ""}, // "nocolon"
		{map[string]string{}, ""},
	} {
		h := http.Header{}
		for k, v := range tc.header {
			h.Set(k, v)
		}
		if got := Credential(h); got != tc.want {
			t.Errorf("Credential(%v) = %q, want %q", tc.header, got, tc.want)
		}
	}
}

// fakeNow is a clock the test moves by hand.
type fakeNow struct {
	mu sync.Mutex
	t  time.Time
}

func (f *fakeNow) now() time.Time { f.mu.Lock(); defer f.mu.Unlock(); return f.t }
func (f *fakeNow) add(d time.Duration) {
	f.mu.Lock()
	f.t = f.t.Add(d)
	f.mu.Unlock()
}

func caller(t *testing.T, key Key, clk *fakeNow) *Caller {
	t.Helper()
	secret, hash := Generate()
	key.Name, key.Hash = "k", hash
	kr, err := NewKeyring("keys", []Key{key}, clk.now)
	if err != nil {
		t.Fatal(err)
	}
	return kr.Authenticate(secret)
}

func TestConcurrencyLimit(t *testing.T) {
	clk := &fakeNow{t: time.Unix(1000, 0)}
	c := caller(t, Key{MaxConcurrent: 2}, clk)
	p1, err1 := c.Admit()
	p2, err2 := c.Admit()
	if err1 != nil || err2 != nil {
		t.Fatal(err1, err2)
	}
	_, err := c.Admit()
	var le *LimitError
	if !errors.As(err, &le) || le.Limit != "max_concurrent" || le.RetryAfter <= 0 || !errors.Is(err, ErrLimited) {
		t.Fatalf("third Admit: %v", err)
	}
	p1.Release()
	p1.Release() // a second release gives nothing back
	if c.InFlight() != 1 {
		t.Fatalf("in flight %d after one release (twice), want 1", c.InFlight())
	}
	p3, err := c.Admit()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Admit(); err == nil {
		t.Fatal("over the limit after a double release")
	}
	p2.Release()
	p3.Release()
	if c.InFlight() != 0 {
		t.Fatalf("in flight %d at the end", c.InFlight())
	}
}

func TestRequestsPerMinuteLimit(t *testing.T) {
	clk := &fakeNow{t: time.Unix(1000, 0)}
	c := caller(t, Key{RequestsPerMinute: 3}, clk)
	for i := range 3 {
		p, err := c.Admit()
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		p.Release()
	}
	_, err := c.Admit()
	var le *LimitError
	if !errors.As(err, &le) || le.Limit != "requests_per_minute" {
		t.Fatalf("fourth request: %v", err)
	}
	// One request's allowance comes back every 20s.
	if le.RetryAfter <= 0 || le.RetryAfter > 20*time.Second {
		t.Fatalf("RetryAfter %s, want (0, 20s]", le.RetryAfter)
	}
	// A refused request spent nothing: the retry succeeds once RetryAfter has passed.
	clk.add(le.RetryAfter)
	p, err := c.Admit()
	if err != nil {
		t.Fatalf("after RetryAfter: %v", err)
	}
	p.Release()
	if _, err := c.Admit(); err == nil {
		t.Fatal("a fifth request within the refill was admitted")
	}
}

func TestConcurrencyRefusalSpendsNoRateToken(t *testing.T) {
	clk := &fakeNow{t: time.Unix(1000, 0)}
	c := caller(t, Key{MaxConcurrent: 1, RequestsPerMinute: 2}, clk)
	p, err := c.Admit()
	if err != nil {
		t.Fatal(err)
	}
	for range 5 {
		if _, err := c.Admit(); err == nil {
			t.Fatal("admitted over max_concurrent")
		}
	}
	p.Release()
	if p, err := c.Admit(); err != nil {
		t.Fatalf("the second of 2 per minute was refused after concurrency refusals: %v", err)
	} else {
		p.Release()
	}
}

func TestConcurrentAdmitsNeverExceedTheLimit(t *testing.T) {
	clk := &fakeNow{t: time.Unix(1000, 0)}
	c := caller(t, Key{MaxConcurrent: 3}, clk)
	var wg sync.WaitGroup
	var mu sync.Mutex
	peak, cur := 0, 0
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 200 {
				p, err := c.Admit()
				if err != nil {
					continue
				}
				mu.Lock()
				cur++
				peak = max(peak, cur)
				mu.Unlock()
				mu.Lock()
				cur--
				mu.Unlock()
				p.Release()
			}
		}()
	}
	wg.Wait()
	if peak > 3 || c.InFlight() != 0 {
		t.Fatalf("peak %d (limit 3), in flight at the end %d", peak, c.InFlight())
	}
}

func TestAllowedModels(t *testing.T) {
	clk := &fakeNow{t: time.Unix(1000, 0)}
	c := caller(t, Key{Models: []string{"llama3", "qwen:7b", "org/m:latest"}}, clk)
	for model, want := range map[string]bool{
		"llama3": true, "llama3:latest": true, "qwen:7b": true,
		"qwen": false, "qwen:7b:latest": true, "qwen:8b": false, "mistral": false, "": false, "../../admin": false, "org/m": true, ":latest": false,
	} {
		if got := c.Allows(model); got != want {
			t.Errorf("Allows(%q) = %v, want %v", model, got, want)
		}
	}
	got := c.Filter([]string{"mistral", "llama3", "qwen:7b", "x"})
	if strings.Join(got, ",") != "llama3,qwen:7b" {
		t.Errorf("Filter = %v", got)
	}
	all := caller(t, Key{}, clk)
	if !all.Allows("anything") || len(all.Filter([]string{"a", "b"})) != 2 {
		t.Error("a key without models must allow every model")
	}
}

// TestCallerPriority: a key's priority is its own unless its
// priority_header lets X-Iop-Priority ask, at most for that priority; an
// unknown name is not ok only where the header counts.
func TestCallerPriority(t *testing.T) {
	_, h1 := Generate()
	_, h2 := Generate()
	ring, err := NewKeyring("keys", []Key{{Name: "a", Hash: h1, Priority: "sheddable", Weight: 4}, {Name: "b", Hash: h2, PriorityHeader: "standard"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var a, b *Caller
	for _, c := range ring.table.Load().byHash {
		if c.Name() == "a" {
			a = c
		} else {
			b = c
		}
	}
	for _, c := range []struct {
		who    *Caller
		header string
		rank   int
		ok     bool
	}{
		{a, "", -1, true}, {a, "critical", -1, true}, {a, "nonsense", -1, true},
		{b, "", 0, true}, {b, "sheddable", -1, true}, {b, "critical", 0, true}, {b, "nonsense", 0, false},
	} {
		if rank, ok := c.who.Priority(c.header); rank != c.rank || ok != c.ok {
			t.Errorf("%s with %q: %d %v, want %d %v", c.who.Name(), c.header, rank, ok, c.rank, c.ok)
		}
	}
	if a.Weight() != 4 || b.Weight() != 1 {
		t.Errorf("weights %d %d, want 4 1", a.Weight(), b.Weight())
	}
}

// TestReplaceKeys: Replace applies at once to Authenticate (a removed key
// is refused, an added one accepted), keeps a renamed-in-place key's
// requests in flight counted against its new max_concurrent, and a
// released permit of the old configuration gives its slot back to the
// new one.
func TestReplaceKeys(t *testing.T) {
	clk := &fakeNow{t: time.Unix(1000, 0)}
	sa, ha := Generate()
	sb, hb := Generate()
	ring, err := NewKeyring("keys", []Key{{Name: "a", Hash: ha, MaxConcurrent: 2}}, clk.now)
	if err != nil {
		t.Fatal(err)
	}
	p1, err := ring.Authenticate(sa).Admit()
	if err != nil {
		t.Fatal(err)
	}
	if ring.Authenticate(sb) != nil {
		t.Fatal("key b accepted before it was added")
	}
	if err := ring.Replace([]Key{{Name: "a", Hash: ha, MaxConcurrent: 1}, {Name: "b", Hash: hb}}); err != nil {
		t.Fatal(err)
	}
	a := ring.Authenticate(sa)
	if a == nil || ring.Authenticate(sb) == nil {
		t.Fatal("a key is refused after Replace")
	}
	if _, err := a.Admit(); !errors.Is(err, ErrLimited) {
		t.Fatalf("a at its new max_concurrent 1 with one request in flight: %v, want limited", err)
	}
	p1.Release()
	p2, err := a.Admit()
	if err != nil {
		t.Fatalf("a after its old permit was released: %v", err)
	}
	p2.Release()
	if err := ring.Replace([]Key{{Name: "b", Hash: hb}}); err != nil {
		t.Fatal(err)
	}
	if ring.Authenticate(sa) != nil {
		t.Fatal("removed key a still accepted")
	}
	if err := ring.Replace([]Key{{Name: "b", Hash: "nonsense"}}); !errors.Is(err, ErrInvalidKey) {
		t.Fatalf("invalid Replace: %v", err)
	}
	if ring.Authenticate(sb) == nil {
		t.Fatal("an invalid Replace changed the keys")
	}
}

// TestKeyExpiresAt: a key is accepted before its expires_at and refused
// from that instant on.
func TestKeyExpiresAt(t *testing.T) {
	clk := &fakeNow{t: time.Unix(1000, 0)}
	s, h := Generate()
	ring, err := NewKeyring("keys", []Key{{Name: "old", Hash: h, ExpiresAt: time.Unix(1060, 0)}}, clk.now)
	if err != nil {
		t.Fatal(err)
	}
	if ring.Authenticate(s) == nil {
		t.Fatal("refused before expires_at")
	}
	clk.add(60 * time.Second)
	if ring.Authenticate(s) != nil {
		t.Fatal("accepted at expires_at")
	}
}

// TestCallerLimited: a key is Limited when it has max_concurrent or
// requests_per_minute, and stays so across a Replace that changes them.
func TestCallerLimited(t *testing.T) {
	_, h1 := Generate()
	_, h2 := Generate()
	_, h3 := Generate()
	kr, err := NewKeyring("keys", []Key{
		{Name: "free", Hash: h1},
		{Name: "conc", Hash: h2, MaxConcurrent: 2},
		{Name: "rate", Hash: h3, RequestsPerMinute: 60},
	}, time.Now)
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]bool{"free": false, "conc": true, "rate": true} {
		if got := kr.ByName(name).Limited(); got != want {
			t.Errorf("%s: Limited() = %v, want %v", name, got, want)
		}
	}
	if err := kr.Replace([]Key{{Name: "free", Hash: h1, RequestsPerMinute: 5}, {Name: "rate", Hash: h3}}); err != nil {
		t.Fatal(err)
	}
	if !kr.ByName("free").Limited() || kr.ByName("rate").Limited() {
		t.Errorf("after Replace: free Limited %v (want true), rate Limited %v (want false)", kr.ByName("free").Limited(), kr.ByName("rate").Limited())
	}
}

func TestValidateQuotas(t *testing.T) {
	t.Parallel()
	_, h := Generate()
	team := Team{Name: "research", Quota: quota.Limits{TokensPerDay: 1000}}
	good := []Key{{Name: "a", Hash: h, Team: "research", Quota: quota.Limits{TokensPerMinute: 100, Uncapped: quota.UncappedRefuse}}}
	if err := Validate("keys", good); err != nil {
		t.Fatal(err)
	}
	if err := ValidateQuotas(good, []Team{team}, map[string]quota.Price{"m": {Input: 1, Output: 2}}); err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]struct {
		keys   []Key
		teams  []Team
		prices map[string]quota.Price
	}{
		"unknown team":       {keys: good},
		"team without name":  {keys: nil, teams: []Team{{}}},
		"team repeated":      {keys: good, teams: []Team{team, team}},
		"team uncapped":      {teams: []Team{{Name: "x", Quota: quota.Limits{Uncapped: "clamp"}}}},
		"team negative":      {teams: []Team{{Name: "x", Quota: quota.Limits{TokensPerDay: -1}}}},
		"negative price":     {prices: map[string]quota.Price{"m": {Input: -1}}},
		"team counted wrong": {teams: []Team{{Name: "x", Quota: quota.Limits{TokensCounted: "both"}}}},
	} {
		if err := ValidateQuotas(c.keys, c.teams, c.prices); !errors.Is(err, ErrInvalidKey) {
			t.Errorf("%s: %v, want ErrInvalidKey", name, err)
		}
	}
	bad := []Key{{Name: "a", Hash: h, Quota: quota.Limits{Uncapped: "sometimes"}}}
	if err := Validate("keys", bad); !errors.Is(err, ErrInvalidKey) || !errors.Is(err, quota.ErrInvalidLimits) {
		t.Errorf("a key's bad uncapped: %v", err)
	}
	keys, teams := QuotaScopes(good, []Team{team})
	if keys["a"].Team != "research" || keys["a"].Bounds[0] != 100 || teams["research"].Bounds[1] != 1000 {
		t.Errorf("scopes %+v %+v", keys, teams)
	}
}

// AdmitLeaving keeps leave of a key's max_concurrent slots free for its
// other requests, but never all of them: a key of max_concurrent 1 lends
// its one slot.
func TestAdmitLeaving(t *testing.T) {
	for _, c := range []struct{ max, leave, want int }{{2, 1, 1}, {4, 1, 3}, {1, 1, 1}, {3, 0, 3}, {0, 1, 100}} {
		ring, err := NewKeyring("keys", []Key{{Name: "k", Hash: Hash("s"), MaxConcurrent: c.max}}, time.Now)
		if err != nil {
			t.Fatal(err)
		}
		caller := ring.ByName("k")
		got := 0
		for got < 100 {
			if _, err := caller.AdmitLeaving(c.leave); err != nil {
				break
			}
			got++
		}
		if got != c.want {
			t.Errorf("max_concurrent %d, leave %d: %d admitted, want %d", c.max, c.leave, got, c.want)
		}
		if c.max > 0 {
			if _, err := caller.Admit(); err == nil && got == c.max {
				t.Errorf("max_concurrent %d: Admit past the limit", c.max)
			} else if err != nil && got < c.max {
				t.Errorf("max_concurrent %d: Admit refused with %d of %d taken: %v", c.max, got, c.max, err)
			}
		}
	}
}
