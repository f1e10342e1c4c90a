package node

import (
	"fmt"
	"reflect"
	"slices"
	"time"
)

// ReloadResult says what Agent.Reload changed.
type ReloadResult struct {
	// Applied describes each change applied now, one phrase each (for
	// example `provider "p1" capacity 2 → 4`).
	Applied []string
	// Restart names the settings (YAML keys, sorted; a provider's as
	// providers.ID) that differ but apply only at the next start; they keep
	// their running values.
	Restart []string
}

// Reload applies a new configuration to the running agent: the capacity
// and long_capacity of each provider (its node-wide slots at once, the
// edges through a ProviderUpdate; a provider over a lowered capacity
// starts nothing new until it is under it), the discovery interval of
// each discovering provider (from its next wait), and the TLS files and
// settings (read again now, used from the next connection on; the
// connections up stay). Runs in flight are untouched. Every other
// difference (node id, edges, token, providers added, removed or with other
// fields, ...) is named in Restart and keeps its running value.
//
// cfg's zero fields take their defaults; a cfg that does not validate, or
// whose TLS files cannot be read, changes nothing and returns an error
// wrapping ErrInvalidConfig. Reloads are serialized.
func (a *Agent) Reload(cfg Config) (ReloadResult, error) {
	cfg = cfg.withDefaults()
	if cfg.Version == "" {
		cfg.Version = a.cfg.Version
	}
	if err := cfg.validate(a.gateway != nil); err != nil {
		return ReloadResult{}, err
	}
	creds, err := transportCredentials(cfg)
	if err != nil {
		return ReloadResult{}, err
	}
	a.reloadMu.Lock()
	defer a.reloadMu.Unlock()
	var res ReloadResult
	restart := func(key string, differs bool) {
		if differs {
			res.Restart = append(res.Restart, key)
		}
	}
	old := a.cfg
	restart("node_id", old.NodeID != cfg.NodeID)
	restart("label", old.Label != cfg.Label)
	restart("edge", old.Edge != cfg.Edge)
	restart("edges", !slices.Equal(old.Edges, cfg.Edges))
	restart("resolve_interval", old.ResolveInterval != cfg.ResolveInterval)
	restart("token", old.Token != cfg.Token)
	restart("reconnect_min", old.ReconnectMin != cfg.ReconnectMin)
	restart("reconnect_max", old.ReconnectMax != cfg.ReconnectMax)
	restart("drain_timeout", old.DrainTimeout != cfg.DrainTimeout)
	restart("tracing", !reflect.DeepEqual(old.Tracing, cfg.Tracing))

	next := make(map[string]ProviderConfig, len(cfg.Providers))
	for _, pc := range cfg.Providers {
		next[pc.ID] = pc
	}
	for _, p := range a.order {
		pc, ok := next[p.cfg.ID]
		if !ok {
			restart("providers."+p.cfg.ID, true) // removed
			continue
		}
		delete(next, pc.ID)
		// Only the capacities and the discovery interval apply now.
		was, is := p.cfg, pc
		was.Capacity, was.LongCapacity, was.DiscoveryInterval = 0, 0, 0
		is.Capacity, is.LongCapacity, is.DiscoveryInterval = 0, 0, 0
		if !reflect.DeepEqual(was, is) {
			restart("providers."+pc.ID, true)
			continue
		}
		a.slots[pc.ID].setLimit(max(pc.Capacity, pc.LongCapacity))
		if a.setCapacity(pc.ID, pc.Capacity, pc.LongCapacity) {
			res.Applied = append(res.Applied, fmt.Sprintf("provider %q capacity %d, long_capacity %d", pc.ID, pc.Capacity, pc.LongCapacity))
		}
		if p.lister != nil && time.Duration(p.interval.Load()) != pc.DiscoveryInterval {
			p.interval.Store(int64(pc.DiscoveryInterval))
			res.Applied = append(res.Applied, fmt.Sprintf("provider %q discovery_interval %s", pc.ID, pc.DiscoveryInterval))
		}
	}
	for id := range next {
		restart("providers."+id, true) // added
	}
	if cfg.TLS || cfg.TLSCA != "" || cfg.TLSCert != "" || old.TLS || old.TLSCA != "" || old.TLSCert != "" {
		a.creds.Store(&creds)
		res.Applied = append(res.Applied, "tls files read again (used from the next connection)")
	}
	slices.Sort(res.Restart)
	return res, nil
}
