package deploy

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"iop/internal/testenv"
)

// TestHelmChart runs the tests of the chart deploy/helm/iop, which live in
// the Go module deploy/helm/check (so that iop's go.mod does not take the
// Kubernetes modules): helm lint and helm template with several values
// sets, every rendered object decoded strictly into the Kubernetes API
// types, the config files it renders passed through iop check. helm comes
// from $IOP_HELM_BIN (make test sets it), PATH, or what make helm
// installed in ~/.cache/iop.
func TestHelmChart(t *testing.T) {
	t.Parallel()
	helm := os.Getenv("IOP_HELM_BIN")
	if helm == "" {
		helm, _ = exec.LookPath("helm")
	}
	if home, err := os.UserHomeDir(); helm == "" && err == nil {
		// What make helm installed, whatever its version.
		if found, _ := filepath.Glob(filepath.Join(home, ".cache", "iop", "helm-*", "helm")); len(found) > 0 {
			helm = found[len(found)-1]
		}
	}
	if helm == "" {
		testenv.Missing(t, "helm is not installed: `make helm` installs it (go install helm.sh/helm/v4/cmd/helm) into ~/.cache/iop; or set IOP_HELM_BIN")
	}
	cmd := exec.Command("go", "test", "-race", "-count=1", "-v", "./...")
	cmd.Dir = "helm/check"
	// The module's tests must run, not skip: helm is there.
	cmd.Env = append(os.Environ(), "IOP_HELM_BIN="+helm, "IOP_BIN="+buildIOP(t), testenv.StrictEnv+"=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go test in deploy/helm/check: %v\n%s", err, out)
	}
	if strings.Contains(string(out), "--- SKIP") {
		t.Fatalf("a chart test skipped:\n%s", out)
	}
	for _, line := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "--- PASS") || strings.HasPrefix(line, "ok") {
			t.Log(line)
		}
	}
}
