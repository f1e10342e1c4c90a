package edge

import (
	"fmt"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"iop/internal/clock"
	"iop/internal/edge/contract"
	"iop/internal/modelname"
	"iop/internal/scheduler"
)

// candidate is a scheduler candidate with the provider behind it.
type candidate struct {
	scheduler.Candidate
	prov *provider
}

// catalog maps requested model names to candidates: an alias from the
// config to its targets, any other name to itself if some node serves it.
type catalog struct {
	// aliases maps each alias to its targets; the map is never modified,
	// a config reload swaps in a new one.
	aliases atomic.Pointer[map[string][]string]
	reg     *registry
	// awayFor is the longest reconnect grace of the config (ns): a model
	// whose providers' node drains, or went less than that ago, has its
	// providers away (scheduler.ErrProviderAway) rather than none.
	awayFor atomic.Int64
}

func newCatalog(models map[string]ModelConfig, reg *registry) *catalog {
	c := &catalog{reg: reg}
	c.setAliases(models)
	return c
}

// setAliases replaces the aliases with those of models. Resolutions already
// running keep the map they loaded.
func (c *catalog) setAliases(models map[string]ModelConfig) {
	aliases := make(map[string][]string, len(models))
	for alias, m := range models {
		aliases[alias] = slices.Clone(m.Targets)
	}
	c.aliases.Store(&aliases)
}

// resolve returns one candidate per target of model a healthy provider of
// a current node connection, not draining, serves with every capability
// of needs (capabilities are per served model: a provider may serve one
// target with tools and another without). Candidates are ordered by node,
// then provider, then target in alias order: with several targets on one
// provider, the scheduler takes the first unless the provider holds
// another loaded (residency), so an alias's request goes to the target
// already loaded rather than swap. missing is the capability that the first provider left
// out for lacking it (in target order) lacked first, "" when none was left
// out. It returns an error wrapping scheduler.ErrUnknownModel when model is
// neither an alias nor a known served name (served now, or less than
// ForgetAfter ago), or an alias every target of which is unmatched (see
// unmatched; the error also wraps a *contract.UnmatchedAliasError naming
// them), and scheduler.ErrNoProvider when no live healthy provider of a
// node that is not draining serves it (whatever its capabilities). It reads the registry's published state and takes no
// lock, so it may run under the scheduler's lock.
func (c *catalog) resolve(model string, needs []string) (out []candidate, missing string, err error) {
	targets, alias := c.targets(model)
	st := c.reg.load()
	if !alias && !st.known(model) {
		return nil, "", fmt.Errorf("%w %q", scheduler.ErrUnknownModel, model)
	}
	type rejection struct {
		p    *provider
		need string
	}
	taken := make(map[*provider]bool) // by any target
	var rejected []rejection          // in the order met
	for _, target := range targets {
		takenHere := make(map[*provider]bool) // by this target, under one of its spellings
		for _, t := range spellings(target) {
			if t == "" {
				continue
			}
			list, _ := st.served.get(t)
			for _, s := range list {
				if takenHere[s.p] || !s.p.healthy || s.cs.draining {
					continue
				}
				caps, own := s.p.capsOf(t)
				if m := lacks(s.p.path, s.p.typ, caps, own, needs); m != "" {
					rejected = append(rejected, rejection{s.p, m})
					continue
				}
				taken[s.p], takenHere[s.p] = true, true
				out = append(out, candidate{
					Candidate: scheduler.Candidate{NodeID: s.cs.c.nodeID, Generation: s.cs.c.gen, ProviderID: s.p.id, Target: t},
					prov:      s.p,
				})
			}
		}
	}
	if len(out) == 0 && len(rejected) == 0 {
		if alias {
			if un := unmatched(st, targets); len(un) == len(targets) {
				return nil, "", fmt.Errorf("%w: %w", scheduler.ErrUnknownModel, &contract.UnmatchedAliasError{Alias: model, Targets: slices.Clone(targets)})
			}
		}
		if c.away(st, targets) {
			return nil, "", fmt.Errorf("%w %q: %w", scheduler.ErrNoProvider, model, scheduler.ErrProviderAway)
		}
		return nil, "", fmt.Errorf("%w %q: no live healthy provider serves it", scheduler.ErrNoProvider, model)
	}
	for _, r := range rejected {
		if !taken[r.p] {
			missing = r.need
			break
		}
	}
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].NodeID != out[j].NodeID {
			return out[i].NodeID < out[j].NodeID
		}
		return out[i].ProviderID < out[j].ProviderID
	})
	return out, missing, nil
}

