package edge

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"reflect"
	"sort"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"iop/internal/auth"
	"iop/internal/cluster"
	"iop/internal/quota"
	"iop/internal/scheduler"
	"iop/internal/tracing"
)

// Defaults applied by Config.SetDefaults to zero fields.
const (
	DefaultListen            = "127.0.0.1:8080"
	DefaultNodeListen        = "127.0.0.1:7070"
	DefaultHeartbeatInterval = 5 * time.Second
	DefaultDispatchTimeout   = 10 * time.Second
	DefaultMaxQueue          = scheduler.DefaultMaxQueue     // 16
	DefaultQueueTimeout      = scheduler.DefaultQueueTimeout // 30s
	DefaultLongContextTokens = 8192
	DefaultMaxBodyBytes      = 32 << 20 // 32 MiB
	DefaultWriteTimeout      = 60 * time.Second
	DefaultDrainTimeout      = 30 * time.Second
	DefaultDatabase          = "iop.db"
	DefaultMaxRetries        = 1
	DefaultBreakerFailures   = 3
	DefaultBreakerCoolDown   = 30 * time.Second
	DefaultBreakerMaxCool    = 5 * time.Minute
)

// Config is the edge's configuration, loaded once from YAML (LoadConfig) and
// overridden by flags. A zero field means its documented default; durations
// are Go duration strings in YAML ("30s", "1m30s").
//
//	listen: 127.0.0.1:8080
//	node_listen: 0.0.0.0:7070
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
//	keys:                                      # client API keys (hashes; iop keys create)
//	  - {name: team-a, hash: "sha256:...", max_concurrent: 4, requests_per_minute: 60, models: [llama3]}
//	admin_keys:
//	  - {name: ops, hash: "sha256:..."}
//	keys_file: /etc/iop/keys.yaml              # more keys/admin_keys, same shape
//	ledger_dsn: postgres://iop@db/iop          # usage ledger in PostgreSQL (default: database)
//	runs_dsn: postgres://iop@db/iop            # run records and events in PostgreSQL, shared by several edges
//	name: edge-a                               # this edge among those sharing runs_dsn (default: the host name)
//	long_context_tokens: 8192
//	max_body_bytes: 33554432
//	write_timeout: 60s
//	drain_timeout: 30s                         # on SIGTERM: how long requests in flight may take
//	database: /var/lib/iop/edge.db
//	max_retries: 1
//	circuit_breaker: {failures: 3, cool_down: 30s, max_cool_down: 5m}
//	routing: prefix                            # or least_loaded; per alias too (models.<alias>.routing)
//	prefix_index_blocks: 16384                 # per served model
//	prefix_load_slack: 0.5
type Config struct {
	// Listen is the HTTP API address (host:port); default 127.0.0.1:8080.
	// The edge core does not serve it; the HTTP layer does.
	Listen string `yaml:"listen"`
	// NodeListen is the gRPC address nodes dial (host:port); default
	// 127.0.0.1:7070.
	NodeListen string `yaml:"node_listen"`
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
	// Keys are the client API keys (auth.Key: name, hash, limits,
	// models). With none (here and in KeysFile) the client API is open,
	// and served only on a loopback address unless InsecureOpen. Served
	// by the HTTP layer.
	Keys []auth.Key `yaml:"keys"`
	// AdminKeys are the keys of the admin routes (/admin, /metrics, /ui,
	// /debug). Served by the HTTP layer.
	AdminKeys []auth.Key `yaml:"admin_keys"`
	// Teams are the teams keys may belong to (Key.Team), each with a
	// quota that bounds the sum of its keys' usage (package quota).
	// Served by the HTTP layer.
	Teams []auth.Team `yaml:"teams"`
	// Prices maps a requested model name to its price per million input
	// and output tokens, for the quota budget windows; a model without a
	// price costs nothing (its tokens still count).
	Prices map[string]quota.Price `yaml:"prices"`
	// KeysFile is a YAML file with more keys, admin_keys, teams and prices,
	// in the same shape as here (LoadKeysFile); read once at start.
	KeysFile string `yaml:"keys_file"`
	// InsecureOpen allows an open client API (no keys) on a non-loopback
	// listen address.
	InsecureOpen bool `yaml:"insecure_open"`
	// LedgerDSN, when set, keeps the usage ledger in this PostgreSQL
	// database (a pgx DSN) instead of the Database file; several edges
	// may share it.
	LedgerDSN string `yaml:"ledger_dsn"`
	// RunsDSN, when set, keeps the run records of the runs API and their
	// event logs in this PostgreSQL database (a pgx DSN, may be the same
	// as LedgerDSN) instead of the Database file: several edges sharing it
	// read, stream and cancel each other's runs (runs.Postgres).
	RunsDSN string `yaml:"runs_dsn"`
	// Name names this edge among the edges sharing RunsDSN: its runs are
	// saved under it, and when it starts it ends as interrupted only the
	// runs it left unfinished, never another live edge's. It must stay the
	// same across the edge's restarts and differ between edges; default
	// cluster.name when the edge has a cluster section, else the host
	// name.
	Name string `yaml:"name"`
	// LongContextTokens is the estimated prompt size, in tokens, from which
	// a request is long-context and also needs a free long_capacity slot of
	// its provider; default 8192, negative disables the classification.
	LongContextTokens int `yaml:"long_context_tokens"`
	// MaxBodyBytes caps a client request body, in bytes (413 above it);
	// default 32 MiB. Served by the HTTP layer.
	MaxBodyBytes int64 `yaml:"max_body_bytes"`
	// MaxUploadBytes caps a multipart upload's body (POST
	// /v1/audio/transcriptions), in bytes (413 above it), apart from
	// MaxBodyBytes: an upload is streamed to its provider, not held;
	// default 1 GiB (0). Served by the HTTP layer (package media).
	MaxUploadBytes int64 `yaml:"max_upload_bytes"`
	// MaxAnswerBytes caps a provider answer the edge reads whole to
	// translate it for another API (a non-streamed tunnel answer for an
	// Ollama or Anthropic client), in bytes (502 above it); default
	// 256 MiB, the bound a node puts on an answer it reads whole. Served by
	// the HTTP layer.
	MaxAnswerBytes int64 `yaml:"max_answer_bytes"`
	// WriteTimeout bounds one write to a client: a client that stays
	// connected but reads nothing for this long has its run cancelled and
	// its slot released; default 60s. Served by the HTTP layer.
	WriteTimeout time.Duration `yaml:"write_timeout"`
	// DrainTimeout is how long a stopping edge (SIGTERM or SIGINT) lets
	// the requests in flight finish before it ends them with an answer
	// that says it stopped (503, or a stream's error event); default 30s,
	// as a node's. Served by the process (cmd/iop).
	DrainTimeout time.Duration `yaml:"drain_timeout"`
	// Database is the SQLite file holding run records (the runs API) and
	// the usage ledger; it is created if missing. "" or ":memory:" keeps
	// them in memory only, lost at exit. `iop edge` defaults it to
	// DefaultDatabase ("iop.db" in the working directory); the zero Config
	// (tests, embedding) keeps nothing on disk.
	Database string `yaml:"database"`
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
	// Tracing exports OpenTelemetry traces of the API requests (package
	// tracing; docs/observability.md, "Tracing"): off unless an endpoint is set here or in
	// OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT. A field set here wins over its
	// environment variable.
	Tracing tracing.Config `yaml:"tracing"`
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
	if c.Listen == "" {
		c.Listen = DefaultListen
	}
	if c.NodeListen == "" {
		c.NodeListen = DefaultNodeListen
	}
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
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if c.DrainTimeout == 0 {
		c.DrainTimeout = DefaultDrainTimeout
	}
	if c.WriteTimeout == 0 {
		c.WriteTimeout = DefaultWriteTimeout
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
// set, as an error wrapping ErrInvalidConfig: an address that is not
// host:port, a non-positive interval or timeout, a negative queue field, an
// alias with an empty name or no (or an empty or repeated) target, an empty
// token, a negative max_retries, a negative circuit breaker cool-down or a
// max_cool_down below cool_down.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...))
	}
	for _, a := range []struct{ name, addr string }{{"listen", c.Listen}, {"node_listen", c.NodeListen}} {
		if _, _, err := net.SplitHostPort(a.addr); err != nil {
			bad("%s %q is not host:port", a.name, a.addr)
		}
	}
	if c.HeartbeatInterval <= 0 {
		bad("heartbeat_interval %s must be positive", c.HeartbeatInterval)
	}
	if c.DispatchTimeout <= 0 {
		bad("dispatch_timeout %s must be positive", c.DispatchTimeout)
	}
	if c.MaxAnswerBytes < 0 {
		bad("max_answer_bytes %d must not be negative", c.MaxAnswerBytes)
	}
	if c.MaxUploadBytes < 0 {
		bad("max_upload_bytes %d must not be negative", c.MaxUploadBytes)
	}
	if c.MaxBodyBytes <= 0 {
		bad("max_body_bytes %d must be positive", c.MaxBodyBytes)
	}
	if c.WriteTimeout <= 0 {
		bad("write_timeout %s must be positive", c.WriteTimeout)
	}
	if c.DrainTimeout < 0 {
		bad("drain_timeout %s must not be negative", c.DrainTimeout)
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
	if err := auth.Validate("keys", c.Keys); err != nil {
		bad("%v", err)
	}
	if err := auth.Validate("admin_keys", c.AdminKeys); err != nil {
		bad("%v", err)
	}
	if err := auth.ValidateQuotas(c.Keys, c.Teams, c.Prices); err != nil {
		bad("%v", err)
	}
	return errors.Join(errs...)
}

// LoadConfig reads the YAML file at path, rejecting unknown fields, fills
// defaults and validates it. Errors wrap ErrInvalidConfig, or are the
// file's read error.
func LoadConfig(path string) (Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Config{}, err
	}
	return ParseConfig(data)
}

