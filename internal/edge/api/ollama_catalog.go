package api

import (
	"slices"
	"strings"

	"iop/internal/edge/contract"
	"iop/internal/modelname"
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
	// model name. The edge's *edge.Service implements ModelCatalog.
	RunsInFlight() map[string]int
}

// ModelInfo is what the edge knows of one model (contract.ModelInfo).
type ModelInfo = contract.ModelInfo

// ModelProvider is one provider of a model (contract.ModelProvider).
type ModelProvider = contract.ModelProvider

// knownModel returns the name in names that the Ollama model name means:
// name itself, else its other spelling (modelname.Alternative); ok is false when neither is there.
func knownModel(names []string, name string) (string, bool) {
	alt := modelname.Alternative(name)
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
	alt := modelname.Alternative(name)
	if alt == "" || strings.HasSuffix(name, modelname.LatestTag) || slices.Contains(names, alt) {
		return name
	}
	return alt
}
