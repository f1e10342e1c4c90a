package managed

import (
	"errors"
	"fmt"
	"maps"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Defaults applied to zero fields of Server and Config.
const (
	DefaultURL          = "http://127.0.0.1:${PORT}/v1"
	DefaultHealthURL    = "http://127.0.0.1:${PORT}/health"
	DefaultStartTimeout = 2 * time.Minute
	DefaultKillGrace    = 10 * time.Second
	DefaultMaxLoaded    = 1
)

// The placeholders of a Server's cmd, env values, url and health_url.
const (
	PlaceholderPort  = "${PORT}"  // a free TCP port on 127.0.0.1, chosen by the node at each start
	PlaceholderModel = "${MODEL}" // the served model name (the key of Config.Servers)
)

// Server is how to run the model server of one model: an OpenAI-compatible
// server (llama.cpp's llama-server, `vllm serve`, `iop sim`, ...) that the
// node starts on demand and stops when idle.
//
//	cmd: [llama-server, -m, /models/qwen.gguf, --port, "${PORT}", --alias, "${MODEL}"]
//	env: {CUDA_VISIBLE_DEVICES: "0"}
//	url: http://127.0.0.1:${PORT}/v1
//	health_url: http://127.0.0.1:${PORT}/health
//	ttl: 10m
//	start_timeout: 2m
type Server struct {
	// Cmd is the executable (looked up in PATH, or a path) and its
	// arguments, ${PORT} and ${MODEL} replaced; no shell. Required.
	Cmd []string `yaml:"cmd"`
	// Env is added to the node's own environment for the command; its
	// values may hold ${PORT} and ${MODEL}.
	Env map[string]string `yaml:"env"`
	// URL is the server's API root that "/chat/completions" is appended to;
	// default http://127.0.0.1:${PORT}/v1. It holds ${PORT} exactly when
	// Cmd or Env does.
	URL string `yaml:"url"`
	// HealthURL answers 200 once the server is ready to serve; default
	// http://127.0.0.1:${PORT}/health (llama-server and vLLM have it).
	HealthURL string `yaml:"health_url"`
	// TTL stops the server after this long with no run in flight; 0 means
	// it stays until another model needs its place or the node stops.
	TTL time.Duration `yaml:"ttl"`
	// StartTimeout bounds the wait from the start of the process to the
	// health URL's first 200; default 2m. Past it the process is stopped.
	StartTimeout time.Duration `yaml:"start_timeout"`
}

// WithDefaults returns s with the documented defaults in its zero fields.
func (s Server) WithDefaults() Server {
	if s.URL == "" {
		s.URL = DefaultURL
	}
	if s.HealthURL == "" {
		s.HealthURL = DefaultHealthURL
	}
	if s.StartTimeout == 0 {
		s.StartTimeout = DefaultStartTimeout
	}
	return s
}

// anyPlaceholder matches one "${...}".
var anyPlaceholder = regexp.MustCompile(`\$\{[^{}]*\}`)

// Problems returns what is wrong with the server of model (defaults
// applied), one phrase each: no cmd, an unknown placeholder, ${PORT} in the
// command but not in url or health_url (or the other way round), a url
// that is not http(s) with a host, an env name unusable in an
// environment, a negative duration.
func (s Server) Problems(model string) []string {
	var out []string
	bad := func(format string, args ...any) { out = append(out, fmt.Sprintf(format, args...)) }
	if len(s.Cmd) == 0 || s.Cmd[0] == "" {
		bad("cmd is required: the server's executable, then its arguments")
	}
	portInCmd := false
	check := func(where, v string) {
		if strings.IndexByte(v, 0) >= 0 {
			bad("%s holds a NUL byte", where)
		}
		for _, ph := range anyPlaceholder.FindAllString(v, -1) {
			switch ph {
			case PlaceholderPort:
			case PlaceholderModel:
			default:
				bad("%s: unknown placeholder %s: want ${PORT} or ${MODEL}", where, ph)
			}
		}
	}
	for i, a := range s.Cmd {
		check(fmt.Sprintf("cmd[%d]", i), a)
		portInCmd = portInCmd || strings.Contains(a, PlaceholderPort)
	}
	for _, k := range slices.Sorted(maps.Keys(s.Env)) {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			bad("env %q: a name must be non-empty without '=' or NUL", k)
		}
		check(fmt.Sprintf("env %s", k), s.Env[k])
		portInCmd = portInCmd || strings.Contains(s.Env[k], PlaceholderPort)
	}
	for _, u := range []struct{ key, v string }{{"url", s.URL}, {"health_url", s.HealthURL}} {
		check(u.key, u.v)
		if portInCmd != strings.Contains(u.v, PlaceholderPort) {
			if portInCmd {
				bad("%s %q: the command listens on ${PORT}, so %s must use ${PORT} too", u.key, u.v, u.key)
			} else {
				bad("%s %q uses ${PORT} but the command does not: pass ${PORT} to the server (cmd or env)", u.key, u.v)
			}
		}
		if _, err := parseHTTP(expand(u.v, 1, model)); err != nil {
			bad("%s %q: %v", u.key, u.v, err)
		}
	}
	if s.TTL < 0 || s.StartTimeout < 0 {
		bad("ttl %v, start_timeout %v: must not be negative", s.TTL, s.StartTimeout)
	}
	return out
}

