package process

import (
	"context"

	"iop/internal/edge"
	"iop/internal/edge/api"
)

// gateway is *edge.Service as the HTTP API's Gateway: both speak the
// contract's types (package edge/contract), and the service is also the
// API's Admin and ModelCatalog; only Dispatch's result widens to api.Run.
type gateway struct{ *edge.Service }

var (
	_ api.Gateway      = gateway{}
	_ api.Admin        = gateway{}
	_ api.ModelCatalog = gateway{}
)

func (g gateway) Dispatch(ctx context.Context, req api.Request) (api.Run, error) {
	run, err := g.Service.Dispatch(ctx, req)
	if err != nil {
		return nil, err
	}
	return run, nil
}
