package edge

import (
	"errors"
	"strings"
	"testing"
	"time"

	"iop/internal/scheduler"
)

const exampleConfig = `
heartbeat_interval: 2s
dispatch_timeout: 15s
queue:
  max_queue: 8
  queue_timeout: 1m
models:
  llama3:
    targets: [llama3.1:8b, meta-llama/Llama-3.1-8B-Instruct]
    max_queue: 32
  embed:
    targets: [nomic-embed-text]
    queue_timeout: 5s
tokens: [s3cret]
`

func TestParseConfig(t *testing.T) {
	cfg, err := ParseConfig([]byte(exampleConfig))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.HeartbeatInterval != 2*time.Second ||
		cfg.DispatchTimeout != 15*time.Second || cfg.Queue.MaxQueue != 8 || cfg.Queue.QueueTimeout != time.Minute ||
		len(cfg.Tokens) != 1 || cfg.Tokens[0].Token != "s3cret" {
		t.Errorf("config %+v", cfg)
	}
	if m := cfg.Models["llama3"]; len(m.Targets) != 2 || m.Targets[1] != "meta-llama/Llama-3.1-8B-Instruct" || m.MaxQueue != 32 {
		t.Errorf("llama3 %+v", m)
	}
	sc := cfg.schedulerConfig(nil)
	if sc.Default != (scheduler.Policy{MaxQueue: 8, QueueTimeout: time.Minute, Fairness: scheduler.FairnessOn, ReconnectGrace: DefaultReconnectGrace}) ||
		sc.Groups["llama3"] != (scheduler.Policy{MaxQueue: 32}) || sc.Groups["embed"] != (scheduler.Policy{QueueTimeout: 5 * time.Second}) {
		t.Errorf("scheduler config %+v", sc)
	}
	if _, err := ParseConfig([]byte("listen: 0.0.0.0:8080\n")); !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "listen") {
		t.Errorf("a key of the process's part: %v, want ErrInvalidConfig naming it", err)
	}
}

func TestConfigDefaults(t *testing.T) {
	cfg, err := ParseConfig(nil)
	if err != nil {
		t.Fatal(err)
	}
	want := Config{
		HeartbeatInterval: 5 * time.Second, DispatchTimeout: 10 * time.Second,
		Queue: QueueConfig{MaxQueue: 16, QueueTimeout: 30 * time.Second, ReconnectGrace: 5 * time.Second},
	}
	if cfg.HeartbeatInterval != want.HeartbeatInterval ||
		cfg.DispatchTimeout != want.DispatchTimeout || cfg.Queue != want.Queue {
		t.Errorf("defaults %+v, want %+v", cfg, want)
	}
	if d := DefaultConfig(); d.Queue != want.Queue || d.HeartbeatInterval != want.HeartbeatInterval {
		t.Errorf("DefaultConfig() = %+v", d)
	}
}

func TestConfigInvalid(t *testing.T) {
	tests := []struct {
		name, yaml, text string
	}{
		{"unknown field", "heartbeat_intervl: 1s", "heartbeat_intervl"},
		{"integer duration", "dispatch_timeout: 5", "into time.Duration"},
		{"bad duration", "heartbeat_interval: soon", "soon"},
		{"negative heartbeat", "heartbeat_interval: -1s", "heartbeat_interval"},
		{"negative max_queue", "queue: {max_queue: -1}", "max_queue"},
		{"negative queue_timeout", "queue: {queue_timeout: -5s}", "queue_timeout"},
		{"alias without targets", "models: {a: {}}", "no targets"},
		{"empty target", `models: {a: {targets: [""]}}`, "empty target"},
		{"repeated target", "models: {a: {targets: [x, x]}}", "repeated"},
		{"negative model max_queue", "models: {a: {targets: [x], max_queue: -2}}", "models.a.max_queue"},
		{"empty token", `tokens: [""]`, "tokens[0]"},
		{"negative max_retries", "max_retries: -1", "max_retries"},
		{"negative cool-down", "circuit_breaker: {cool_down: -1s}", "cool_down"},
		{"max cool-down below cool-down", "circuit_breaker: {cool_down: 1m, max_cool_down: 30s}", "max_cool_down"},
		{"fairness mode", "fairness: maybe", "fairness.mode"},
		{"fairness mapping mode", "fairness: {mode: fair}", "fairness.mode"},
		{"fairness flow", "fairness: {flow: ip}", "fairness.flow"},
		{"fairness flow header", "fairness: {flow: 'header:'}", "fairness.flow"},
		{"model fairness", "models: {a: {targets: [x], fairness: sometimes}}", "models.a.fairness"},
		{"unknown routing", "routing: round_robin", "routing"},
		{"unknown alias routing", "models: {a: {targets: [x], routing: random}}", "models.a.routing"},
		{"negative prefix slack", "prefix_load_slack: -0.1", "prefix_load_slack"},
		{"prefix slack above 1", "prefix_load_slack: 1.5", "prefix_load_slack"},
		{"negative index bound", "prefix_index_blocks: -1", "prefix_index_blocks"},
		{"unknown alias key", "models:\n  a:\n    targets: [x]\n    max_qeue: 2\n", "line 4: field max_qeue not found in type edge.ModelConfig"},
		{"repeated alias", "models:\n  a: {targets: [x]}\n  a: {targets: [y]}\n", `line 3: mapping key "a" already defined at line 2`},
		{"alias target not a list", "models: {a: {targets: x}}", "cannot unmarshal"},
		{"models not a mapping", "models: [a, b]", "models mapping"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseConfig([]byte(tc.yaml))
			if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tc.text) {
				t.Fatalf("ParseConfig = %v, want ErrInvalidConfig mentioning %q", err, tc.text)
			}
		})
	}
	if _, err := NewServer(Config{DispatchTimeout: -time.Second}, Deps{}); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("NewServer with a bad config = %v, want ErrInvalidConfig", err)
	}
}