// ParseConfig is LoadConfig on YAML bytes. An empty document is the default
// configuration.
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

// KeysFile is the shape of a keys file (Config.KeysFile).
type KeysFile struct {
	Keys      []auth.Key             `yaml:"keys"`
	AdminKeys []auth.Key             `yaml:"admin_keys"`
	Teams     []auth.Team            `yaml:"teams"`
	Prices    map[string]quota.Price `yaml:"prices"`
}

// LoadKeysFile reads c.KeysFile (if set) and returns c with its keys,
// admin keys and teams appended and its prices added (the file's win),
// validated together. Errors wrap ErrInvalidConfig,
// or are the file's read error.
func (c Config) LoadKeysFile() (Config, error) {
	if c.KeysFile == "" {
		return c, nil
	}
	data, err := os.ReadFile(c.KeysFile)
	if err != nil {
		return c, err
	}
	var kf KeysFile
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&kf); err != nil && !errors.Is(err, io.EOF) {
		return c, fmt.Errorf("%w: keys_file %s: %w", ErrInvalidConfig, c.KeysFile, err)
	}
	c.Keys = append(append([]auth.Key(nil), c.Keys...), kf.Keys...)
	c.AdminKeys = append(append([]auth.Key(nil), c.AdminKeys...), kf.AdminKeys...)
	c.Teams = append(append([]auth.Team(nil), c.Teams...), kf.Teams...)
	if len(kf.Prices) > 0 {
		prices := maps.Clone(c.Prices)
		if prices == nil {
			prices = make(map[string]quota.Price, len(kf.Prices))
		}
		maps.Copy(prices, kf.Prices)
		c.Prices = prices
	}
	c.KeysFile = ""
	if err := c.Validate(); err != nil {
		return c, err
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
		Batch:     scheduler.BatchPolicy{Headroom: c.Queue.Batch.Headroom, MaxQueue: c.Queue.Batch.MaxQueue, QueueTimeout: c.Queue.Batch.QueueTimeout},
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
