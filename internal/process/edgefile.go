package process

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"reflect"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"gopkg.in/yaml.v3"

	"iop/internal/auth"
	"iop/internal/edge"
	"iop/internal/edge/api"
	"iop/internal/node"
	"iop/internal/quota"
	"iop/internal/tracing"
)

// Defaults of the edge process's own parts of its file (EdgeFile).
const (
	DefaultListen       = "127.0.0.1:8080"
	DefaultNodeListen   = "127.0.0.1:7070"
	DefaultDrainTimeout = 30 * time.Second
	// DefaultLameDuck is ServeConfig.LameDuck's default.
	DefaultLameDuck = time.Second
	// DefaultDatabase is iop edge's database file (EdgeFileDefaults); a
	// file without one built by DefaultEdgeFile keeps nothing on disk.
	DefaultDatabase = "iop.db"
)

// EdgeFile is the schema of iop edge's config file: one part per
// component, each its own type with its own Validate. The parts are
// inlined, so the file's keys stay flat (listen, models, keys, database,
// ...) and a Go field of a part is reached from the file directly
// (file.Listen, file.Models).
//
//	ServeConfig   listen, node_listen, drain_timeout: the process's listeners and drain
//	edge.Config   the edge core: node link, queues, aliases, tokens, routing, cluster
//	HTTPConfig    max_body_bytes, max_upload_bytes, max_answer_bytes, write_timeout: the HTTP API's limits
//	AccessConfig  keys, admin_keys, teams, prices, keys_file, insecure_open
//	StoreConfig   database, ledger_dsn, runs_dsn, name: ledger, runs, responses, batches
//	tracing       tracing.Config
//	providers, local_node_id: the node in the edge's process (node.ProviderConfig)
type EdgeFile struct {
	ServeConfig  `yaml:",inline"`
	edge.Config  `yaml:",inline"`
	HTTPConfig   `yaml:",inline"`
	AccessConfig `yaml:",inline"`
	StoreConfig  `yaml:",inline"`
	// Tracing exports OpenTelemetry traces of the API requests (package
	// tracing): off unless an endpoint is set here or in
	// OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT; a field set here wins over its
	// environment variable.
	Tracing tracing.Config `yaml:"tracing"`
	// Providers are served by a node in the edge's own process, connected
	// in memory (package memlink), named LocalNodeID.
	Providers []node.ProviderConfig `yaml:"providers"`
	// LocalNodeID is the node id of Providers; "" is DefaultLocalNodeID.
	LocalNodeID string `yaml:"local_node_id"`
}

// DefaultEdgeFile is the edge's file with every default filled in and no
// database file: run records and the ledger in memory (tests, embedding).
func DefaultEdgeFile() EdgeFile {
	var f EdgeFile
	f.SetDefaults()
	return f
}

// EdgeFileDefaults is what iop edge starts from before its file:
// DefaultEdgeFile with run records and the ledger in the file
// DefaultDatabase (iop.db) and local_node_id DefaultLocalNodeID.
func EdgeFileDefaults() EdgeFile {
	f := DefaultEdgeFile()
	f.Database = DefaultDatabase
	f.LocalNodeID = DefaultLocalNodeID
	return f
}

// ParseEdgeFile decodes an edge file's YAML over DefaultEdgeFile,
// rejecting unknown keys, and validates it (EdgeFile.Validate). Errors
// wrap edge.ErrInvalidConfig, naming the key.
func ParseEdgeFile(data []byte) (EdgeFile, error) {
	f := DefaultEdgeFile()
	if err := decodeYAMLStrict(data, &f); err != nil {
		return EdgeFile{}, invalid("%w", err)
	}
	if err := f.Validate(); err != nil {
		return EdgeFile{}, err
	}
	return f, nil
}

// SetDefaults fills each part's zero fields with its defaults.
func (f *EdgeFile) SetDefaults() {
	f.ServeConfig.SetDefaults()
	f.Config.SetDefaults()
	f.HTTPConfig.SetDefaults()
}

