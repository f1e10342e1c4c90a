package auth

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"iop/internal/quota"
)

// HashPrefix starts every stored key hash: "sha256:" and 64 lowercase hex
// digits.
const HashPrefix = "sha256:"

// KeyPrefix starts every key Generate makes, so a leaked one is easy to
// recognise (secret scanners, logs).
const KeyPrefix = "iop-"

// keyBytes is the entropy of a generated key: 256 bits.
const keyBytes = 32

// Key is one configured API key: a name, the hash of its secret, and the
// limits of a client key (admin keys have none). In YAML:
//
//   - name: team-a
//     hash: sha256:9f86d0...
//     max_concurrent: 4          # requests in flight at once; 0 = no limit
//     requests_per_minute: 60    # 0 = no limit
//     models: [llama3, qwen2.5]  # empty = every model
//     weight: 2                  # the key's share of a busy model; default 1
//     priority: standard         # critical | standard (default) | sheddable
//     priority_header: standard  # highest X-Iop-Priority may ask; "" = ignored
//     expires_at: 2026-12-31T00:00:00Z  # refused from then on; unset = never
//     team: research             # its team (Team.Name); "" = none
//     quota: {tokens_per_minute: 10000, uncapped: clamp}  # quota.Limits
type Key struct {
	// Name identifies the key in logs, the usage ledger and errors. Required,
	// unique among the keys of one keyring.
	Name string `yaml:"name"`
	// Hash is HashPrefix + hex(SHA-256(secret)), as Hash returns it.
	Hash string `yaml:"hash"`
	// MaxConcurrent bounds the key's requests in flight; 0 = no limit.
	MaxConcurrent int `yaml:"max_concurrent"`
	// RequestsPerMinute bounds how many requests the key may start per
	// minute (a token bucket of that size, refilled evenly); 0 = no limit.
	RequestsPerMinute int `yaml:"requests_per_minute"`
	// Models are the model names (aliases or served names) the key may
	// request; empty means every model.
	Models []string `yaml:"models"`
	// Weight is the key's flow weight, 1 to MaxWeight: where a model's
	// queue is busy, flows get slots in proportion to their weights
	// (package scheduler, "Fair order"). 0 means 1.
	Weight int `yaml:"weight"`
	// Priority is the band of the key's requests: "critical", "standard"
	// (the default, also "") or "sheddable".
	Priority string `yaml:"priority"`
	// PriorityHeader is the highest priority a request of the key may ask
	// for with the X-Iop-Priority header (a priority name); a higher ask
	// is lowered to it. "" means the header is ignored.
	PriorityHeader string `yaml:"priority_header"`
	// ExpiresAt, when set, is the instant (RFC 3339 in YAML) from which
	// the key is refused with 401, as if removed: the overlap window of a
	// rotation lists the old key with expires_at beside the new one.
	ExpiresAt time.Time `yaml:"expires_at"`
	// Team names the key's team (a Team of the same configuration); the
	// team's quota bounds the sum of its keys' usage. "" = none.
	Team string `yaml:"team"`
	// Quota are the key's own quota windows (package quota); zero = none.
	Quota quota.Limits `yaml:"quota"`
}

// Team is a named group of keys whose quota bounds the sum of their
// usage. In YAML, at the top of a keys file:
//
//	teams:
//	  - name: research
//	    quota: {tokens_per_day: 2000000, gpu_seconds_per_month: 36000}
type Team struct {
	// Name identifies the team (Key.Team); required, unique.
	Name string `yaml:"name"`
	// Quota are the team's windows (quota.Limits; uncapped and
	// default_max_tokens are a key's only).
	Quota quota.Limits `yaml:"quota"`
}

