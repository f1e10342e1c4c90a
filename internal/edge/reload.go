package edge

import (
	"fmt"
	"maps"
	"reflect"
	"slices"
	"sort"
	"sync"
)

// reloadState is the configuration the last Reload applied.
type reloadState struct {
	mu      sync.Mutex // guards the fields below; held for a whole Reload
	applied *Config    // nil until the first Reload: Service.cfg
}

// ReloadResult says what a Reload changed.
type ReloadResult struct {
	// Added, Removed and Changed name the aliases (sorted) that are new,
	// gone, or have other targets or queue overrides.
	Added, Removed, Changed []string
	// QueueChanged is set when the default queue policy (or fairness.mode) changed.
	QueueChanged bool
	// TokensAdded and TokensRemoved count the node join tokens (by hash)
	// the reload added and removed.
	TokensAdded, TokensRemoved int
	// Restart names the settings (YAML keys, sorted) that differ from the
	// running ones but apply only at the next start; they keep their
	// running values.
	Restart []string
}

// Reload applies a new configuration to the running edge (DESIGN.md
// "Policy refresh"): the model aliases (added, removed, new targets) take
// effect for the next resolution, the routing (routing, each alias's
// routing, prefix_load_slack) for the next admission, and the queue policies of every model
// group (the default and each alias's override) for the next admission;
// runs in flight and requests already queued are untouched (a queued
// request keeps its deadline and its candidates). The node join tokens
// apply to the next Hello (nodes already connected stay; an id bound to a
// removed token is freed). The core's other settings (heartbeat_interval,
// dispatch_timeout, long_context_tokens, max_retries, circuit_breaker,
// cluster, ...) need a restart; Reload reports those that differ, by YAML
// key (restartOnly), and keeps their running values. The process's parts
// of the file (listeners, keys, stores) are its caller's.
//
// cfg's zero fields take their defaults. An invalid cfg changes nothing and
// returns an error wrapping ErrInvalidConfig that names every problem.
// Reloads are serialized.
func (s *Service) Reload(cfg Config) (ReloadResult, error) {
	cfg.SetDefaults()
	if err := cfg.Validate(); err != nil {
		return ReloadResult{}, err
	}
	s.reload.mu.Lock()
	defer s.reload.mu.Unlock()
	old := s.cfg
	if s.reload.applied != nil {
		old = *s.reload.applied
	}
	sc := cfg.schedulerConfig(s.clock)
	if err := s.sched.SetPolicies(sc.Default, sc.Groups); err != nil {
		return ReloadResult{}, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	if err := s.sched.SetBatchPolicy(sc.Batch); err != nil {
		return ReloadResult{}, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	if err := s.sched.SetResidencyPolicy(sc.Residency); err != nil {
		return ReloadResult{}, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	s.cat.setAliases(cfg.Models)
	s.setKept(cfg.Models)
	s.warnUnmatched()
	s.cat.awayFor.Store(int64(cfg.maxReconnectGrace()))
	s.routing.Store(newRoutingPolicy(cfg))
	tokensAdded, tokensRemoved := s.trust.setTokens(cfg.Tokens)
	applied := old
	applied.Models, applied.Queue = maps.Clone(cfg.Models), cfg.Queue
	applied.Tokens = slices.Clone(cfg.Tokens)
	applied.Fairness.Mode = cfg.Fairness.Mode
	applied.Routing, applied.PrefixLoadSlack = cfg.Routing, cfg.PrefixLoadSlack
	applied.Residency = cfg.Residency
	s.reload.applied = &applied
	s.reg.notify()

	res := ReloadResult{QueueChanged: old.Queue != cfg.Queue || old.Fairness.Mode != cfg.Fairness.Mode, Restart: restartOnly(old, cfg),
		TokensAdded: tokensAdded, TokensRemoved: tokensRemoved}
	for alias, m := range cfg.Models {
		was, ok := old.Models[alias]
		switch {
		case !ok:
			res.Added = append(res.Added, alias)
		case !slices.Equal(was.Targets, m.Targets) || was.MaxQueue != m.MaxQueue || was.QueueTimeout != m.QueueTimeout || was.ReconnectGrace != m.ReconnectGrace || was.Fairness != m.Fairness || was.Routing != m.Routing || was.KeepLoaded != m.KeepLoaded:
			res.Changed = append(res.Changed, alias)
		}
	}
	for alias := range old.Models {
		if _, ok := cfg.Models[alias]; !ok {
			res.Removed = append(res.Removed, alias)
		}
	}
	sort.Strings(res.Added)
	sort.Strings(res.Removed)
	sort.Strings(res.Changed)
	return res, nil
}

// restartOnly names the settings that differ between running and next but
// are read only at start.
func restartOnly(running, next Config) []string {
	var out []string
	for _, f := range []struct {
		key     string
		differs bool
	}{
		{"dispatch_timeout", running.DispatchTimeout != next.DispatchTimeout},
		{"heartbeat_interval", running.HeartbeatInterval != next.HeartbeatInterval},
		{"long_context_tokens", running.LongContextTokens != next.LongContextTokens},
		{"prefix_index_blocks", running.PrefixIndexBlocks != next.PrefixIndexBlocks},
		{"tls", running.TLSCert != next.TLSCert || running.TLSKey != next.TLSKey || running.ClientCA != next.ClientCA},
		{"fairness.flow", running.Fairness.Flow != next.Fairness.Flow},
		{"cluster", !reflect.DeepEqual(running.Cluster, next.Cluster)},
		{"max_retries", running.Retries() != next.Retries()},
		{"circuit_breaker", running.CircuitBreaker != next.CircuitBreaker},
	} {
		if f.differs {
			out = append(out, f.key)
		}
	}
	sort.Strings(out)
	return out
}
