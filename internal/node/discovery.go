package node

import (
	"context"
	"slices"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	"iop/internal/wire/nodev1"
)

// advert is what the agent tells the edge of one provider: its health and
// its served models, with what it knows of each. A published advert is
// never modified (a change publishes a new one).
type advert struct {
	// capacity and longCapacity are the provider's configured ones (Reload
	// changes them; a discovery round never does).
	capacity, longCapacity int
	healthy                bool
	models                 []string                    // served model names, sorted
	entries                []*nodev1.ModelCapabilities // per-model capabilities and details, sorted by model; nil when none
}

func (v advert) equal(w advert) bool {
	return v.capacity == w.capacity && v.longCapacity == w.longCapacity && v.healthy == w.healthy && slices.Equal(v.models, w.models) &&
		slices.EqualFunc(v.entries, w.entries, func(a, b *nodev1.ModelCapabilities) bool { return proto.Equal(a, b) })
}

// advertised is a provider's current advert and its version, which every
// change increments.
type advertised struct {
	advert
	version uint64
}

// configuredAdvert is the advert of a provider with configured models: it
// serves them and is healthy, for good.
func configuredAdvert(pc ProviderConfig) advert {
	return advert{capacity: pc.Capacity, longCapacity: pc.LongCapacity, healthy: true, models: slices.Clone(pc.Models)}
}

// discoveredAdvert is the advert of a provider whose server listed models
// (sorted by name): healthy when it lists at least one. A model gets an
// entry in model_capabilities when its server said its capabilities (they
// are then "stream" and those, unless the provider configures
// capabilities, which override the server's) or its details (with the
// provider's capabilities and "completion": a model of the provider's
// capabilities is taken to generate text, as the edge takes it).
func discoveredAdvert(pc ProviderConfig, models []DiscoveredModel) advert {
	v := advert{capacity: pc.Capacity, longCapacity: pc.LongCapacity, healthy: len(models) > 0, models: []string{}}
	base := pc.capabilities()
	for _, m := range models {
		v.models = append(v.models, m.Name)
		var caps []string
		switch {
		case len(pc.Capabilities) == 0 && m.Capabilities != nil:
			caps = appendNew(slices.Clone(base), m.Capabilities...)
		case m.Details != nil:
			caps = appendNew(slices.Clone(base), "completion")
		default:
			continue
		}
		v.entries = append(v.entries, &nodev1.ModelCapabilities{Model: m.Name, Capabilities: caps, Details: m.Details})
	}
	return v
}

// appendNew appends those of add that are not in list yet.
func appendNew(list []string, add ...string) []string {
	for _, s := range add {
		if !slices.Contains(list, s) {
			list = append(list, s)
		}
	}
	return list
}

// providerMessage is the Provider message of p for a Hello, advertised as v.
func (a *Agent) providerMessage(p *provider, v advert) *nodev1.Provider {
	return &nodev1.Provider{
		Id:                p.cfg.ID,
		Type:              p.cfg.Type,
		Models:            v.models,
		Capacity:          int32(v.capacity),
		LongCapacity:      int32(v.longCapacity),
		Capabilities:      p.cfg.capabilities(),
		ExecutionPath:     p.path,
		Healthy:           v.healthy,
		ModelCapabilities: v.entries,
		MaxLoadedModels:   int32(p.cfg.MaxLoadedModels),
		CostWeight:        p.cfg.CostWeight,
	}
}

// helloNow returns the Hello to send on a new connection, describing every
// provider as advertised now, the advert versions it describes, and a
// channel closed at the next change of an advert.
func (a *Agent) helloNow() (*nodev1.Hello, map[string]sentAdvert, <-chan struct{}) {
	a.advMu.Lock()
	defer a.advMu.Unlock()
	h := &nodev1.Hello{
		NodeId:             a.cfg.NodeID,
		Label:              a.cfg.Label,
		Token:              a.cfg.Token,
		RuntimeConcurrency: int32(a.cfg.RuntimeConcurrency),
		Version:            a.cfg.Version,
		Instance:           a.instance,
	}
	sent := make(map[string]sentAdvert, len(a.order))
	for _, p := range a.order {
		adv := a.adverts[p.cfg.ID]
		pm := a.providerMessage(p, adv.advert)
		loaded, lv, set := a.loadedOfLocked(p.cfg.ID)
		pm.LoadedSet, pm.Loaded = set, loaded
		h.Providers = append(h.Providers, pm)
		sent[p.cfg.ID] = sentAdvert{adv.version, adv.capacity, adv.longCapacity, lv}
	}
	return h, sent, a.advChanged
}

// sentAdvert is what one connection told its edge of a provider: the
// advert's version and capacities, and the version of its residency.
type sentAdvert struct {
	version                uint64
	capacity, longCapacity int
	loadedVersion          uint64
}

