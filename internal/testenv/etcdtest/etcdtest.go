// Package etcdtest starts a real etcd cluster of three members for tests,
// each member its own `etcd` process (Debian's etcd-server, 3.4.x, which
// `make test` installs when missing) on free loopback ports with a
// temporary data directory. A test can kill one member (SIGKILL) and start
// it again. Without an etcd binary on PATH (or in IOP_ETCD_BIN), the test
// is skipped through package testenv (a failure under IOP_TEST_STRICT=1).
//
// Only tests import this package.
package etcdtest

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"iop/internal/testenv"
)

// BinEnv names the environment variable that may give the etcd binary's path.
const BinEnv = "IOP_ETCD_BIN"

// Members is the cluster's size.
const Members = 3

// Cluster is a running three-member etcd cluster. Its methods are safe for
// concurrent use.
type Cluster struct {
	t       testing.TB
	bin     string
	dir     string
	initial string // --initial-cluster
	members [Members]*member
}

type member struct {
	name       string
	clientURL  string
	peerURL    string
	dataDir    string
	mu         sync.Mutex
	cmd        *exec.Cmd
	done       chan struct{} // closed when cmd exited
	logs       *bytes.Buffer // guarded by mu
	logsWriter *lockedWriter
}

type lockedWriter struct {
	mu *sync.Mutex
	b  *bytes.Buffer
}

func (w *lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

// Bin is the etcd binary's path: IOP_ETCD_BIN, else `etcd` on PATH; "" if
// neither.
func Bin() string {
	if b := os.Getenv(BinEnv); b != "" {
		return b
	}
	if p, err := exec.LookPath("etcd"); err == nil {
		return p
	}
	return ""
}

// Start starts three members and waits (up to 60 s) until each answers its
// /health with a leader. It stops them at t's cleanup.
func Start(t testing.TB) *Cluster {
	t.Helper()
	bin := Bin()
	if bin == "" {
		testenv.Missing(t, "etcd is not installed (Debian's etcd-server; `make etcd` installs it, or set %s)", BinEnv)
	}
	// A free port picked here may be taken by another process before etcd
	// binds it (the machine is shared): then the cluster starts again on
	// new ports, a few times.
	var c *Cluster
	for attempt := 1; ; attempt++ {
		c = &Cluster{t: t, bin: bin, dir: t.TempDir()}
		var initial []string
		for i := range c.members {
			name := fmt.Sprintf("etcd-%d", i+1)
			m := &member{
				name:      name,
				clientURL: "http://" + freeAddr(t),
				peerURL:   "http://" + freeAddr(t),
				dataDir:   filepath.Join(c.dir, name),
				logs:      &bytes.Buffer{},
			}
			m.logsWriter = &lockedWriter{mu: &m.mu, b: m.logs}
			c.members[i] = m
			initial = append(initial, name+"="+m.peerURL)
		}
		c.initial = strings.Join(initial, ",")
		for i := range c.members {
			c.start(i, "new")
		}
		if err := c.waitAll(); err == nil {
			break
		} else if attempt == 3 || !strings.Contains(err.Error(), "address already in use") {
			c.stopAll()
			t.Fatal(err)
		}
		c.stopAll()
	}
	t.Cleanup(c.stopAll)
	return c
}

// waitAll waits (up to 60 s) until every member is healthy, or returns
// why not with the log of the member that failed.
func (c *Cluster) waitAll() error {
	for i := range c.members {
		if err := c.healthyErr(i); err != nil {
			return err
		}
	}
	return nil
}

// freeAddr is an address for a member to listen on, also when it
// restarts (testenv.ProcessAddr).
func freeAddr(t testing.TB) string {
	t.Helper()
	return testenv.ProcessAddr(t)
}

func (c *Cluster) start(i int, state string) {
	m := c.members[i]
	cmd := exec.Command(c.bin,
		"--name", m.name,
		"--data-dir", m.dataDir,
		"--listen-client-urls", m.clientURL,
		"--advertise-client-urls", m.clientURL,
		"--listen-peer-urls", m.peerURL,
		"--initial-advertise-peer-urls", m.peerURL,
		"--initial-cluster", c.initial,
		"--initial-cluster-state", state,
		"--initial-cluster-token", "iop-test",
		"--heartbeat-interval", "50",
		"--election-timeout", "500",
		"--logger", "zap",
		"--log-level", "warn",
	)
	cmd.Env = append(os.Environ(), "ETCD_UNSUPPORTED_ARCH=")
	cmd.Stdout = m.logsWriter
	cmd.Stderr = m.logsWriter
	if err := cmd.Start(); err != nil {
		c.t.Fatalf("etcdtest: start %s: %v", m.name, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	m.mu.Lock()
	m.cmd, m.done = cmd, done
	m.mu.Unlock()
}

// Endpoints are the client URLs of every member ("http://127.0.0.1:PORT").
func (c *Cluster) Endpoints() []string {
	out := make([]string, 0, Members)
	for _, m := range c.members {
		out = append(out, m.clientURL)
	}
	return out
}

// Kill SIGKILLs member i (0..2) and waits until it exited.
func (c *Cluster) Kill(i int) {
	m := c.members[i]
	m.mu.Lock()
	cmd, done := m.cmd, m.done
	m.cmd = nil
	m.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	<-done
}

// Restart starts member i again on its data directory (after Kill) and
// waits until it is healthy.
func (c *Cluster) Restart(i int) {
	c.start(i, "existing")
	c.WaitHealthy(i)
}

// WaitHealthy waits (up to 60 s) until member i answers /health with
// {"health":"true"}; it fails the test with the member's log otherwise.
func (c *Cluster) WaitHealthy(i int) {
	if err := c.healthyErr(i); err != nil {
		c.t.Fatal(err)
	}
}

func (c *Cluster) healthyErr(i int) error {
	m := c.members[i]
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		if healthy(ctx, m.clientURL) {
			return nil
		}
		select {
		case <-ctx.Done():
			m.mu.Lock()
			logs := m.logs.String()
			m.mu.Unlock()
			return fmt.Errorf("etcdtest: %s not healthy within 60s; its log:\n%s", m.name, logs)
		case <-m.doneChan():
			m.mu.Lock()
			logs := m.logs.String()
			m.mu.Unlock()
			return fmt.Errorf("etcdtest: %s exited; its log:\n%s", m.name, logs)
		case <-tick.C:
		}
	}
}

func (m *member) doneChan() <-chan struct{} {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.done
}

func healthy(ctx context.Context, url string) bool {
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(rctx, http.MethodGet, url+"/health", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	_, _ = b.ReadFrom(resp.Body)
	return resp.StatusCode == http.StatusOK && strings.Contains(b.String(), `"health":"true"`)
}

func (c *Cluster) stopAll() {
	for i := range c.members {
		c.Kill(i)
	}
}
