package node

import (
	"fmt"
	"log/slog"
	"maps"
	"net/url"
	"slices"
	"strings"

	"iop/internal/clock"
	"iop/internal/node/adapter"
	"iop/internal/node/managed"
	nodev1 "iop/internal/wire/nodev1"
)

// The wire protocols a provider's server speaks (providerKind.protocol).
const (
	protocolOllama = "ollama" // Ollama's native API: normalized path; /api/tags, /api/show, /api/ps
	protocolOpenAI = "openai" // OpenAI-compatible API: tunnel path; GET {base_url}/models
	protocolNone   = ""       // no server: a local program (normalized path, nothing to discover)
)

// providerKind is everything the node knows of one provider type. Adding a
// provider type is adding one entry to providerKinds.
type providerKind struct {
	name string // ProviderConfig.Type
	// protocol is the wire protocol of pc's server (a protocol* constant);
	// it gives the execution path, the discovery and the Ollama metadata.
	protocol func(pc ProviderConfig) string
	// defaults fills the type's own defaults into pc (nil: none).
	defaults func(pc *ProviderConfig)
	// validate returns the problems of pc's type-specific fields, each
	// prefixed with name ("provider \"x\"").
	validate func(pc ProviderConfig, name string) []error
	// newAdapter makes pc's adapter, speaking protocol (protocol's
	// result), from ac (address, key, timeout, connections).
	newAdapter func(pc ProviderConfig, protocol string, ac adapter.Config, deps adapterDeps) (adapter.Adapter, error)
}

// adapterDeps are the agent's own parts an adapter may use: its logger and
// clock (a managed provider logs its servers' output and times their TTLs).
type adapterDeps struct {
	logger *slog.Logger
	clock  clock.Clock
}

// providerKinds are the provider types, in the order error messages name
// them.
var providerKinds = []providerKind{
	{name: TypeOllama, protocol: fixedProtocol(protocolOllama), defaults: defaultOllamaURL, validate: validateServer, newAdapter: serverAdapter},
	{name: TypeOpenAI, protocol: fixedProtocol(protocolOpenAI), validate: validateServer, newAdapter: serverAdapter},
	{name: TypeVLLM, protocol: fixedProtocol(protocolOpenAI), validate: validateServer, newAdapter: serverAdapter},
	{name: TypeSim, protocol: simProtocol, defaults: defaultSimProtocol, validate: validateSim, newAdapter: serverAdapter},
	{name: TypeCLI, protocol: fixedProtocol(protocolNone), defaults: defaultCLI, validate: validateCLIKind, newAdapter: cliAdapter},
	{name: TypeManaged, protocol: fixedProtocol(protocolOpenAI), defaults: defaultManaged, validate: validateManaged, newAdapter: managedAdapter},
}

// kindOf returns the provider kind of type t; false for an unknown type.
func kindOf(t string) (providerKind, bool) {
	for _, k := range providerKinds {
		if k.name == t {
			return k, true
		}
	}
	return providerKind{}, false
}

// kindNames is "ollama, openai, vllm, sim, cli or managed": the known types.
func kindNames() string {
	names := make([]string, len(providerKinds))
	for i, k := range providerKinds {
		names[i] = k.name
	}
	return strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
}

// unknownKind is the error of a provider whose type has no kind.
func unknownKind(name, t string) error {
	return fmt.Errorf("%s: type %q: want %s", name, t, kindNames())
}

func fixedProtocol(p string) func(ProviderConfig) string {
	return func(ProviderConfig) string { return p }
}

// simProtocol is the protocol an `iop sim` server was started with
// (ProviderConfig.Protocol).
func simProtocol(pc ProviderConfig) string { return pc.Protocol }

func defaultOllamaURL(pc *ProviderConfig) {
	if pc.BaseURL == "" {
		pc.BaseURL = DefaultOllamaURL
	}
}

func defaultSimProtocol(pc *ProviderConfig) {
	if pc.Protocol == "" {
		pc.Protocol = protocolOllama
	}
}

func defaultCLI(pc *ProviderConfig) {
	if pc.PromptVia == "" {
		pc.PromptVia = PromptViaStdin
	}
	if pc.KillGrace == 0 {
		pc.KillGrace = DefaultKillGrace
	}
}

// validateServer checks a provider with a server: an http(s) base_url, no
// protocol (type sim's) and none of type cli's fields.
func validateServer(pc ProviderConfig, name string) []error {
	var errs []error
	if pc.Protocol != "" {
		errs = append(errs, fmt.Errorf("%s: protocol is only for type sim", name))
	}
	return append(errs, validateBaseURL(pc, name)...)
}

func validateBaseURL(pc ProviderConfig, name string) []error {
	var errs []error
	if len(pc.Command) > 0 || pc.PromptVia != "" || len(pc.Env) > 0 || pc.Dir != "" || pc.KillGrace != 0 {
		errs = append(errs, fmt.Errorf("%s: command, prompt_via, env, dir and kill_grace are only for type cli", name))
	}
	if u, err := url.Parse(pc.BaseURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		errs = append(errs, fmt.Errorf("%s: base_url %q: want an http(s) URL with a host", name, pc.BaseURL))
	}
	return errs
}

// validateSim checks an `iop sim` provider: protocol ollama or openai.
func validateSim(pc ProviderConfig, name string) []error {
	var errs []error
	if pc.Protocol != protocolOllama && pc.Protocol != protocolOpenAI {
		errs = append(errs, fmt.Errorf("%s: protocol %q: want ollama or openai", name, pc.Protocol))
	}
	return append(errs, validateBaseURL(pc, name)...)
}

