package edge

import (
	"context"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"
	"testing"
	"time"

	"iop/internal/edge/contract"
	"iop/internal/scheduler"
	"iop/internal/wire/nodev1"
)

// retryConfig is testConfig with max_retries n and the circuit breaker
// off, so a test of retries is not disturbed by circuits opening.
func retryConfig(n int) Config {
	cfg := testConfig()
	cfg.MaxRetries = &n
	cfg.CircuitBreaker.Failures = -1
	return cfg
}

func errorEvent(status int32) *nodev1.RunUp {
	return events(&nodev1.RunEvent{Type: nodev1.RunEvent_TYPE_ERROR, Error: "provider failed", Status: status})
}

func tunnelHead(status int32) *nodev1.RunUp {
	return &nodev1.RunUp{Msg: &nodev1.RunUp_TunnelHead{TunnelHead: &nodev1.TunnelHead{Status: status, Headers: map[string]string{"Content-Type": "application/json"}}}}
}

// tunnelWhole is a whole answer in one message: a head with the body and
// end (node.proto TunnelHead.data, end).
func tunnelWhole(status int32, body string) *nodev1.RunUp {
	m := tunnelHead(status)
	m.GetTunnelHead().Data, m.GetTunnelHead().End = []byte(body), true
	return m
}

func tunnelData(s string) *nodev1.RunUp {
	return &nodev1.RunUp{Msg: &nodev1.RunUp_TunnelData{TunnelData: &nodev1.TunnelData{Data: []byte(s)}}}
}

func tunnelEnd() *nodev1.RunUp {
	return &nodev1.RunUp{Msg: &nodev1.RunUp_TunnelEnd{TunnelEnd: &nodev1.TunnelEnd{}}}
}

func tunnelError(status int32) *nodev1.RunUp {
	return &nodev1.RunUp{Msg: &nodev1.RunUp_TunnelError{TunnelError: &nodev1.TunnelError{Message: "provider unreachable: connection refused", Status: status}}}
}

// acceptRun takes n's next dispatch, opens its run and reads the body.
func acceptRun(t *testing.T, n *fakeNode) (*nodev1.Dispatch, runStream) {
	t.Helper()
	d := n.nextDispatch(t)
	rs := n.openRun(t, d.GetRunId(), n.gen)
	n.e.readBody(t, d, rs)
	return d, rs
}

// failure is what a failing provider's node sends up a run.
type failure struct {
	name   string
	path   nodev1.ExecutionPath
	msgs   []*nodev1.RunUp
	reason string // the retry reason; "" when the failure is not retried
}

var retryable = []failure{
	{"normalized 429", normalized, []*nodev1.RunUp{errorEvent(429)}, "status 429"},
	{"normalized 503", normalized, []*nodev1.RunUp{errorEvent(503)}, "status 503"},
	{"normalized unreachable", normalized, []*nodev1.RunUp{errorEvent(502)}, "status 502"},
	{"tunnel 429 with a body", tunnel, []*nodev1.RunUp{tunnelHead(429), tunnelData(`{"error":{"message":"slow down"}}`), tunnelEnd()}, "status 429"},
	{"tunnel 503 with a body", tunnel, []*nodev1.RunUp{tunnelHead(503), tunnelData(`{"error":{"message":"overloaded"}}`), tunnelEnd()}, "status 503"},
	{"tunnel 429 in one message", tunnel, []*nodev1.RunUp{tunnelWhole(429, `{"error":{"message":"slow down"}}`)}, "status 429"},
	{"tunnel 503 in one message", tunnel, []*nodev1.RunUp{tunnelWhole(503, `{"error":{"message":"overloaded"}}`)}, "status 503"},
	{"tunnel unreachable", tunnel, []*nodev1.RunUp{tunnelError(502)}, "status 502"},
}

var notRetryable = []failure{
	{"normalized 400", normalized, []*nodev1.RunUp{errorEvent(400)}, ""},
	{"normalized 500", normalized, []*nodev1.RunUp{errorEvent(500)}, ""},
	{"normalized timeout", normalized, []*nodev1.RunUp{errorEvent(504)}, ""},
	{"normalized 503 after the first byte", normalized, []*nodev1.RunUp{events(event(nodev1.RunEvent_TYPE_STARTED, "")), errorEvent(503)}, ""},
	{"tunnel 401 with a body", tunnel, []*nodev1.RunUp{tunnelHead(401), tunnelData(`{"error":{"message":"bad key"}}`), tunnelEnd()}, ""},
	{"tunnel 500 with a body", tunnel, []*nodev1.RunUp{tunnelHead(500), tunnelData(`{"error":{"message":"boom"}}`), tunnelEnd()}, ""},
	{"tunnel 401 in one message", tunnel, []*nodev1.RunUp{tunnelWhole(401, `{"error":{"message":"bad key"}}`)}, ""},
	{"tunnel 500 in one message", tunnel, []*nodev1.RunUp{tunnelWhole(500, `{"error":{"message":"boom"}}`)}, ""},
	{"tunnel timeout", tunnel, []*nodev1.RunUp{tunnelError(504)}, ""},
	{"tunnel 503 after the head", tunnel, []*nodev1.RunUp{tunnelHead(200), tunnelData("data: {}\n\n"), tunnelError(503)}, ""},
}

