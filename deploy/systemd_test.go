package deploy

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"iop/internal/testenv"
)

var iopBinary struct {
	once sync.Once
	path string
	out  []byte
	err  error
}

// buildIOP builds iop/cmd/iop once into a temporary directory.
func buildIOP(t *testing.T) string {
	t.Helper()
	iopBinary.once.Do(func() {
		dir, err := os.MkdirTemp("", "iop-deploy-test-")
		if err != nil {
			iopBinary.err = err
			return
		}
		iopBinary.path = filepath.Join(dir, "iop")
		iopBinary.out, iopBinary.err = exec.Command("go", "build", "-o", iopBinary.path, "iop/cmd/iop").CombinedOutput()
	})
	if iopBinary.err != nil {
		t.Fatalf("go build iop/cmd/iop: %v\n%s", iopBinary.err, iopBinary.out)
	}
	return iopBinary.path
}

// TestSystemdUnitsVerify runs systemd-analyze verify on the edge's and the
// node's units, with ExecStart pointed at a freshly built iop (verify
// checks that the command exists), and fails on any complaint, also on
// the warnings (an unknown key) that verify does not count as errors.
// It also checks what the units promise: reload by SIGHUP, a stop
// timeout above the 30 s drain, SIGTERM to the main process alone.
func TestSystemdUnitsVerify(t *testing.T) {
	t.Parallel()
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		testenv.Missing(t, "systemd-analyze is not installed (Debian's systemd package; make test installs it)")
	}
	bin := buildIOP(t)
	dir := t.TempDir()
	var units []string
	for _, name := range []string{"iop-edge.service", "iop-node.service"} {
		data, err := os.ReadFile(filepath.Join("systemd", name))
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{"ExecReload=/bin/kill -HUP $MAINPID", "KillSignal=SIGTERM", "KillMode=mixed", "TimeoutStopSec=45s", "NoNewPrivileges=yes", "ProtectSystem=strict"} {
			if !bytes.Contains(data, []byte("\n"+want+"\n")) {
				t.Errorf("%s lacks %s", name, want)
			}
		}
		data = bytes.ReplaceAll(data, []byte("/usr/local/bin/iop"), []byte(bin))
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
		units = append(units, p)
	}
	cmd := exec.Command(analyze, append([]string{"verify"}, units...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if msg := strings.TrimSpace(stderr.String() + string(out)); err != nil || msg != "" {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, msg)
	}
}
