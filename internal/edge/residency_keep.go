package edge

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"iop/internal/edge/contract"
	"iop/internal/wire/nodev1"
)

// keepAnswerTimeout bounds how long a load or unload waits for its node's
// answer (the node bounds its server's load at 5 min).
const keepAnswerTimeout = 6 * time.Minute

// keepRecheck is how often the keeper looks again with no registry
// change; keepRetry how long it leaves a provider alone after a failed
// load there.
const (
	keepRecheck = 10 * time.Second
	keepRetry   = 30 * time.Second
)

// errKeepNoAnswer: the node connection ended, or the node did not answer
// within keepAnswerTimeout.
var errKeepNoAnswer = errors.New("the node did not answer")

// keepKey names one served model on one provider.
type keepKey struct{ node, provider, served string }

// kept is one alias with keep_loaded: its targets, in preference order,
// and on how many providers to hold one of them.
type kept struct {
	alias   string
	targets []string
	n       int
}

// keepState is what the keeper and the admin calls share.
type keepState struct {
	wg sync.WaitGroup // one per load the keeper started

	mu sync.Mutex // guards the fields below
	// aliases are the aliases with keep_loaded, sorted (setKept).
	aliases []kept
	// pending are the loads the keeper asked for and not yet answered.
	pending map[keepKey]bool
	// failed holds when a load the keeper asked for failed.
	failed map[keepKey]time.Time
}

// setKept takes the keep_loaded of cfg's aliases, and tells the scheduler
// their targets are kept (scheduler.SetKept).
func (s *Service) setKept(models Aliases) {
	var ks []kept
	var targets []string
	for alias, m := range models {
		if m.KeepLoaded > 0 {
			ks = append(ks, kept{alias: alias, targets: slices.Clone(m.Targets), n: m.KeepLoaded})
			targets = append(targets, m.Targets...)
		}
	}
	slices.SortFunc(ks, func(a, b kept) int { return cmp.Compare(a.alias, b.alias) })
	s.keep.mu.Lock()
	s.keep.aliases = ks
	s.keep.mu.Unlock()
	s.sched.SetKept(targets)
	s.reg.notify()
}

// residentOf lists the served models p holds loaded as its node last
// read them, each marked kept when an alias with keep_loaded names it;
// nil when its node reads none. An empty list when it holds none.
func (s *Service) residentOf(p *provider) []contract.ResidentModel {
	if !p.loadedSet {
		return nil
	}
	kept := s.keptTargets()
	out := []contract.ResidentModel{}
	for _, lm := range p.loaded {
		served, ok := p.servedName(lm.GetName())
		if !ok {
			continue
		}
		out = append(out, contract.ResidentModel{Model: served, Since: lm.GetLoadedSince(), Kept: kept[served]})
	}
	return out
}

// keptTargets returns the targets of the aliases with keep_loaded.
func (s *Service) keptTargets() map[string]bool {
	s.keep.mu.Lock()
	defer s.keep.mu.Unlock()
	kept := make(map[string]bool)
	for _, ka := range s.keep.aliases {
		for _, t := range ka.targets {
			kept[t] = true
		}
	}
	return kept
}

// KeepModel asks node nodeID, on its current connection, to have the
// model server of its provider providerID load model (a served name of
// it, under the name rule) and keep it loaded, or with unload to unload
// it, and waits for the node's answer (a load: until the model is
// loaded). The node then reads what its server holds and reports it, so
// /api/ps and the scheduler follow. A load or an unload is one action, not
// a setting the edge keeps: what the nodes report and the configuration
// are the keeper's only inputs, so it decides the same on every edge and
// after a restart. A model an alias's keep_loaded keeps is loaded again by
// its rule (keepPass) once a provider has room, maybe the one it was
// unloaded from; to stop keeping it, lower keep_loaded. Errors: contract.ErrUnknownProvider (the node is not connected,
// has no such provider, or it does not serve model);
// contract.ErrResidencyConflict (its server holds its models always: its
// node reads none and it is no Ollama; or refused, or the node did not
// answer within 6 min); ctx's error;
// ErrShuttingDown.
func (s *Service) KeepModel(ctx context.Context, nodeID, providerID, model string, unload bool) error {
	c := s.reg.current(nodeID)
	if c == nil {
		return fmt.Errorf("%w: node %q is not connected", contract.ErrUnknownProvider, nodeID)
	}
	p := c.lastState().byID[providerID]
	if p == nil {
		return fmt.Errorf("%w: node %q has no provider %q", contract.ErrUnknownProvider, nodeID, providerID)
	}
	served, ok := p.servedName(model)
	if !ok {
		return fmt.Errorf("%w: provider %q of node %q does not serve %q", contract.ErrUnknownProvider, providerID, nodeID, model)
	}
	if !p.ollamaAPI() && !p.loadedSet {
		return fmt.Errorf("%w: provider %q of node %q holds its models always",
			contract.ErrResidencyConflict, providerID, nodeID)
	}
	if unload && s.keptTargets()[served] {
		s.log.Info("unloading a kept model: keep_loaded loads it again where there is room", "model", served, "node", nodeID, "provider", providerID)
	}
	if err := s.askKeep(ctx, c, providerID, served, unload); err != nil {
		if errors.Is(err, ctx.Err()) || errors.Is(err, ErrShuttingDown) {
			return err
		}
		return fmt.Errorf("%w: %w", contract.ErrResidencyConflict, err)
	}
	return nil
}

