package process

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"iop/internal/edge"
	"iop/internal/node"
)

// stepLog records a process's open and close steps (Deps.Steps) and fails
// the open step named fail.
type stepLog struct {
	fail string

	mu     sync.Mutex
	events []string
}

var errInjected = errors.New("injected step failure")

func (l *stepLog) hook(phase, name string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events = append(l.events, phase+" "+name)
	if phase == "open" && name == l.fail {
		return errInjected
	}
	return nil
}

func (l *stepLog) get() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.events)
}

// The open steps of each process, in order; each shuts down in reverse.
var (
	edgeSteps = []string{"config", "keys", "edge server", "tracing", "history", "node endpoint",
		"ledger", "responses", "runs", "batches", "http listener", "serve", "profiler", "reload watcher"}
	devSteps = []string{"node tracing", "sim sim-ollama", "sim sim-openai",
		"config", "keys", "edge server", "tracing", "history", "node endpoint", "in-process node",
		"ledger", "responses", "runs", "batches", "http listener", "serve", "node ready", "reload watcher"}
	agentSteps = []string{"tracing", "agent", "profiler", "reload watcher", "run"}
	// An edge with providers of its own: their node in its process.
	edgeLocalSteps = []string{"config", "keys", "edge server", "tracing", "history", "node endpoint", "in-process node",
		"ledger", "responses", "runs", "batches", "http listener", "serve", "in-process node ready", "profiler", "reload watcher"}
)

// stepsEdgeLocalConfig is stepsEdgeConfig with a provider the edge serves
// itself (nothing answers at its address: the node connects regardless).
func stepsEdgeLocalConfig(t *testing.T, listen, nodeListen, pprof string) Config {
	cfg := stepsEdgeConfig(t, listen, nodeListen, pprof)
	cfg.Edge.Providers = []node.ProviderConfig{{ID: "p", Type: node.TypeOpenAI, BaseURL: "http://127.0.0.1:1/v1", Models: []string{"m"}}}
	return cfg
}

// wantSteps is the record of opening names[:n] (the last of them failing
// when failed) and closing the opened ones in reverse.
func wantSteps(names []string, n int, failed bool) []string {
	var out []string
	for _, s := range names[:n] {
		out = append(out, "open "+s)
	}
	opened := n
	if failed {
		opened--
	}
	for i := opened - 1; i >= 0; i-- {
		out = append(out, "close "+names[i])
	}
	return out
}

