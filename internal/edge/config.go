package edge

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"reflect"
	"sort"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"iop/internal/cluster"
	"iop/internal/scheduler"
)

// Defaults applied by Config.SetDefaults to zero fields.
const (
	DefaultHeartbeatInterval = 5 * time.Second
	DefaultDispatchTimeout   = 10 * time.Second
	DefaultMaxQueue          = scheduler.DefaultMaxQueue     // 16
	DefaultQueueTimeout      = scheduler.DefaultQueueTimeout // 30s
	DefaultLongContextTokens = 8192
	DefaultMaxRetries        = 1
	DefaultBreakerFailures   = 3
	DefaultBreakerCoolDown   = 30 * time.Second
	DefaultBreakerMaxCool    = 5 * time.Minute
)

// Config is the edge core's configuration: the node endpoint's protocol
// and TLS, the scheduler's queue policies and routing, the model aliases,
// node join tokens, retries and the circuit breaker, and the cluster. It
// is one part of the edge process's file (process.EdgeFile), whose keys
// are flat; the listeners, the HTTP API's limits, the keys, the stores and
// tracing are the process's parts. A zero field means its documented
// default; durations are Go duration strings in YAML ("30s", "1m30s").
//
//	heartbeat_interval: 5s
//	dispatch_timeout: 10s
//	queue: {max_queue: 16, queue_timeout: 30s}
//	models:
//	  llama3:
//	    targets: [llama3.1:8b, meta-llama/Llama-3.1-8B-Instruct]
//	    max_queue: 32
//	    queue_timeout: 1m
//	tokens:
//	  - s3cret-node-token                      # any node id
//	  - {token: gpu-token, nodes: [gpu-1]}     # only node gpu-1
//	tls_cert: /etc/iop/edge.crt                # TLS on the node endpoint
//	tls_key: /etc/iop/edge.key
//	client_ca: /etc/iop/nodes-ca.crt           # mutual TLS: nodes need a cert from this CA
//	long_context_tokens: 8192
//	max_retries: 1
//	circuit_breaker: {failures: 3, cool_down: 30s, max_cool_down: 5m}
//	routing: prefix                            # or least_loaded; per alias too (models.<alias>.routing)
//	prefix_index_blocks: 16384                 # per served model
//	prefix_load_slack: 0.5
type Config struct {
	// HeartbeatInterval is how often both sides send a heartbeat on a
	// node's control stream; a connection silent for 3 intervals is fenced.
	// Default 5s.
	HeartbeatInterval time.Duration `yaml:"heartbeat_interval"`
	// DispatchTimeout bounds the time from sending a Dispatch to the node
	// opening that run's Run stream; default 10s.
	DispatchTimeout time.Duration `yaml:"dispatch_timeout"`
	// Queue is the default policy of every model group.
	Queue QueueConfig `yaml:"queue"`
	// Models maps an alias clients may request to the served model names
	// that can answer it, with per-model queue overrides. A served model
	// name needs no entry to be requested.
	Models Aliases `yaml:"models"`
	// Tokens are the node join tokens accepted in Hello, each optionally
	// limited to some node ids; empty accepts any token. Whatever the
	// tokens, a node id stays bound to the token it first joined with
	// (trust.go).
	Tokens []NodeToken `yaml:"tokens"`
	// TLSCert and TLSKey are PEM files of the node endpoint's certificate
	// and key; both empty means plaintext gRPC (keep it on loopback or a
	// private network).
	TLSCert string `yaml:"tls_cert"`
	TLSKey  string `yaml:"tls_key"`
	// ClientCA, with TLS, is a PEM file of the CA(s) node certificates
	// must chain to: mutual TLS; a node without such a certificate cannot
	// connect.
	ClientCA string `yaml:"client_ca"`
	// LongContextTokens is the estimated prompt size, in tokens, from which
	// a request is long-context and also needs a free long_capacity slot of
	// its provider; default 8192, negative disables the classification.
	LongContextTokens int `yaml:"long_context_tokens"`
	// MaxRetries is how many more times a request is admitted, each time to
	// a candidate not tried yet for it, when its provider failed before any
	// byte of the answer reached the client: unreachable, or answered 502,
	// 503 or 429, or its node was lost before the run's first message.
	// nil means the default, 1; 0 disables these retries. (A dispatch that
	// never reached a provider, see Service.Dispatch, is admitted again once
	// whatever this says.)
	MaxRetries *int `yaml:"max_retries"`
	// CircuitBreaker takes a provider that keeps failing out of rotation
	// for a cool-down.
	CircuitBreaker BreakerConfig `yaml:"circuit_breaker"`
	// Fairness orders each model's queue between flows (docs/scheduling.md, "Fair
	// sharing"): `fairness: off`, or a mapping {mode: on|off, flow: ...}.
	Fairness FairnessConfig `yaml:"fairness"`
	// Residency makes the scheduler treat a model load as a cost
	// (scheduler package doc, "Residency"; docs/scheduling.md): a provider
	// holding the model wins, requests wait for a load in progress, and a
	// provider serves the waiters of a model it holds before switching,
	// each passed over for at most max_extra_wait. `residency: off`, or a
	// mapping {mode, max_extra_wait, load_time}. Reloadable.
	Residency ResidencyConfig `yaml:"residency"`
	// Routing is how a provider is chosen among the candidates with a free
	// slot, for every model group without its own (ModelConfig.Routing):
	// "prefix" (the default: prefix-cache-aware, the provider expected to
	// hold the longest prefix of the prompt in its cache, traded against
	// load; see PrefixLoadSlack) or "least_loaded" (the lowest
	// in-flight/capacity). Either way a busy provider is never chosen while
	// another candidate has a free slot, and a session's preferred provider
	// (Request.PreferProviderID) wins while it has one. Reloadable.
	Routing Routing `yaml:"routing"`
	// PrefixIndexBlocks bounds the edge's prefix index of one served model,
	// in blocks of 64 characters of rendered prompt (about 16 tokens); LRU
	// beyond it. Default 16384 (about 262,000 tokens of prompt, about 5 MiB
	// per served model). Read at start.
	PrefixIndexBlocks int `yaml:"prefix_index_blocks"`
	// PrefixLoadSlack bounds what prefix routing trades for a cache hit:
	// a provider is chosen for the prefix it is expected to hold only
	// while its load (in-flight/capacity) is at most this much above the
	// least loaded free candidate's; among those the longest expected hit
	// wins, ties least-loaded (scheduler.Request.Affinity). nil means the
	// default, 0.5 (2 requests more on a provider of capacity 4); 0 uses
	// the prefix only to break ties between equally loaded providers.
	// Reloadable.
	PrefixLoadSlack *float64 `yaml:"prefix_load_slack"`
	// Cluster, when set, makes this edge one of several that elect one
	// scheduler leader on etcd (package cluster; cluster.go): nil is a
	// single edge, its own leader, with no etcd.
	Cluster *cluster.Config `yaml:"cluster"`
}