// askKeep sends c's node a ResidencyRequest and waits for its answer.
// Errors: errKeepNoAnswer, the node's error text, ctx's error,
// ErrShuttingDown.
func (s *Service) askKeep(ctx context.Context, c *conn, providerID, served string, unload bool) error {
	id, answer := c.addKeep()
	defer c.dropKeep(id)
	m := &nodev1.EdgeMessage{Msg: &nodev1.EdgeMessage_ResidencyRequest{ResidencyRequest: &nodev1.ResidencyRequest{
		RequestId: id, ProviderId: providerID, Model: served, Unload: unload}}}
	if !c.enqueue(m) {
		return fmt.Errorf("%w: node %q: connection closed", errKeepNoAnswer, c.nodeID)
	}
	timeout := make(chan struct{})
	t := s.clock.AfterFunc(keepAnswerTimeout, func() { close(timeout) })
	defer t.Stop()
	select {
	case err := <-answer:
		return err
	case <-timeout:
		return fmt.Errorf("%w: node %q within %s", errKeepNoAnswer, c.nodeID, keepAnswerTimeout)
	case <-ctx.Done():
		return ctx.Err()
	case <-s.shutdown:
		return ErrShuttingDown
	}
}

// addKeep registers a ResidencyRequest of c and returns its id and the
// channel its answer comes on (one send; an error when the connection
// closed).
func (c *conn) addKeep() (uint64, chan error) {
	ch := make(chan error, 1)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.nextKeep++
	if c.closed {
		ch <- fmt.Errorf("%w: node %q: connection closed", errKeepNoAnswer, c.nodeID)
		return c.nextKeep, ch
	}
	if c.keeps == nil {
		c.keeps = make(map[uint64]chan error)
	}
	c.keeps[c.nextKeep] = ch
	return c.nextKeep, ch
}

// dropKeep forgets ResidencyRequest id.
func (c *conn) dropKeep(id uint64) {
	c.mu.Lock()
	delete(c.keeps, id)
	c.mu.Unlock()
}

// keepAnswer takes a ResidencyAnswer from c's node; one no longer awaited
// is dropped.
func (c *conn) keepAnswer(a *nodev1.ResidencyAnswer) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch := c.keeps[a.GetRequestId()]
	if ch == nil {
		return
	}
	delete(c.keeps, a.GetRequestId())
	if a.GetError() != "" {
		ch <- fmt.Errorf("node %q: %s", c.nodeID, a.GetError())
		return
	}
	ch <- nil
}

// failKeepsLocked ends every ResidencyRequest of c still waiting: its
// connection closed. The caller holds c.mu.
func (c *conn) failKeepsLocked() {
	for id, ch := range c.keeps {
		ch <- fmt.Errorf("%w: node %q: connection closed", errKeepNoAnswer, c.nodeID)
		delete(c.keeps, id)
	}
}

