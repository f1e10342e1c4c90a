package node

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"iop/internal/wire/nodev1"
)

// drainGrace is the drain grace period of these tests: a duration no other
// timer of the agent has (heartbeats are an hour apart, the hello timeout
// is 10 s, backoffs 3 s and more), so waitArmed finds the drain's timer.
const drainGrace = 7 * time.Second

// gatedUpstream answers in the shape of path: a first chunk at once, then,
// when release is closed, the rest of a complete answer. A request aborted
// before that closes gone.
func gatedUpstream(t *testing.T, path nodev1.ExecutionPath) (pc ProviderConfig, release, gone chan struct{}) {
	release, gone = make(chan struct{}), make(chan struct{}, 16)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		first, rest := `{"message":{"role":"assistant","content":"first "},"done":false}`+"\n",
			`{"message":{"role":"assistant","content":"last"},"done":false}`+"\n"+
				`{"message":{"role":"assistant","content":""},"done":true,"done_reason":"stop","prompt_eval_count":3,"eval_count":2}`+"\n"
		if path == tunnel {
			w.Header().Set("Content-Type", "text/event-stream")
			first, rest = `data: {"choices":[{"delta":{"content":"first "}}]}`+"\n\n",
				`data: {"choices":[{"delta":{"content":"last"}}]}`+"\n\ndata: [DONE]\n\n"
		}
		io.WriteString(w, first)
		w.(http.Flusher).Flush()
		select {
		case <-release:
			io.WriteString(w, rest)
		case <-r.Context().Done():
			gone <- struct{}{}
		}
	}))
	t.Cleanup(srv.Close)
	if path == normalized {
		return ProviderConfig{ID: "p", Type: "ollama", BaseURL: srv.URL, Models: []string{"served-model"}, Capacity: 4}, release, gone
	}
	return ProviderConfig{ID: "p", Type: "vllm", BaseURL: srv.URL, Models: []string{"served-model"}, Capacity: 4}, release, gone
}

// runAgent runs an agent for cfg on clk and returns it with Run's result
// channel; the test's end cancels Run if it is still going.
func runAgent(t *testing.T, cfg Config, clk *testClock) (*Agent, <-chan error) {
	t.Helper()
	a, err := New(cfg, nil, WithClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	a.jitter = func(d time.Duration) time.Duration { return d }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	returned := make(chan struct{})
	go func() {
		defer close(returned)
		done <- a.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-returned:
		case <-time.After(failsafe):
			t.Error("Run did not return")
		}
	})
	return a, done
}

// startRun dispatches run id on c with an inline body and returns its run
// stream after the first chunk of the answer arrived.
func startRun(t *testing.T, e *fakeEdge, c *edgeConn, id string, path nodev1.ExecutionPath) *edgeRun {
	t.Helper()
	c.send(t, inlineDispatchMsg(id, "p", path, `{"messages":[{"role":"user","content":"x"}],"stream":true}`))
	r := recv(t, e.runs, "run stream "+id)
	if path == normalized {
		// STARTED comes with the first part of the answer.
		if ev := r.next(t).GetEvents().GetEvents(); len(ev) != 2 || ev[0].Type != nodev1.RunEvent_TYPE_STARTED || ev[1].Text != "first " {
			t.Fatalf("run %s: want STARTED and the first delta, got %v", id, ev)
		}
	} else if h := r.next(t).GetTunnelHead(); !strings.Contains(string(h.GetData()), "first ") {
		// The head goes with the stream's first event.
		t.Fatalf("run %s: want the head with the first data, got %v", id, h)
	}
	return r
}

// answerRest returns the text the rest of a run carried and whether it ended
// with its terminal frame (COMPLETE, TunnelEnd) and a half-close.
func answerRest(t *testing.T, r *edgeRun, path nodev1.ExecutionPath) (text string, complete bool) {
	t.Helper()
	rest := r.rest(t)
	for _, m := range rest {
		for _, ev := range m.GetEvents().GetEvents() {
			text += ev.Text
			complete = complete || ev.Type == nodev1.RunEvent_TYPE_COMPLETE
		}
		text += string(m.GetTunnelData().GetData())
		complete = complete || m.GetTunnelEnd() != nil
	}
	return text, complete && errors.Is(r.recvErr, io.EOF)
}

