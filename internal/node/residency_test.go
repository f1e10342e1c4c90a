package node

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"iop/internal/testenv"
	"iop/internal/wire/nodev1"
)

// psServer is an Ollama stand-in answering GET /api/ps with its models
// (set by the test) and counting the readings, and POST /api/show with
// show.
type psServer struct {
	url   string
	reads atomic.Int32
	mu    sync.Mutex
	ps    string // the /api/ps answer
	show  string // the /api/show answer
	asked []string
}

func startPSServer(t *testing.T, ps string) *psServer {
	t.Helper()
	s := &psServer{ps: ps}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		s.mu.Lock()
		defer s.mu.Unlock()
		switch r.URL.Path {
		case "/api/ps":
			s.reads.Add(1)
			io.WriteString(w, s.ps)
		case "/api/show":
			s.asked = append(s.asked, string(body))
			io.WriteString(w, s.show)
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	s.url = srv.URL
	return s
}

func (s *psServer) set(ps string) {
	s.mu.Lock()
	s.ps = ps
	s.mu.Unlock()
}

func psOf(names ...string) string {
	var models []map[string]any
	for _, n := range names {
		models = append(models, map[string]any{"name": n, "model": n, "size": 100, "size_vram": 60, "digest": "d-" + n,
			"details":    map[string]any{"parent_model": "/root/.ollama/models/blobs/sha256-1", "format": "gguf", "family": "llama"},
			"expires_at": "2026-01-01T00:05:00Z", "context_length": 4096})
	}
	b, _ := json.Marshal(map[string]any{"models": models})
	return string(b)
}

func loadedNames(u []*nodev1.LoadedModel) string {
	var names []string
	for _, m := range u {
		names = append(names, m.GetName())
	}
	return strings.Join(names, ",")
}

// TestResidencyIsReportedWhenItChanges: a node reads its Ollama
// provider's /api/ps at once, on every interval and after a run ends, and
// tells the edge (ProviderUpdate.loaded, alone) only when what is loaded
// changed; a model keeps the time it was first seen loaded, and a
// parent_model path is not passed on.
func TestResidencyIsReportedWhenItChanges(t *testing.T) {
	const interval = 7 * time.Second
	s := startPSServer(t, psOf("a:latest"))
	e, addr := startEdge(t)
	clk := newTestClock()
	cfg := testConfig(addr, ProviderConfig{ID: "ol", Type: TypeOllama, BaseURL: s.url, Models: []string{"a", "b"}})
	cfg.DiscoveryInterval = interval
	a := startAgentWith(t, cfg, clk, nil, func(a *Agent) { a.noResidency = false })
	c := connect(t, e, 1, hour)
	waitGeneration(t, a, 1) // the Welcome is taken before the clock moves
	first := c.rawHello.GetProviders()[0].GetLoaded()
	if !c.rawHello.GetProviders()[0].GetLoadedSet() {
		u := recv(t, c.loaded, "first residency update")
		first = u.GetLoaded()
	}
	if loadedNames(first) != "a:latest" || first[0].GetSizeVram() != 60 || first[0].GetDetails().GetParentModel() != "" ||
		first[0].GetExpiresAt() != "2026-01-01T00:05:00Z" || first[0].GetLoadedSince() == "" {
		t.Fatalf("first reading %v", first)
	}
	since := first[0].GetLoadedSince()

	// Nothing changed: a reading on the interval sends nothing.
	clk.waitArmed(t, interval)
	n := s.reads.Load()
	clk.Advance(interval)
	waitUntil(t, "a reading on the interval", func() bool { return s.reads.Load() > n })
	// A change: the next reading sends it.
	s.set(psOf("a:latest", "b:latest"))
	clk.waitArmed(t, interval)
	clk.Advance(interval)
	u := recvOr(t, c.loaded, func() string { return fmt.Sprintf("residency update (%d readings)", s.reads.Load()) })
	if loadedNames(u.GetLoaded()) != "a:latest,b:latest" || u.GetModelsSet() || !u.GetHealthy() || u.GetLoaded()[0].GetLoadedSince() != since {
		t.Fatalf("update %v", u)
	}
	select {
	case u := <-c.loaded:
		t.Fatalf("an update no reading changed: %v", u)
	default:
	}
}

// TestResidencyAfterRunsAtMostOncePerGap: the end of a run asks for a
// reading at once; ends that come during the residencyGap after a
// reading wait for it to pass, and many of them make one reading.
func TestResidencyAfterRunsAtMostOncePerGap(t *testing.T) {
	s := startPSServer(t, psOf())
	e, addr := startEdge(t)
	clk := newTestClock()
	cfg := testConfig(addr, ProviderConfig{ID: "ol", Type: TypeOllama, BaseURL: s.url, Models: []string{"a"}})
	cfg.DiscoveryInterval = time.Hour
	a := startAgentWith(t, cfg, clk, nil, func(a *Agent) { a.noResidency = false })
	connect(t, e, 1, hour)
	waitGeneration(t, a, 1) // the Welcome is taken before the clock moves
	waitUntil(t, "the first reading", func() bool { return s.reads.Load() == 1 })
	clk.waitArmed(t, time.Hour) // the loop waits for the interval or a kick
	a.kickResidency("ol")
	clk.waitArmed(t, residencyGap) // woken at once: it waits out the gap from the last reading
	for range 5 {
		a.kickResidency("ol")
	}
	if got := s.reads.Load(); got != 1 {
		t.Fatalf("%d readings before the gap passed, want 1", got)
	}
	clk.Advance(residencyGap)
	waitUntil(t, "the kicked reading", func() bool { return s.reads.Load() == 2 })
	// The kicks that came meanwhile make one more reading, a gap later.
	clk.waitArmed(t, time.Hour)
	clk.waitArmed(t, residencyGap)
	if got := s.reads.Load(); got != 2 {
		t.Fatalf("%d readings, want 2", got)
	}
	clk.Advance(residencyGap)
	waitUntil(t, "one reading for the kicks", func() bool { return s.reads.Load() == 3 })
	clk.waitArmed(t, time.Hour)
	if got := s.reads.Load(); got != 3 {
		t.Fatalf("%d readings, want 3", got)
	}
}

// waitUntil polls cond until it holds, failing after failsafe.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testenv.Eventually(t, what, cond)
}

// recvOr is recv with a description made when it fails.
func recvOr[T any](t *testing.T, ch <-chan T, what func() string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(failsafe):
		t.Fatalf("timed out waiting for %s", what())
		panic("unreachable")
	}
}

// TestResidencyKickOnlyAfterAColdRun: the end of a run asks for a reading
// only when the last reading did not show its model loaded (under either
// spelling of its name), or there was none.
func TestResidencyKickOnlyAfterAColdRun(t *testing.T) {
	p := &provider{kick: make(chan struct{}, 1)}
	a := &Agent{providers: map[string]*provider{"ol": p}, residency: map[string]*resident{}}
	kicked := func() bool {
		select {
		case <-p.kick:
			return true
		default:
			return false
		}
	}
	a.kickResidencyAfter("ol", "a")
	if !kicked() {
		t.Fatal("no reading yet: the end of a run did not ask for one")
	}
	a.residency["ol"] = &resident{loaded: []*nodev1.LoadedModel{{Name: "a:latest"}}, version: 1}
	a.kickResidencyAfter("ol", "a")
	if kicked() {
		t.Fatal("a run of a loaded model asked for a reading")
	}
	a.kickResidencyAfter("ol", "b")
	if !kicked() {
		t.Fatal("a run of a model not loaded did not ask for a reading")
	}
}