// keepLoaded keeps the aliases with keep_loaded loaded, until ctx ends,
// then waits for the loads it started: at each registry change (a node
// connects, a provider's loaded models change) and every keepRecheck it
// makes one pass (keepPass).
func (s *Service) keepLoaded(ctx context.Context) {
	defer s.keep.wg.Wait()
	for {
		changed := s.reg.changes()
		s.keepPass(ctx)
		tick := make(chan struct{})
		t := s.clock.AfterFunc(keepRecheck, func() { close(tick) })
		select {
		case <-changed:
		case <-tick:
		case <-ctx.Done():
			t.Stop()
			return
		}
		t.Stop()
	}
}

// keepPass counts, for each alias with keep_loaded N, the providers that
// hold any one of its targets (as their nodes last read: an Ollama's
// /api/ps, a managed provider's servers; a provider whose server holds
// its models always counts when healthy) or are loading one for the
// keeper; below N, it asks the nodes of the others to load the first
// target each serves, on
// providers with room (fewer models loaded
// than their node's max_loaded_models, or no limit known), fewest loaded
// first, then by node and provider id. It never evicts: a model that
// demand or an admin unload evicted is loaded again once a provider has
// room. It skips providers that are draining or unhealthy, and where a
// load failed in the last keepRetry. Its inputs are the nodes' reports
// and the configuration alone, so every edge (and one restarted) decides
// the same. With several edges only the scheduler leader keeps.
func (s *Service) keepPass(ctx context.Context) {
	if s.cl != nil && s.cl.leadsReady() == 0 {
		return
	}
	type room struct {
		c      *conn
		p      *provider
		served string
	}
	now := s.clock.Now()
	st := s.reg.load()
	s.keep.mu.Lock()
	defer s.keep.mu.Unlock()
	for _, ka := range s.keep.aliases {
		held := 0
		var free []room
		for node, cs := range st.nodes.all() {
			for _, p := range cs.providers {
				// served is the first target p serves (the one to load);
				// p holds the alias when any target it serves is loaded
				// or being loaded for the keeper.
				served, holds := "", false
				for _, t := range ka.targets {
					name, ok := p.servedName(t)
					if !ok {
						continue
					}
					if served == "" {
						served = name
					}
					holds = holds || s.keep.pending[keepKey{node, p.id, name}] || slices.ContainsFunc(p.loaded, func(lm *nodev1.LoadedModel) bool {
						loaded, ok := p.servedName(lm.GetName())
						return ok && loaded == name
					})
				}
				if served == "" {
					continue
				}
				k := keepKey{node, p.id, served}
				switch {
				case !p.loadedSet:
					// Not read yet (an Ollama), or held always.
					if p.healthy && !p.ollamaAPI() {
						held++
					}
				case holds:
					held++
				case cs.draining || !p.healthy || now.Sub(s.keep.failed[k]) < keepRetry:
				case p.maxLoaded == 0 || len(p.loaded) < p.maxLoaded:
					free = append(free, room{cs.c, p, served})
				}
			}
		}
		slices.SortFunc(free, func(a, b room) int {
			return cmp.Or(cmp.Compare(len(a.p.loaded), len(b.p.loaded)), cmp.Compare(a.c.nodeID, b.c.nodeID), cmp.Compare(a.p.id, b.p.id))
		})
		for _, r := range free {
			if held >= ka.n {
				break
			}
			held++
			s.startKeepLocked(ctx, r.c, r.p.id, r.served, ka.alias)
		}
	}
}

// startKeepLocked asks c's node to load served on providerID for alias,
// on its own goroutine (keepState.wg). The caller holds s.keep.mu.
func (s *Service) startKeepLocked(ctx context.Context, c *conn, providerID, served, alias string) {
	k := keepKey{c.nodeID, providerID, served}
	if s.keep.pending == nil {
		s.keep.pending = make(map[keepKey]bool)
		s.keep.failed = make(map[keepKey]time.Time)
	}
	s.keep.pending[k] = true
	s.log.Info("loading a kept model", "alias", alias, "model", served, "node", c.nodeID, "provider", providerID)
	s.keep.wg.Go(func() {
		err := s.askKeep(ctx, c, providerID, served, false)
		s.keep.mu.Lock()
		delete(s.keep.pending, k)
		if err != nil {
			s.keep.failed[k] = s.clock.Now()
		} else {
			delete(s.keep.failed, k)
		}
		s.keep.mu.Unlock()
		if err != nil && ctx.Err() == nil {
			s.log.Warn("loading a kept model failed", "alias", alias, "model", served, "node", c.nodeID, "provider", providerID, "err", err)
		}
	})
}
