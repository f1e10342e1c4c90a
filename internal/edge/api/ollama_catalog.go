package api

import (
	"slices"
	"strings"

	"iop/internal/wire/nodev1"
)

// ModelCatalog is what POST /api/show and GET /api/ps need beyond
// Gateway.Models. A Gateway may implement it; without it /api/show answers
// from Gateway.Models alone and /api/ps lists no model.
type ModelCatalog interface {
	// ModelInfo describes the model clients call name (an alias or a served
	// name; "x" and "x:latest" are one model, as in Dispatch). ok is false
	// when no alias or served name matches.
	ModelInfo(name string) (info ModelInfo, ok bool)
	// RunsInFlight counts the runs dispatched and not yet ended, by served
	// model name.
	RunsInFlight() map[string]int
}

// ModelInfo is what the edge knows of one model. Its fields mirror
// edge.ModelInfo in name, type and order.
type ModelInfo struct {
	// Name is the catalog's own name for the model.
	Name string
	// Alias is set when Name is a configured alias; Targets are then its
	// served model names, else Targets is [Name].
	Alias   bool
	Targets []string
	// Providers are the live providers serving a target.
	Providers []ModelProvider
}

// ModelProvider is one provider of a model. Its fields mirror
// edge.ModelProvider in name, type and order.
type ModelProvider struct {
	NodeID, ProviderID, Type string
	// Capabilities are iop's capability words for Target on this provider
	// ("completion", "tools", "vision", "embeddings", "thinking", ...,
	// and lifecycle ones such as "stream").
	Capabilities       []string
	Healthy            bool
	Capacity, InFlight int
	// Target is the served model name the provider serves the model as.
	Target string
	// Details are what the provider's model server says of Target, nil
	// when nothing. Not to be modified.
	Details *nodev1.ModelDetails
}

// latestTag is the tag Ollama gives a model name without one (Ollama API
// doc, "Model names": the tag "will default to latest").
const latestTag = ":latest"

// tagAlternative returns the other spelling of an Ollama model name: "x"
// for "x:latest" and "x:latest" for "x" (a name with no tag: no ':' after
// its last '/'); "" for a name with another tag.
func tagAlternative(name string) string {
	if base, ok := strings.CutSuffix(name, latestTag); ok && base != "" {
		return base
	}
	if strings.Contains(name[strings.LastIndex(name, "/")+1:], ":") {
		return ""
	}
	return name + latestTag
}

// knownModel returns the name in names that the Ollama model name means:
// name itself, else its tagAlternative; ok is false when neither is there.
func knownModel(names []string, name string) (string, bool) {
	alt := tagAlternative(name)
	found := ""
	for _, n := range names {
		if n == name {
			return n, true
		}
		if alt != "" && n == alt {
			found = n
		}
	}
	return found, found != ""
}

// ollamaName is the name Ollama's /api/tags and /api/ps show for name, one
// of names: with its tag, as Ollama lists every model ("demo:latest",
// model.Name.DisplayShortest), so clients that look a tagged name up find
// it; a name without a tag gets ":latest", unless that name is itself in
// names (then the two are two models, and each keeps its own name).
func ollamaName(names []string, name string) string {
	alt := tagAlternative(name)
	if alt == "" || strings.HasSuffix(name, latestTag) || slices.Contains(names, alt) {
		return name
	}
	return alt
}