// Validate checks each part after its defaults: the listeners, the edge
// core (edge.Config.Validate), the HTTP API's limits, the keys and quotas,
// tracing, and the providers as a node in the edge's process takes them
// (node.Config.ValidateLocal). It returns every problem, joined, each
// naming its YAML key.
func (f EdgeFile) Validate() error {
	f.SetDefaults()
	errs := []error{f.ServeConfig.Validate(), f.Config.Validate(), f.HTTPConfig.Validate(), f.AccessConfig.Validate(), f.StoreConfig.Validate()}
	if err := f.Tracing.Validate(func(string) string { return "" }); err != nil {
		errs = append(errs, fmt.Errorf("%w: tracing: %w", edge.ErrInvalidConfig, err))
	}
	if len(f.Providers) > 0 {
		errs = append(errs, node.Config{NodeID: cmp.Or(f.LocalNodeID, DefaultLocalNodeID), Providers: f.Providers}.ValidateLocal())
	}
	return errors.Join(errs...)
}

// invalid is a problem of the edge's file, wrapping edge.ErrInvalidConfig.
func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{edge.ErrInvalidConfig}, args...)...)
}

// ServeConfig is where the edge process listens and how long it drains.
type ServeConfig struct {
	// Listen is the HTTP API address (host:port); default DefaultListen.
	Listen string `yaml:"listen"`
	// NodeListen is the gRPC address nodes dial (host:port); default
	// DefaultNodeListen.
	NodeListen string `yaml:"node_listen"`
	// DrainTimeout is how long a stopping edge (SIGTERM or SIGINT) lets
	// the requests in flight finish before it ends them with an answer
	// that says it stopped (503, or a stream's error event); default
	// DefaultDrainTimeout, as a node's.
	DrainTimeout time.Duration `yaml:"drain_timeout"`
	// LameDuck is how long a stopping edge keeps its HTTP listener and
	// idle connections open before it closes them (cut short at
	// DrainTimeout), answering each new request but a GET or HEAD 503
	// edge_shutting_down with Retry-After and "Connection: close": long
	// enough for a load balancer's health check (/readyz, 503 from the
	// first instant) to take the edge out of rotation. Default
	// DefaultLameDuck.
	LameDuck time.Duration `yaml:"lame_duck"`
}

// SetDefaults fills the zero fields.
func (c *ServeConfig) SetDefaults() {
	if c.Listen == "" {
		c.Listen = DefaultListen
	}
	if c.NodeListen == "" {
		c.NodeListen = DefaultNodeListen
	}
	if c.DrainTimeout == 0 {
		c.DrainTimeout = DefaultDrainTimeout
	}
	if c.LameDuck == 0 {
		c.LameDuck = DefaultLameDuck
	}
}

// Validate refuses an address that is not host:port and a negative
// drain_timeout or lame_duck.
func (c ServeConfig) Validate() error {
	var errs []error
	for _, a := range []struct{ name, addr string }{{"listen", c.Listen}, {"node_listen", c.NodeListen}} {
		if _, _, err := net.SplitHostPort(a.addr); err != nil {
			errs = append(errs, invalid("%s %q is not host:port", a.name, a.addr))
		}
	}
	if c.DrainTimeout < 0 {
		errs = append(errs, invalid("drain_timeout %s must not be negative", c.DrainTimeout))
	}
	if c.LameDuck < 0 {
		errs = append(errs, invalid("lame_duck %s must not be negative", c.LameDuck))
	}
	return errors.Join(errs...)
}

// HTTPConfig is the HTTP API's limits, copied into api.Config.
type HTTPConfig struct {
	// MaxBodyBytes caps a client request body, in bytes (413 above it);
	// default api.DefaultMaxBodyBytes (32 MiB).
	MaxBodyBytes int64 `yaml:"max_body_bytes"`
	// MaxUploadBytes caps a multipart upload's body (POST
	// /v1/audio/transcriptions), in bytes (413 above it), apart from
	// MaxBodyBytes: an upload is streamed to its provider, not held; 0 is
	// media.DefaultMaxUploadBytes (1 GiB).
	MaxUploadBytes int64 `yaml:"max_upload_bytes"`
	// UploadIdleTimeout bounds the pause in a multipart upload's body
	// (POST /v1/audio/transcriptions): a client that sends nothing for
	// this long is answered 408 and the provider slot its run holds is
	// released; 0 is media.DefaultUploadIdleTimeout (60s).
	UploadIdleTimeout time.Duration `yaml:"upload_idle_timeout"`
	// MaxAnswerBytes caps a provider answer the edge reads whole to
	// translate it for another API, in bytes (502 above it); 0 is the
	// HTTP API's default (256 MiB, the bound a node puts on an answer it
	// reads whole).
	MaxAnswerBytes int64 `yaml:"max_answer_bytes"`
	// WriteTimeout bounds one write to a client: a client that stays
	// connected but reads nothing for this long has its run cancelled and
	// its slot released; default api.DefaultWriteTimeout (60s).
	WriteTimeout time.Duration `yaml:"write_timeout"`
}