// unmatched returns the targets, in order, that name no model a node
// serves or served less than ForgetAfter ago (under the name rule: "x"
// matches a served "x:latest"). It returns nil while the edge knows no
// node at all (none connected, none remembered): before the first node
// connects, nothing is unmatched yet. It reads st and takes no lock.
func unmatched(st *regState, targets []string) []string {
	if st.nodes.len() == 0 && st.gone.len() == 0 {
		return nil
	}
	var out []string
	for _, t := range targets {
		if !st.known(t) && !st.known(modelname.Alternative(t)) {
			out = append(out, t)
		}
	}
	return out
}

// unmatchedAliases returns the configured aliases with their unmatched
// targets (see unmatched), those with none left out.
func (c *catalog) unmatchedAliases() map[string][]string {
	st := c.reg.load()
	var out map[string][]string
	for alias, targets := range *c.aliases.Load() {
		if un := unmatched(st, targets); len(un) > 0 {
			if out == nil {
				out = make(map[string][]string)
			}
			out[alias] = un
		}
	}
	return out
}

// away reports whether a provider that serves one of targets is away for
// now: its node's current connection drains, or its node went less than
// awayFor ago.
func (c *catalog) away(st *regState, targets []string) bool {
	grace := time.Duration(c.awayFor.Load())
	if grace <= 0 {
		return false
	}
	for _, target := range targets {
		for _, t := range spellings(target) {
			list, _ := st.served.get(t)
			for _, s := range list {
				if s.cs.draining {
					return true
				}
			}
		}
	}
	now := c.reg.now()
	for _, g := range st.gone.all() {
		if now.Sub(g.at) >= grace {
			continue
		}
		for _, p := range g.cs.providers {
			if slices.ContainsFunc(targets, func(t string) bool { _, ok := p.servedName(t); return ok }) {
				return true
			}
		}
	}
	return false
}

// targets returns the served names model resolves to: an alias's targets,
// or model itself.
func (c *catalog) targets(model string) (targets []string, alias bool) {
	targets, alias = (*c.aliases.Load())[model]
	if !alias {
		targets = []string{model}
	}
	return targets, alias
}

// choosable reports whether more than one provider of a current
// connection serves one of model's targets (healthy or not, whatever its
// capabilities): whether routing has anything to choose between. It reads
// the registry's published state and takes no lock.
func (c *catalog) choosable(model string) bool {
	targets, _ := c.targets(model)
	st := c.reg.load()
	var first *provider
	for _, target := range targets {
		for _, t := range spellings(target) {
			if t == "" {
				continue
			}
			list, _ := st.served.get(t)
			for _, s := range list {
				if first == nil {
					first = s.p
				} else if s.p != first {
					return true
				}
			}
		}
	}
	return false
}

// couldMeet reports whether some provider the edge knows has every
// capability in needs and serves one of model's targets: a provider of a
// current connection, healthy or not, in rotation or not, or of a gone
// node's last connection (remembered for ForgetAfter; the node may come
// back). A request the live candidates reject is then unavailable for now,
// not one no provider can take. It reads the registry's published state
// and takes no lock.
func (c *catalog) couldMeet(model string, needs []string) bool {
	targets, _ := c.targets(model)
	st := c.reg.load()
	for _, target := range targets {
		for _, t := range spellings(target) {
			list, _ := st.served.get(t)
			for _, s := range list {
				if s.p.meets(t, needs) {
					return true
				}
			}
		}
	}
	return st.goneProviders(func(p *provider) bool {
		return slices.ContainsFunc(targets, func(target string) bool {
			t, ok := p.servedName(target)
			return ok && p.meets(t, needs)
		})
	})
}

