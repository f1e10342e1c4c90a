package ollamatest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"iop/internal/testenv"
)

// Version is the Ollama release the tests run against: test/ollama/build.sh
// builds it (its OLLAMA_VERSION default must be the same; a test checks).
// v0.17.4 is the newest the Go module proxy serves here; it reports the
// tools and thinking capabilities in /api/show, parses thinking into its own
// field, and serves the OpenAI-compatible /v1 API with `reasoning`.
const Version = "v0.17.4"

// The environment variables that tell tests where the binary is and, besides
// testenv.StrictEnv (IOP_TEST_STRICT), that a missing one fails them (see
// the package doc).
const (
	EnvBinary  = "IOP_OLLAMA_BIN"
	EnvRequire = "IOP_REQUIRE_OLLAMA"
)

// readyTimeout bounds the wait for a started server to answer, and stopTimeout
// the wait for a stopped one to exit before it is killed. Neither is asserted:
// they turn a hang into a failure on a loaded machine.
const (
	readyTimeout = 2 * time.Minute
	stopTimeout  = 30 * time.Second
)

// Binary returns the path of the Ollama binary: $IOP_OLLAMA_BIN if set, else
// where test/ollama/build.sh puts it: $IOP_CACHE/ollama-VERSION/ollama, with
// IOP_CACHE defaulting to $XDG_CACHE_HOME/iop (XDG_CACHE_HOME to ~/.cache). When
// it is not an executable file the test is skipped (testenv.Missing), or
// fails under testenv.Strict (IOP_TEST_STRICT=1, as make test sets it) or
// with $IOP_REQUIRE_OLLAMA "1".
func Binary(t testing.TB) string {
	t.Helper()
	path := os.Getenv(EnvBinary)
	if path == "" {
		cache := os.Getenv("IOP_CACHE")
		if cache == "" {
			cache = os.Getenv("XDG_CACHE_HOME")
			if cache == "" {
				home, _ := os.UserHomeDir()
				cache = filepath.Join(home, ".cache")
			}
			cache = filepath.Join(cache, "iop")
		}
		path = filepath.Join(cache, "ollama-"+Version, "ollama")
	}
	st, err := os.Stat(path)
	if err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
		return path
	}
	msg := fmt.Sprintf("no Ollama binary at %s (%v): `make test` builds it (test/ollama/build.sh); set %s to use another", path, err, EnvBinary)
	if os.Getenv(EnvRequire) == "1" {
		t.Fatalf("%s; %s=1 makes this a failure", msg, EnvRequire)
	}
	testenv.Missing(t, "%s", msg)
	return ""
}

// Server is one `ollama serve` process started by [Start].
type Server struct {
	// URL is the server's base URL, "http://127.0.0.1:PORT", with no
	// trailing slash: the native API is under URL+"/api", the
	// OpenAI-compatible one under URL+"/v1".
	URL string
	// Addr is its host:port (OLLAMA_HOST).
	Addr string
	// ModelsDir is its OLLAMA_MODELS folder; it outlives Stop.
	ModelsDir string
	// Client is an HTTP client for requests to it, with no timeout.
	Client *http.Client

	bin     string
	env     []string
	logPath string

	mu     sync.Mutex    // guards the fields below
	cmd    *exec.Cmd     // the running process, nil when stopped
	exited chan struct{} // closed when cmd has exited
}

// BeforeStart, when set, is called by Start with its test first: a test
// harness that runs tests in parallel sets it to check that t may start
// an Ollama server now. Two servers loading models at once can pick the
// same port for their runners (each binds port 0, closes it, and starts
// the runner on it) and talk to each other's runner.
var BeforeStart func(t testing.TB)

// Start starts `ollama serve` for the test and waits until it answers; it is
// stopped when the test ends. extraEnv entries ("KEY=VALUE", for example
// "OLLAMA_NUM_PARALLEL=2") are added to its environment after the harness's
// own (OLLAMA_HOST, OLLAMA_MODELS, HOME, OLLAMA_DEBUG=1, OLLAMA_NOPRUNE=1,
// OLLAMA_LOAD_TIMEOUT=1m); every other OLLAMA_* variable of the test's
// environment is dropped. Start skips or fails the test as [Binary] does
// when there is no binary.
func Start(t testing.TB, extraEnv ...string) *Server {
	t.Helper()
	if BeforeStart != nil {
		BeforeStart(t)
	}
	bin := Binary(t)
	dir := t.TempDir()
	s := &Server{
		ModelsDir: filepath.Join(dir, "models"),
		Client:    &http.Client{Transport: &http.Transport{}},
		bin:       bin,
		logPath:   filepath.Join(dir, "ollama.log"),
	}
	home := filepath.Join(dir, "home")
	for _, d := range []string{s.ModelsDir, home} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("ollama log (%s), last part:\n%s", s.logPath, tail(s.Log(), 16<<10))
		}
		s.Stop()
		s.Client.CloseIdleConnections()
	})
	// The port is free when picked but another process may take it before
	// Ollama binds it; then Ollama exits and another port is tried.
	var err error
	for range 3 {
		port, perr := freePort()
		if perr != nil {
			t.Fatal(perr)
		}
		s.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		s.URL = "http://" + s.Addr
		s.env = serverEnv(s.Addr, s.ModelsDir, home, extraEnv)
		if err = s.start(); err == nil {
			return s
		}
		if !errors.Is(err, errExited) {
			break
		}
	}
	t.Fatalf("starting ollama serve: %v\nollama log:\n%s", err, tail(s.Log(), 16<<10))
	return nil
}

