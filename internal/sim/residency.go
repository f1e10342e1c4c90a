package sim

import (
	"cmp"
	"context"
	"math"
	"slices"
	"time"
)

// keepAlive is how long a loaded model stays loaded after its last use,
// as /api/ps's expires_at says (Ollama's default keep_alive) unless a
// request set its own; the simulator never unloads a model on it.
const keepAlive = 5 * time.Minute

// forever is the keep-alive of a model a request kept loaded for ever
// (keep_alive negative): Ollama's /api/ps shows it expiring that far
// ahead.
const forever = time.Duration(math.MaxInt64)

// simulatesResidency reports whether the server loads models on demand
// (Config.MaxLoadedModels or a load time set); otherwise every served
// model is always loaded.
func (c Config) simulatesResidency() bool {
	return c.MaxLoadedModels > 0 || c.LoadTime > 0 || len(c.LoadTimes) > 0
}

// loadTimeOf is how long loading model takes.
func (c Config) loadTimeOf(model string) time.Duration {
	if d, ok := c.LoadTimes[model]; ok {
		return d
	}
	return c.LoadTime
}

// resident is one model the server has loaded or is loading.
type resident struct {
	name     string
	ready    chan struct{} // closed when its load is done
	loading  bool
	inUse    int // requests running on it
	lastUsed time.Time
	// keepAlive is the model's keep-alive: the last request's that set
	// one (forever for a negative one), else keepAlive.
	keepAlive time.Duration
}

// setKeepAlive takes a request's keep_alive (nil: none) as the model's.
func (m *resident) setKeepAlive(d *time.Duration) {
	switch {
	case d == nil:
	case *d < 0:
		m.keepAlive = forever
	default:
		m.keepAlive = *d
	}
}

// evictsBefore reports whether a is evicted before b: the shorter
// keep-alive first (a model kept for ever last), as Ollama's scheduler
// picks the runner to unload, then the least recently used.
func (a *resident) evictsBefore(b *resident) bool {
	if a.keepAlive != b.keepAlive {
		return a.keepAlive < b.keepAlive
	}
	return a.lastUsed.Before(b.lastUsed)
}

// load makes model loaded for one request, as Ollama's scheduler does with
// OLLAMA_MAX_LOADED_MODELS: a loaded model is used at once; one being
// loaded is waited for; else, at the limit, a model no request runs on is
// evicted, the shortest keep-alive first, then the least recently used
// (keepAliveAsked, the request's keep_alive, becomes the model's; nil
// leaves it) (or, with every model busy, the request
// waits for one to finish), and the model is loaded, which takes its load
// time (on the server's clock, whatever the request does meanwhile). It
// returns how long the request waited (Ollama's load_duration) and a
// done function to call when the request ends; or ctx's error, holding
// nothing. Without residency it returns at once.
func (s *Server) load(ctx context.Context, model string, keepAliveAsked *time.Duration) (waited time.Duration, done func(), err error) {
	if !s.cfg.simulatesResidency() {
		return 0, func() {}, nil
	}
	start := s.clock.Now()
	var own *resident // the load this request started: its use is taken
	s.mu.Lock()
	for {
		if own != nil {
			own.lastUsed = s.clock.Now()
			own.setKeepAlive(keepAliveAsked)
			s.mu.Unlock()
			return s.clock.Now().Sub(start), func() { s.unuse(own) }, nil
		}
		i := slices.IndexFunc(s.resident, func(m *resident) bool { return m.name == model })
		if i >= 0 && !s.resident[i].loading {
			m := s.resident[i]
			m.inUse++
			m.lastUsed = s.clock.Now()
			m.setKeepAlive(keepAliveAsked)
			s.mu.Unlock()
			return s.clock.Now().Sub(start), func() { s.unuse(m) }, nil
		}
		var wait <-chan struct{}
		switch {
		case i >= 0:
			wait = s.resident[i].ready
		case s.cfg.MaxLoadedModels > 0 && len(s.resident) >= s.cfg.MaxLoadedModels:
			victim := -1
			for j, m := range s.resident {
				if m.inUse == 0 && !m.loading && (victim < 0 || m.evictsBefore(s.resident[victim])) {
					victim = j
				}
			}
			if victim < 0 {
				wait = s.residentChanged
				break
			}
			s.logger.Debug("evicting model", "model", s.resident[victim].name, "for", model)
			s.resident = slices.Delete(s.resident, victim, victim+1)
			s.stats.Evictions++
			s.notifyResidentLocked()
			continue
		default:
			// The use is taken now: the model cannot be evicted between
			// its load's end and this request's first step.
			m := &resident{name: model, ready: make(chan struct{}), loading: true, inUse: 1, keepAlive: keepAlive}
			own = m
			s.resident = append(s.resident, m)
			s.stats.Loads++
			d := s.cfg.loadTimeOf(model)
			s.logger.Debug("loading model", "model", model, "load_time", d)
			wait = m.ready
			s.mu.Unlock()
			// Outside the lock: a test clock may run f at once.
			s.clock.AfterFunc(d, func() {
				s.mu.Lock()
				m.loading = false
				m.lastUsed = s.clock.Now()
				close(m.ready)
				s.notifyResidentLocked()
				s.mu.Unlock()
			})
			s.mu.Lock()
		}
		s.mu.Unlock()
		select {
		case <-wait:
		case <-ctx.Done():
			if own != nil {
				<-own.ready // give the use back once the load is done
				s.unuse(own)
			}
			return 0, nil, ctx.Err()
		}
		s.mu.Lock()
	}
}