// sameMessages reports whether got are the messages of want, decoded, in
// order.
func sameMessages(got []contract.Message, want []*nodev1.RunUp) bool {
	if len(got) != len(want) {
		return false
	}
	for i := range got {
		if !reflect.DeepEqual(got[i], decoded(want[i])) {
			return false
		}
	}
	return true
}

// TestRetryBeforeFirstByte: a provider that fails before any byte of its
// answer (429, 503, unreachable) loses the request to another candidate; the
// caller of Dispatch sees only the healthy provider's run, the failed run's
// slot is free, and the retry is counted by reason.
func TestRetryBeforeFirstByte(t *testing.T) {
	for _, f := range retryable {
		t.Run(f.name, func(t *testing.T) {
			e := startEdge(t, retryConfig(1))
			bad := e.connect(t, hello("a-bad", prov("a", f.path, 1, "m1")))
			good := e.connect(t, hello("z-good", prov("z", f.path, 1, "m1")))
			res := e.dispatchAsync(context.Background(), chatReq("m1"))
			d, rs := acceptRun(t, bad) // ties go to provider "a"
			for _, m := range f.msgs {
				sendUp(t, rs, m)
			}
			d2, rs2 := acceptRun(t, good)
			if d2.GetRunId() != d.GetRunId()+"-retry" {
				t.Errorf("retry run id %q, want %q", d2.GetRunId(), d.GetRunId()+"-retry")
			}
			first := events(event(nodev1.RunEvent_TYPE_STARTED, ""))
			if f.path == tunnel {
				first = tunnelHead(200)
			}
			sendUp(t, rs2, first)
			r := wait(t, res)
			if r.err != nil {
				t.Fatalf("Dispatch = %v, want the healthy provider's run", r.err)
			}
			defer r.run.Close("test")
			if info := r.run.Info(); info.NodeID != "z-good" || info.RunID != d2.GetRunId() {
				t.Fatalf("run %+v, want the one on z-good", info)
			}
			if m, err := r.run.Recv(); err != nil || !reflect.DeepEqual(m, decoded(first)) {
				t.Fatalf("first Recv = %v, %v; want %v", m, err, first)
			}
			if got := e.inFlight("a-bad", "a"); got != 0 {
				t.Errorf("failed provider in flight %d, want 0", got)
			}
			if got := e.svc.Stats().Retries[f.reason]; got != 1 {
				t.Errorf("retries %v, want 1 for %q", e.svc.Stats().Retries, f.reason)
			}
			// The failed run's stream is ended by the edge.
			if _, err := drainRun(t, rs); err == nil {
				t.Error("failed run's stream still open")
			}
		})
	}
}

// TestNoRetryForOtherFailures: a client error, a 500 with a body, a timeout
// and any failure after the first byte are relayed as they came, from the
// provider that had them; no other provider is tried.
func TestNoRetryForOtherFailures(t *testing.T) {
	for _, f := range notRetryable {
		t.Run(f.name, func(t *testing.T) {
			e := startEdge(t, retryConfig(1))
			bad := e.connect(t, hello("a-bad", prov("a", f.path, 1, "m1")))
			e.connect(t, hello("z-good", prov("z", f.path, 1, "m1")))
			res := e.dispatchAsync(context.Background(), chatReq("m1"))
			_, rs := acceptRun(t, bad)
			for _, m := range f.msgs {
				sendUp(t, rs, m)
			}
			r := wait(t, res)
			if r.err != nil {
				t.Fatalf("Dispatch = %v, want the failed run", r.err)
			}
			defer r.run.Close("test")
			if r.run.Info().NodeID != "a-bad" {
				t.Fatalf("run on %s, want a-bad", r.run.Info().NodeID)
			}
			got, err := recvAll(r.run)
			if err != io.EOF || !sameMessages(got, f.msgs) {
				t.Fatalf("Recv gave %v then %v, want %v then EOF", got, err, f.msgs)
			}
			if n := len(e.svc.Stats().Retries); n != 0 || e.inFlight("z-good", "z") != 0 {
				t.Fatalf("retries %v, z in flight %d: want none", e.svc.Stats().Retries, e.inFlight("z-good", "z"))
			}
		})
	}
}

// TestRetryWithoutOtherCandidate: with nobody else to ask, the provider's
// own failure reaches the caller whole: for a tunnel 429, its head, body
// and end.
func TestRetryWithoutOtherCandidate(t *testing.T) {
	for _, f := range retryable {
		t.Run(f.name, func(t *testing.T) {
			e := startEdge(t, retryConfig(1))
			bad := e.connect(t, hello("a-bad", prov("a", f.path, 1, "m1")))
			res := e.dispatchAsync(context.Background(), chatReq("m1"))
			_, rs := acceptRun(t, bad)
			for _, m := range f.msgs {
				sendUp(t, rs, m)
			}
			r := wait(t, res)
			if r.err != nil {
				t.Fatalf("Dispatch = %v, want the failed run", r.err)
			}
			defer r.run.Close("test")
			got, err := recvAll(r.run)
			if err != io.EOF || !sameMessages(got, f.msgs) {
				t.Fatalf("Recv gave %v then %v, want %v then EOF", got, err, f.msgs)
			}
			if e.inFlight("a-bad", "a") != 0 || e.svc.Snapshot().Leases != 0 {
				t.Fatal("slot still held")
			}
		})
	}
}