// Fairness modes and flow sources (FairnessConfig).
const (
	FairnessOn       = "on"
	FairnessOff      = "off"
	FlowKey          = "key"
	FlowUser         = "user"
	FlowHeaderPrefix = "header:"
)

// FairnessConfig is the edge's fair sharing. In YAML, a scalar (`fairness:
// off`) sets Mode alone; a mapping sets both:
//
//	fairness:
//	  mode: on                 # on (default) | off: FIFO, as before
//	  flow: header:X-Iop-Flow  # key (default) | user | header:<Name>
type FairnessConfig struct {
	// Mode is "on" (the default, also "") or "off". With "off" every
	// model's queue is FIFO within each priority band, as iop was before
	// flows; a model's own `fairness` overrides it.
	Mode string `yaml:"mode"`
	// Flow says what names a request's flow: "key" (the default, also
	// ""): its API key's name; "user": the OpenAI body's "user" field, or
	// the key's name where there is none; "header:<Name>": that header's
	// value, or the key's name where it is absent. Requests with no key
	// and no value share one flow.
	Flow string `yaml:"flow"`
}

// UnmarshalYAML reads a scalar as Mode, or a mapping.
func (f *FairnessConfig) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode {
		f.Mode = n.Value
		return nil
	}
	type plain FairnessConfig
	return n.Decode((*plain)(f))
}

// Residency modes (ResidencyConfig).
const (
	ResidencyOn  = "on"
	ResidencyOff = "off"
)

// ResidencyConfig is the edge's residency-aware routing. In YAML, a
// scalar (`residency: off`) sets Mode alone.
//
//	residency:
//	  mode: on             # on (default) | off: least loaded, FIFO
//	  max_extra_wait: 10s  # how long one request may be passed over
//	  load_time: 5s        # a load's cost until one is measured
type ResidencyConfig struct {
	// Mode is "on" (the default, also "") or "off".
	Mode string `yaml:"mode"`
	// MaxExtraWait bounds how long one request may be passed over by
	// requests for a model its provider holds, or wait for a provider
	// holding its model; default scheduler.DefaultMaxExtraWait (10s).
	MaxExtraWait time.Duration `yaml:"max_extra_wait"`
	// LoadTime is a model load's expected cost where none was measured
	// yet (a cold run's delay to its first output); default
	// scheduler.DefaultLoadTime (5s).
	LoadTime time.Duration `yaml:"load_time"`
}

