package node

import (
	"time"

	"iop/internal/node/managed"
	"iop/internal/wire/nodev1"
)

// reportManaged makes a managed provider's loaded models its residency:
// none at first (set, so the edge knows nothing is loaded), then, at every
// change, the models whose server is up and healthy. Other providers are
// left alone.
func (a *Agent) reportManaged(p *provider) {
	m, ok := p.adapter.(*managed.Manager)
	if !ok {
		return
	}
	id := p.cfg.ID
	a.advMu.Lock()
	a.residency[id] = &resident{loaded: []*nodev1.LoadedModel{}, version: 1}
	a.advMu.Unlock()
	m.SetOnChange(func(loaded []managed.Loaded) { a.setLoaded(id, loaded) })
}

// setLoaded publishes loaded as what provider id holds and wakes every
// connection to send it (managed.Manager's lock is held; advMu is a leaf).
func (a *Agent) setLoaded(id string, loaded []managed.Loaded) {
	out := make([]*nodev1.LoadedModel, len(loaded))
	for i, l := range loaded {
		out[i] = &nodev1.LoadedModel{Name: l.Model, Model: l.Model, LoadedSince: l.Since.UTC().Format(time.RFC3339Nano)}
	}
	a.advMu.Lock()
	defer a.advMu.Unlock()
	var version uint64
	if cur := a.residency[id]; cur != nil {
		version = cur.version
	}
	a.residency[id] = &resident{loaded: out, version: version + 1}
	close(a.advChanged)
	a.advChanged = make(chan struct{})
}