// TestRetriesAtMostMaxRetries: with max_retries 1 and three failing
// providers, the request goes to two of them, never to the same one twice,
// and the second failure is the answer.
func TestRetriesAtMostMaxRetries(t *testing.T) {
	e := startEdge(t, retryConfig(1))
	a := e.connect(t, hello("n-a", prov("a", normalized, 1, "m1")))
	b := e.connect(t, hello("n-b", prov("b", normalized, 1, "m1")))
	c := e.connect(t, hello("n-c", prov("c", normalized, 1, "m1")))
	res := e.dispatchAsync(context.Background(), chatReq("m1"))
	_, rs := acceptRun(t, a)
	sendUp(t, rs, errorEvent(503))
	_, rs = acceptRun(t, b)
	sendUp(t, rs, errorEvent(429))
	r := wait(t, res)
	if r.err != nil {
		t.Fatal(r.err)
	}
	defer r.run.Close("test")
	if m, err := r.run.Recv(); err != nil || r.run.Info().NodeID != "n-b" || first(m).Kind != contract.EventFailure || first(m).Status != 429 {
		t.Fatalf("run on %s: Recv = %v, %v; want n-b's 429", r.run.Info().NodeID, m, err)
	}
	if got := e.svc.Stats().Retries; got["status 503"] != 1 || len(got) != 1 {
		t.Fatalf("retries %v, want one for status 503", got)
	}
	// Dispatch returned without waiting for c: it was never asked.
	if got := e.inFlight("n-c", "c"); got != 0 {
		t.Fatalf("c in flight %d, want 0", got)
	}
	_ = c
}

// TestMaxRetriesAboveOne: each retry goes to a provider not tried yet.
func TestMaxRetriesAboveOne(t *testing.T) {
	e := startEdge(t, retryConfig(2))
	a := e.connect(t, hello("n-a", prov("a", tunnel, 1, "m1")))
	b := e.connect(t, hello("n-b", prov("b", tunnel, 1, "m1")))
	c := e.connect(t, hello("n-c", prov("c", tunnel, 1, "m1")))
	res := e.dispatchAsync(context.Background(), chatReq("m1"))
	d, rs := acceptRun(t, a)
	sendUp(t, rs, tunnelError(502))
	d2, rs := acceptRun(t, b)
	sendUp(t, rs, tunnelHead(503))
	sendUp(t, rs, tunnelEnd())
	d3, rs := acceptRun(t, c)
	sendUp(t, rs, tunnelHead(200))
	r := wait(t, res)
	if r.err != nil {
		t.Fatal(r.err)
	}
	defer r.run.Close("test")
	if r.run.Info().NodeID != "n-c" || d2.GetRunId() != d.GetRunId()+"-retry" || d3.GetRunId() != d.GetRunId()+"-retry2" {
		t.Fatalf("run on %s, ids %s %s %s", r.run.Info().NodeID, d.GetRunId(), d2.GetRunId(), d3.GetRunId())
	}
	if got := e.svc.Stats().Retries; got["status 502"] != 1 || got["status 503"] != 1 {
		t.Fatalf("retries %v", got)
	}
}

// TestRetriesDisabled: max_retries 0 returns the run as soon as its body
// went down; a 503 is the caller's to relay.
func TestRetriesDisabled(t *testing.T) {
	e := startEdge(t, retryConfig(0))
	bad := e.connect(t, hello("a-bad", prov("a", normalized, 1, "m1")))
	e.connect(t, hello("z-good", prov("z", normalized, 1, "m1")))
	run, rs, _ := e.startRun(t, bad, chatReq("m1"))
	sendUp(t, rs, errorEvent(503))
	if m, err := run.Recv(); err != nil || first(m).Kind != contract.EventFailure || first(m).Status != 503 {
		t.Fatalf("Recv = %v, %v; want the 503", m, err)
	}
	if n := len(e.svc.Stats().Retries); n != 0 {
		t.Fatalf("retries %v, want none", e.svc.Stats().Retries)
	}
}

// TestRetryWhenNodeLostBeforeFirstByte: a node that dies after opening a
// run but before its first message loses the run to another candidate;
// with none left the caller gets ErrProviderUnavailable.
func TestRetryWhenNodeLostBeforeFirstByte(t *testing.T) {
	e := startEdge(t, retryConfig(1))
	bad := e.connect(t, hello("a-bad", prov("a", normalized, 1, "m1")))
	good := e.connect(t, hello("z-good", prov("z", normalized, 1, "m1")))
	res := e.dispatchAsync(context.Background(), chatReq("m1"))
	acceptRun(t, bad)
	bad.cancel() // the control stream dies; the edge fences the generation
	_, rs2 := acceptRun(t, good)
	sendUp(t, rs2, events(event(nodev1.RunEvent_TYPE_DELTA, "hi")))
	r := wait(t, res)
	if r.err != nil || r.run.Info().NodeID != "z-good" {
		t.Fatalf("Dispatch = %v, want a run on z-good", r.err)
	}
	r.run.Close("test")
	good.nextCancel(t)
	if got := e.svc.Stats().Retries["node gone"]; got != 1 {
		t.Fatalf("retries %v", e.svc.Stats().Retries)
	}

	res = e.dispatchAsync(context.Background(), chatReq("m1"))
	acceptRun(t, good)
	good.cancel()
	if r := wait(t, res); !errors.Is(r.err, scheduler.ErrProviderUnavailable) || !errors.Is(r.err, ErrNodeGone) {
		t.Fatalf("Dispatch = %v, want ErrProviderUnavailable wrapping ErrNodeGone", r.err)
	}
	if snap := e.svc.Snapshot(); snap.Leases != 0 {
		t.Fatalf("leases %d", snap.Leases)
	}
}

