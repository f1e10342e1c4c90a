package managed

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"sync"
	"syscall"
	"time"

	"iop/internal/clock"
	"iop/internal/node/adapter"
)

// healthPoll is the wait between two health polls of a starting server;
// healthTimeout bounds one poll.
const (
	healthPoll    = 200 * time.Millisecond
	healthTimeout = 5 * time.Second
)

// outputDrain bounds how long a server's output is still read after its
// process group was killed (a process that left the group may hold the
// pipe open).
const outputDrain = 2 * time.Second

// maxLine is the longest output line logged whole; a longer one is logged
// in pieces.
const maxLine = 64 << 10

type state int

const (
	stateStarting state = iota // process starting, health not yet 200
	stateReady                 // health answered 200
	stateStopping              // SIGTERM sent or start failed; until the process exited
)

// child is one model server process. Its supervisor goroutine (run) is
// the sole writer of cmd, pid, relay, startErr and exitText before it closes
// ready or exited; the fields below mu are Manager.mu's.
type child struct {
	model  string
	srv    Server        // with defaults, placeholders not replaced
	ready  chan struct{} // closed when the start is over: healthy, or startErr set
	exited chan struct{} // closed after the process exited and the child left Manager.children
	stop   chan struct{} // closed by stopLocked

	// Manager.mu guards the fields below.
	state    state
	pid      int // 0 until the process started
	relay    *adapter.OpenAI
	startErr error  // why the start failed; nil once healthy
	exitText string // how the process ended ("exit status 1", "signal: killed")
	inFlight int    // runs counted by acquire and not yet released
	lastUsed time.Time
	since    time.Time   // when it became ready
	idle     clock.Timer // the TTL, while idle
	idleSeq  uint64      // increments at every arm or stop of idle
	kill     clock.Timer // SIGKILL after KillGrace, once stopping
}

// stopIdleLocked stops c's TTL.
func (c *child) stopIdleLocked() {
	if c.idle != nil {
		c.idle.Stop()
		c.idle = nil
	}
	c.idleSeq++
}

// startLocked registers a starting child for model and starts its
// supervisor.
func (m *Manager) startLocked(model string, srv Server) *child {
	c := &child{model: model, srv: srv, ready: make(chan struct{}), exited: make(chan struct{}), stop: make(chan struct{}),
		state: stateStarting, lastUsed: m.clock.Now()}
	m.children[model] = c
	m.wg.Go(func() { m.run(c) })
	return c
}

// stopLocked stops c: SIGTERM to its process group now, SIGKILL after
// KillGrace (a child not yet started is signalled by run once it is).
func (m *Manager) stopLocked(c *child) {
	if c.state == stateStopping {
		return
	}
	wasReady := c.state == stateReady
	c.state = stateStopping
	close(c.stop)
	c.stopIdleLocked()
	if wasReady {
		m.notifyLocked()
	}
	if c.pid != 0 {
		m.signalLocked(c)
	}
}

// signalLocked sends SIGTERM to c's process group and arms the SIGKILL.
func (m *Manager) signalLocked(c *child) {
	pid := c.pid
	_ = syscall.Kill(-pid, syscall.SIGTERM)
	c.kill = m.clock.AfterFunc(m.cfg.KillGrace, func() { _ = syscall.Kill(-pid, syscall.SIGKILL) })
}

// run is c's supervisor: it starts the process, polls its health until
// it is ready, then waits for it to exit and removes c from m.children.
func (m *Manager) run(c *child) {
	log := m.logger.With("model", c.model)
	startErr, exitText := m.runProcess(c, log)
	m.mu.Lock()
	if !isClosed(c.ready) { // the start failed before the health polls
		c.startErr = startErr
		close(c.ready)
	}
	wasReady := c.state == stateReady
	crashed := c.state != stateStopping
	c.state = stateStopping
	c.exitText = exitText
	c.stopIdleLocked()
	if c.kill != nil {
		c.kill.Stop()
	}
	if m.children[c.model] == c {
		delete(m.children, c.model)
	}
	if wasReady {
		m.notifyLocked()
	}
	m.broadcastLocked()
	m.mu.Unlock()
	close(c.exited)
	switch {
	case startErr != nil:
		log.Warn("model server did not become ready", "err", startErr, "exit", exitText)
	case crashed:
		log.Warn("model server exited", "exit", exitText)
	default:
		log.Info("model server stopped", "exit", exitText)
	}
}

