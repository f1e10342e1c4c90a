// Package apitest is the test harness of the edge's HTTP API packages: a
// scripted gateway and run (Gateway, FakeRun), the node messages a run
// yields (Events, Delta, TunnelHead, ...), and an httptest server over a
// handler that checks every run was closed exactly once (Env). It imports
// no API package, so the frame's tests and each client API's use it
// alike; the caller builds the handler (api.New over Gateway).
package apitest

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"iop/internal/edge"
	"iop/internal/edge/contract"
	"iop/internal/wire/nodev1"
)

// Run is the run a Gateway hands out: api.Run's methods.
type Run interface {
	Info() contract.DispatchInfo
	Recv() (contract.Message, error)
	Cancel(reason string)
	Fail(reason string)
	Close(outcome contract.Outcome)
}

// Gateway is a gateway whose Dispatch is scripted by each test
// (DispatchFunc). It records every request and every FakeRun it handed
// out (also one wrapped by a test's run that has a Base method).
type Gateway struct {
	Names        []string // what Models returns
	DispatchFunc func(ctx context.Context, req contract.Request) (Run, error)

	mu   sync.Mutex // guards the fields below
	reqs []contract.Request
	runs []*FakeRun
}

// Dispatch records req and returns what DispatchFunc returns.
func (g *Gateway) Dispatch(ctx context.Context, req contract.Request) (Run, error) {
	g.mu.Lock()
	g.reqs = append(g.reqs, req)
	g.mu.Unlock()
	run, err := g.DispatchFunc(ctx, req)
	if err != nil {
		return nil, err
	}
	if fr, ok := run.(interface{ Base() *FakeRun }); ok {
		g.mu.Lock()
		g.runs = append(g.runs, fr.Base())
		g.mu.Unlock()
	}
	return run, nil
}

// Models returns Names.
func (g *Gateway) Models() []string { return g.Names }

// Requests returns the requests Dispatch was called with, in order.
func (g *Gateway) Requests() []contract.Request {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]contract.Request(nil), g.reqs...)
}

// Runs returns the FakeRuns Dispatch handed out, in order.
func (g *Gateway) Runs() []*FakeRun {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]*FakeRun(nil), g.runs...)
}

// ErrRunClosed is what a FakeRun's Recv returns after Cancel or Close,
// like a real run whose stream was cancelled.
var ErrRunClosed = errors.New("run closed")

// FakeRun is a Run fed from a channel (Up): a closed channel means
// io.EOF, Cancel or Close makes a blocked Recv return ErrRunClosed. It
// counts Close calls and keeps their outcomes, and the Cancel reasons.
type FakeRun struct {
	RunInfo contract.DispatchInfo
	// Up takes the node messages Recv yields, decoded as the edge does.
	Up     chan *nodev1.RunUp
	closed chan struct{}
	once   sync.Once

	mu       sync.Mutex // guards the fields below
	closes   int
	outcomes []contract.Outcome // the outcomes Close was given
	cancels  []string           // the reasons Cancel was given
}

// ScriptedRun returns a run on path that yields msgs, then io.EOF.
func ScriptedRun(path contract.Path, msgs ...*nodev1.RunUp) *FakeRun {
	r := LiveRun(path, len(msgs))
	for _, m := range msgs {
		r.Up <- m
	}
	close(r.Up)
	return r
}

// LiveRun returns a run on path whose messages the test sends on Up
// (buffer of them buffered): run id "run1" on node1's provider prov1.
func LiveRun(path contract.Path, buffer int) *FakeRun {
	return &FakeRun{
		RunInfo: contract.DispatchInfo{
			RunID: "run1", NodeID: "node1", ProviderID: "prov1", ProviderType: "sim",
			ServedModel: "served-model", Generation: 1, Path: path,
		},
		Up:     make(chan *nodev1.RunUp, buffer),
		closed: make(chan struct{}),
	}
}

// Info returns RunInfo.
func (r *FakeRun) Info() contract.DispatchInfo { return r.RunInfo }