// TestClientGoneWhileWaitingForFirstByte: the caller's context ending
// while the provider has not answered cancels the run on the node and
// frees the slot; no retry happens.
func TestClientGoneWhileWaitingForFirstByte(t *testing.T) {
	e := startEdge(t, retryConfig(1))
	n := e.connect(t, hello("n1", prov("p1", normalized, 1, "m1")))
	ctx, cancel := context.WithCancel(context.Background())
	res := e.dispatchAsync(ctx, chatReq("m1"))
	d, _ := acceptRun(t, n)
	cancel()
	if r := wait(t, res); !errors.Is(r.err, context.Canceled) {
		t.Fatalf("Dispatch = %v, want context.Canceled", r.err)
	}
	if c := n.nextCancel(t); c.GetRunId() != d.GetRunId() {
		t.Fatalf("cancel %v, want run %s", c, d.GetRunId())
	}
	if e.inFlight("n1", "p1") != 0 || len(e.svc.Stats().Retries) != 0 {
		t.Fatalf("in flight %d, retries %v", e.inFlight("n1", "p1"), e.svc.Stats().Retries)
	}
}

// TestCloseDropsReadAhead: a run Dispatch read ahead returns io.EOF after
// Close, like any closed run.
func TestCloseDropsReadAhead(t *testing.T) {
	e := startEdge(t, retryConfig(1))
	n := e.connect(t, hello("n1", prov("p1", normalized, 1, "m1")))
	res := e.dispatchAsync(context.Background(), chatReq("m1"))
	_, rs := acceptRun(t, n)
	sendUp(t, rs, events(event(nodev1.RunEvent_TYPE_STARTED, "")))
	r := wait(t, res)
	if r.err != nil {
		t.Fatal(r.err)
	}
	r.run.Close("test")
	if m, err := r.run.Recv(); err != io.EOF {
		t.Fatalf("Recv after Close = %v, %v; want io.EOF", m, err)
	}
}

// breakerConfig opens a circuit after 2 failures for 10s (doubling up to
// 25s), without retries.
func breakerConfig() Config {
	cfg := testConfig()
	cfg.CircuitBreaker = BreakerConfig{Failures: 2, CoolDown: 10 * time.Second, MaxCoolDown: 25 * time.Second}
	return cfg
}

func circuitOf(e *testEdge, node, id string) string {
	p, _ := providerOf(e.svc.Snapshot(), node, id)
	return p.Circuit
}

// failRun runs one request on n whose provider answers m, and returns once
// the caller saw it.
func failRun(t *testing.T, e *testEdge, n *fakeNode, m *nodev1.RunUp) {
	t.Helper()
	run, rs, _ := e.startRun(t, n, chatReq("m1"))
	if run.Info().NodeID != n.id {
		t.Fatalf("run went to %s, want %s", run.Info().NodeID, n.id)
	}
	sendUp(t, rs, m)
	if _, err := recvAll(run); err != io.EOF {
		t.Fatalf("Recv ended with %v", err)
	}
}

