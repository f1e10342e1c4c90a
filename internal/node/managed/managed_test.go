package managed

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"iop/internal/node/adapter"
	"iop/internal/testenv"
	"iop/internal/wire/nodev1"
)

// deadline bounds every wait for an event in these tests: generous, they
// start real processes on a loaded machine.
const deadline = 60 * time.Second

// simServer is the Server of a model whose command is this test binary
// playing `iop sim` (serveChild) with extra flags.
func simServer(extra ...string) Server {
	return Server{
		Cmd:       append([]string{os.Args[0], "--listen", "127.0.0.1:${PORT}", "--model", "${MODEL}"}, extra...),
		Env:       map[string]string{envChild: "sim"},
		URL:       "http://127.0.0.1:${PORT}/v1",
		HealthURL: "http://127.0.0.1:${PORT}/v1/models",
	}
}

// logRec is a slog.Handler that keeps every record.
type logRec struct {
	mu      sync.Mutex
	records []slog.Record
	attrs   []slog.Attr
	parent  *logRec
}

func (h *logRec) root() *logRec {
	if h.parent != nil {
		return h.parent.root()
	}
	return h
}
func (h *logRec) Enabled(context.Context, slog.Level) bool { return true }
func (h *logRec) Handle(_ context.Context, r slog.Record) error {
	r = r.Clone()
	r.AddAttrs(h.attrs...)
	root := h.root()
	root.mu.Lock()
	root.records = append(root.records, r)
	root.mu.Unlock()
	return nil
}
func (h *logRec) WithAttrs(as []slog.Attr) slog.Handler {
	return &logRec{attrs: append(append([]slog.Attr{}, h.attrs...), as...), parent: h.root()}
}
func (h *logRec) WithGroup(string) slog.Handler { return h }

// find returns the attributes of every record with message msg.
func (h *logRec) find(msg string) []map[string]string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []map[string]string
	for _, r := range h.records {
		if r.Message != msg {
			continue
		}
		m := map[string]string{}
		r.Attrs(func(a slog.Attr) bool { m[a.Key] = a.Value.String(); return true })
		out = append(out, m)
	}
	return out
}

// pids are the pids of every server started for model.
func (h *logRec) pids(t *testing.T, model string) []int {
	var out []int
	for _, a := range h.find("model server started") {
		if a["model"] == model {
			pid, err := strconv.Atoi(a["pid"])
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, pid)
		}
	}
	return out
}

