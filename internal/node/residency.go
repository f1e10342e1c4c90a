package node

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	"iop/internal/modelname"
	"iop/internal/wire/nodev1"
)

// residencyTimeout bounds one GET /api/ps.
const residencyTimeout = 5 * time.Second

// maxPSBytes caps one /api/ps answer.
const maxPSBytes = 4 << 20

// residencyGap is the least time between two readings of a provider's
// /api/ps: the end of a run asks for a reading (kickResidency), and many
// runs ending together ask for one.
const residencyGap = time.Second

// resident is what the agent tells the edge of the models one provider
// holds loaded, and its version, which every change increments.
type resident struct {
	loaded  []*nodev1.LoadedModel // sorted by name; never modified once published
	version uint64
}

// residencyInterval is how often p's /api/ps is read when no run ends:
// its discovery interval, else the node's.
func (a *Agent) residencyInterval(p *provider) time.Duration {
	if d := time.Duration(p.interval.Load()); d > 0 {
		return d
	}
	return a.cfg.DiscoveryInterval
}

// kickResidency asks for a reading of provider id's /api/ps (a run on it
// ended: its server may have loaded or unloaded a model); it never blocks.
func (a *Agent) kickResidency(id string) {
	if p := a.providers[id]; p != nil && p.kick != nil {
		select {
		case p.kick <- struct{}{}:
		default:
		}
	}
}

// kickResidencyAfter asks for a reading of provider id's /api/ps after a
// run for model ended, when the last reading did not show model loaded
// (the run loaded it, and may have evicted another): a run of a loaded
// model changes nothing the edge needs at once, and the discovery
// interval's reading catches a model its server unloaded when idle.
func (a *Agent) kickResidencyAfter(id, model string) {
	a.advMu.Lock()
	r := a.residency[id]
	loaded := r != nil && slices.ContainsFunc(r.loaded, func(m *nodev1.LoadedModel) bool {
		return modelname.Same(m.GetName(), model)
	})
	a.advMu.Unlock()
	if !loaded {
		a.kickResidency(id)
	}
}

// startResidency starts one goroutine per Ollama provider that reads its
// server's /api/ps and publishes what it holds loaded: at once, then
// every residencyInterval, and after a run on it ends (kickResidency), at
// most once per residencyGap, until ctx ends. stop waits for them.
func (a *Agent) startResidency(ctx context.Context) (stop func()) {
	var wg sync.WaitGroup
	for _, p := range a.order {
		if p.meta == nil || a.noResidency {
			continue
		}
		wg.Go(func() { a.watchResidency(ctx, p) })
	}
	return wg.Wait
}

func (a *Agent) watchResidency(ctx context.Context, p *provider) {
	failing := false
	for {
		err := a.readResidency(ctx, p)
		if ctx.Err() != nil {
			return
		}
		if err != nil && !failing {
			a.logger.Warn("provider's loaded models unknown: its model server does not answer /api/ps", "provider", p.cfg.ID, "err", err)
		}
		failing = err != nil
		last := a.clock.Now()
		woke := make(chan struct{})
		t := a.clock.AfterFunc(a.residencyInterval(p), func() { close(woke) })
		select {
		case <-woke:
		case <-p.kick:
		case <-ctx.Done():
		}
		t.Stop()
		if wait := residencyGap - a.clock.Now().Sub(last); wait > 0 && !a.sleepOn(ctx, nil, wait) {
			return
		}
		if ctx.Err() != nil {
			return
		}
	}
}

// readResidency reads p's /api/ps once and publishes it; a failed reading
// publishes no model loaded (the server holds none the node can use).
func (a *Agent) readResidency(ctx context.Context, p *provider) error {
	rctx, cancel := context.WithTimeout(ctx, residencyTimeout)
	defer cancel()
	loaded, err := p.meta.ps(rctx)
	if ctx.Err() != nil {
		return ctx.Err()
	}
	now := a.clock.Now().UTC().Format(time.RFC3339Nano)
	a.advMu.Lock()
	defer a.advMu.Unlock()
	cur := a.residency[p.cfg.ID]
	for _, m := range loaded {
		m.LoadedSince = now
		if cur == nil {
			continue
		}
		if i := slices.IndexFunc(cur.loaded, func(o *nodev1.LoadedModel) bool { return o.GetName() == m.GetName() && o.GetDigest() == m.GetDigest() }); i >= 0 {
			m.LoadedSince = cur.loaded[i].GetLoadedSince()
		}
	}
	if cur != nil && slices.EqualFunc(cur.loaded, loaded, func(x, y *nodev1.LoadedModel) bool { return proto.Equal(x, y) }) {
		return err
	}
	var version uint64
	if cur != nil {
		version = cur.version
	}
	a.residency[p.cfg.ID] = &resident{loaded: loaded, version: version + 1}
	close(a.advChanged)
	a.advChanged = make(chan struct{})
	return err
}

// ps reads GET /api/ps: the models the server holds loaded, sorted by
// name, each with its parent_model cleared when it is a file path (as
// discovery does). Errors: the server did not answer, or not 200 with a
// listing.
func (m *ollamaMeta) ps(ctx context.Context) ([]*nodev1.LoadedModel, error) {
	status, data, err := m.get(ctx, http.MethodGet, "/api/ps", nil, maxPSBytes)
	if err != nil {
		return []*nodev1.LoadedModel{}, err
	}
	if status != http.StatusOK {
		return []*nodev1.LoadedModel{}, fmt.Errorf("GET /api/ps: status %d", status)
	}
	var ps struct {
		Models []struct {
			Name          string        `json:"name"`
			Model         string        `json:"model"`
			Size          int64         `json:"size"`
			SizeVRAM      int64         `json:"size_vram"`
			Digest        string        `json:"digest"`
			Details       ollamaDetails `json:"details"`
			ExpiresAt     string        `json:"expires_at"`
			ContextLength int64         `json:"context_length"`
		} `json:"models"`
	}
	if err := json.Unmarshal(data, &ps); err != nil {
		return []*nodev1.LoadedModel{}, fmt.Errorf("GET /api/ps: not a listing: %w", err)
	}
	out := make([]*nodev1.LoadedModel, 0, len(ps.Models))
	for _, e := range ps.Models {
		name := e.Name
		if name == "" {
			name = e.Model
		}
		if name == "" {
			continue
		}
		d := e.Details
		if isFilePath(d.ParentModel) {
			d.ParentModel = ""
		}
		out = append(out, &nodev1.LoadedModel{
			Name: name, Model: e.Model, Size: e.Size, SizeVram: e.SizeVRAM, Digest: e.Digest, ExpiresAt: e.ExpiresAt,
			ContextLength: e.ContextLength,
			Details: &nodev1.ModelDetails{
				Format: d.Format, Family: d.Family, Families: d.Families, ParameterSize: d.ParameterSize,
				QuantizationLevel: d.QuantizationLevel, ParentModel: d.ParentModel,
			},
		})
	}
	slices.SortFunc(out, func(x, y *nodev1.LoadedModel) int { return strings.Compare(x.GetName(), y.GetName()) })
	return out, nil
}

// loadedOfLocked returns what the edge is told of provider id's loaded
// models and its version; set is false while the node has read none (not
// an Ollama provider, or before the first reading). The caller holds
// advMu.
func (a *Agent) loadedOfLocked(id string) (loaded []*nodev1.LoadedModel, version uint64, set bool) {
	if r := a.residency[id]; r != nil {
		return r.loaded, r.version, true
	}
	return nil, 0, false
}