// Base lets Gateway find the FakeRun inside a test's wrapping run.
func (r *FakeRun) Base() *FakeRun { return r }

// Recv returns the next message sent on Up as the edge decodes it
// (edge.DecodeRunUp), skipping those the edge does not hand on (a
// RunOpen, an empty message).
func (r *FakeRun) Recv() (contract.Message, error) {
	for {
		select {
		case <-r.closed:
			return contract.Message{}, ErrRunClosed
		default:
		}
		select {
		case m, ok := <-r.Up:
			if !ok {
				return contract.Message{}, io.EOF
			}
			if d, ok := edge.DecodeRunUp(m); ok {
				return d, nil
			}
		case <-r.closed:
			return contract.Message{}, ErrRunClosed
		}
	}
}

// Cancel records reason and ends the run.
func (r *FakeRun) Cancel(reason string) {
	r.mu.Lock()
	r.cancels = append(r.cancels, reason)
	r.mu.Unlock()
	r.once.Do(func() { close(r.closed) })
}

// Fail is Cancel, with its reason recorded as "fail: " + reason.
func (r *FakeRun) Fail(reason string) { r.Cancel("fail: " + reason) }

// Close records outcome and ends the run.
func (r *FakeRun) Close(outcome contract.Outcome) {
	r.mu.Lock()
	r.closes++
	r.outcomes = append(r.outcomes, outcome)
	r.mu.Unlock()
	r.once.Do(func() { close(r.closed) })
}

// Closed is closed once Cancel or Close was called.
func (r *FakeRun) Closed() <-chan struct{} { return r.closed }

// CancelReasons returns the reasons Cancel was called with.
func (r *FakeRun) CancelReasons() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.cancels...)
}

// CloseCalls returns how many times Close was called, and its outcomes.
func (r *FakeRun) CloseCalls() (int, []contract.Outcome) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.closes, append([]contract.Outcome(nil), r.outcomes...)
}

// RunWith makes a DispatchFunc that hands out run.
func RunWith(run Run) func(context.Context, contract.Request) (Run, error) {
	return func(context.Context, contract.Request) (Run, error) { return run, nil }
}

// FailWith makes a DispatchFunc that fails with err.
func FailWith(err error) func(context.Context, contract.Request) (Run, error) {
	return func(context.Context, contract.Request) (Run, error) { return nil, err }
}

// Env is an httptest server over a handler. Its cleanup closes the
// server, waits for every handler to return, then checks that each run
// the Gateway handed out was closed exactly once.
type Env struct {
	GW       *Gateway
	Srv      *httptest.Server
	handlers sync.WaitGroup
}

// Start serves h, the handler over gw, until the test ends.
func Start(t testing.TB, gw *Gateway, h http.Handler) *Env {
	t.Helper()
	env := &Env{GW: gw}
	env.Srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		env.handlers.Add(1)
		defer env.handlers.Done()
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(func() {
		env.Srv.Close()
		env.handlers.Wait()
		for i, run := range gw.Runs() {
			if n, outcomes := run.CloseCalls(); n != 1 {
				t.Errorf("run %d: Close called %d times (outcomes %q), want exactly 1", i, n, outcomes)
			}
		}
	})
	return env
}

// WaitHandlers blocks until every handler that started has returned.
func (e *Env) WaitHandlers() { e.handlers.Wait() }

// Response is one raw HTTP exchange.
type Response struct {
	Status int
	Header http.Header
	Body   string
}

// Post sends body to path with the given Content-Type ("" for none).
func (e *Env) Post(t testing.TB, path, contentType, body string) Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, e.Srv.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	return e.Do(t, req)
}

// Get requests path.
func (e *Env) Get(t testing.TB, path string) Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, e.Srv.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	return e.Do(t, req)
}

// Do sends req and reads its whole answer.
func (e *Env) Do(t testing.TB, req *http.Request) Response {
	t.Helper()
	resp, err := e.Srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading body: %v", err)
	}
	return Response{Status: resp.StatusCode, Header: resp.Header, Body: string(b)}
}