// ValidateQuotas reports the first problem of the quota configuration:
// a team without a name or named twice, a team's or a key's invalid
// limits, a key naming a team that does not exist, an invalid price.
// Errors wrap ErrInvalidKey.
func ValidateQuotas(keys []Key, teams []Team, prices map[string]quota.Price) error {
	names := make(map[string]bool, len(teams))
	for i, t := range teams {
		at := fmt.Sprintf("teams[%d]", i)
		if t.Name == "" || strings.ContainsAny(t.Name, "\r\n") {
			return fmt.Errorf("%w: %s: empty name or a line break in it", ErrInvalidKey, at)
		}
		if names[t.Name] {
			return fmt.Errorf("%w: %s: name %q repeated", ErrInvalidKey, at, t.Name)
		}
		names[t.Name] = true
		if err := t.Quota.ValidateTeam(); err != nil {
			return fmt.Errorf("%w: %s (%s): %w", ErrInvalidKey, at, t.Name, err)
		}
	}
	for i, k := range keys {
		if k.Team != "" && !names[k.Team] {
			return fmt.Errorf("%w: keys[%d] (%s): team %q is not among teams", ErrInvalidKey, i, k.Name, k.Team)
		}
	}
	for model, p := range prices {
		if err := p.Validate(); err != nil {
			return fmt.Errorf("%w: prices[%s]: %w", ErrInvalidKey, model, err)
		}
	}
	return nil
}

// QuotaScopes converts keys and teams to the scopes of a quota.Ledger
// (quota.Ledger.Configure), by name.
func QuotaScopes(keys []Key, teams []Team) (byKey, byTeam map[string]quota.Scope) {
	byKey, byTeam = make(map[string]quota.Scope, len(keys)), make(map[string]quota.Scope, len(teams))
	for _, k := range keys {
		byKey[k.Name] = quota.Scope{Team: k.Team, Bounds: k.Quota.Bounds(), TokensCounted: k.Quota.TokensCounted}
	}
	for _, t := range teams {
		byTeam[t.Name] = quota.Scope{Bounds: t.Quota.Bounds(), TokensCounted: t.Quota.TokensCounted}
	}
	return byKey, byTeam
}

// MaxWeight is the largest Key.Weight (the scheduler's bound).
const MaxWeight = 1 << 16

// Priorities are the priority names, highest first.
var Priorities = []string{"critical", "standard", "sheddable"}

// PriorityRank is a priority name's rank: 1 critical, 0 standard (and ""),
// -1 sheddable; ok false for any other name.
func PriorityRank(name string) (rank int, ok bool) {
	switch name {
	case "critical":
		return 1, true
	case "standard", "":
		return 0, true
	case "sheddable":
		return -1, true
	}
	return 0, false
}

// Generate returns a new random key, KeyPrefix followed by 256 bits of
// crypto/rand in unpadded base64url, and its Hash.
func Generate() (secret, hash string) {
	var b [keyBytes]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go ≥ 1.24)
	secret = KeyPrefix + base64.RawURLEncoding.EncodeToString(b[:])
	return secret, Hash(secret)
}

// Hash returns the stored form of a secret: HashPrefix + hex SHA-256.
//
// A plain, unsalted SHA-256 is enough here, unlike for passwords: the keys
// Generate makes carry 256 bits of entropy, so no dictionary or brute-force
// search of the hash is feasible and a slow KDF (bcrypt, argon2) would only
// cost every request time. The hash is what lets the config hold no usable
// secret. Node join tokens are hashed the same way when configured by hash;
// an operator choosing a low-entropy token gets no such protection.
func Hash(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return HashPrefix + hex.EncodeToString(sum[:])
}

// ParseHash decodes a stored hash (HashPrefix + 64 hex digits, any case).
func ParseHash(s string) ([sha256.Size]byte, error) {
	var out [sha256.Size]byte
	digits, ok := strings.CutPrefix(s, HashPrefix)
	if !ok {
		return out, fmt.Errorf("%w: hash must start with %q", ErrInvalidKey, HashPrefix)
	}
	b, err := hex.DecodeString(digits)
	if err != nil || len(b) != sha256.Size {
		return out, fmt.Errorf("%w: hash must be %q and 64 hex digits", ErrInvalidKey, HashPrefix)
	}
	copy(out[:], b)
	return out, nil
}