func isClosed(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// runProcess starts c's process, makes it ready when its health URL
// answers 200, and returns when it has exited: why the start failed (nil
// when it became ready or was stopped after) and how the process ended.
func (m *Manager) runProcess(c *child, log *slog.Logger) (startErr error, exitText string) {
	port, err := freePort()
	if err != nil {
		log.Error("model server not started: no free port", "err", err)
		return fmt.Errorf("model %q: %w: no free port", c.model, ErrStartFailed), "not started"
	}
	srv := c.srv.expanded(port, c.model)
	relay, err := adapter.NewOpenAI(adapter.Config{BaseURL: srv.URL, APIKey: m.cfg.APIKey, Timeout: m.cfg.Timeout, MaxConns: m.cfg.MaxConns})
	if err != nil {
		return fmt.Errorf("model %q: %w: %w", c.model, ErrStartFailed, err), "not started"
	}
	defer relay.Close()
	cmd := exec.Command(srv.Cmd[0], srv.Cmd[1:]...)
	cmd.Env = os.Environ()
	for _, k := range slices.Sorted(maps.Keys(srv.Env)) {
		cmd.Env = append(cmd.Env, k+"="+srv.Env[k])
	}
	cmd.SysProcAttr = sysProcAttr()
	outR, outW, err := os.Pipe()
	if err != nil {
		return fmt.Errorf("model %q: %w: %w", c.model, ErrStartFailed, err), "not started"
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		outR.Close()
		outW.Close()
		return fmt.Errorf("model %q: %w: %w", c.model, ErrStartFailed, err), "not started"
	}
	cmd.Stdout, cmd.Stderr = outW, errW
	// One goroutine, locked to its thread, starts and waits for the
	// process: Pdeathsig fires when the thread that forked exits, and this
	// thread lives (locked, running nothing else) until the process has
	// exited.
	started := make(chan error, 1)
	exited := make(chan struct{})
	var waitErr error
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		waitErr = cmd.Wait()
		// Whatever the server left in its group goes with it.
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		close(exited)
	}()
	err = <-started
	outW.Close()
	errW.Close()
	if err != nil {
		outR.Close()
		errR.Close()
		log.Error("model server not started", "cmd", srv.Cmd, "err", err)
		return fmt.Errorf("model %q: %w (see the node's log)", c.model, ErrStartFailed), "not started"
	}
	pid := cmd.Process.Pid
	var readers sync.WaitGroup
	readers.Go(func() { logLines(outR, log.With("stream", "stdout")) })
	readers.Go(func() { logLines(errR, log.With("stream", "stderr")) })
	log.Info("model server started", "pid", pid, "port", port)

	m.mu.Lock()
	c.pid, c.relay = pid, relay
	if c.state == stateStopping {
		m.signalLocked(c)
	}
	m.mu.Unlock()

	startErr = m.awaitHealth(c, srv, exited)
	if startErr != nil {
		m.mu.Lock()
		if c.state != stateStopping {
			c.state = stateStopping // not via stopLocked: stop is closed below
			close(c.stop)
			m.signalLocked(c)
		}
		c.startErr = startErr
		close(c.ready)
		m.mu.Unlock()
	}
	<-exited
	drained := make(chan struct{})
	go func() { readers.Wait(); close(drained) }()
	woke := make(chan struct{})
	t := m.clock.AfterFunc(outputDrain, func() { close(woke) })
	select {
	case <-drained:
	case <-woke:
		outR.Close()
		errR.Close()
		<-drained
	}
	t.Stop()
	outR.Close()
	errR.Close()
	return startErr, exitString(waitErr)
}

// awaitHealth polls srv's health URL until it answers 200 (c becomes
// ready: nil), the process exits, c is stopped or its start timeout passes
// (the error).
func (m *Manager) awaitHealth(c *child, srv Server, exited <-chan struct{}) error {
	timedOut := make(chan struct{})
	deadline := m.clock.AfterFunc(srv.StartTimeout, func() { close(timedOut) })
	defer deadline.Stop()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-exited:
		case <-timedOut:
		case <-c.stop:
		case <-ctx.Done():
		}
		cancel()
	}()
	var last string // the health URL's last answer, for the timeout's log
	for {
		var ok bool
		if ok, last = m.healthy(ctx, srv.HealthURL); ok {
			m.mu.Lock()
			defer m.mu.Unlock()
			if c.state != stateStarting {
				return fmt.Errorf("model %q: %w while starting", c.model, ErrStopped)
			}
			c.state, c.since = stateReady, m.clock.Now()
			close(c.ready)
			if c.inFlight == 0 {
				m.armIdleLocked(c)
			}
			m.notifyLocked()
			m.logger.Info("model server ready", "model", c.model, "pid", c.pid)
			return nil
		}
		woke := make(chan struct{})
		t := m.clock.AfterFunc(healthPoll, func() { close(woke) })
		select {
		case <-woke:
		case <-exited:
		case <-timedOut:
		case <-c.stop:
		}
		t.Stop()
		select {
		case <-exited:
			return fmt.Errorf("model %q: %w while starting", c.model, ErrExited)
		case <-timedOut:
			m.logger.Warn("model server not healthy in time", "model", c.model, "health_url", srv.HealthURL,
				"last_answer", last, "start_timeout", srv.StartTimeout)
			return fmt.Errorf("model %q: %w: no 200 from its health URL within %v (the node's log names the URL and its last answer)",
				c.model, ErrStartTimeout, srv.StartTimeout)
		case <-c.stop:
			return fmt.Errorf("model %q: %w while starting", c.model, ErrStopped)
		default:
		}
	}
}

// healthy reports whether GET u answers 200, and what it answered: its
// status line ("404 Not Found") or the error of the request.
func (m *Manager) healthy(ctx context.Context, u string) (ok bool, answer string) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return false, err.Error()
	}
	resp, err := m.health.Do(req)
	if err != nil {
		return false, err.Error()
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK, resp.Status
}

// logLines logs every line r yields, at info level, until r ends.
func logLines(r io.Reader, log *slog.Logger) {
	br := bufio.NewReaderSize(r, maxLine)
	for {
		line, err := br.ReadSlice('\n')
		if len(line) > 0 {
			if line[len(line)-1] == '\n' {
				line = line[:len(line)-1]
			}
			log.Info(string(line))
		}
		if err != nil && !errors.Is(err, bufio.ErrBufferFull) {
			return
		}
	}
}

// freePort is a TCP port on 127.0.0.1 that was free a moment ago (the
// server may lose it to another process before it binds it: its start
// then fails, and the next run tries another).
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// exitString says how a process ended, from cmd.Wait's error.
func exitString(err error) string {
	var ee *exec.ExitError
	switch {
	case err == nil:
		return "exit status 0"
	case errors.As(err, &ee):
		return ee.String()
	default:
		return err.Error()
	}
}
