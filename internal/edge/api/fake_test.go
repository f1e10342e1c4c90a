package api

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"iop/internal/edge"
	"iop/internal/edge/api/apitest"
	"iop/internal/edge/contract"
	"iop/internal/wire/nodev1"
)

// fakeGateway is a Gateway whose Dispatch is scripted by each test. It
// records every request and every run it handed out.
type fakeGateway struct {
	models   []string
	dispatch func(ctx context.Context, req contract.Request) (Run, error)

	mu   sync.Mutex // guards the fields below
	reqs []contract.Request
	runs []*fakeRun
}

var _ Gateway[Run] = (*fakeGateway)(nil)

// withFeatures sets the optional features of cfg that gw implements and
// cfg leaves nil: the wiring a composition root writes by hand, for the
// tests' gateways.
func withFeatures(cfg Config, gw Gateway[Run]) Config {
	if k, ok := gw.(interface{ Known(string) bool }); ok && cfg.Known == nil {
		cfg.Known = k.Known
	}
	return cfg
}

func (g *fakeGateway) Dispatch(ctx context.Context, req contract.Request) (Run, error) {
	g.mu.Lock()
	g.reqs = append(g.reqs, req)
	g.mu.Unlock()
	run, err := g.dispatch(ctx, req)
	if err != nil {
		return nil, err
	}
	if fr, ok := run.(interface{ base() *fakeRun }); ok {
		g.mu.Lock()
		g.runs = append(g.runs, fr.base())
		g.mu.Unlock()
	}
	return run, nil
}

func (g *fakeGateway) Models() []string { return g.models }

func (g *fakeGateway) requests() []contract.Request {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]contract.Request(nil), g.reqs...)
}

func (g *fakeGateway) allRuns() []*fakeRun {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]*fakeRun(nil), g.runs...)
}

// errRunClosed is what a fakeRun's Recv returns after Close, like a real run
// whose stream was cancelled.
var errRunClosed = errors.New("run closed")

// fakeRun is a Run fed from a channel: a closed channel means io.EOF,
// Cancel or Close makes a blocked Recv return errRunClosed. It counts
// Close calls and keeps their outcomes, and the Cancel reasons.
type fakeRun struct {
	info   contract.DispatchInfo
	up     chan *nodev1.RunUp
	closed chan struct{}
	once   sync.Once

	mu      sync.Mutex // guards the fields below
	closes  int
	reasons []contract.Outcome // the outcomes Close was given
	cancels []string           // the reasons Cancel was given
}

var _ Run = (*fakeRun)(nil)

// scriptedRun returns a run that yields msgs, then io.EOF.
func scriptedRun(path contract.Path, msgs ...*nodev1.RunUp) *fakeRun {
	r := liveRun(path, len(msgs))
	for _, m := range msgs {
		r.up <- m
	}
	close(r.up)
	return r
}

// liveRun returns a run whose messages the test sends on r.up.
func liveRun(path contract.Path, buffer int) *fakeRun {
	return &fakeRun{
		info: contract.DispatchInfo{
			RunID: "run1", NodeID: "node1", ProviderID: "prov1", ProviderType: "sim",
			ServedModel: "served-model", Generation: 1, Path: path,
		},
		up:     make(chan *nodev1.RunUp, buffer),
		closed: make(chan struct{}),
	}
}

func (r *fakeRun) Info() contract.DispatchInfo { return r.info }

// base lets fakeGateway find the fakeRun inside a wrapping test run.
func (r *fakeRun) base() *fakeRun { return r }

// Recv returns the next scripted node message as the edge decodes it
// (edge.DecodeRunUp), skipping those the edge does not hand on (a RunOpen,
// an empty message).
func (r *fakeRun) Recv() (contract.Message, error) {
	for {
		select {
		case <-r.closed:
			return contract.Message{}, errRunClosed
		default:
		}
		select {
		case m, ok := <-r.up:
			if !ok {
				return contract.Message{}, io.EOF
			}
			if d, ok := edge.DecodeRunUp(m); ok {
				return d, nil
			}
		case <-r.closed:
			return contract.Message{}, errRunClosed
		}
	}
}