// Validate reports the first problem of keys, naming them by field (for
// example "keys[2]"): an empty or repeated name, a malformed or repeated
// hash, a negative limit, an empty model name, invalid quota limits.
// Errors wrap ErrInvalidKey. ValidateQuotas checks the teams the keys
// name.
func Validate(field string, keys []Key) error {
	names := make(map[string]bool, len(keys))
	hashes := make(map[[sha256.Size]byte]bool, len(keys))
	for i, k := range keys {
		at := fmt.Sprintf("%s[%d]", field, i)
		if k.Name == "" {
			return fmt.Errorf("%w: %s: empty name", ErrInvalidKey, at)
		}
		if strings.ContainsAny(k.Name, "\r\n") {
			return fmt.Errorf("%w: %s: name has a line break", ErrInvalidKey, at)
		}
		if names[k.Name] {
			return fmt.Errorf("%w: %s: name %q repeated", ErrInvalidKey, at, k.Name)
		}
		names[k.Name] = true
		h, err := ParseHash(k.Hash)
		if err != nil {
			return fmt.Errorf("%s (%s): %w", at, k.Name, err)
		}
		if hashes[h] {
			return fmt.Errorf("%w: %s (%s): the same hash as another key", ErrInvalidKey, at, k.Name)
		}
		hashes[h] = true
		if k.MaxConcurrent < 0 || k.RequestsPerMinute < 0 {
			return fmt.Errorf("%w: %s (%s): negative limit", ErrInvalidKey, at, k.Name)
		}
		if k.Weight < 0 || k.Weight > MaxWeight {
			return fmt.Errorf("%w: %s (%s): weight %d is outside 0..%d", ErrInvalidKey, at, k.Name, k.Weight, MaxWeight)
		}
		if _, ok := PriorityRank(k.Priority); !ok {
			return fmt.Errorf("%w: %s (%s): priority %q is none of %s", ErrInvalidKey, at, k.Name, k.Priority, strings.Join(Priorities, ", "))
		}
		if _, ok := PriorityRank(k.PriorityHeader); !ok {
			return fmt.Errorf("%w: %s (%s): priority_header %q is none of %s", ErrInvalidKey, at, k.Name, k.PriorityHeader, strings.Join(Priorities, ", "))
		}
		for _, m := range k.Models {
			if m == "" {
				return fmt.Errorf("%w: %s (%s): empty model name", ErrInvalidKey, at, k.Name)
			}
		}
		if err := k.Quota.Validate(); err != nil {
			return fmt.Errorf("%w: %s (%s): %w", ErrInvalidKey, at, k.Name, err)
		}
	}
	return nil
}

// Keyring holds the keys one class of routes accepts and the live limit
// state of each. Replace swaps its keys while requests run. A nil *Keyring
// holds no key. Safe for concurrent use.
type Keyring struct {
	field string
	now   func() time.Time
	table atomic.Pointer[keyTable] // swapped whole by Replace
}

// keyTable is one configuration's keys; never written once stored.
type keyTable struct {
	byHash map[[sha256.Size]byte]*Caller
	byName map[string]*Caller
}

// NewKeyring validates keys (Validate) and builds their keyring; field
// names them in errors ("keys", "admin_keys"). now is the clock of the
// per-minute limits and of expires_at; nil means time.Now.
func NewKeyring(field string, keys []Key, now func() time.Time) (*Keyring, error) {
	if now == nil {
		now = time.Now
	}
	k := &Keyring{field: field, now: now}
	if err := k.Replace(keys); err != nil {
		return nil, err
	}
	return k, nil
}