// name returns the catalog's name for the requested model: model itself
// when it is an alias or a known served name; else, for an
// Ollama-style name, the same name with or without the ":latest" tag ("x"
// and "x:latest" are one model) if that one is known; else model. Exact
// names win, so an alias "x" and a served "x:latest" stay two models. It
// takes no lock.
func (c *catalog) name(model string) string {
	aliases := *c.aliases.Load()
	if _, ok := aliases[model]; ok {
		return model
	}
	alt := modelname.Alternative(model)
	st := c.reg.load()
	if st.known(model) || alt == "" {
		return model
	}
	if _, ok := aliases[alt]; ok || st.known(alt) {
		return alt
	}
	return model
}

// known reports whether model is an alias or a served name ever
// advertised: a name Dispatch resolves rather than refuses as unknown.
func (c *catalog) known(model string) bool {
	if _, ok := (*c.aliases.Load())[model]; ok {
		return true
	}
	return c.reg.load().known(model)
}

// aliasNames returns the configured aliases, unsorted.
func (c *catalog) aliasNames() []string {
	aliases := *c.aliases.Load()
	names := make([]string, 0, len(aliases))
	for a := range aliases {
		names = append(names, a)
	}
	return names
}

// models returns every alias and every model name served by a current
// node connection, sorted, without repeats.
func (c *catalog) models() []string {
	aliases := *c.aliases.Load()
	st := c.reg.load()
	names := make([]string, 0, len(aliases)+st.served.len())
	for m := range st.served.all() {
		names = append(names, m)
	}
	for a := range aliases {
		names = append(names, a)
	}
	sort.Strings(names)
	return slices.Compact(names)
}

// aliasCheckDelay is how long after it starts serving the edge gives its
// nodes to connect before it checks the aliases' targets against what they
// serve (checkAliasesAtStart).
const aliasCheckDelay = 10 * time.Second

// checkAliasesAtStart logs, aliasCheckDelay after the edge starts serving,
// the aliases with targets no node serves (warnUnmatched); while no node
// has connected yet, it looks again every aliasCheckDelay. The timer runs
// on the edge's clock; stop cancels it.
func (s *Service) checkAliasesAtStart() (stop func()) {
	var mu sync.Mutex // guards the fields below; a leaf lock
	var timer clock.Timer
	stopped := false
	var arm func()
	arm = func() {
		mu.Lock()
		defer mu.Unlock()
		if stopped {
			return
		}
		timer = s.clock.AfterFunc(aliasCheckDelay, func() {
			if st := s.reg.load(); st.nodes.len() == 0 && st.gone.len() == 0 {
				arm()
				return
			}
			s.warnUnmatched()
		})
	}
	arm()
	return func() {
		mu.Lock()
		defer mu.Unlock()
		stopped = true
		if timer != nil {
			timer.Stop()
		}
	}
}

// warnUnmatched logs one warning per configured alias that has targets no
// node serves or served lately (catalog.unmatchedAliases), naming them;
// nothing while no node has connected. Called at a reload and once the
// nodes had time to connect after the start.
func (s *Service) warnUnmatched() {
	un := s.cat.unmatchedAliases()
	aliases := make([]string, 0, len(un))
	for a := range un {
		aliases = append(aliases, a)
	}
	sort.Strings(aliases)
	all := *s.cat.aliases.Load()
	for _, a := range aliases {
		msg := "alias targets match no model any node serves; check their spelling"
		if len(un[a]) == len(all[a]) {
			msg = "alias matches no model any node serves: its requests get 404; check its targets' spelling"
		}
		s.log.Warn(msg, "alias", a, "unmatched", un[a], "targets", all[a])
	}
}
