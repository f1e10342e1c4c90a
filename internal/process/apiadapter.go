package process

import (
	"context"
	"errors"
	"fmt"
	"io"

	"iop/internal/edge"
	"iop/internal/edge/api"
	"iop/internal/scheduler"
	"iop/internal/wire/nodev1"
)

// gateway adapts *edge.Service to the HTTP API's Gateway, mapping the
// edge's and scheduler's errors onto the API's sentinels: the one place
// where they meet.
type gateway struct{ svc *edge.Service }

var _ api.Gateway = gateway{}

func (g gateway) Dispatch(ctx context.Context, req api.Request) (api.Run, error) {
	run, err := g.svc.Dispatch(ctx, edge.Request(req))
	if err != nil {
		return nil, apiError(err)
	}
	return apiRun{run}, nil
}

func (g gateway) Models() []string { return g.svc.Models() }

var _ api.Admin = gateway{}

// AdminSnapshot converts the edge's snapshot into the API's views (their
// fields mirror edge's one to one).
func (g gateway) AdminSnapshot() api.AdminSnapshot {
	snap := g.svc.Snapshot()
	var out api.AdminSnapshot
	for _, n := range snap.Nodes {
		out.Nodes = append(out.Nodes, api.AdminNode(n))
	}
	for _, p := range snap.Providers {
		out.Providers = append(out.Providers, api.AdminProvider(p))
	}
	for _, q := range snap.Queues {
		out.Queues = append(out.Queues, api.AdminQueue(q))
	}
	return out
}

var _ api.ModelCatalog = gateway{}

func (g gateway) ModelInfo(name string) (api.ModelInfo, bool) {
	info, ok := g.svc.ModelInfo(name)
	out := api.ModelInfo{Name: info.Name, Alias: info.Alias, Targets: info.Targets}
	for _, p := range info.Providers {
		out.Providers = append(out.Providers, api.ModelProvider(p))
	}
	return out, ok
}

func (g gateway) RunsInFlight() map[string]int { return g.svc.RunsInFlight() }

type apiRun struct{ *edge.Run }

func (r apiRun) Info() api.DispatchInfo { return api.DispatchInfo(r.Run.Info()) }

func (r apiRun) Recv() (*nodev1.RunUp, error) {
	m, err := r.Run.Recv()
	if err != nil && !errors.Is(err, io.EOF) {
		err = apiError(err)
	}
	return m, err
}

// apiError wraps err with the API sentinel for its outcome (the first
// that matches: a lost provider is unavailable even if a rejection is in
// the chain); errors without one (context errors, invalid requests) pass
// through.
func apiError(err error) error {
	for _, m := range []struct{ from, to error }{
		{scheduler.ErrUnknownModel, api.ErrUnknownModel},
		{scheduler.ErrProviderUnavailable, api.ErrProviderUnavailable},
		{scheduler.ErrCandidatesRejected, api.ErrCandidatesRejected},
		{scheduler.ErrQueueFull, api.ErrQueueFull},
		{scheduler.ErrQueueTimeout, api.ErrQueueTimeout},
		{scheduler.ErrNoProvider, api.ErrNoProvider},
		{edge.ErrDispatchTimeout, api.ErrDispatchTimeout},
		{edge.ErrDispatchRefused, api.ErrDispatchRefused},
		{edge.ErrStaleGeneration, api.ErrStaleGeneration},
		{edge.ErrNodeGone, api.ErrNodeGone},
		{edge.ErrShuttingDown, api.ErrShuttingDown},
	} {
		if errors.Is(err, m.from) {
			return fmt.Errorf("%w: %w", m.to, err)
		}
	}
	return err
}