// UnmarshalYAML reads a scalar as Mode, or a mapping.
func (r *ResidencyConfig) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode {
		r.Mode = n.Value
		return nil
	}
	type plain ResidencyConfig
	return n.Decode((*plain)(r))
}

// policy is the scheduler's residency policy: nil when off.
func (r ResidencyConfig) policy() *scheduler.ResidencyPolicy {
	if r.Mode == ResidencyOff {
		return nil
	}
	return &scheduler.ResidencyPolicy{MaxExtraWait: r.MaxExtraWait, LoadTime: r.LoadTime}
}

func fairnessPolicy(mode string) scheduler.Fairness {
	switch mode {
	case FairnessOff:
		return scheduler.FairnessOff
	case FairnessOn:
		return scheduler.FairnessOn
	}
	return scheduler.FairnessDefault
}

// prefixLoadSlack returns PrefixLoadSlack, or its default when unset.
func (c Config) prefixLoadSlack() float64 {
	if c.PrefixLoadSlack == nil {
		return DefaultPrefixLoadSlack
	}
	return *c.PrefixLoadSlack
}

// BreakerConfig is the circuit breaker of every (node, provider); zero
// fields take the defaults (failures 3, cool_down 30s, max_cool_down 5m).
type BreakerConfig struct {
	// Failures is how many failures of a provider in a row (an error
	// status of 500 or above or 429 before the first byte, unreachable, a
	// timeout, a dispatch its node did not open or refused, but for a
	// drain or a busy provider: DispatchRefused.busy) open its
	// circuit. Negative disables the breaker.
	Failures int `yaml:"failures"`
	// CoolDown is how long an open circuit keeps its provider out of
	// rotation before one trial request may go to it. A failed trial opens
	// the circuit again for twice the previous cool-down, up to
	// MaxCoolDown.
	CoolDown time.Duration `yaml:"cool_down"`
	// MaxCoolDown caps the doubled cool-down; at least CoolDown.
	MaxCoolDown time.Duration `yaml:"max_cool_down"`
}

// QueueConfig is a model group's queue policy; zero fields take the defaults
// (max_queue 16, queue_timeout 30s).
type QueueConfig struct {
	// MaxQueue is the most requests that may wait in one group at once.
	MaxQueue int `yaml:"max_queue"`
	// QueueTimeout is how long one request may wait for a slot.
	QueueTimeout time.Duration `yaml:"queue_timeout"`
	// ReconnectGrace is how long a queued request whose every provider
	// went away (its node disconnected, or drains for a restart) stays
	// queued for one to come back before it is answered 503; default
	// DefaultReconnectGrace (5s), never beyond the queue timeout; negative
	// means none (503 at once).
	ReconnectGrace time.Duration `yaml:"reconnect_grace"`
	// Batch is the batch band's policy (every model's): the queue of the
	// batch runner's requests, below every interactive band.
	Batch BatchQueueConfig `yaml:"batch"`
}

// BatchQueueConfig is the batch band's policy (scheduler.BatchPolicy);
// zero fields take the defaults.
type BatchQueueConfig struct {
	// Headroom is how many slots of each provider a batch request leaves
	// free for interactive ones (at most capacity − 1); default 1,
	// negative none.
	Headroom int `yaml:"headroom"`
	// MaxQueue is the most batch requests that may wait in one model's
	// queue, apart from max_queue; default 4096.
	MaxQueue int `yaml:"max_queue"`
	// QueueTimeout is how long one batch request may wait; default 24h.
	QueueTimeout time.Duration `yaml:"queue_timeout"`
	// Backoff is how long an interactive request that had to wait for a
	// provider keeps one more of its slots from batch requests, the
	// headroom at most doubling (scheduler.BatchPolicy's Backoff); default
	// DefaultBatchBackoff (5s), negative none.
	Backoff time.Duration `yaml:"backoff"`
}

// DefaultBatchBackoff is queue.batch.backoff's default: longer than a
// typical interactive answer, so the requests that waited end and their
// slots go to the next ones before batch lines take slots again.
const DefaultBatchBackoff = 5 * time.Second