// TestCircuitBreaker: a provider that fails twice in a row is out of
// rotation for its cool-down, though it is idle and would win every tie;
// then one trial request goes to it at a time; a failed trial doubles the
// cool-down, a successful one closes the circuit.
func TestCircuitBreaker(t *testing.T) {
	e := startEdge(t, breakerConfig())
	bad := e.connect(t, hello("a-bad", prov("a", normalized, 1, "m1")))
	good := e.connect(t, hello("z-good", prov("z", normalized, 2, "m1")))

	failRun(t, e, bad, errorEvent(500))
	if got := circuitOf(e, "a-bad", "a"); got != CircuitClosed {
		t.Fatalf("circuit %s after one failure, want closed", got)
	}
	// A success in between resets the count.
	ok, rs, _ := e.startRun(t, bad, chatReq("m1"))
	sendUp(t, rs, events(event(nodev1.RunEvent_TYPE_STARTED, "")))
	ok.Recv()
	ok.Close("test")
	bad.nextCancel(t)
	failRun(t, e, bad, errorEvent(500))
	if got := circuitOf(e, "a-bad", "a"); got != CircuitClosed {
		t.Fatalf("circuit %s after a success and a failure, want closed", got)
	}
	failRun(t, e, bad, tunnelError(502)) // any failure before the first byte counts
	if got := circuitOf(e, "a-bad", "a"); got != CircuitOpen || e.svc.Stats().CircuitOpened != 1 {
		t.Fatalf("circuit %s, opened %d times; want open, once", got, e.svc.Stats().CircuitOpened)
	}

	// Out of rotation: the idle "a" would win the tie, "z" gets the work.
	r1, rs1, _ := e.startRun(t, good, chatReq("m1"))
	r2, _, _ := e.startRun(t, good, chatReq("m1"))
	if r1.Info().NodeID != "z-good" || r2.Info().NodeID != "z-good" {
		t.Fatal("runs went to the open provider")
	}
	// z is full: a third request waits for z, not for the open a.
	queued := e.dispatchAsync(context.Background(), chatReq("m1"))
	waitFor(t, func() bool { return e.svc.Snapshot().Waiters == 1 })
	sendUp(t, rs1, events(&nodev1.RunEvent{Type: nodev1.RunEvent_TYPE_COMPLETE}))
	recvAll(r1)
	acceptRun(t, good)
	q := wait(t, queued)
	if q.err != nil || q.run.Info().NodeID != "z-good" {
		t.Fatalf("queued request: %v", q.err)
	}
	defer q.run.Close("test")
	r2.Close("test")
	good.nextCancel(t)

	// After the cool-down one trial goes to "a"; while it is in flight, "a"
	// takes nothing else.
	e.clk.Advance(10 * time.Second)
	if got := circuitOf(e, "a-bad", "a"); got != CircuitHalfOpen {
		t.Fatalf("circuit %s after the cool-down, want half_open", got)
	}
	trial, trs, _ := e.startRun(t, bad, chatReq("m1"))
	other, _, _ := e.startRun(t, good, chatReq("m1"))
	other.Close("test")
	good.nextCancel(t)
	sendUp(t, trs, errorEvent(503))
	recvAll(trial)
	if got := circuitOf(e, "a-bad", "a"); got != CircuitOpen || e.svc.Stats().CircuitOpened != 2 {
		t.Fatalf("circuit %s after a failed trial, opened %d; want open, twice", got, e.svc.Stats().CircuitOpened)
	}
	// The cool-down doubled: 10s later it is still open, 20s later half-open.
	e.clk.Advance(10 * time.Second)
	if got := circuitOf(e, "a-bad", "a"); got != CircuitOpen {
		t.Fatalf("circuit %s 10s into a 20s cool-down, want open", got)
	}
	e.clk.Advance(10 * time.Second)
	if got := circuitOf(e, "a-bad", "a"); got != CircuitHalfOpen {
		t.Fatalf("circuit %s after the doubled cool-down, want half_open", got)
	}
	// A trial the client abandons says nothing: the next request is the trial.
	res := e.dispatchAsync(context.Background(), chatReq("m1"))
	acceptRun(t, bad)
	wait(t, res).run.Close("client gone")
	bad.nextCancel(t)
	if got := circuitOf(e, "a-bad", "a"); got != CircuitHalfOpen {
		t.Fatalf("circuit %s after an abandoned trial, want half_open", got)
	}
	trial, trs, _ = e.startRun(t, bad, chatReq("m1"))
	sendUp(t, trs, events(event(nodev1.RunEvent_TYPE_DELTA, "fine")))
	trial.Recv()
	trial.Close("test")
	bad.nextCancel(t)
	if got := circuitOf(e, "a-bad", "a"); got != CircuitClosed {
		t.Fatalf("circuit %s after a good trial, want closed", got)
	}
	// Closed again: back in rotation, and the cool-down is back to 10s.
	failRun(t, e, bad, errorEvent(500))
	failRun(t, e, bad, errorEvent(500))
	e.clk.Advance(10 * time.Second)
	if got := circuitOf(e, "a-bad", "a"); got != CircuitHalfOpen {
		t.Fatalf("circuit %s 10s after re-opening, want half_open", got)
	}
}

// TestCircuitCapsCoolDown: repeated failed trials double the cool-down up
// to max_cool_down.
func TestCircuitCapsCoolDown(t *testing.T) {
	e := startEdge(t, breakerConfig())
	bad := e.connect(t, hello("a-bad", prov("a", normalized, 1, "m1")))
	failRun(t, e, bad, errorEvent(500))
	failRun(t, e, bad, errorEvent(500))
	for _, coolDown := range []time.Duration{10 * time.Second, 20 * time.Second, 25 * time.Second, 25 * time.Second} {
		e.clk.Advance(coolDown - time.Second)
		if got := circuitOf(e, "a-bad", "a"); got != CircuitOpen {
			t.Fatalf("circuit %s 1s before the end of a %s cool-down", got, coolDown)
		}
		e.clk.Advance(time.Second)
		failRun(t, e, bad, errorEvent(503)) // the trial fails
	}
}

// TestAllCircuitsOpen: a model whose every provider is out of rotation
// fails at once with ErrNoProvider (503 with Retry-After) instead of
// queueing; a request queued for a provider whose circuit opens fails
// with ErrProviderUnavailable instead of waiting for it.
func TestAllCircuitsOpen(t *testing.T) {
	cfg := breakerConfig()
	cfg.CircuitBreaker.Failures = 1
	e := startEdge(t, cfg)
	bad := e.connect(t, hello("a-bad", prov("a", normalized, 1, "m1")))
	holder, rs, _ := e.startRun(t, bad, chatReq("m1"))
	queued := e.dispatchAsync(context.Background(), chatReq("m1"))
	waitFor(t, func() bool { return e.svc.Snapshot().Waiters == 1 })
	sendUp(t, rs, errorEvent(502))
	recvAll(holder)
	if q := wait(t, queued); !errors.Is(q.err, scheduler.ErrProviderUnavailable) {
		t.Fatalf("queued request: %v, want ErrProviderUnavailable", q.err)
	}
	if _, err := e.svc.Dispatch(context.Background(), chatReq("m1")); !errors.Is(err, scheduler.ErrNoProvider) {
		t.Fatalf("Dispatch = %v, want ErrNoProvider", err)
	}
	if snap := e.svc.Snapshot(); snap.Leases != 0 || snap.Waiters != 0 {
		t.Fatalf("leases %d waiters %d", snap.Leases, snap.Waiters)
	}
}