// validateCLIKind checks a cli provider: its command and at least one
// model (there is no list to discover).
func validateCLIKind(pc ProviderConfig, name string) []error {
	errs := pc.validateCLI(name)
	if len(pc.Models) == 0 {
		errs = append(errs, fmt.Errorf("%s: at least one model is required for type cli (it has no model list to discover)", name))
	}
	return errs
}

// serverAdapter is the adapter of pc's server protocol: Ollama's
// (normalized path) or the OpenAI-compatible relay (tunnel path).
func serverAdapter(_ ProviderConfig, protocol string, ac adapter.Config, _ adapterDeps) (adapter.Adapter, error) {
	if protocol == protocolOllama {
		return adapter.NewOllama(ac)
	}
	return adapter.NewOpenAI(ac)
}

// cliAdapter runs pc's command, one process a request.
func cliAdapter(pc ProviderConfig, _ string, _ adapter.Config, _ adapterDeps) (adapter.Adapter, error) {
	return adapter.NewCLI(adapter.CLIConfig{
		Command: pc.Command, PromptVia: pc.PromptVia, Env: pc.Env, Dir: pc.Dir,
		Timeout: pc.Timeout, KillGrace: pc.KillGrace, MaxProcs: max(pc.Capacity, pc.LongCapacity),
	})
}

// protocol is the wire protocol of p's server (protocolNone for type cli
// and for an unknown type).
func (p ProviderConfig) protocol() string {
	if k, ok := kindOf(p.Type); ok {
		return k.protocol(p)
	}
	return protocolNone
}

// path is the execution path p answers on: tunnel for an OpenAI-compatible
// server, normalized otherwise.
func (p ProviderConfig) path() nodev1.ExecutionPath {
	if p.protocol() == protocolOpenAI {
		return nodev1.ExecutionPath_EXECUTION_PATH_TUNNEL
	}
	return nodev1.ExecutionPath_EXECUTION_PATH_NORMALIZED
}

// discovers reports whether the agent discovers p's models (and health):
// it omits them and has a server to ask.
func (p ProviderConfig) discovers() bool {
	return p.protocol() != protocolNone && len(p.Models) == 0
}

// Discovers reports whether a node discovers the models of p (with its
// defaults filled in): it omits them and its type has a server to ask.
func (p ProviderConfig) Discovers() bool { return p.discovers() }

// defaultManaged fills a managed provider's defaults: its models are the
// keys of its servers (sorted), max_loaded_models 1, kill_grace 10s, and
// each server's url, health_url and start_timeout.
func defaultManaged(pc *ProviderConfig) {
	if len(pc.Models) == 0 {
		pc.Models = slices.Sorted(maps.Keys(pc.Servers))
	}
	if pc.MaxLoadedModels == 0 {
		pc.MaxLoadedModels = managed.DefaultMaxLoaded
	}
	if pc.KillGrace == 0 {
		pc.KillGrace = managed.DefaultKillGrace
	}
	servers := make(map[string]managed.Server, len(pc.Servers))
	for m, s := range pc.Servers {
		servers[m] = s.WithDefaults()
	}
	pc.Servers = servers
}

// validateManaged checks a managed provider: at least one server, each
// with a command and urls that reach it (managed.Server.Problems), models
// left to be the servers' names, and none of the fields of a provider the
// node does not start.
func validateManaged(pc ProviderConfig, name string) []error {
	var errs []error
	if pc.Protocol != "" || pc.BaseURL != "" || len(pc.Command) > 0 || pc.PromptVia != "" || len(pc.Env) > 0 || pc.Dir != "" {
		errs = append(errs, fmt.Errorf("%s: protocol, base_url, command, prompt_via, env and dir are not used by type managed: each model's server has its cmd, env and url under servers", name))
	}
	if len(pc.Servers) == 0 {
		errs = append(errs, fmt.Errorf("%s: servers is required for type managed: the command line of each model's server", name))
	}
	if keys := slices.Sorted(maps.Keys(pc.Servers)); !slices.Equal(slices.Sorted(slices.Values(pc.Models)), keys) {
		errs = append(errs, fmt.Errorf("%s: models %v: for type managed the models are the names under servers %v; leave models out", name, pc.Models, keys))
	}
	for _, m := range slices.Sorted(maps.Keys(pc.Servers)) {
		if m == "" {
			errs = append(errs, fmt.Errorf("%s: servers: a model name is empty", name))
		}
		for _, p := range pc.Servers[m].WithDefaults().Problems(m) {
			errs = append(errs, fmt.Errorf("%s: servers[%q]: %s", name, m, p))
		}
	}
	if pc.KillGrace < 0 {
		errs = append(errs, fmt.Errorf("%s: kill_grace %v: must not be negative", name, pc.KillGrace))
	}
	return errs
}

// managedAdapter runs pc's model servers (package managed).
func managedAdapter(pc ProviderConfig, _ string, ac adapter.Config, deps adapterDeps) (adapter.Adapter, error) {
	return managed.New(managed.Config{
		Servers: pc.Servers, MaxLoaded: pc.MaxLoadedModels, KillGrace: pc.KillGrace,
		APIKey: ac.APIKey, Timeout: ac.Timeout, MaxConns: ac.MaxConns,
	}, managed.Deps{Logger: deps.logger.With("provider", pc.ID), Clock: deps.clock})
}