// Replace makes keys the keyring's keys, at once for every later
// Authenticate: a key left out is refused from now on, a new one accepted,
// a changed one has its new limits. The requests already admitted keep
// their permits. A key that keeps its name keeps its live state: its
// requests in flight count against its (new) max_concurrent, and its
// per-minute bucket stays unless requests_per_minute changed. An invalid
// keys (Validate) changes nothing and returns the error.
func (k *Keyring) Replace(keys []Key) error {
	if err := Validate(k.field, keys); err != nil {
		return err
	}
	old := k.table.Load()
	t := &keyTable{byHash: make(map[[sha256.Size]byte]*Caller, len(keys)), byName: make(map[string]*Caller, len(keys))}
	for _, key := range keys {
		h, _ := ParseHash(key.Hash)
		c := &Caller{name: key.Name, hash: h, maxConcurrent: key.MaxConcurrent, now: k.now, expiresAt: key.ExpiresAt,
			weight: max(key.Weight, 1), headerMax: key.PriorityHeader != "", team: key.Team, quota: key.Quota}
		c.priority, _ = PriorityRank(key.Priority)
		c.priorityMax, _ = PriorityRank(key.PriorityHeader)
		if len(key.Models) > 0 {
			c.models = make(map[string]bool, len(key.Models))
			for _, m := range key.Models {
				c.models[m] = true
			}
		}
		var was *Caller
		if old != nil {
			was = old.byName[key.Name]
		}
		if was != nil {
			c.st = was.st
		} else {
			c.st = &keyState{}
		}
		c.st.setRate(key.RequestsPerMinute)
		t.byHash[h] = c
		t.byName[key.Name] = c
	}
	k.table.Store(t)
	return nil
}

// ByName returns the caller of the key named name, or nil: the scheduler
// leader of several edges takes a follower's request slots of a key by its
// name (its limits are counted once, at the leader).
func (k *Keyring) ByName(name string) *Caller {
	if k == nil {
		return nil
	}
	return k.table.Load().byName[name]
}

// ExhaustRates empties every key's per-minute allowance
// (Caller.ExhaustRate).
func (k *Keyring) ExhaustRates() {
	if k == nil {
		return
	}
	for _, c := range k.table.Load().byName {
		c.ExhaustRate()
	}
}

// Len is the number of keys; 0 for a nil keyring.
func (k *Keyring) Len() int {
	if k == nil {
		return 0
	}
	return len(k.table.Load().byHash)
}

// Authenticate returns the caller whose key is secret, or nil (also for a
// key past its expires_at). The
// secret's SHA-256 is looked up in a map (a lookup by a hash of a
// high-entropy secret reveals nothing useful through timing), then compared
// in constant time (crypto/subtle) with the stored hash.
func (k *Keyring) Authenticate(secret string) *Caller {
	if k == nil || secret == "" {
		return nil
	}
	sum := sha256.Sum256([]byte(secret))
	c := k.table.Load().byHash[sum]
	if c == nil || subtle.ConstantTimeCompare(c.hash[:], sum[:]) != 1 {
		return nil
	}
	if !c.expiresAt.IsZero() && !k.now().Before(c.expiresAt) {
		return nil
	}
	return c
}

// Credential returns the API key a request carries: the token of
// "Authorization: Bearer KEY" (scheme case-insensitive, RFC 7235 §2.1), or
// the password of "Authorization: Basic" (RFC 7617; any user name: what a
// browser sends for the dashboard after its login prompt), else the
// "x-api-key" header (Anthropic's and several gateways' convention), else
// "". Surrounding spaces are trimmed.
func Credential(h http.Header) string {
	if v := h.Get("Authorization"); v != "" {
		scheme, token, ok := strings.Cut(strings.TrimSpace(v), " ")
		switch {
		case ok && strings.EqualFold(scheme, "Bearer"):
			return strings.TrimSpace(token)
		case ok && strings.EqualFold(scheme, "Basic"):
			if pair, err := base64.StdEncoding.DecodeString(strings.TrimSpace(token)); err == nil {
				if _, password, ok := strings.Cut(string(pair), ":"); ok {
					return strings.TrimSpace(password)
				}
			}
		}
	}
	return strings.TrimSpace(h.Get("X-Api-Key"))
}