// TestCircuitSurvivesReconnect: the circuit is the (node, provider)'s, not
// its connection's: a node that reconnects with a broken model server stays
// out of rotation.
func TestCircuitSurvivesReconnect(t *testing.T) {
	cfg := breakerConfig()
	cfg.CircuitBreaker.Failures = 1
	e := startEdge(t, cfg)
	h := hello("a-bad", prov("a", normalized, 1, "m1"))
	n := e.connect(t, h)
	failRun(t, e, n, errorEvent(500))
	n2 := e.connect(t, h)
	if n2.gen <= n.gen || circuitOf(e, "a-bad", "a") != CircuitOpen {
		t.Fatalf("generation %d, circuit %s: want a new generation, still open", n2.gen, circuitOf(e, "a-bad", "a"))
	}
}

// TestDispatchFailuresOpenTheCircuit: a node that never opens its runs
// fails each dispatch; after 2 its provider is out of rotation.
func TestDispatchFailuresOpenTheCircuit(t *testing.T) {
	e := startEdge(t, breakerConfig())
	bad := e.connect(t, hello("a-bad", prov("a", normalized, 1, "m1")))
	for i := 1; i <= 2; i++ {
		res := e.dispatchAsync(context.Background(), chatReq("m1"))
		d := bad.nextDispatch(t)
		bad.send(t, &nodev1.NodeMessage{Msg: &nodev1.NodeMessage_DispatchRefused{DispatchRefused: &nodev1.DispatchRefused{RunId: d.GetRunId(), Reason: "broken"}}})
		if r := wait(t, res); !errors.Is(r.err, ErrDispatchRefused) {
			t.Fatalf("Dispatch %d = %v", i, r.err)
		}
	}
	// Run.finish closes the run's end (so Dispatch returns) before it
	// reports the outcome to the breaker: the circuit opens a moment later.
	waitFor(t, func() bool { return circuitOf(e, "a-bad", "a") == CircuitOpen })
}

// TestBreakerDisabled: failures < 0 keeps every provider in rotation.
func TestBreakerDisabled(t *testing.T) {
	e := startEdge(t, retryConfig(0)) // breaker off
	bad := e.connect(t, hello("a-bad", prov("a", normalized, 1, "m1")))
	for range 5 {
		failRun(t, e, bad, errorEvent(503))
	}
	if got := circuitOf(e, "a-bad", "a"); got != CircuitClosed {
		t.Fatalf("circuit %s, want closed", got)
	}
}

// TestRegression_FailingFastProviderTakesEveryRequest: least-loaded
// admission sent every request to a provider that answered 503 at once,
// since it was always idle, while a healthy one sat with its runs; with
// the circuit breaker (default 3 failures) it gets 3 requests, then none.
func TestRegression_FailingFastProviderTakesEveryRequest(t *testing.T) {
	cfg := testConfig() // max_retries 0: every request is one attempt
	cfg.CircuitBreaker = BreakerConfig{}
	e := startEdge(t, cfg)
	bad := e.connect(t, hello("a-bad", prov("a", normalized, 4, "m1")))
	good := e.connect(t, hello("z-good", prov("z", normalized, 8, "m1")))
	badRuns := 0
	for i := range 6 {
		res := e.dispatchAsync(context.Background(), chatReq("m1"))
		select {
		case m := <-bad.msgs:
			d := m.GetDispatch()
			if d == nil {
				t.Fatalf("request %d: a-bad got %v", i, m)
			}
			badRuns++
			rs := bad.openRun(t, d.GetRunId(), bad.gen)
			e.readBody(t, d, rs)
			r := wait(t, res)
			sendUp(t, rs, errorEvent(503))
			recvAll(r.run)
		case m := <-good.msgs:
			d := m.GetDispatch()
			if d == nil {
				t.Fatalf("request %d: z-good got %v", i, m)
			}
			rs := good.openRun(t, d.GetRunId(), good.gen)
			e.readBody(t, d, rs)
			r := wait(t, res)
			defer r.run.Close("test") // held: z-good is the busier one
		case <-time.After(failsafe):
			t.Fatal("no dispatch")
		}
	}
	if badRuns != DefaultBreakerFailures {
		t.Fatalf("the failing provider got %d of 6 requests, want %d", badRuns, DefaultBreakerFailures)
	}
}