// backoff is the scheduler's Backoff of b: its default for zero, none
// (0) for a negative one.
func (b BatchQueueConfig) backoff() time.Duration {
	if b.Backoff == 0 {
		return DefaultBatchBackoff
	}
	return max(b.Backoff, 0)
}

// maxReconnectGrace is the longest reconnect grace of c (its default and
// every model's), 0 when none is positive.
func (c Config) maxReconnectGrace() time.Duration {
	g := max(c.Queue.ReconnectGrace, 0)
	for _, m := range c.Models {
		g = max(g, m.ReconnectGrace)
	}
	return g
}

// DefaultReconnectGrace is queue.reconnect_grace's default: a node's
// restart of a few seconds keeps its queued requests.
const DefaultReconnectGrace = 5 * time.Second

// Aliases maps each alias to its ModelConfig (Config.Models).
type Aliases map[string]ModelConfig

// UnmarshalYAML reads a mapping of aliases in time linear in their number
// (yaml.v3 compares a mapping's keys pairwise, which is quadratic). A
// repeated alias, an unknown key of an alias or a value of the wrong shape
// is a *yaml.TypeError naming its line, as yaml.v3's strict decoding says
// them.
func (a *Aliases) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		*a = nil
		return nil
	}
	if n.Kind != yaml.MappingNode {
		return &yaml.TypeError{Errors: []string{fmt.Sprintf("line %d: cannot unmarshal %s into the models mapping", n.Line, n.ShortTag())}}
	}
	out := make(Aliases, len(n.Content)/2)
	at := make(map[string]int, len(n.Content)/2)
	var bad []string
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if line, ok := at[k.Value]; ok {
			bad = append(bad, fmt.Sprintf("line %d: mapping key %q already defined at line %d", k.Line, k.Value, line))
			continue
		}
		at[k.Value] = k.Line
		if v.Kind == yaml.MappingNode {
			for j := 0; j+1 < len(v.Content); j += 2 {
				if f := v.Content[j]; !modelConfigKeys[f.Value] {
					bad = append(bad, fmt.Sprintf("line %d: field %s not found in type edge.ModelConfig", f.Line, f.Value))
				}
			}
		}
		var m ModelConfig
		if err := v.Decode(&m); err != nil {
			var te *yaml.TypeError
			if !errors.As(err, &te) {
				return err
			}
			bad = append(bad, te.Errors...)
			continue
		}
		out[k.Value] = m
	}
	if len(bad) > 0 {
		return &yaml.TypeError{Errors: bad}
	}
	*a = out
	return nil
}

// modelConfigKeys are ModelConfig's yaml keys.
var modelConfigKeys = func() map[string]bool {
	keys := make(map[string]bool)
	t := reflect.TypeOf(ModelConfig{})
	for i := range t.NumField() {
		if name, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ","); name != "" && name != "-" {
			keys[name] = true
		}
	}
	return keys
}()

// ModelConfig is one alias: its served targets and its queue overrides
// (zero = the queue defaults).
type ModelConfig struct {
	// Targets are served model names, in order of preference when one
	// provider serves several of them. At least one.
	Targets      []string      `yaml:"targets"`
	MaxQueue     int           `yaml:"max_queue"`
	QueueTimeout time.Duration `yaml:"queue_timeout"`
	// ReconnectGrace overrides queue.reconnect_grace for this model; 0
	// keeps it.
	ReconnectGrace time.Duration `yaml:"reconnect_grace"`
	// Fairness, "on" or "off", overrides the edge's fairness.mode for this
	// model's queue; "" keeps it.
	Fairness string `yaml:"fairness"`
	// Routing overrides Config.Routing for this alias: "prefix" or
	// "least_loaded"; "" means the edge's.
	Routing Routing `yaml:"routing"`
	// KeepLoaded is on how many providers to keep one of Targets loaded
	// ahead of demand (an Ollama's; one whose server holds its models
	// always counts as holding them); 0: none.
	KeepLoaded int `yaml:"keep_loaded"`
}

// DefaultConfig returns the configuration with every default filled in.
func DefaultConfig() Config {
	var c Config
	c.SetDefaults()
	return c
}

