package admin

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"

	"iop/internal/edge/api"
	"iop/internal/edge/api/httpconn"
)

// Residency is what the load and unload routes need of the edge. The
// edge's *edge.Service is one.
type Residency interface {
	// KeepModel has the server of provider providerID of node nodeID load
	// model and keep it loaded, or with unload unload it, and returns once
	// it did. Errors wrap contract.ErrUnknownProvider (404) or
	// contract.ErrResidencyConflict (409), or are the context's.
	KeepModel(ctx context.Context, nodeID, providerID, model string, unload bool) error
}

// residencyPrefix is the path under which the load and unload routes
// live: /admin/v1/providers/{node}/{provider}/load and .../unload.
const residencyPrefix = "/admin/v1/providers/"

// residencyRoutes returns POST /admin/v1/providers/{node}/{provider}/load
// and /unload (one prefix route).
func residencyRoutes(res Residency) map[string]api.Route {
	return map[string]api.Route{residencyPrefix: {Method: http.MethodPost, Serve: serveResidency(res)}}
}

// residencyBody is the body of a load or unload.
type residencyBody struct {
	Model string `json:"model"`
}

// residencyAnswer is the answer of a load or unload that was done.
type residencyAnswer struct {
	NodeID     string `json:"node_id"`
	ProviderID string `json:"provider_id"`
	Model      string `json:"model"`
	// Status is "loaded" or "unloaded".
	Status string `json:"status"`
}

// serveResidency serves POST /admin/v1/providers/{node}/{provider}/load
// and /unload with {"model": NAME}: the provider's server loads the
// model and keeps it loaded (until an unload), or unloads it; one action,
// not a setting (keep_loaded applies its own rule afterwards).
// It answers 200 {"node_id","provider_id","model","status"} once done;
// 400 a body without a model; 404 another path, or no such connected
// node, provider or served model; 409 a provider whose server holds its
// models always, or that refused or did not answer.
func serveResidency(res Residency) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		parts := strings.Split(strings.TrimPrefix(r.URL.Path, residencyPrefix), "/")
		if len(parts) != 3 || parts[0] == "" || parts[1] == "" || (parts[2] != "load" && parts[2] != "unload") {
			api.WriteError(w, r, api.ErrNotFound)
			return
		}
		var body residencyBody
		data, err := io.ReadAll(r.Body)
		if err != nil {
			api.WriteError(w, r, err)
			return
		}
		if json.Unmarshal(data, &body) != nil || body.Model == "" {
			api.WriteError(w, r, api.InvalidParam("model", `the body must be {"model": NAME}`))
			return
		}
		unload := parts[2] == "unload"
		if err := res.KeepModel(r.Context(), parts[0], parts[1], body.Model, unload); err != nil {
			api.WriteError(w, r, err)
			return
		}
		status := "loaded"
		if unload {
			status = "unloaded"
		}
		httpconn.WriteJSON(w, http.StatusOK, residencyAnswer{NodeID: parts[0], ProviderID: parts[1], Model: body.Model, Status: status})
	}
}