func newManager(t *testing.T, cfg Config) (*Manager, *logRec) {
	t.Helper()
	logs := &logRec{}
	m, err := New(cfg, Deps{Logger: slog.New(logs)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	return m, logs
}

// sink is a TunnelSink that keeps the answer; onData, when set, is called
// after each chunk.
type sink struct {
	mu     sync.Mutex
	status int
	body   bytes.Buffer
	onData func()
}

func (s *sink) Head(h adapter.TunnelHead) error {
	s.mu.Lock()
	s.status = h.Status
	s.body.Write(h.Body)
	s.mu.Unlock()
	if s.onData != nil && len(h.Body) > 0 {
		s.onData()
	}
	return nil
}

func (s *sink) Data(p []byte) error {
	s.mu.Lock()
	s.body.Write(p)
	s.mu.Unlock()
	if s.onData != nil {
		s.onData()
	}
	return nil
}

// chat is a streamed chat request for model, answered in at most 4 tokens
// (a server's --default-max-tokens lowers it).
func chat(model string) adapter.Request {
	return adapter.Request{Op: nodev1.Operation_OPERATION_CHAT, Stream: true, ServedModel: model,
		Body: []byte(`{"model":"` + model + `","stream":true,"max_tokens":4,"messages":[{"role":"user","content":"hello"}]}`)}
}

// longChat is chat without the token limit: as long as the server's
// --default-max-tokens.
func longChat(model string) adapter.Request {
	return adapter.Request{Op: nodev1.Operation_OPERATION_CHAT, Stream: true, ServedModel: model,
		Body: []byte(`{"model":"` + model + `","stream":true,"messages":[{"role":"user","content":"hello"}]}`)}
}

// run tunnels one chat request for model and checks it succeeded.
func run(t *testing.T, m *Manager, model string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	var s sink
	if err := m.Tunnel(ctx, chat(model), &s); err != nil {
		t.Fatalf("run for %s: %v", model, err)
	}
	if s.status != http.StatusOK || !strings.Contains(s.body.String(), "data: [DONE]") {
		t.Fatalf("run for %s: status %d, body %q", model, s.status, s.body.String())
	}
}

// alive reports whether process pid exists and is not a zombie.
func alive(pid int) bool {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// "pid (comm) S ...": the state follows the last ')'.
	i := bytes.LastIndexByte(data, ')')
	return i < 0 || i+2 >= len(data) || data[i+2] != 'Z'
}

func loadedModels(m *Manager) []string {
	var out []string
	for _, l := range m.Loaded() {
		out = append(out, l.Model)
	}
	return out
}

func TestStartOnDemand(t *testing.T) {
	t.Parallel()
	m, logs := newManager(t, Config{Servers: map[string]Server{"m1": simServer()}})
	var changes [][]Loaded
	m.SetOnChange(func(l []Loaded) { changes = append(changes, l) })
	if got := m.Loaded(); len(got) != 0 {
		t.Fatalf("loaded before any run: %v", got)
	}
	run(t, m, "m1")
	run(t, m, "m1")
	pids := logs.pids(t, "m1")
	if len(pids) != 1 || !alive(pids[0]) {
		t.Fatalf("servers started: %v (want one, alive)", pids)
	}
	if got := m.Loaded(); len(got) != 1 || got[0].Model != "m1" || got[0].PID != pids[0] {
		t.Fatalf("loaded %+v", got)
	}
	m.mu.Lock()
	if len(changes) != 1 || len(changes[0]) != 1 || changes[0][0].Model != "m1" {
		t.Errorf("OnChange calls %+v: want one, with m1", changes)
	}
	m.mu.Unlock()
	// The server's output reaches the log line by line, tagged.
	testenv.EventuallyWithin(t, deadline, "the child's stdout and stderr in the log", func() bool {
		var out, errs bool
		for _, a := range logs.find("child of model m1 starting") {
			out = out || a["model"] == "m1" && a["stream"] == "stdout"
		}
		for _, a := range logs.find("child of model m1 on stderr") {
			errs = errs || a["model"] == "m1" && a["stream"] == "stderr"
		}
		return out && errs
	})
}

func TestConcurrentFirstRunsStartOneServer(t *testing.T) {
	t.Parallel()
	m, logs := newManager(t, Config{Servers: map[string]Server{"m1": simServer("--sleep", "300ms")}, MaxConns: 8})
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() { run(t, m, "m1") })
	}
	wg.Wait()
	if pids := logs.pids(t, "m1"); len(pids) != 1 {
		t.Fatalf("servers started for 8 concurrent first runs: %v, want 1", pids)
	}
}

func TestSlowStartWaitsAndOutlivesACancelledRun(t *testing.T) {
	t.Parallel()
	m, logs := newManager(t, Config{Servers: map[string]Server{"m1": simServer("--sleep", "500ms")}})
	// The first run gives up while the server starts; the start goes on.
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Tunnel(ctx, chat("m1"), &sink{}) }()
	testenv.EventuallyWithin(t, deadline, "the server's start", func() bool { return len(logs.pids(t, "m1")) == 1 })
	cancel()
	if err := <-done; !errors.Is(err, adapter.ErrCancelled) {
		t.Fatalf("cancelled run: %v, want ErrCancelled", err)
	}
	testenv.EventuallyWithin(t, deadline, "the abandoned start to become ready", func() bool { return len(m.Loaded()) == 1 })
	run(t, m, "m1")
	if pids := logs.pids(t, "m1"); len(pids) != 1 {
		t.Fatalf("servers started: %v, want the one whose start a cancelled run left", pids)
	}
}

