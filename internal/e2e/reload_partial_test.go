package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"iop/internal/auth"
	"iop/internal/e2e/harness"
	"iop/internal/testenv"
)

// TestRegression_HalfWrittenConfigNeverOpensAPI runs `iop edge --config
// FILE` with a client key and an admin key, then writes the file in two
// parts 1.5 s apart, the first without the keys: the watcher reads the
// half file, the reload is refused (it would remove every key), and
// neither the client API nor the admin API ever answers without a key;
// the whole file is then applied.
func TestRegression_HalfWrittenConfigNeverOpensAPI(t *testing.T) {
	harness.Parallel(t)
	dir := t.TempDir()
	path := filepath.Join(dir, "edge.yaml")
	_, hash := auth.Generate()
	adminSecret, adminHash := auth.Generate()
	head := "tokens: [join-1]\nmodels:\n  m: {targets: [m]}\n"
	tail := fmt.Sprintf("keys:\n  - {name: alice, hash: %q}\nadmin_keys:\n  - {name: ops, hash: %q}\n", hash, adminHash)
	writeAtomically(t, path, head+tail)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	edgeCmd := harness.StartCommand(t, ctx, "edge", "--config", path, "--listen", "127.0.0.1:0", "--node-listen", "127.0.0.1:0", "--database", ":memory:", "--log-format", "json")
	base := edgeCmd.WaitLog(t, "edge ready")["http"].(string)

	get := func(path, secret string) int {
		t.Helper()
		req, err := http.NewRequest(http.MethodGet, base+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		if secret != "" {
			req.Header.Set("Authorization", "Bearer "+secret)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	closed := func(when string) {
		t.Helper()
		if s := get("/v1/models", ""); s != http.StatusUnauthorized {
			t.Fatalf("%s: GET /v1/models without a key: %d, want 401\n%s", when, s, edgeCmd.Log.String())
		}
		if s := get("/admin/v1/providers", ""); s != http.StatusUnauthorized {
			t.Fatalf("%s: GET /admin/v1/providers without a key: %d, want 401\n%s", when, s, edgeCmd.Log.String())
		}
	}
	closed("before")

	// The first part, in place (truncate and write), as a slow writer does.
	if err := os.WriteFile(path, []byte(head), 0o600); err != nil {
		t.Fatal(err)
	}
	refusedAt := time.Time{}
	testenv.Eventually(t, "the half file's reload refused", func() bool {
		closed("half written")
		for _, l := range harness.JSONLines(t, edgeCmd.Log.String()) {
			if l["msg"] == "config reload refused; the running config stays" {
				if err, _ := l["err"].(string); !strings.Contains(err, "no keys") || !strings.Contains(err, "insecure_open") {
					t.Fatalf("refusal line %v", l)
				}
				refusedAt = time.Now()
				return true
			}
		}
		return false
	})
	// The rest of the file 1.5 s after the first part.
	for time.Since(refusedAt) < 500*time.Millisecond {
		closed("half written")
		time.Sleep(20 * time.Millisecond)
	}
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(tail); err != nil {
		t.Fatal(err)
	}
	f.Close()
	testenv.Eventually(t, "the whole file reloaded", func() bool {
		closed("whole file")
		return countReloads(t, edgeCmd, "file changed") == 1
	})
	closed("after")
	if s := get("/admin/v1/providers", adminSecret); s != http.StatusOK {
		t.Fatalf("GET /admin/v1/providers with the admin key: %d", s)
	}
	l := lastLog(t, edgeCmd, "config reloaded")
	for _, k := range []string{"keys_removed", "admin_keys_removed"} {
		if v := l[k]; v != nil && fmt.Sprint(v) != "[]" {
			t.Errorf("reload line %v", l)
		}
	}
}