// SetDefaults fills zero fields with their documented defaults.
func (c *Config) SetDefaults() {
	if c.HeartbeatInterval == 0 {
		c.HeartbeatInterval = DefaultHeartbeatInterval
	}
	if c.DispatchTimeout == 0 {
		c.DispatchTimeout = DefaultDispatchTimeout
	}
	if c.Queue.MaxQueue == 0 {
		c.Queue.MaxQueue = DefaultMaxQueue
	}
	if c.Queue.QueueTimeout == 0 {
		c.Queue.QueueTimeout = DefaultQueueTimeout
	}
	if c.Queue.ReconnectGrace == 0 {
		c.Queue.ReconnectGrace = DefaultReconnectGrace
	}
	if c.Fairness.Mode == "" {
		c.Fairness.Mode = FairnessOn
	}
	if c.Fairness.Flow == "" {
		c.Fairness.Flow = FlowKey
	}
	if c.LongContextTokens == 0 {
		c.LongContextTokens = DefaultLongContextTokens
	}
	if c.MaxRetries == nil {
		n := DefaultMaxRetries
		c.MaxRetries = &n
	}
	if c.Routing == "" {
		c.Routing = RoutingPrefix
	}
	if c.PrefixIndexBlocks == 0 {
		c.PrefixIndexBlocks = DefaultPrefixIndexBlocks
	}
	if c.CircuitBreaker.Failures == 0 {
		c.CircuitBreaker.Failures = DefaultBreakerFailures
	}
	if c.CircuitBreaker.CoolDown == 0 {
		c.CircuitBreaker.CoolDown = DefaultBreakerCoolDown
	}
	if c.CircuitBreaker.MaxCoolDown == 0 {
		c.CircuitBreaker.MaxCoolDown = max(DefaultBreakerMaxCool, c.CircuitBreaker.CoolDown)
	}
}

// Retries returns MaxRetries, or its default when unset.
func (c Config) Retries() int {
	if c.MaxRetries == nil {
		return DefaultMaxRetries
	}
	return *c.MaxRetries
}

// Validate reports the first problem of a configuration whose defaults are
// set, as an error wrapping ErrInvalidConfig that names the YAML key: a
// non-positive interval or timeout, a negative queue field, an
// alias with an empty name or no (or an empty or repeated) target, an empty
// token, a negative max_retries, a negative circuit breaker cool-down or a
// max_cool_down below cool_down, TLS files that do not go together, an
// invalid cluster section.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...))
	}
	if c.HeartbeatInterval <= 0 {
		bad("heartbeat_interval %s must be positive", c.HeartbeatInterval)
	}
	if c.DispatchTimeout <= 0 {
		bad("dispatch_timeout %s must be positive", c.DispatchTimeout)
	}
	if c.Queue.MaxQueue < 0 {
		bad("queue.max_queue %d is negative", c.Queue.MaxQueue)
	}
	if m := c.Fairness.Mode; m != "" && m != FairnessOn && m != FairnessOff {
		bad("fairness.mode %q is neither on nor off", m)
	}
	if m := c.Residency.Mode; m != "" && m != ResidencyOn && m != ResidencyOff {
		bad("residency.mode %q is neither on nor off", m)
	}
	if c.Residency.MaxExtraWait < 0 || c.Residency.LoadTime < 0 {
		bad("residency.max_extra_wait %s and load_time %s must not be negative", c.Residency.MaxExtraWait, c.Residency.LoadTime)
	}
	switch f := c.Fairness.Flow; {
	case f == "", f == FlowKey, f == FlowUser:
	case strings.HasPrefix(f, FlowHeaderPrefix):
		if name := strings.TrimPrefix(f, FlowHeaderPrefix); name == "" || strings.ContainsAny(name, " :\r\n\t") {
			bad("fairness.flow %q: header name is empty or not a token", f)
		}
	default:
		bad("fairness.flow %q is none of key, user, header:<Name>", f)
	}
	if c.Queue.QueueTimeout < 0 {
		bad("queue.queue_timeout %s is negative", c.Queue.QueueTimeout)
	}
	if c.Queue.Batch.MaxQueue < 0 || c.Queue.Batch.QueueTimeout < 0 {
		bad("queue.batch: max_queue %d or queue_timeout %s is negative", c.Queue.Batch.MaxQueue, c.Queue.Batch.QueueTimeout)
	}
	if c.MaxRetries != nil && *c.MaxRetries < 0 {
		bad("max_retries %d is negative", *c.MaxRetries)
	}
	if !c.Routing.valid(false) {
		bad("routing %q: want %q or %q", c.Routing, RoutingPrefix, RoutingLeastLoaded)
	}
	if c.PrefixIndexBlocks < 0 {
		bad("prefix_index_blocks %d is negative", c.PrefixIndexBlocks)
	}
	if v := c.PrefixLoadSlack; v != nil && !(*v >= 0 && *v <= 1) {
		bad("prefix_load_slack %v: want a number in [0, 1]", *v)
	}
	if c.Cluster != nil {
		if err := c.Cluster.Validate(); err != nil {
			bad("%v", err)
		}
	}
	if b := c.CircuitBreaker; b.CoolDown < 0 || b.MaxCoolDown < b.CoolDown {
		bad("circuit_breaker: cool_down %s must not be negative nor above max_cool_down %s", b.CoolDown, b.MaxCoolDown)
	}
	aliases := make([]string, 0, len(c.Models))
	for alias := range c.Models {
		aliases = append(aliases, alias)
	}
	sort.Strings(aliases)
	for _, alias := range aliases {
		m := c.Models[alias]
		if alias == "" {
			bad("models: empty model name")
			continue
		}
		if len(m.Targets) == 0 {
			bad("models.%s: no targets", alias)
		}
		seen := make(map[string]bool, len(m.Targets))
		for _, t := range m.Targets {
			if t == "" {
				bad("models.%s: empty target", alias)
			} else if seen[t] {
				bad("models.%s: target %q repeated", alias, t)
			}
			seen[t] = true
		}
		if m.MaxQueue < 0 {
			bad("models.%s.max_queue %d is negative", alias, m.MaxQueue)
		}
		if m.QueueTimeout < 0 {
			bad("models.%s.queue_timeout %s is negative", alias, m.QueueTimeout)
		}
		if m.Fairness != "" && m.Fairness != FairnessOn && m.Fairness != FairnessOff {
			bad("models.%s.fairness %q is neither on nor off", alias, m.Fairness)
		}
		if !m.Routing.valid(true) {
			bad("models.%s.routing %q: want %q or %q", alias, m.Routing, RoutingPrefix, RoutingLeastLoaded)
		}
		if m.KeepLoaded < 0 {
			bad("models.%s.keep_loaded %d is negative", alias, m.KeepLoaded)
		}
	}
	for i, t := range c.Tokens {
		if err := t.validate(); err != nil {
			bad("tokens[%d]: %v", i, err)
		}
	}
	if (c.TLSCert == "") != (c.TLSKey == "") {
		bad("tls_cert and tls_key go together")
	}
	if c.ClientCA != "" && c.TLSCert == "" {
		bad("client_ca needs tls_cert and tls_key")
	}
	return errors.Join(errs...)
}