// decoded is m as the edge decodes it.
func decoded(m *nodev1.RunUp) *contract.Message {
	d, _ := edge.DecodeRunUp(m)
	return &d
}

func (r *fakeRun) Cancel(reason string) {
	r.mu.Lock()
	r.cancels = append(r.cancels, reason)
	r.mu.Unlock()
	r.once.Do(func() { close(r.closed) })
}

// Fail is Cancel, with its reason recorded as "fail: " + reason.
func (r *fakeRun) Fail(reason string) { r.Cancel("fail: " + reason) }

func (r *fakeRun) Close(outcome contract.Outcome) {
	r.mu.Lock()
	r.closes++
	r.reasons = append(r.reasons, outcome)
	r.mu.Unlock()
	r.once.Do(func() { close(r.closed) })
}

// cancelReasons returns the reasons Cancel was called with.
func (r *fakeRun) cancelReasons() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.cancels...)
}

func (r *fakeRun) closeCalls() (int, []contract.Outcome) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.closes, append([]contract.Outcome(nil), r.reasons...)
}

// runWith makes a dispatch func that hands out run.
func runWith(run *fakeRun) func(context.Context, contract.Request) (Run, error) {
	return func(context.Context, contract.Request) (Run, error) { return run, nil }
}

// failWith makes a dispatch func that fails with err.
func failWith(err error) func(context.Context, contract.Request) (Run, error) {
	return func(context.Context, contract.Request) (Run, error) { return nil, err }
}

// testEnv is an httptest server running New over a fakeGateway. Its cleanup
// waits for every handler to return, then checks that each run was closed
// exactly once.
type testEnv struct {
	t        *testing.T
	gw       *fakeGateway
	srv      *httptest.Server
	handlers sync.WaitGroup
}

// newEnv starts a server; dispatch scripts the gateway.
func newEnv(t *testing.T, cfg Config, dispatch func(context.Context, contract.Request) (Run, error)) *testEnv {
	t.Helper()
	return newEnvLogging(t, cfg, nil, dispatch)
}

// newEnvLogging is newEnv with the handler logging to logger.
func newEnvLogging(t *testing.T, cfg Config, logger *slog.Logger, dispatch func(context.Context, contract.Request) (Run, error)) *testEnv {
	t.Helper()
	if cfg.Now == nil {
		cfg.Now = func() time.Time { return time.Unix(1700000000, 0) }
	}
	env := &testEnv{t: t, gw: &fakeGateway{models: []string{"m", "alias"}, dispatch: dispatch}}
	h := New(withOpenAI(cfg), env.gw, logger)
	env.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		env.handlers.Add(1)
		defer env.handlers.Done()
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(func() {
		env.srv.Close()
		env.handlers.Wait()
		for i, run := range env.gw.allRuns() {
			if n, reasons := run.closeCalls(); n != 1 {
				t.Errorf("run %d: Close called %d times (reasons %q), want exactly 1", i, n, reasons)
			}
		}
	})
	return env
}

// waitHandlers blocks until every handler that started has returned.
func (e *testEnv) waitHandlers() { e.handlers.Wait() }

// Run messages (package apitest's).
var (
	events      = apitest.Events
	started     = apitest.Started
	delta       = apitest.Delta
	usageEvent  = apitest.Usage
	complete    = apitest.Complete
	errorEvent  = apitest.ErrorEvent
	tunnelHead  = apitest.TunnelHead
	tunnelData  = apitest.TunnelData
	tunnelEnd   = apitest.TunnelEnd
	tunnelError = apitest.TunnelError
)

func cancelledEvent() *nodev1.RunEvent {
	return &nodev1.RunEvent{Type: nodev1.RunEvent_TYPE_CANCELLED}
}

const (
	normalized = contract.PathNormalized
	tunnel     = contract.PathTunnel
)