// TestAgentDrainLetsRunsFinish: on Drain the agent tells the edge (Drain
// with the reason), refuses a Dispatch that still arrives (DispatchRefused,
// so the edge admits it elsewhere), lets the runs in flight, one per
// execution path, send their whole answers, then closes the connection and
// Run returns nil without connecting again.
func TestAgentDrainLetsRunsFinish(t *testing.T) {
	for _, path := range []nodev1.ExecutionPath{normalized, tunnel} {
		t.Run(path.String(), func(t *testing.T) {
			e, addr := startEdge(t)
			pc, release, _ := gatedUpstream(t, path)
			cfg := testConfig(addr, pc)
			cfg.DrainTimeout = drainGrace
			a, done := runAgent(t, cfg, newTestClock())
			c := connect(t, e, 1, hour)
			r1, r2 := startRun(t, e, c, "r1", path), startRun(t, e, c, "r2", path)

			a.Drain("SIGTERM")
			if d := c.next(t).GetDrain(); d == nil || d.Reason != "SIGTERM" {
				t.Fatalf("want Drain{SIGTERM} first, got %v", d)
			}
			c.send(t, inlineDispatchMsg("late", "p", path, `{}`))
			if m := c.next(t).GetDispatchRefused(); m == nil || m.RunId != "late" || !strings.Contains(m.Reason, ErrDraining.Error()) {
				t.Fatalf("late dispatch: got %v, want DispatchRefused for draining", m)
			}
			select {
			case err := <-done:
				t.Fatalf("Run returned %v with runs in flight", err)
			case <-c.done:
				t.Fatal("connection closed with runs in flight")
			default:
			}

			close(release)
			for _, r := range []*edgeRun{r1, r2} {
				text, complete := answerRest(t, r, path)
				if !complete || !strings.Contains(text, "last") {
					t.Errorf("run %s: rest %q complete %v (%v), want the whole answer", r.open.RunId, text, complete, r.recvErr)
				}
			}
			if err := recv(t, done, "Run to return after the drain"); err != nil {
				t.Fatalf("Run returned %v, want nil", err)
			}
			recv(t, c.done, "the connection to end")
			select {
			case <-e.conns:
				t.Fatal("a drained agent connected again")
			default:
			}
		})
	}
}

// TestAgentDrainGracePeriodAbortsTheRest: runs still going when the drain's
// grace period (on the agent's clock) ends are aborted, their provider
// requests too, and their streams end without a last frame (the edge then
// ends them as it does any run of a connection that closed: one error for
// every client); Run returns nil. Until then the node keeps serving them.
func TestAgentDrainGracePeriodAbortsTheRest(t *testing.T) {
	for _, path := range []nodev1.ExecutionPath{normalized, tunnel} {
		t.Run(path.String(), func(t *testing.T) {
			e, addr := startEdge(t)
			pc, _, gone := gatedUpstream(t, path)
			cfg := testConfig(addr, pc)
			cfg.DrainTimeout = drainGrace
			clk := newTestClock()
			a, done := runAgent(t, cfg, clk)
			c := connect(t, e, 1, hour)
			r := startRun(t, e, c, "r1", path)

			a.Drain("SIGTERM")
			clk.waitArmed(t, drainGrace)
			if c.next(t).GetDrain() == nil {
				t.Fatal("want Drain")
			}
			clk.Advance(drainGrace - time.Millisecond)
			// Still serving: a refusal comes back on the control stream and
			// the run is still open.
			c.send(t, inlineDispatchMsg("late", "p", path, `{}`))
			if c.next(t).GetDispatchRefused() == nil {
				t.Fatal("want a refusal")
			}
			select {
			case m := <-r.up:
				t.Fatalf("run ended before the grace period: %v", m)
			case err := <-done:
				t.Fatalf("Run returned %v before the grace period", err)
			default:
			}

			clk.Advance(time.Millisecond)
			recv(t, gone, "the provider request to be aborted")
			if rest := r.rest(t); len(rest) != 0 {
				t.Errorf("aborted run sent %v, want no last frame", rest)
			}
			if err := recv(t, done, "Run to return"); err != nil {
				t.Fatalf("Run returned %v, want nil", err)
			}
		})
	}
}

