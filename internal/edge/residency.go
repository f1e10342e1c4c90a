package edge

import (
	"cmp"
	"slices"

	"iop/internal/edge/contract"
	"iop/internal/wire/nodev1"
)

// Loaded lists the models the providers of the current node connections
// hold loaded, sorted by node, provider, then served name: for a provider
// whose node reads its server's loaded models (an Ollama: /api/ps on the
// node's discovery interval and after each run ends, at most once a
// second), those of them it serves (Source "reported"); for an
// OpenAI-compatible provider every served model (Source "always": such a
// server serves its models always); and, on any provider, a served model
// with runs in flight not listed so (Source "in_flight": it is loading or
// loaded, and the node's next reading will say). Each carries its runs in
// flight on that provider, and whether keep_loaded keeps it. It reads the registry's published state and
// the runs under the service's lock; it costs O(providers' models + runs).
func (s *Service) Loaded() []contract.LoadedModel {
	type key struct{ node, provider, served string }
	inFlight := make(map[key]int)
	s.mu.Lock()
	for _, r := range s.runs {
		inFlight[key{r.info.NodeID, r.info.ProviderID, r.info.ServedModel}]++
	}
	s.mu.Unlock()

	var out []contract.LoadedModel
	listed := make(map[key]bool)
	kept := s.keptTargets()
	for node, cs := range s.reg.load().nodes.all() {
		for _, p := range cs.providers {
			add := func(m contract.LoadedModel) {
				k := key{node, p.id, m.Served}
				m.NodeID, m.ProviderID, m.Type, m.InFlight, m.Kept = node, p.id, p.typ, inFlight[k], kept[m.Served]
				listed[k] = true
				out = append(out, m)
			}
			details := func(served string) (d contract.ModelDetails) {
				if sm := p.model[served]; sm != nil {
					if md := modelDetails(sm.details); md != nil {
						d = *md
					}
				}
				return d
			}
			switch {
			case p.loadedSet:
				for _, lm := range p.loaded {
					served, ok := p.servedName(lm.GetName())
					if !ok {
						continue
					}
					add(reportedModel(served, lm))
				}
			case p.path == nodev1.ExecutionPath_EXECUTION_PATH_TUNNEL:
				for _, m := range p.models {
					d := details(m)
					add(contract.LoadedModel{Served: m, Name: m, Model: m, Size: d.Size, Digest: d.Digest, Details: d,
						ContextLength: d.ContextLength, Source: contract.LoadedAlways})
				}
			}
			for _, m := range p.models {
				if k := (key{node, p.id, m}); inFlight[k] > 0 && !listed[k] {
					d := details(m)
					add(contract.LoadedModel{Served: m, Name: m, Model: m, Size: d.Size, Digest: d.Digest, Details: d,
						ContextLength: d.ContextLength, Source: contract.LoadedInFlight})
				}
			}
		}
	}
	slices.SortFunc(out, func(a, b contract.LoadedModel) int {
		return cmp.Or(cmp.Compare(a.NodeID, b.NodeID), cmp.Compare(a.ProviderID, b.ProviderID), cmp.Compare(a.Served, b.Served))
	})
	return out
}

// reportedModel is the LoadedModel of lm, a model the node read loaded,
// served as served.
func reportedModel(served string, lm *nodev1.LoadedModel) contract.LoadedModel {
	d := contract.ModelDetails{}
	if md := modelDetails(lm.GetDetails()); md != nil {
		d = *md
	}
	return contract.LoadedModel{
		Served: served, Name: lm.GetName(), Model: lm.GetModel(), Size: lm.GetSize(), SizeVRAM: lm.GetSizeVram(),
		Digest: lm.GetDigest(), Details: d, ExpiresAt: lm.GetExpiresAt(), ContextLength: lm.GetContextLength(),
		LoadedSince: lm.GetLoadedSince(), Source: contract.LoadedReported,
	}
}

// syncResidency tells the scheduler what provider providerID of c holds
// loaded (its served names), when c's node reads it: after the Hello's
// activation and on each ProviderUpdate that changed it, with the limit
// its node was configured with (0: learned from the readings,
// scheduler.SetLoaded).
func (s *Service) syncResidency(c *conn, providerID string) {
	_, p := s.reg.lookup(c.nodeID, c.gen, providerID)
	if p == nil || !p.loadedSet {
		return
	}
	served := make([]string, 0, len(p.loaded))
	for _, lm := range p.loaded {
		if name, ok := p.servedName(lm.GetName()); ok {
			served = append(served, name)
		}
	}
	if err := s.sched.SetLoaded(c.nodeID, providerID, served, p.maxLoaded); err != nil {
		s.log.Debug("residency not applied", "node", c.nodeID, "provider", providerID, "err", err)
	}
}