// TestRegression_HalfOpenTrialSlotGoesToAWaiter: a request queued while
// its model's other provider was out of rotation (circuit open) lists only
// the busy one. When the cool-down ends, the half-open provider's trial
// slot goes to the earliest waiter at once, instead of staying idle beside
// it until the busy provider frees a slot (work conservation; before,
// nothing re-resolved the waiters when the cool-down ended). When the
// trial succeeds and ends, the provider takes the next waiter, though the
// other provider is still busy: a waiter that raced for the trial and lost
// it is not left without that provider for good.
func TestRegression_HalfOpenTrialSlotGoesToAWaiter(t *testing.T) {
	e := startEdge(t, breakerConfig())
	bad := e.connect(t, hello("a-bad", prov("a", normalized, 1, "m1")))
	good := e.connect(t, hello("z-good", prov("z", normalized, 1, "m1")))
	failRun(t, e, bad, errorEvent(500))
	failRun(t, e, bad, errorEvent(500))
	if got := circuitOf(e, "a-bad", "a"); got != CircuitOpen {
		t.Fatalf("circuit %s, want open", got)
	}
	busy, _, _ := e.startRun(t, good, chatReq("m1"))
	defer busy.Close("test")
	if busy.Info().NodeID != "z-good" {
		t.Fatalf("run went to %s, want z-good", busy.Info().NodeID)
	}
	first := e.dispatchAsync(context.Background(), chatReq("m1"))
	waitFor(t, func() bool { return e.svc.Snapshot().Waiters == 1 })
	second := e.dispatchAsync(context.Background(), chatReq("m1"))
	waitFor(t, func() bool { return e.svc.Snapshot().Waiters == 2 })

	e.clk.Advance(10 * time.Second) // the cool-down ends: "a" is half-open
	_, trs := acceptRun(t, bad)
	sendUp(t, trs, events(event(nodev1.RunEvent_TYPE_STARTED, "")))
	r := wait(t, first)
	if r.err != nil || r.run.Info().NodeID != "a-bad" {
		t.Fatalf("first waiter: %v on %+v, want the trial on a-bad", r.err, r.run)
	}
	if _, err := r.run.Recv(); err != nil { // the provider answered
		t.Fatal(err)
	}
	r.run.Close("test") // the answer that began ended well: the trial succeeded
	if got := circuitOf(e, "a-bad", "a"); got != CircuitClosed {
		t.Fatalf("circuit %s after a good trial, want closed", got)
	}
	_, rs2 := cancelThenAccept(t, bad)
	sendUp(t, rs2, events(event(nodev1.RunEvent_TYPE_STARTED, "")))
	r2 := wait(t, second)
	if r2.err != nil || r2.run.Info().NodeID != "a-bad" {
		t.Fatalf("second waiter: %v, want a-bad", r2.err)
	}
	if e.svc.Snapshot().Waiters != 0 {
		t.Fatal("a waiter is left")
	}
	r2.run.Close("test")
}

// TestRegression_WaiterQueuedDuringATrialGetsTheProviderBack: a request
// that queued while a half-open provider's trial was in flight lists only
// the other, busy provider. When the trial's answer ends well (the circuit
// closes), the freed slot goes to that waiter: the close
// re-resolves the queued requests (breakers.onBack), so it does not wait
// for the busy provider beside an idle one.
func TestRegression_WaiterQueuedDuringATrialGetsTheProviderBack(t *testing.T) {
	e := startEdge(t, breakerConfig())
	bad := e.connect(t, hello("a-bad", prov("a", normalized, 1, "m1")))
	good := e.connect(t, hello("z-good", prov("z", normalized, 1, "m1")))
	failRun(t, e, bad, errorEvent(500))
	failRun(t, e, bad, errorEvent(500))
	busy, _, _ := e.startRun(t, good, chatReq("m1"))
	defer busy.Close("test")
	e.clk.Advance(10 * time.Second)
	trial, trs, _ := e.startRun(t, bad, chatReq("m1"))
	if trial.Info().NodeID != "a-bad" {
		t.Fatalf("trial went to %s", trial.Info().NodeID)
	}
	waiter := e.dispatchAsync(context.Background(), chatReq("m1"))
	waitFor(t, func() bool { return e.svc.Snapshot().Waiters == 1 })
	sendUp(t, trs, events(event(nodev1.RunEvent_TYPE_STARTED, "")))
	if _, err := trial.Recv(); err != nil {
		t.Fatal(err)
	}
	trial.Close("test")
	if got := circuitOf(e, "a-bad", "a"); got != CircuitClosed {
		t.Fatalf("circuit %s after a good trial, want closed", got)
	}
	cancelThenAccept(t, bad)
	r := wait(t, waiter)
	if r.err != nil || r.run.Info().NodeID != "a-bad" {
		t.Fatalf("waiter: %v, want a run on a-bad", r.err)
	}
	r.run.Close("test")
}

// cancelThenAccept reads n's Cancel of the run just closed and the Dispatch
// of the request its freed slot went to, in either order (the slot is free
// before the Cancel is queued), and accepts the dispatched run.
func cancelThenAccept(t *testing.T, n *fakeNode) (*nodev1.Dispatch, runStream) {
	t.Helper()
	var d *nodev1.Dispatch
	for cancels := 0; d == nil || cancels == 0; {
		m := n.next(t)
		switch {
		case m.GetCancel() != nil && cancels == 0:
			cancels++
		case m.GetDispatch() != nil && d == nil:
			d = m.GetDispatch()
		default:
			t.Fatalf("node %s: got %v, want one Cancel and one Dispatch", n.id, m)
		}
	}
	rs := n.openRun(t, d.GetRunId(), n.gen)
	n.e.readBody(t, d, rs)
	return d, rs
}

