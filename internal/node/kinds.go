package node

import (
	"fmt"
	"net/url"
	"strings"

	"iop/internal/node/adapter"
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
	newAdapter func(pc ProviderConfig, protocol string, ac adapter.Config) (adapter.Adapter, error)
}

// providerKinds are the provider types, in the order error messages name
// them.
var providerKinds = []providerKind{
	{name: TypeOllama, protocol: fixedProtocol(protocolOllama), defaults: defaultOllamaURL, validate: validateServer, newAdapter: serverAdapter},
	{name: TypeOpenAI, protocol: fixedProtocol(protocolOpenAI), validate: validateServer, newAdapter: serverAdapter},
	{name: TypeVLLM, protocol: fixedProtocol(protocolOpenAI), validate: validateServer, newAdapter: serverAdapter},
	{name: TypeSim, protocol: simProtocol, defaults: defaultSimProtocol, validate: validateSim, newAdapter: serverAdapter},
	{name: TypeCLI, protocol: fixedProtocol(protocolNone), defaults: defaultCLI, validate: validateCLIKind, newAdapter: cliAdapter},
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

// kindNames is "ollama, openai, vllm, sim or cli": the known types.
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
func serverAdapter(_ ProviderConfig, protocol string, ac adapter.Config) (adapter.Adapter, error) {
	if protocol == protocolOllama {
		return adapter.NewOllama(ac)
	}
	return adapter.NewOpenAI(ac)
}

// cliAdapter runs pc's command, one process a request.
func cliAdapter(pc ProviderConfig, _ string, _ adapter.Config) (adapter.Adapter, error) {
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
