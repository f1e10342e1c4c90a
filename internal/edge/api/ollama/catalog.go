package ollama

import (
	"context"
	"slices"
	"strings"

	"iop/internal/edge/contract"
	"iop/internal/modelname"
)

// ModelCatalog is what POST /api/show and GET /api/ps need beyond the
// frame's models (Config.Catalog); without it /api/show answers from
// api.Frame.Models alone and /api/ps lists no model. The edge's
// *edge.Service implements it.
type ModelCatalog interface {
	// ModelInfo describes the model clients call name (an alias or a
	// served name; "x" and "x:latest" are one model, as in
	// api.Gateway.Dispatch). ok is false when no alias or served name
	// matches.
	ModelInfo(name string) (info contract.ModelInfo, ok bool)
	// Loaded lists the models the providers hold loaded, one entry per
	// provider and served model (contract.LoadedModel says where each
	// comes from).
	Loaded() []contract.LoadedModel
}

// ModelShower is what POST /api/show needs to answer with the serving
// Ollama's own description of a model (Config.Shower; the
// edge's *edge.Service does); without it /api/show is iop's own answer.
type ModelShower interface {
	// Show returns what the Ollama server of provider providerID of node
	// nodeID says of its served model (POST /api/show): the server's HTTP
	// status and JSON body, with paths of the provider's host removed.
	// An error means no answer came (node gone, not an Ollama, timeout).
	Show(ctx context.Context, nodeID, providerID, model string, verbose bool) (status int, body []byte, err error)
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