// expand replaces ${PORT} by port and ${MODEL} by model in v.
func expand(v string, port int, model string) string {
	return strings.NewReplacer(PlaceholderPort, strconv.Itoa(port), PlaceholderModel, model).Replace(v)
}

// expanded is s with its placeholders replaced, for one start.
func (s Server) expanded(port int, model string) Server {
	out := s
	out.Cmd = make([]string, len(s.Cmd))
	for i, a := range s.Cmd {
		out.Cmd[i] = expand(a, port, model)
	}
	out.Env = make(map[string]string, len(s.Env))
	for k, v := range s.Env {
		out.Env[k] = expand(v, port, model)
	}
	out.URL = expand(s.URL, port, model)
	out.HealthURL = expand(s.HealthURL, port, model)
	return out
}

// parseHTTP parses u as an http(s) URL with a host.
func parseHTTP(u string) (*url.URL, error) {
	p, err := url.Parse(u)
	if err != nil || (p.Scheme != "http" && p.Scheme != "https") || p.Host == "" {
		return nil, errors.New("want an http(s) URL with a host")
	}
	return p, nil
}

// Config is one managed provider: the servers of its models and how many
// may run at once.
type Config struct {
	// Servers are the model servers, by served model name. At least one.
	Servers map[string]Server
	// MaxLoaded is how many servers run at once; 0 means 1.
	MaxLoaded int
	// KillGrace is how long a stopped server's process group has between
	// SIGTERM and SIGKILL; 0 means 10s.
	KillGrace time.Duration
	// APIKey, when set, is sent to every server as a bearer token.
	APIKey string
	// Timeout bounds one relayed request (adapter.Config.Timeout); 0
	// means adapter.DefaultTimeout.
	Timeout time.Duration
	// MaxConns is the most requests relayed at once to one server (the
	// provider's capacity).
	MaxConns int
}

func (c Config) withDefaults() Config {
	if c.MaxLoaded == 0 {
		c.MaxLoaded = DefaultMaxLoaded
	}
	if c.KillGrace == 0 {
		c.KillGrace = DefaultKillGrace
	}
	servers := make(map[string]Server, len(c.Servers))
	for m, s := range c.Servers {
		servers[m] = s.WithDefaults()
	}
	c.Servers = servers
	return c
}

// validate reports every problem of c (defaults applied), joined.
func (c Config) validate() error {
	var errs []error
	if len(c.Servers) == 0 {
		errs = append(errs, errors.New("at least one model server is required"))
	}
	for _, m := range slices.Sorted(maps.Keys(c.Servers)) {
		for _, p := range c.Servers[m].Problems(m) {
			errs = append(errs, fmt.Errorf("servers[%q]: %s", m, p))
		}
	}
	if c.MaxLoaded < 0 || c.KillGrace < 0 {
		errs = append(errs, fmt.Errorf("max loaded %d, kill grace %v: must not be negative", c.MaxLoaded, c.KillGrace))
	}
	return errors.Join(errs...)
}