// updatesSince returns a ProviderUpdate for every provider whose advert
// or residency changed since the versions in sent (which it brings up to
// date), in config order, and a channel closed at the next change. An
// update carries the served models only when the advert changed
// (models_set), the loaded models only when they changed (loaded_set),
// and capacities only when they differ from those sent (0 = unchanged).
func (a *Agent) updatesSince(sent map[string]sentAdvert) ([]*nodev1.ProviderUpdate, <-chan struct{}) {
	a.advMu.Lock()
	defer a.advMu.Unlock()
	var out []*nodev1.ProviderUpdate
	for _, p := range a.order {
		adv := a.adverts[p.cfg.ID]
		was := sent[p.cfg.ID]
		loaded, lv, set := a.loadedOfLocked(p.cfg.ID)
		if adv.version == was.version && lv == was.loadedVersion {
			continue
		}
		sent[p.cfg.ID] = sentAdvert{adv.version, adv.capacity, adv.longCapacity, lv}
		u := &nodev1.ProviderUpdate{ProviderId: p.cfg.ID, Healthy: adv.healthy}
		if adv.version != was.version {
			u.ModelsSet, u.Models, u.ModelCapabilities = true, adv.models, adv.entries
		}
		if set && lv != was.loadedVersion {
			u.LoadedSet, u.Loaded = true, loaded
		}
		if adv.capacity != was.capacity || adv.longCapacity != was.longCapacity {
			u.Capacity, u.LongCapacity = int32(adv.capacity), int32(adv.longCapacity)
		}
		out = append(out, u)
	}
	return out, a.advChanged
}

// publish makes v p's advert if it differs from the current one, waking
// every connection to send it; it returns the advert it replaced and
// whether it did. v's capacities are ignored: the current ones stay
// (setCapacity changes them).
func (a *Agent) publish(id string, v advert) (old advert, changed bool) {
	a.advMu.Lock()
	defer a.advMu.Unlock()
	cur := a.adverts[id]
	v.capacity, v.longCapacity = cur.capacity, cur.longCapacity
	return a.publishLocked(id, v)
}

// setCapacity publishes p's new capacities, keeping the rest of its
// advert; it reports whether they changed.
func (a *Agent) setCapacity(id string, capacity, longCapacity int) bool {
	a.advMu.Lock()
	defer a.advMu.Unlock()
	v := a.adverts[id].advert
	v.capacity, v.longCapacity = capacity, longCapacity
	_, changed := a.publishLocked(id, v)
	return changed
}

func (a *Agent) publishLocked(id string, v advert) (old advert, changed bool) {
	cur := a.adverts[id]
	if cur.equal(v) {
		return cur.advert, false
	}
	old = cur.advert
	a.adverts[id] = &advertised{advert: v, version: cur.version + 1}
	close(a.advChanged)
	a.advChanged = make(chan struct{})
	return old, true
}

// round reads what p's server serves now and publishes it: its models
// (sorted; healthy when there is at least one) when the listing succeeded;
// when it failed (the server unreachable, or not answering its listing),
// the models last read, unhealthy, so the edge takes the provider out of
// rotation until it answers again.
func (a *Agent) round(ctx context.Context, p *provider) {
	models, err := p.lister.list(ctx)
	if ctx.Err() != nil {
		return
	}
	a.advMu.Lock()
	v := a.adverts[p.cfg.ID].advert
	a.advMu.Unlock()
	if err == nil {
		v = discoveredAdvert(p.cfg, models)
	} else {
		v.healthy = false
	}
	old, changed := a.publish(p.cfg.ID, v)
	first := p.rounds == 0
	p.rounds++
	log := a.logger.With("provider", p.cfg.ID, "base_url", p.cfg.BaseURL)
	switch {
	case err != nil && (old.healthy || first):
		log.Warn("provider out of rotation: its model server does not answer its model list", "err", err)
	case err == nil && !v.healthy && (old.healthy || first || len(old.models) > 0):
		log.Warn("provider out of rotation: its model server serves no model")
	case v.healthy && !old.healthy:
		log.Info("provider in rotation: its model server answers", "models", v.models)
	}
	if changed && !slices.Equal(old.models, v.models) && err == nil {
		added, removed := diff(old.models, v.models)
		log.Info("provider's served models changed", "added", added, "removed", removed)
	}
	if a.afterRound != nil {
		a.afterRound(p.cfg.ID, changed)
	}
}

// diff returns the names in b not in a, and those in a not in b.
func diff(a, b []string) (added, removed []string) {
	for _, s := range b {
		if !slices.Contains(a, s) {
			added = append(added, s)
		}
	}
	for _, s := range a {
		if !slices.Contains(b, s) {
			removed = append(removed, s)
		}
	}
	return added, removed
}

// startDiscovery runs a first round for every discovering provider, all at
// once, and returns when they are done (each request is bounded by
// discoveryTimeout), so the first Hello says what the servers serve; then
// it starts one goroutine per discovering provider that runs a round every
// discovery interval of the agent's clock, until ctx ends. stop waits for
// those goroutines.
func (a *Agent) startDiscovery(ctx context.Context) (stop func()) {
	var wg sync.WaitGroup
	for _, p := range a.order {
		if p.lister == nil {
			continue
		}
		wg.Go(func() { a.round(ctx, p) })
	}
	wg.Wait()
	for _, p := range a.order {
		if p.lister == nil {
			continue
		}
		wg.Go(func() {
			for a.sleepOn(ctx, a.draining, time.Duration(p.interval.Load())) {
				a.round(ctx, p)
			}
		})
	}
	return wg.Wait
}