// TestRoutingConfig: routing is prefix unless set, per edge and
// per alias; prefix_load_slack defaults to 0.5 and keeps an explicit 0.
func TestRoutingConfig(t *testing.T) {
	cfg, err := ParseConfig(nil)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Routing != RoutingPrefix || DefaultConfig().Routing != RoutingPrefix || cfg.PrefixIndexBlocks != DefaultPrefixIndexBlocks {
		t.Fatalf("defaults: routing %q, index %d", cfg.Routing, cfg.PrefixIndexBlocks)
	}
	if p := newRoutingPolicy(cfg); p.slack != 0.5 || p.of("any") != RoutingPrefix {
		t.Fatalf("default policy %+v", p)
	}
	cfg, err = ParseConfig([]byte("routing: least_loaded\nprefix_load_slack: 0\nmodels: {a: {targets: [x], routing: prefix}, b: {targets: [y]}}"))
	if err != nil {
		t.Fatal(err)
	}
	p := newRoutingPolicy(cfg)
	if p.of("a") != RoutingPrefix || p.of("b") != RoutingLeastLoaded || p.of("x") != RoutingLeastLoaded || p.slack != 0 {
		t.Fatalf("policy %+v", p)
	}
	var none *routingPolicy
	if none.of("a") != RoutingLeastLoaded {
		t.Fatal("no policy must route least-loaded")
	}
}

// TestConfigFaultDefaults: max_retries is 1 unless set, and 0 is kept (it
// disables retries); the circuit breaker defaults to 3 failures and a 30s
// cool-down capped at 5m (raised to the cool-down when that is longer).
func TestConfigFaultDefaults(t *testing.T) {
	for _, tc := range []struct {
		yaml    string
		retries int
		breaker BreakerConfig
	}{
		{"", 1, BreakerConfig{Failures: 3, CoolDown: 30 * time.Second, MaxCoolDown: 5 * time.Minute}},
		{"max_retries: 0", 0, BreakerConfig{Failures: 3, CoolDown: 30 * time.Second, MaxCoolDown: 5 * time.Minute}},
		{"max_retries: 3\ncircuit_breaker: {failures: -1, cool_down: 10m}", 3, BreakerConfig{Failures: -1, CoolDown: 10 * time.Minute, MaxCoolDown: 10 * time.Minute}},
		{"circuit_breaker: {failures: 5, cool_down: 2s, max_cool_down: 1m}", 1, BreakerConfig{Failures: 5, CoolDown: 2 * time.Second, MaxCoolDown: time.Minute}},
	} {
		cfg, err := ParseConfig([]byte(tc.yaml))
		if err != nil {
			t.Fatalf("%q: %v", tc.yaml, err)
		}
		if cfg.Retries() != tc.retries || cfg.CircuitBreaker != tc.breaker {
			t.Errorf("%q: retries %d, breaker %+v; want %d, %+v", tc.yaml, cfg.Retries(), cfg.CircuitBreaker, tc.retries, tc.breaker)
		}
	}
}

// TestFairnessConfig: fairness is on, with key flows, by default;
// `fairness: off` (a scalar) turns it off for every model but one that
// says on; the mapping form sets the flow source; the scheduler's default
// and per-model policies follow.
func TestFairnessConfig(t *testing.T) {
	def := DefaultConfig()
	if def.Fairness.Mode != FairnessOn || def.Fairness.Flow != FlowKey {
		t.Fatalf("default fairness %+v, want on by key", def.Fairness)
	}
	if sc := def.schedulerConfig(nil); sc.Default.Fairness != scheduler.FairnessOn {
		t.Fatalf("default scheduler fairness %q", sc.Default.Fairness)
	}
	cfg, err := ParseConfig([]byte("fairness: off\nmodels:\n  chat: {targets: [x], fairness: \"on\"}\n  other: {targets: [y]}\n"))
	if err != nil {
		t.Fatal(err)
	}
	sc := cfg.schedulerConfig(nil)
	if cfg.Fairness.Mode != FairnessOff || sc.Default.Fairness != scheduler.FairnessOff ||
		sc.Groups["chat"].Fairness != scheduler.FairnessOn || sc.Groups["other"].Fairness != scheduler.FairnessDefault {
		t.Fatalf("fairness off with chat on: %+v, scheduler %+v", cfg.Fairness, sc)
	}
	cfg, err = ParseConfig([]byte("fairness: {flow: header:X-Tenant}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Fairness.Mode != FairnessOn || cfg.Fairness.Flow != "header:X-Tenant" {
		t.Fatalf("mapping: %+v", cfg.Fairness)
	}
}