// A provider failure that ends an answer after it began counts for the
// circuit breaker too (a provider's error object is a provider failure on
// every path): an error event after the first delta, a tunnel
// stream that carried the provider's error event (TunnelEnd
// provider_error), a tunnel that broke after its head. Two in a row open
// the circuit (breakerConfig). A cancel or a client error after the
// answer began does not count.
func TestLateProviderFailureCountsForTheBreaker(t *testing.T) {
	started := events(event(nodev1.RunEvent_TYPE_STARTED, ""), event(nodev1.RunEvent_TYPE_DELTA, "hel"))
	sseHead := &nodev1.RunUp{Msg: &nodev1.RunUp_TunnelHead{TunnelHead: &nodev1.TunnelHead{Status: 200, Headers: map[string]string{"Content-Type": "text/event-stream"}}}}
	providerError := &nodev1.RunUp{Msg: &nodev1.RunUp_TunnelEnd{TunnelEnd: &nodev1.TunnelEnd{ProviderError: "overloaded"}}}
	cancelled := events(event(nodev1.RunEvent_TYPE_CANCELLED, ""))
	for _, c := range []struct {
		name  string
		path  nodev1.ExecutionPath
		msgs  []*nodev1.RunUp
		opens bool
	}{
		{"normalized error line after a delta", normalized, []*nodev1.RunUp{started, errorEvent(502)}, true},
		{"normalized timeout after a delta", normalized, []*nodev1.RunUp{started, errorEvent(504)}, true},
		{"tunnel error event in a 200 stream", tunnel, []*nodev1.RunUp{sseHead, tunnelData("data: {}\n\ndata: {\"error\":{\"message\":\"overloaded\"}}\n\n"), providerError}, true},
		{"tunnel broken after its head", tunnel, []*nodev1.RunUp{sseHead, tunnelData("data: {}\n\n"), tunnelError(502)}, true},
		{"normalized cancel after a delta", normalized, []*nodev1.RunUp{started, cancelled}, false},
		{"normalized 400 after a delta", normalized, []*nodev1.RunUp{started, errorEvent(400)}, false},
		{"tunnel cancel after its head", tunnel, []*nodev1.RunUp{sseHead, tunnelData("data: {}\n\n"), tunnelError(0)}, false},
		{"tunnel clean end", tunnel, []*nodev1.RunUp{sseHead, tunnelData("data: {}\n\ndata: [DONE]\n\n"), tunnelEnd()}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := startEdge(t, breakerConfig())
			n := e.connect(t, hello("a-node", prov("a", c.path, 1, "m1")))
			for range 2 {
				run, rs, _ := e.startRun(t, n, chatReq("m1"))
				for _, m := range c.msgs {
					sendUp(t, rs, m)
				}
				if _, err := recvAll(run); err != io.EOF {
					t.Fatalf("Recv ended with %v", err)
				}
			}
			if c.opens {
				waitFor(t, func() bool { return circuitOf(e, "a-node", "a") == CircuitOpen })
				return
			}
			waitFor(t, func() bool { return e.inFlight("a-node", "a") == 0 })
			if got := circuitOf(e, "a-node", "a"); got != CircuitClosed {
				t.Fatalf("circuit %s, want closed", got)
			}
		})
	}
}

// TestRegression_BrokenAnswerClosedEarlyCountsForTheBreaker: the HTTP
// API's translated routes (Ollama, Responses, Messages) stop reading a
// tunnel at the provider's error object and Close the run with
// OutcomeUpstreamError before the TunnelEnd that carries provider_error
// arrives; such failures must still count (ten broken Responses streams
// in a row left the circuit closed). Two in a row open it; a run its client left (OutcomeClientGone) after the
// answer began still counts as the provider's success.
func TestRegression_BrokenAnswerClosedEarlyCountsForTheBreaker(t *testing.T) {
	sseHead := &nodev1.RunUp{Msg: &nodev1.RunUp_TunnelHead{TunnelHead: &nodev1.TunnelHead{Status: 200, Headers: map[string]string{"Content-Type": "text/event-stream"}}}}
	for _, c := range []struct {
		fail    bool // Fail before Close, as the HTTP API's answerFailed does
		outcome contract.Outcome
		opens   bool
	}{
		{false, contract.OutcomeUpstreamError, true},
		{true, contract.OutcomeUpstreamError, true},
		{false, contract.OutcomeClientGone, false},
	} {
		t.Run(fmt.Sprintf("fail=%v/%s", c.fail, c.outcome), func(t *testing.T) {
			e := startEdge(t, breakerConfig())
			n := e.connect(t, hello("a-node", prov("a", tunnel, 1, "m1")))
			for range 2 {
				run, rs, _ := e.startRun(t, n, chatReq("m1"))
				sendUp(t, rs, sseHead)
				sendUp(t, rs, tunnelData("data: {}\n\ndata: {\"error\":{\"message\":\"overloaded\"}}\n\n"))
				for got := 0; got < 2; got++ { // the head, the data
					if _, err := run.Recv(); err != nil {
						t.Fatalf("Recv: %v", err)
					}
				}
				want := string(c.outcome)
				if c.fail {
					run.Fail("the provider's answer carried an error")
					want = "carried an error"
				}
				run.Close(c.outcome)
				if got := n.nextCancel(t).GetReason(); !strings.Contains(got, want) {
					t.Fatalf("Cancel reason %q", got)
				}
				waitFor(t, func() bool { return e.inFlight("a-node", "a") == 0 })
			}
			if c.opens {
				waitFor(t, func() bool { return circuitOf(e, "a-node", "a") == CircuitOpen })
				return
			}
			if got := circuitOf(e, "a-node", "a"); got != CircuitClosed {
				t.Fatalf("circuit %s, want closed", got)
			}
		})
	}
}
