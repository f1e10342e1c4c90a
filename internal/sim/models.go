package sim

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strconv"
	"time"
)

// DefaultCapabilities are the Ollama capabilities (/api/show
// "capabilities") of a model whose Config.Capabilities entry is missing:
// what the simulator does with every model (it answers chat and generate,
// calls tools, takes images and embeds text).
var DefaultCapabilities = []string{"completion", "tools", "vision", "embedding"}

// model is one model the server serves. Its fields are never written once
// it is in Server.models; a re-created model is a new value.
type model struct {
	name         string
	capabilities []string // Ollama capability words, for /api/show
	modifiedAt   time.Time
	digest       string // sha256 hex, new for every (re)creation
}

// newModel returns the model name created at t, the created-th model of
// its server (0 for the configured ones, whose digest depends on the name
// alone).
func newModel(name string, caps []string, t time.Time, created int) model {
	seed := name
	if created > 0 {
		seed += "\x00" + strconv.Itoa(created)
	}
	sum := sha256.Sum256([]byte(seed))
	return model{name: name, capabilities: slices.Clone(caps), modifiedAt: t, digest: hex.EncodeToString(sum[:])}
}

// AddModel makes the server serve name from now on, as if it had just been
// pulled or created: /api/tags and /v1/models list it (Ollama's /api/tags
// lists the most recently modified first), its modified_at is the clock's
// now and its digest is new, and requests naming it are answered. caps are
// the Ollama capabilities its /api/show reports (none given:
// DefaultCapabilities). Adding a model the server already serves replaces
// it, like a pull of a newer version. An empty name is an error.
func (s *Server) AddModel(name string, caps ...string) error {
	if name == "" {
		return fmt.Errorf("%w: empty model name", ErrInvalidConfig)
	}
	if len(caps) == 0 {
		caps = DefaultCapabilities
	}
	now := s.clock.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.created++
	m := newModel(name, caps, now, s.created)
	s.models = slices.DeleteFunc(s.models, func(o model) bool { return o.name == name })
	// Newest first, as Ollama lists them; the latest added first among
	// equal times.
	i := slices.IndexFunc(s.models, func(o model) bool { return !o.modifiedAt.After(now) })
	if i < 0 {
		i = len(s.models)
	}
	s.models = slices.Insert(s.models, i, m)
	return nil
}

// RemoveModel stops serving name, as if it had been deleted: listings no
// longer show it and requests naming it are answered 404. It reports
// whether the server served it.
func (s *Server) RemoveModel(name string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := len(s.models)
	s.models = slices.DeleteFunc(s.models, func(o model) bool { return o.name == name })
	return len(s.models) != n
}

// Models returns the names of the models served now, in listing order.
func (s *Server) Models() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	names := make([]string, len(s.models))
	for i, m := range s.models {
		names[i] = m.name
	}
	return names
}

// servedModels returns the models served now; the slice is the caller's.
func (s *Server) servedModels() []model {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.models)
}

// lookup returns the served model called name.
func (s *Server) lookup(name string) (model, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, m := range s.models {
		if m.name == name {
			return m, true
		}
	}
	return model{}, false
}

// serves reports whether model is served now.
func (s *Server) serves(name string) bool {
	_, ok := s.lookup(name)
	return ok
}