// freeStepAddr is a loopback host:port free at the time of the call.
func freeStepAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// stepsEdgeConfig is an edge on the given addresses with a profiler and
// a watched config file, so every step of edgeSteps holds a resource.
func stepsEdgeConfig(t *testing.T, listen, nodeListen, pprof string) Config {
	cfg := DefaultEdgeFile()
	cfg.Listen, cfg.NodeListen, cfg.Database = listen, nodeListen, ":memory:"
	cfg.Models = map[string]edge.ModelConfig{"m": {Targets: []string{"m"}}}
	file := filepath.Join(t.TempDir(), "edge.yaml")
	if err := os.WriteFile(file, []byte("listen: "+listen+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return Config{Mode: ModeEdge, Edge: cfg, PprofListen: pprof, ConfigFile: file,
		Reload: func() (EdgeFile, error) { return cfg, nil }}
}

func stepsDevConfig(listen, nodeListen string) Config {
	d := DevDefaults()
	d.Listen, d.NodeListen, d.Database = listen, nodeListen, ""
	d.ForceSim, d.OllamaURL = true, ""
	d.DrainTimeout = 5 * time.Second
	return Config{Mode: ModeDev, Dev: d, Version: "test",
		ReloadDev: func() (DevConfig, error) { return d, nil }}
}

func stepsNodeConfig(edgeAddr, pprof string) Config {
	return Config{Mode: ModeNode, Version: "test", PprofListen: pprof, Node: node.Config{
		NodeID: "steps", Edge: edgeAddr, DrainTimeout: 5 * time.Second,
		Providers: []node.ProviderConfig{{ID: "p", Type: node.TypeOpenAI, BaseURL: "http://127.0.0.1:1/v1", Models: []string{"m"}}},
	}, ReloadNode: func() (node.Config, error) { return node.Config{}, errors.New("unused") }}
}

func quietStepsLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

// TestStartShutdownOrder: each process kind closes its steps in the
// reverse of their open order when it drains, exactly once each.
func TestStartShutdownOrder(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	run := func(t *testing.T, cfg Config, names []string, ready func(*Process)) {
		t.Helper()
		var log stepLog
		p, err := Start(context.Background(), cfg, Deps{Logger: quietStepsLogger(), Steps: log.hook})
		if err != nil {
			t.Fatal(err)
		}
		if ready != nil {
			ready(p)
		}
		if got, want := log.get(), wantSteps(names, len(names), false)[:len(names)]; !slices.Equal(got, want) {
			t.Fatalf("after Start: steps\n%q\nwant\n%q", got, want)
		}
		p.Drain("test")
		if err := p.Wait(); err != nil {
			t.Fatalf("Wait: %v", err)
		}
		if got, want := log.get(), wantSteps(names, len(names), false); !slices.Equal(got, want) {
			t.Fatalf("steps\n%q\nwant\n%q", got, want)
		}
	}
	t.Run("edge", func(t *testing.T) {
		run(t, stepsEdgeConfig(t, "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"), edgeSteps, nil)
	})
	t.Run("dev", func(t *testing.T) {
		run(t, stepsDevConfig("127.0.0.1:0", "127.0.0.1:0"), devSteps, nil)
	})
	t.Run("edge with providers", func(t *testing.T) {
		run(t, stepsEdgeLocalConfig(t, "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"), edgeLocalSteps, nil)
	})
	t.Run("node", func(t *testing.T) {
		ecfg := stepsEdgeConfig(t, "127.0.0.1:0", "127.0.0.1:0", "")
		e, err := Start(context.Background(), ecfg, Deps{Logger: quietStepsLogger()})
		if err != nil {
			t.Fatal(err)
		}
		defer func() {
			e.Drain("test")
			if err := e.Wait(); err != nil {
				t.Errorf("edge: %v", err)
			}
		}()
		run(t, stepsNodeConfig(e.NodeAddr, "127.0.0.1:0"), agentSteps, func(p *Process) {
			select {
			case <-p.Agent.Ready():
			case <-time.After(30 * time.Second):
				t.Fatal("node did not connect within 30s")
			}
		})
	})
}

// TestStartFailedStepUndoesOpened: a step that fails at any position of
// any process kind makes Start return its error after closing exactly the
// steps opened before it, in reverse: every listener is free again and no
// goroutine is left.
func TestStartFailedStepUndoesOpened(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	type kind struct {
		name  string
		steps []string
		// config returns the config and the addresses its listeners use.
		config func(t *testing.T) (Config, []string)
	}
	kinds := []kind{
		{"edge", edgeSteps, func(t *testing.T) (Config, []string) {
			addrs := []string{freeStepAddr(t), freeStepAddr(t), freeStepAddr(t)}
			return stepsEdgeConfig(t, addrs[0], addrs[1], addrs[2]), addrs
		}},
		{"dev", devSteps, func(t *testing.T) (Config, []string) {
			addrs := []string{freeStepAddr(t), freeStepAddr(t)}
			return stepsDevConfig(addrs[0], addrs[1]), addrs
		}},
		{"edge with providers", edgeLocalSteps, func(t *testing.T) (Config, []string) {
			addrs := []string{freeStepAddr(t), freeStepAddr(t), freeStepAddr(t)}
			return stepsEdgeLocalConfig(t, addrs[0], addrs[1], addrs[2]), addrs
		}},
		{"node", agentSteps, func(t *testing.T) (Config, []string) {
			addrs := []string{freeStepAddr(t)}
			return stepsNodeConfig("127.0.0.1:1", addrs[0]), addrs
		}},
	}
	for _, k := range kinds {
		for i, name := range k.steps {
			t.Run(fmt.Sprintf("%s/%d %s", k.name, i, name), func(t *testing.T) {
				cfg, addrs := k.config(t)
				log := stepLog{fail: name}
				p, err := Start(context.Background(), cfg, Deps{Logger: quietStepsLogger(), Steps: log.hook})
				if !errors.Is(err, errInjected) {
					if p != nil {
						p.Abort()
						_ = p.Wait()
					}
					t.Fatalf("Start: %v, want the injected failure", err)
				}
				if got, want := log.get(), wantSteps(k.steps, i+1, true); !slices.Equal(got, want) {
					t.Fatalf("steps\n%q\nwant\n%q", got, want)
				}
				for _, a := range addrs {
					ln, err := net.Listen("tcp", a)
					if err != nil {
						t.Fatalf("listener %s left open: %v", a, err)
					}
					ln.Close()
				}
			})
		}
	}
}