// Restart starts the server again, on the same port and models folder, after
// [Server.Stop]; it does nothing if it is running. It fails the test if the
// server does not come up.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	if err := s.start(); err != nil {
		t.Fatalf("restarting ollama serve on %s: %v\nollama log:\n%s", s.Addr, err, tail(s.Log(), 16<<10))
	}
}

// Stop stops the server: SIGTERM, and after stopTimeout SIGKILL to its
// process group (the serve process and the model runners it started). It
// returns once the process has exited; it does nothing if it is not running.
// Requests in flight fail; the models folder is kept for [Server.Restart].
func (s *Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopLocked()
}

func (s *Server) stopLocked() {
	if s.cmd == nil {
		return
	}
	pid := s.cmd.Process.Pid
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.exited:
	case <-time.After(stopTimeout):
		_ = syscall.Kill(-pid, syscall.SIGKILL)
		<-s.exited
	}
	// A runner that outlived the serve process is still in its group.
	_ = syscall.Kill(-pid, syscall.SIGKILL)
	s.cmd, s.exited = nil, nil
	s.Client.CloseIdleConnections()
	s.appendLog("---- ollamatest: stopped ----\n")
}

// errExited is returned by start when the process exits before answering.
var errExited = errors.New("ollama serve exited before it answered")

// start runs the process and waits until GET /api/version answers 200.
func (s *Server) start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		return nil
	}
	logf, err := os.OpenFile(s.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close() // the child has its own descriptor
	fmt.Fprintf(logf, "---- ollamatest: starting %s serve on %s ----\n", s.bin, s.Addr)
	cmd := exec.Command(s.bin, "serve")
	cmd.Env = s.env
	cmd.Stdout, cmd.Stderr = logf, logf
	// Its own process group, so that Stop can kill the runners with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait() // sole writer of cmd's exit status
		close(exited)
	}()
	s.cmd, s.exited = cmd, exited

	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	deadline := time.Now().Add(readyTimeout)
	for {
		if s.answers() {
			return nil
		}
		select {
		case <-exited:
			s.cmd, s.exited = nil, nil
			return fmt.Errorf("%w (%s)", errExited, cmd.ProcessState)
		case <-tick.C:
		}
		if time.Now().After(deadline) {
			s.stopLocked()
			return fmt.Errorf("ollama serve did not answer on %s within %v", s.Addr, readyTimeout)
		}
	}
}

// answers reports whether GET /api/version answers 200 within a second.
func (s *Server) answers() bool {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.URL+"/api/version", nil)
	if err != nil {
		return false
	}
	resp, err := s.Client.Do(req)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// Log returns everything the server has written so far (stdout and stderr,
// across restarts, each start and stop marked by a "---- ollamatest:" line).
func (s *Server) Log() string {
	b, _ := os.ReadFile(s.logPath)
	return string(b)
}

func (s *Server) appendLog(line string) {
	if f, err := os.OpenFile(s.logPath, os.O_WRONLY|os.O_APPEND, 0); err == nil {
		f.WriteString(line)
		f.Close()
	}
}

// serverEnv is the test's environment without OLLAMA_* variables, plus the
// server's own and extra.
func serverEnv(addr, models, home string, extra []string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "OLLAMA_") || strings.HasPrefix(kv, "HOME=") {
			continue
		}
		env = append(env, kv)
	}
	env = append(env,
		"OLLAMA_HOST="+addr,
		"OLLAMA_MODELS="+models,
		"HOME="+home,
		"OLLAMA_DEBUG=1",
		"OLLAMA_NOPRUNE=1",
		// A runner that never comes up fails its load in a minute, not
		// Ollama's default five: the models here load in well under a
		// second.
		"OLLAMA_LOAD_TIMEOUT=1m",
	)
	return append(env, extra...)
}

// freePort returns a loopback TCP port that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// tail is the last n bytes of s.
func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	s = s[len(s)-n:]
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[i+1:]
	}
	return "…\n" + s
}

// LogSince returns the part of the log written after mark, a length returned
// by an earlier len(s.Log()); it lets a test look only at what one request
// caused.
func (s *Server) LogSince(mark int) string {
	l := s.Log()
	if mark > len(l) {
		return ""
	}
	return l[mark:]
}

// trimJSON shortens a response body for an error message.
func trimJSON(b []byte) string {
	b = bytes.TrimSpace(b)
	if len(b) > 512 {
		return string(b[:512]) + "…"
	}
	return string(b)
}
