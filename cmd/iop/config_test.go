package main

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"

	"iop/internal/edge"
	"iop/internal/process"
)

// A flag the user set overrides the file; the file overrides defaults.
func TestLoadConfigFlagsOverrideFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "dev.yaml")
	if err := os.WriteFile(path, []byte("listen: 127.0.0.1:9999\nsim_capacity: 2\nsim_ttft: 1s\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := process.DevConfig{Listen: "default", SimCapacity: 4, SimTTFT: 5 * time.Second}
	cmd := &cobra.Command{Use: "x"}
	cmd.Flags().StringVar(&cfg.Listen, "listen", cfg.Listen, "")
	cmd.Flags().IntVar(&cfg.SimCapacity, "sim-capacity", cfg.SimCapacity, "")
	cmd.Flags().DurationVar(&cfg.SimTTFT, "sim-ttft", cfg.SimTTFT, "")
	if err := cmd.Flags().Parse([]string{"--sim-capacity", "7"}); err != nil {
		t.Fatal(err)
	}
	if err := loadConfig(cmd, path, &cfg); err != nil {
		t.Fatal(err)
	}
	if cfg.Listen != "127.0.0.1:9999" || cfg.SimCapacity != 7 || cfg.SimTTFT != time.Second {
		t.Fatalf("config %+v", cfg)
	}
}

func TestLoadConfigRejectsUnknownFields(t *testing.T) {
	path := filepath.Join(t.TempDir(), "edge.yaml")
	if err := os.WriteFile(path, []byte("lisen: 127.0.0.1:1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var cfg process.DevConfig
	if err := loadConfig(&cobra.Command{Use: "x"}, path, &cfg); err == nil {
		t.Fatal("a misspelt field was accepted")
	}
}

// The edge's --max-retries flag overrides the file's max_retries, also
// with 0 (which disables retries, unlike an unset field).
func TestEdgeMaxRetriesFlag(t *testing.T) {
	path := filepath.Join(t.TempDir(), "edge.yaml")
	if err := os.WriteFile(path, []byte("max_retries: 2\ncircuit_breaker: {cool_down: 1m}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want int
	}{{nil, 2}, {[]string{"--max-retries", "0"}, 0}} {
		cfg := edge.DefaultConfig()
		cmd := &cobra.Command{Use: "x"}
		cmd.Flags().Var(optionalInt{&cfg.MaxRetries}, "max-retries", "")
		if err := cmd.Flags().Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		if err := loadConfig(cmd, path, &cfg); err != nil {
			t.Fatal(err)
		}
		if cfg.Retries() != tc.want || cfg.CircuitBreaker.CoolDown != time.Minute {
			t.Errorf("%v: retries %d, cool-down %s; want %d, 1m", tc.args, cfg.Retries(), cfg.CircuitBreaker.CoolDown, tc.want)
		}
	}
}

// TestBadInput_MaxBodyBytesConfig: the limit's default is 32 MiB, and it is
// set by max_body_bytes in the edge's config and --max-body-bytes on edge
// and dev.
func TestBadInput_MaxBodyBytesConfig(t *testing.T) {
	if got := process.DefaultEdgeFile().MaxBodyBytes; got != 32<<20 {
		t.Fatalf("default max_body_bytes %d, want 32 MiB", got)
	}
	logLevel := "info"
	for _, cmd := range []string{"edge", "dev"} {
		c := newEdgeCommand(&logLevel)
		if cmd == "dev" {
			c = newDevCommand(&logLevel)
		}
		if c.Flags().Lookup("max-body-bytes") == nil {
			t.Errorf("iop %s has no --max-body-bytes", cmd)
		}
	}
	path := t.TempDir() + "/edge.yaml"
	if err := os.WriteFile(path, []byte("max_body_bytes: 12345\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := process.DefaultEdgeFile()
	if err := loadConfig(&cobra.Command{Use: "x"}, path, &cfg); err != nil || cfg.MaxBodyBytes != 12345 {
		t.Fatalf("max_body_bytes from YAML: %d, %v", cfg.MaxBodyBytes, err)
	}
}

// iop version prints the version, commit and date set with -ldflags, as
// make build sets them.
func TestVersionCommandPrintsLdflags(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "iop")
	ld := "-X main.version=1.2.3 -X main.commit=0123abc -X main.date=2026-12-06T05:00:00Z"
	if out, err := exec.Command("go", "build", "-ldflags", ld, "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, "version").CombinedOutput()
	if err != nil {
		t.Fatalf("iop version: %v\n%s", err, out)
	}
	want := "iop 1.2.3\ncommit 0123abc\nbuilt 2026-12-06T05:00:00Z\n"
	if !strings.HasPrefix(string(out), want) || !strings.Contains(string(out), "go1.") {
		t.Fatalf("iop version printed\n%s\nwant it to start with\n%s", out, want)
	}
}

// Without -ldflags, iop version falls back to the toolchain's record and
// never prints an empty field.
func TestVersionCommandWithoutLdflags(t *testing.T) {
	var b strings.Builder
	cmd := newVersionCommand()
	cmd.SetOut(&b)
	cmd.SetArgs(nil)
	if err := cmd.Execute(); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) != 4 || !strings.HasPrefix(lines[0], "iop ") || !strings.HasPrefix(lines[1], "commit ") || !strings.HasPrefix(lines[2], "built ") {
		t.Fatalf("iop version printed %q", b.String())
	}
	for _, l := range lines {
		if strings.HasSuffix(l, " ") {
			t.Errorf("empty field: %q", l)
		}
	}
}

// TestRegression_CheckMisusedSaysHow: `iop check` with no file, and `iop
// check --config edge.yaml` (the flag every other command takes), exited 1
// and printed nothing.
func TestRegression_CheckMisusedSaysHow(t *testing.T) {
	for _, args := range [][]string{{"check"}, {"check", "--config", "edge.yaml"}} {
		root := newRootCommand()
		var out strings.Builder
		root.SetOut(&out)
		root.SetErr(&out)
		root.SetArgs(args)
		if err := root.Execute(); err == nil {
			t.Errorf("iop %s: no error", strings.Join(args, " "))
		}
		if !strings.Contains(out.String(), "iop check edge.yaml") {
			t.Errorf("iop %s printed %q, not how to call it", strings.Join(args, " "), out.String())
		}
	}
}

// TestRegression_StatusWithoutAnEdgeSaysHow: `iop status` with no edge on
// the default address printed only "connection refused".
func TestRegression_StatusWithoutAnEdgeSaysHow(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	root := newRootCommand()
	var out strings.Builder
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs([]string{"status", "--edge", addr})
	err = root.Execute()
	if err == nil || !strings.Contains(err.Error(), "--edge URL") || !strings.Contains(err.Error(), "connection refused") {
		t.Errorf("iop status with no edge: %v, want what to do and the cause", err)
	}
}