// unload unloads model, as Ollama does for a request with no prompt and
// keep_alive 0: once no request runs on it (or its load is done) it is
// dropped, counted in Stats.Unloads. A model not loaded is no error. It
// returns as load does, holding nothing; or ctx's error.
func (s *Server) unload(ctx context.Context, model string) (waited time.Duration, done func(), err error) {
	if !s.cfg.simulatesResidency() {
		return 0, func() {}, nil
	}
	s.mu.Lock()
	for {
		i := slices.IndexFunc(s.resident, func(m *resident) bool { return m.name == model })
		if i < 0 {
			s.mu.Unlock()
			return 0, func() {}, nil
		}
		if m := s.resident[i]; m.inUse == 0 && !m.loading {
			s.logger.Debug("unloading model", "model", model)
			s.resident = slices.Delete(s.resident, i, i+1)
			s.stats.Unloads++
			s.notifyResidentLocked()
			s.mu.Unlock()
			return 0, func() {}, nil
		}
		wait := s.residentChanged
		if m := s.resident[i]; m.loading {
			wait = m.ready
		}
		s.mu.Unlock()
		select {
		case <-wait:
		case <-ctx.Done():
			return 0, nil, ctx.Err()
		}
		s.mu.Lock()
	}
}

// unuse ends one request's use of m.
func (s *Server) unuse(m *resident) {
	s.mu.Lock()
	m.inUse--
	m.lastUsed = s.clock.Now()
	s.notifyResidentLocked()
	s.mu.Unlock()
}

// notifyResidentLocked wakes the requests waiting for a model to become
// evictable.
func (s *Server) notifyResidentLocked() {
	close(s.residentChanged)
	s.residentChanged = make(chan struct{})
}

// loadedModels returns the served models loaded now (not those loading),
// each with when it expires (last use + keep-alive), the latest expiry
// first, as Ollama's /api/ps sorts them; without residency every served
// model, expiring keep-alive from now.
func (s *Server) loadedModels() []loadedModel {
	now := s.clock.Now()
	served := s.servedModels()
	var out []loadedModel
	if !s.cfg.simulatesResidency() {
		for _, m := range served {
			out = append(out, loadedModel{m, now.Add(keepAlive)})
		}
		return out
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range s.resident {
		if r.loading {
			continue
		}
		if i := slices.IndexFunc(served, func(m model) bool { return m.name == r.name }); i >= 0 {
			out = append(out, loadedModel{served[i], r.lastUsed.Add(r.keepAlive)})
		}
	}
	slices.SortStableFunc(out, func(a, b loadedModel) int { return cmp.Compare(b.expires.UnixNano(), a.expires.UnixNano()) })
	return out
}

type loadedModel struct {
	model
	expires time.Time
}