// SetDefaults fills the zero fields.
func (c *HTTPConfig) SetDefaults() {
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = api.DefaultMaxBodyBytes
	}
	if c.WriteTimeout == 0 {
		c.WriteTimeout = api.DefaultWriteTimeout
	}
}

// minUploadIdleTimeout is the shortest upload_idle_timeout check takes:
// Linux's TCP retransmission timeout starts at 200 ms and doubles, so a
// shorter bound would cut healthy uploads on a lossy link.
const minUploadIdleTimeout = time.Second

// Validate refuses a non-positive max_body_bytes or write_timeout, a
// negative max_answer_bytes or max_upload_bytes, and an
// upload_idle_timeout that is negative or under minUploadIdleTimeout
// (after SetDefaults).
func (c HTTPConfig) Validate() error {
	var errs []error
	if c.MaxAnswerBytes < 0 {
		errs = append(errs, invalid("max_answer_bytes %d must not be negative", c.MaxAnswerBytes))
	}
	if c.MaxBodyBytes <= 0 {
		errs = append(errs, invalid("max_body_bytes %d must be positive", c.MaxBodyBytes))
	}
	if c.MaxUploadBytes < 0 {
		errs = append(errs, invalid("max_upload_bytes %d must not be negative", c.MaxUploadBytes))
	}
	switch {
	case c.UploadIdleTimeout < 0:
		errs = append(errs, invalid("upload_idle_timeout %s must not be negative", c.UploadIdleTimeout))
	case c.UploadIdleTimeout > 0 && c.UploadIdleTimeout < minUploadIdleTimeout:
		errs = append(errs, invalid("upload_idle_timeout %s is under %s: a TCP retransmission alone can pause a healthy upload that long", c.UploadIdleTimeout, minUploadIdleTimeout))
	}
	if c.WriteTimeout <= 0 {
		errs = append(errs, invalid("write_timeout %s must be positive", c.WriteTimeout))
	}
	return errors.Join(errs...)
}

// AccessConfig is who may call the edge's HTTP API and what they may use:
// the client and admin keys (package auth), the teams and prices of their
// quotas (package quota).
type AccessConfig struct {
	// Keys are the client API keys (auth.Key: name, hash, limits,
	// models). With none (here and in KeysFile) the client API is open,
	// and served only on a loopback address unless InsecureOpen.
	Keys []auth.Key `yaml:"keys"`
	// AdminKeys are the keys of the admin routes (/admin, /metrics, /ui,
	// /debug).
	AdminKeys []auth.Key `yaml:"admin_keys"`
	// Teams are the teams keys may belong to (Key.Team), each with a
	// quota that bounds the sum of its keys' usage.
	Teams []auth.Team `yaml:"teams"`
	// Prices maps a requested model name to its price per million input
	// and output tokens, for the quota budget windows; a model without a
	// price costs nothing (its tokens still count).
	Prices map[string]quota.Price `yaml:"prices"`
	// KeysFile is a YAML file with more keys, admin_keys, teams and
	// prices, in the same shape (LoadKeysFile).
	KeysFile string `yaml:"keys_file"`
	// InsecureOpen allows an open client API (no keys) on a non-loopback
	// listen address.
	InsecureOpen bool `yaml:"insecure_open"`
}

// Validate checks the keys, the admin keys and the quotas of keys and
// teams (auth.Validate, auth.ValidateQuotas).
func (c AccessConfig) Validate() error {
	var errs []error
	if err := auth.Validate("keys", c.Keys); err != nil {
		errs = append(errs, invalid("%v", err))
	}
	if err := auth.Validate("admin_keys", c.AdminKeys); err != nil {
		errs = append(errs, invalid("%v", err))
	}
	if err := auth.ValidateQuotas(c.Keys, c.Teams, c.Prices); err != nil {
		errs = append(errs, invalid("%v", err))
	}
	return errors.Join(errs...)
}

// keysFile is the shape of a keys file (AccessConfig.KeysFile).
type keysFile struct {
	Keys      []auth.Key             `yaml:"keys"`
	AdminKeys []auth.Key             `yaml:"admin_keys"`
	Teams     []auth.Team            `yaml:"teams"`
	Prices    map[string]quota.Price `yaml:"prices"`
}