// ParseConfig decodes YAML holding the edge core's keys alone (unknown
// keys, the process's included, are errors), fills defaults and
// validates. An empty document is the default configuration. Errors wrap
// ErrInvalidConfig. The edge process's file is process.EdgeFile.
func ParseConfig(data []byte) (Config, error) {
	var c Config
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&c); err != nil && !errors.Is(err, io.EOF) {
		return Config{}, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	c.SetDefaults()
	if err := c.Validate(); err != nil {
		return Config{}, err
	}
	return c, nil
}

// schedulerConfig derives the scheduler's queue policies: the default, and
// one override per alias that sets a field.
func (c Config) schedulerConfig(clk scheduler.Clock) scheduler.Config {
	sc := scheduler.Config{
		Default:   scheduler.Policy{MaxQueue: c.Queue.MaxQueue, QueueTimeout: c.Queue.QueueTimeout, Fairness: fairnessPolicy(c.Fairness.Mode), ReconnectGrace: c.Queue.ReconnectGrace},
		Groups:    make(map[string]scheduler.Policy),
		Clock:     clk,
		Residency: c.Residency.policy(),
		Batch: scheduler.BatchPolicy{Headroom: c.Queue.Batch.Headroom, MaxQueue: c.Queue.Batch.MaxQueue, QueueTimeout: c.Queue.Batch.QueueTimeout,
			Backoff: c.Queue.Batch.backoff()},
	}
	if sc.Default.Fairness == scheduler.FairnessDefault {
		sc.Default.Fairness = scheduler.FairnessOn // the default of an edge
	}
	for alias, m := range c.Models {
		if m.MaxQueue != 0 || m.QueueTimeout != 0 || m.Fairness != "" || m.ReconnectGrace != 0 {
			sc.Groups[alias] = scheduler.Policy{MaxQueue: m.MaxQueue, QueueTimeout: m.QueueTimeout, Fairness: fairnessPolicy(m.Fairness), ReconnectGrace: m.ReconnectGrace}
		}
	}
	return sc
}