func TestHealthTimeoutStopsTheServer(t *testing.T) {
	t.Parallel()
	srv := simServer("--never-listen")
	srv.StartTimeout = 300 * time.Millisecond
	m, logs := newManager(t, Config{Servers: map[string]Server{"m1": srv}, KillGrace: 5 * time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	err := m.Tunnel(ctx, chat("m1"), &sink{})
	var aerr *adapter.Error
	if !errors.As(err, &aerr) || aerr.Status != http.StatusGatewayTimeout || !strings.Contains(aerr.Message, `"m1"`) || !strings.Contains(aerr.Message, "health") {
		t.Fatalf("run: %v, want a 504 naming the model and its health URL", err)
	}
	pids := logs.pids(t, "m1")
	if len(pids) != 1 {
		t.Fatalf("servers started: %v", pids)
	}
	// The node's log says where it asked and what it got, which the
	// client's error leaves out (the server's address is the node's).
	if got := logs.find("model server not healthy in time"); len(got) != 1 || !strings.HasPrefix(got[0]["health_url"], "http://127.0.0.1:") ||
		strings.Contains(got[0]["health_url"], "${PORT}") || got[0]["last_answer"] == "" {
		t.Errorf("timeout logged as %v, want the health URL (its port in place) and its last answer", got)
	}
	// The run's error comes when the stop begins; the process and its
	// entry go once it has exited.
	testenv.EventuallyWithin(t, deadline, "the unhealthy server to be gone", func() bool {
		m.mu.Lock()
		defer m.mu.Unlock()
		return !alive(pids[0]) && len(m.children) == 0
	})
	if len(m.Loaded()) != 0 {
		t.Fatalf("loaded %v", m.Loaded())
	}
}

func TestTTLStopsAnIdleServer(t *testing.T) {
	t.Parallel()
	srv := simServer()
	srv.TTL = 200 * time.Millisecond
	m, logs := newManager(t, Config{Servers: map[string]Server{"m1": srv}})
	run(t, m, "m1")
	pid := logs.pids(t, "m1")[0]
	testenv.EventuallyWithin(t, deadline, "the idle server to stop", func() bool { return !alive(pid) && len(m.Loaded()) == 0 })
	if got := logs.find("stopping an idle model server"); len(got) != 1 {
		t.Fatalf("idle stops logged: %v", got)
	}
	run(t, m, "m1") // starts it again
	if pids := logs.pids(t, "m1"); len(pids) != 2 {
		t.Fatalf("servers started: %v, want 2", pids)
	}
}

func TestSwapAtMaxLoadedStopsTheLeastRecentlyUsed(t *testing.T) {
	t.Parallel()
	m, logs := newManager(t, Config{Servers: map[string]Server{"a": simServer(), "b": simServer()}, MaxLoaded: 1})
	run(t, m, "a")
	pa := logs.pids(t, "a")[0]
	run(t, m, "b")
	if alive(pa) {
		t.Fatalf("server of a (pid %d) still runs after the swap to b", pa)
	}
	if got := loadedModels(m); len(got) != 1 || got[0] != "b" {
		t.Fatalf("loaded %v, want [b]", got)
	}
}

func TestSwapWaitsForTheRunInFlight(t *testing.T) {
	t.Parallel()
	m, logs := newManager(t, Config{Servers: map[string]Server{
		"a": simServer("--tokens-per-second", "20", "--default-max-tokens", "20"), "b": simServer(),
	}, MaxLoaded: 1})
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	first := make(chan struct{})
	var once sync.Once
	sa := &sink{onData: func() { once.Do(func() { close(first) }) }}
	aDone := make(chan error, 1)
	go func() { aDone <- m.Tunnel(ctx, longChat("a"), sa) }()
	<-first
	bDone := make(chan error, 1)
	go func() { bDone <- m.Tunnel(ctx, chat("b"), &sink{}) }()
	if err := <-aDone; err != nil {
		t.Fatalf("run for a, in flight when b arrived: %v", err)
	}
	if !strings.Contains(sa.body.String(), "data: [DONE]") {
		t.Fatalf("run for a was cut: %q", sa.body.String())
	}
	if err := <-bDone; err != nil {
		t.Fatalf("run for b: %v", err)
	}
	if len(logs.pids(t, "b")) != 1 {
		t.Fatal("b never started")
	}
}

func TestCrashMidStreamFailsTheRunAndRestarts(t *testing.T) {
	t.Parallel()
	m, logs := newManager(t, Config{Servers: map[string]Server{"m1": simServer("--tokens-per-second", "10", "--default-max-tokens", "200")}})
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	var once sync.Once
	s := &sink{onData: func() {
		once.Do(func() {
			_ = syscall.Kill(logs.pids(t, "m1")[0], syscall.SIGKILL)
		})
	}}
	err := m.Tunnel(ctx, longChat("m1"), s)
	var aerr *adapter.Error
	if !errors.As(err, &aerr) || aerr.Status != http.StatusBadGateway || !strings.Contains(aerr.Message, "exited") {
		t.Fatalf("run whose server was killed: %v, want a 502 saying the server exited", err)
	}
	run(t, m, "m1")
	if pids := logs.pids(t, "m1"); len(pids) != 2 || pids[0] == pids[1] {
		t.Fatalf("servers started: %v, want a new one after the crash", pids)
	}
}

func TestCloseLeavesNoServer(t *testing.T) {
	t.Parallel()
	m, logs := newManager(t, Config{Servers: map[string]Server{"a": simServer(), "b": simServer()}, MaxLoaded: 2})
	run(t, m, "a")
	run(t, m, "b")
	pids := append(logs.pids(t, "a"), logs.pids(t, "b")...)
	m.Close()
	for _, pid := range pids {
		if alive(pid) {
			t.Errorf("server pid %d alive after Close", pid)
		}
	}
	if len(m.Loaded()) != 0 {
		t.Errorf("loaded after Close: %v", m.Loaded())
	}
}

// serveNode plays a node for TestKilledNodeLeavesNoServer: it starts the
// server of model m1, prints its pid and waits to be killed.
func serveNode([]string) int {
	logs := &logRec{}
	m, err := New(Config{Servers: map[string]Server{"m1": simServer()}}, Deps{Logger: slog.New(logs)})
	if err != nil {
		fmt.Println(err)
		return 1
	}
	var s sink
	if err := m.Tunnel(context.Background(), chat("m1"), &s); err != nil {
		fmt.Println(err)
		return 1
	}
	for _, a := range logs.find("model server started") {
		fmt.Printf("pid %s\n", a["pid"])
	}
	select {}
}

func TestKilledNodeLeavesNoServer(t *testing.T) {
	t.Parallel()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), envChild+"=node")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("node's first line: %q, %v", line, err)
	}
	var pid int
	if _, err := fmt.Sscanf(line, "pid %d", &pid); err != nil {
		t.Fatalf("node said %q", line)
	}
	if !alive(pid) {
		t.Fatalf("server pid %d not running", pid)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	testenv.EventuallyWithin(t, deadline, "the server of a killed node to die", func() bool { return !alive(pid) })
}

func TestLoadAndUnload(t *testing.T) {
	t.Parallel()
	m, logs := newManager(t, Config{Servers: map[string]Server{"m1": simServer()}})
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	if err := m.Load(ctx, "m1"); err != nil {
		t.Fatal(err)
	}
	if got := loadedModels(m); len(got) != 1 || got[0] != "m1" {
		t.Fatalf("loaded %v after Load", got)
	}
	if err := m.Load(ctx, "nope"); !errors.Is(err, ErrUnknownModel) {
		t.Fatalf("Load of an unknown model: %v", err)
	}
	// A run in flight keeps it.
	c, err := m.acquire(ctx, "m1")
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Unload("m1"); !errors.Is(err, ErrBusy) {
		t.Fatalf("Unload with a run in flight: %v, want ErrBusy", err)
	}
	m.release(c)
	if err := m.Unload("m1"); err != nil {
		t.Fatal(err)
	}
	pid := logs.pids(t, "m1")[0]
	if len(m.Loaded()) != 0 {
		t.Fatalf("loaded %v after Unload", m.Loaded())
	}
	testenv.EventuallyWithin(t, deadline, "the unloaded server to exit", func() bool { return !alive(pid) })
}