// LoadKeysFile reads c.KeysFile (if set) and returns c with its keys,
// admin keys and teams appended and its prices added (the file's win),
// validated together, and KeysFile cleared. Errors wrap
// edge.ErrInvalidConfig, or are the file's read error.
func (c AccessConfig) LoadKeysFile() (AccessConfig, error) {
	if c.KeysFile == "" {
		return c, nil
	}
	data, err := os.ReadFile(c.KeysFile)
	if err != nil {
		return c, err
	}
	var kf keysFile
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&kf); err != nil && !errors.Is(err, io.EOF) {
		return c, invalid("keys_file %s: %w", c.KeysFile, err)
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
	return c, c.Validate()
}

// StoreConfig is where the edge keeps what outlives a request: the usage
// ledger, the run records, stored Responses and batches.
type StoreConfig struct {
	// Database is the SQLite file holding run records (the runs API),
	// stored Responses, batches and the usage ledger; it is created if
	// missing. "" or ":memory:" keeps them in memory only, lost at exit.
	// iop edge defaults it to DefaultDatabase (EdgeFileDefaults).
	Database string `yaml:"database"`
	// LedgerDSN, when set, keeps the usage ledger in this PostgreSQL
	// database (a pgx DSN) instead of the Database file; several edges
	// may share it.
	LedgerDSN string `yaml:"ledger_dsn"`
	// RunsDSN, when set, keeps the run records of the runs API and their
	// event logs in this PostgreSQL database (may be the same as
	// LedgerDSN): several edges sharing it read, stream and cancel each
	// other's runs (runs.Postgres).
	RunsDSN string `yaml:"runs_dsn"`
	// Name names this edge among the edges sharing RunsDSN: its runs are
	// saved under it, and when it starts it ends as interrupted only the
	// runs it left unfinished. It must stay the same across the edge's
	// restarts and differ between edges; default cluster.name when the
	// edge has a cluster section, else the host name.
	Name string `yaml:"name"`
}

// Validate refuses a ledger_dsn or runs_dsn that is not a PostgreSQL
// connection string as pgx parses it (a URL or key=value pairs), or that
// carries pgxpool's pool_* settings, without connecting: such a DSN is
// found by iop check, not at the first start.
func (c StoreConfig) Validate() error {
	var errs []error
	for _, d := range []struct{ key, dsn string }{{"ledger_dsn", c.LedgerDSN}, {"runs_dsn", c.RunsDSN}} {
		if d.dsn == "" {
			continue
		}
		cfg, err := pgconn.ParseConfig(d.dsn)
		if err != nil {
			errs = append(errs, invalid("%s is not a PostgreSQL connection string: %v", d.key, err))
			continue
		}
		// pgx keeps a parameter it does not know as a server setting,
		// which the server refuses at connect; pgxpool's pool_* settings
		// are the ones people copy in (the edge does not use pgxpool).
		for name := range cfg.RuntimeParams {
			if strings.HasPrefix(name, "pool_") {
				errs = append(errs, invalid("%s: %s is a pgxpool setting, not a PostgreSQL one (the server would refuse the connection): remove it", d.key, name))
			}
		}
	}
	return errors.Join(errs...)
}

// database is the SQLite file of c: Database, or ":memory:" when unset.
func (c StoreConfig) database() string {
	if c.Database == "" {
		return ":memory:"
	}
	return c.Database
}

// restartOnly names the keys of the process's parts that differ between
// running and next: the process reads them only at start.
func (running EdgeFile) restartOnly(next EdgeFile) []string {
	var out []string
	for _, f := range []struct {
		key     string
		differs bool
	}{
		{"database", running.StoreConfig != next.StoreConfig},
		{"drain_timeout", running.DrainTimeout != next.DrainTimeout},
		{"insecure_open", running.InsecureOpen != next.InsecureOpen},
		{"lame_duck", running.LameDuck != next.LameDuck},
		{"listen", running.Listen != next.Listen},
		{"max_answer_bytes", running.MaxAnswerBytes != next.MaxAnswerBytes},
		{"max_body_bytes", running.MaxBodyBytes != next.MaxBodyBytes},
		{"max_upload_bytes", running.MaxUploadBytes != next.MaxUploadBytes},
		{"upload_idle_timeout", running.UploadIdleTimeout != next.UploadIdleTimeout},
		{"node_listen", running.NodeListen != next.NodeListen},
		{"tracing", !reflect.DeepEqual(running.Tracing, next.Tracing)},
		{"write_timeout", running.WriteTimeout != next.WriteTimeout},
	} {
		if f.differs {
			out = append(out, f.key)
		}
	}
	return out
}