// TestAgentAbortSendsNoLastFrame: Run's context ending (a second signal)
// aborts every run at once, on both paths, without a last frame: no
// CANCELLED or TunnelError that would give their clients another error
// than the one the edge gives for a node that went away.
func TestAgentAbortSendsNoLastFrame(t *testing.T) {
	e, addr := startEdge(t)
	norm, _, normGone := gatedUpstream(t, normalized)
	tun, _, tunGone := gatedUpstream(t, tunnel)
	norm.ID, tun.ID = "norm", "tun"
	a, err := New(testConfig(addr, norm, tun), nil, WithClock(newTestClock()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	c := connect(t, e, 1, hour)
	body := `{"messages":[{"role":"user","content":"x"}],"stream":true}`
	c.send(t, inlineDispatchMsg("n", "norm", normalized, body))
	rn := recv(t, e.runs, "normalized run")
	rn.next(t) // STARTED and the first delta
	c.send(t, inlineDispatchMsg("t", "tun", tunnel, body))
	rt := recv(t, e.runs, "tunnel run")
	rt.next(t) // head, with the first data

	a.Drain("SIGTERM")
	cancel()
	recv(t, normGone, "the normalized provider request to be aborted")
	recv(t, tunGone, "the tunnel provider request to be aborted")
	for _, r := range []*edgeRun{rn, rt} {
		if rest := r.rest(t); len(rest) != 0 {
			t.Errorf("run %s sent %v after the abort, want nothing", r.open.RunId, rest)
		}
	}
	if err := recv(t, done, "Run to return"); err != nil {
		t.Fatalf("Run returned %v", err)
	}
}

// TestAgentDrainWithoutRuns: with nothing in flight, a drain tells the edge
// and disconnects at once; while disconnected (backing off), Run returns
// at once.
func TestAgentDrainWithoutRuns(t *testing.T) {
	t.Run("connected", func(t *testing.T) {
		e, addr := startEdge(t)
		a, done := runAgent(t, testConfig(addr, ProviderConfig{ID: "p", Type: "openai", BaseURL: "http://127.0.0.1:1", Models: []string{"m"}}), newTestClock())
		c := connect(t, e, 1, hour)
		waitGeneration(t, a, 1)
		a.Drain("SIGINT")
		if d := c.next(t).GetDrain(); d == nil || d.Reason != "SIGINT" {
			t.Fatalf("want Drain{SIGINT}, got %v", d)
		}
		if err := recv(t, done, "Run to return"); err != nil {
			t.Fatalf("Run returned %v", err)
		}
		recv(t, c.done, "the connection to end")
	})
	t.Run("backing off", func(t *testing.T) {
		e, addr := startEdge(t)
		clk := newTestClock()
		a, done := runAgent(t, testConfig(addr, ProviderConfig{ID: "p", Type: "openai", BaseURL: "http://127.0.0.1:1", Models: []string{"m"}}), clk)
		c := connect(t, e, 1, hour)
		c.end <- errors.New("edge going away")
		clk.waitArmed(t, 3*time.Second) // the reconnect backoff (ReconnectMin, no jitter)
		a.Drain("SIGTERM")
		if err := recv(t, done, "Run to return"); err != nil {
			t.Fatalf("Run returned %v", err)
		}
		select {
		case <-e.conns:
			t.Fatal("a drained agent connected again")
		default:
		}
	})
}

// TestAgentDrainWaitsForWarmRunInFlight: a run on a warm stream in flight
// when the drain begins keeps the connection until its whole answer went
// up and the edge ended its stream (so it read the run's end); then the
// node disconnects and Run returns nil, with no timer (the grace period is
// never reached on the test clock).
func TestAgentDrainWaitsForWarmRunInFlight(t *testing.T) {
	e, addr := startWarmEdge(t)
	pc, release, _ := gatedUpstream(t, tunnel)
	cfg := testConfig(addr, pc)
	cfg.DrainTimeout = drainGrace
	a, done := runAgent(t, cfg, newTestClock())
	c := connect(t, e, 1, hour)
	r := recv(t, e.warm, "warm run stream")
	r.warmDown(t, inlineDispatchMsg("w1", "p", tunnel, `{"messages":[{"role":"user","content":"x"}],"stream":true}`))
	if o := r.next(t).GetOpen(); o.GetRunId() != "w1" {
		t.Fatalf("want the run's RunOpen, got %v", o)
	}
	if h := r.next(t).GetTunnelHead(); !strings.Contains(string(h.GetData()), "first ") {
		t.Fatalf("want the head with the first data, got %v", h)
	}
	a.Drain("SIGTERM")
	for m := c.next(t); m.GetDrain() == nil; m = c.next(t) {
	}
	close(release)
	text := ""
	for {
		m := r.next(t)
		if m == nil {
			t.Fatalf("half-closed before the run's end; got %q", text)
		}
		text += string(m.GetTunnelData().GetData())
		if m.GetTunnelEnd() != nil {
			break
		}
	}
	if !strings.Contains(text, "last") {
		t.Errorf("rest of the answer %q, want its last part", text)
	}
	select {
	case <-c.done:
		t.Fatal("the node disconnected before the edge ended the stream of the run that finished")
	case err := <-done:
		t.Fatalf("Run returned %v before the edge read the run's end", err)
	default:
	}
	r.end <- nil
	if err := recv(t, done, "Run to return after the drain"); err != nil {
		t.Fatalf("Run returned %v, want nil", err)
	}
	recv(t, c.done, "the connection to end")
}
