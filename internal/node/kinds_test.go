package node

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"iop/internal/clock"
	"iop/internal/node/adapter"
	"iop/internal/node/managed"
	nodev1 "iop/internal/wire/nodev1"
)

// pathOnly is an adapter that is neither a Normalizer nor a Tunneler: what
// a provider kind whose adapter constructor is missing or wrong would give.
type pathOnly struct{ path nodev1.ExecutionPath }

func (p pathOnly) Path() nodev1.ExecutionPath { return p.path }
func (pathOnly) Close()                       {}

var _ adapter.Adapter = pathOnly{}

// TestRegression_UnknownProviderKindAtDispatch: a run on a provider whose
// adapter answers on neither execution path ended with no output and no
// error on the normalized path (the adapter switch had no default), and
// with a clean-looking TunnelEnd on the tunnel path. It now ends with an
// error that names the provider and its type, on both paths.
func TestRegression_UnknownProviderKindAtDispatch(t *testing.T) {
	for _, tc := range []struct {
		path nodev1.ExecutionPath
		pc   ProviderConfig
	}{
		{normalized, ProviderConfig{ID: "p", Type: TypeOllama, BaseURL: "http://127.0.0.1:1", Models: []string{"m"}}},
		{tunnel, ProviderConfig{ID: "p", Type: TypeOpenAI, BaseURL: "http://127.0.0.1:1/v1", Models: []string{"m"}}},
	} {
		t.Run(tc.path.String(), func(t *testing.T) {
			e, addr := startEdge(t)
			startAgentWith(t, testConfig(addr, tc.pc), newTestClock(), nil, func(a *Agent) {
				a.providers["p"].adapter = pathOnly{tc.path}
			})
			c := connect(t, e, 1, hour)
			c.send(t, inlineDispatchMsg("r1", "p", tc.path, `{"model":"m","messages":[{"role":"user","content":"x"}],"stream":true}`))
			r := recv(t, e.runs, "run stream")
			rest := r.rest(t)
			var msg string
			var status int32
			if tc.path == normalized {
				evs := eventsOf(rest)
				if len(evs) != 1 || evs[0].Type != nodev1.RunEvent_TYPE_ERROR {
					t.Fatalf("events %v, want one ERROR", evs)
				}
				msg, status = evs[0].Error, evs[0].Status
			} else {
				if len(rest) != 1 || rest[0].GetTunnelError() == nil {
					t.Fatalf("frames %v, want one TunnelError", rest)
				}
				msg, status = rest[0].GetTunnelError().Message, rest[0].GetTunnelError().Status
			}
			if !strings.Contains(msg, ErrNoAdapter.Error()) || !strings.Contains(msg, `provider "p"`) || status != 502 {
				t.Errorf("error %q status %d, want %q naming provider p, 502", msg, status, ErrNoAdapter)
			}
		})
	}
}

// TestUnknownProviderKindAtConfigLoad: a provider type that is not in the
// kind table is refused where the config is read (LoadConfig, Validate),
// where the agent is made (New) and by Discover, naming the type and the
// known ones.
func TestUnknownProviderKindAtConfigLoad(t *testing.T) {
	const want = `type "tgi": want ollama, openai, vllm, sim, cli or managed`
	path := filepath.Join(t.TempDir(), "node.yaml")
	if err := os.WriteFile(path, []byte("node_id: n\nedge: 127.0.0.1:7000\nproviders:\n  - type: tgi\n    base_url: http://127.0.0.1:1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := LoadConfig(path)
	if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), `provider "tgi": `+want) {
		t.Errorf("LoadConfig: %v, want %q", err, want)
	}
	pc := ProviderConfig{ID: "x", Type: "tgi", BaseURL: "http://127.0.0.1:1", Models: []string{"m"}}
	cfg := Config{NodeID: "n", Edge: "127.0.0.1:7000", Providers: []ProviderConfig{pc}}
	if _, err := New(cfg, nil); !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), want) {
		t.Errorf("New: %v, want %q", err, want)
	}
	if _, err := Discover(context.Background(), pc); !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), want) {
		t.Errorf("Discover: %v, want %q", err, want)
	}
}

// TestProviderKinds: every kind of the table fills its defaults, gives
// the execution path and discovery its protocol says, and builds an
// adapter answering on that path.
func TestProviderKinds(t *testing.T) {
	for _, tc := range []struct {
		pc        ProviderConfig
		path      nodev1.ExecutionPath
		discovers bool
	}{
		{ProviderConfig{Type: TypeOllama}, normalized, true},
		{ProviderConfig{Type: TypeOpenAI, BaseURL: "http://h/v1"}, tunnel, true},
		{ProviderConfig{Type: TypeVLLM, BaseURL: "http://h/v1", Models: []string{"m"}}, tunnel, false},
		{ProviderConfig{Type: TypeSim, BaseURL: "http://h"}, normalized, true},
		{ProviderConfig{Type: TypeSim, Protocol: "openai", BaseURL: "http://h/v1"}, tunnel, true},
		{ProviderConfig{Type: TypeCLI, Command: []string{"cat"}, Models: []string{"m"}}, normalized, false},
		{ProviderConfig{Type: TypeManaged, Servers: map[string]managed.Server{"m": {Cmd: []string{"llama-server", "--port", "${PORT}"}}}}, tunnel, false},
	} {
		name := tc.pc.Type + "/" + tc.pc.Protocol
		cfg := Config{NodeID: "n", Edge: "127.0.0.1:7000", Providers: []ProviderConfig{tc.pc}}.withDefaults()
		if err := cfg.Validate(); err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		pc := cfg.Providers[0]
		if pc.path() != tc.path || pc.discovers() != tc.discovers {
			t.Errorf("%s: path %v discovers %v, want %v %v", name, pc.path(), pc.discovers(), tc.path, tc.discovers)
		}
		p, err := newProvider(pc, adapterDeps{logger: slog.New(slog.DiscardHandler), clock: clock.Real()})
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		_, norm := p.adapter.(adapter.Normalizer)
		_, tun := p.adapter.(adapter.Tunneler)
		if p.adapter.Path() != tc.path || norm != (tc.path == normalized) || tun != (tc.path == tunnel) {
			t.Errorf("%s: adapter %T on %v, want %v", name, p.adapter, p.adapter.Path(), tc.path)
		}
		p.adapter.Close()
	}
}
