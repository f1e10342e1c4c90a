package process

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"iop/internal/edge"
)

// TestEdgeFilePartsValidate: each part of the edge's file refuses its own
// bad values with an error wrapping edge.ErrInvalidConfig that names the
// YAML key, and EdgeFile.Validate returns every part's problems at once.
func TestEdgeFilePartsValidate(t *testing.T) {
	t.Parallel()
	hash := `"sha256:` + strings.Repeat("a", 64) + `"`
	for _, tc := range []struct{ name, yaml, text string }{
		{"listen not host:port", "listen: localhost", "listen"},
		{"node_listen not host:port", "node_listen: ':x:y'", "node_listen"},
		{"negative drain_timeout", "drain_timeout: -1s", "drain_timeout"},
		{"negative lame_duck", "lame_duck: -1s", "lame_duck"},
		{"negative max_body_bytes", "max_body_bytes: -1", "max_body_bytes"},
		{"negative max_answer_bytes", "max_answer_bytes: -1", "max_answer_bytes"},
		{"negative write_timeout", "write_timeout: -1s", "write_timeout"},
		// Regression: 1ns passed check and cut every upload at its first pause.
		{"upload_idle_timeout under a second", "upload_idle_timeout: 1ns", "upload_idle_timeout 1ns is under 1s"},
		{"key priority", "keys: [{name: a, hash: " + hash + ", priority: urgent}]", "priority"},
		{"admin key weight", "admin_keys: [{name: a, hash: " + hash + ", weight: -1}]", "weight"},
		{"team of no key", "teams: [{name: t, quota: {tokens_per_day: 1}}, {name: t}]", "team"},
		{"tracing sampler", "tracing: {endpoint: http://127.0.0.1:4318, sampler: sometimes}", "tracing"},
		{"core part", "heartbeat_interval: -1s", "heartbeat_interval"},
		{"local providers", "providers: [{type: tgi}]", "tgi"},
		{"unknown key", "listne: x", "listne"},
		// Regression: a malformed DSN passed iop check and failed at start.
		{"runs_dsn not a connection string", "runs_dsn: 'postgres://u:secret@host:notaport/db'", "runs_dsn"},
		{"ledger_dsn not a connection string", "ledger_dsn: 'host=a port=x'", "ledger_dsn"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := ParseEdgeFile([]byte(tc.yaml))
			if err == nil || !strings.Contains(err.Error(), tc.text) {
				t.Fatalf("ParseEdgeFile(%q) = %v, want an error naming %q", tc.yaml, err, tc.text)
			}
			if strings.Contains(err.Error(), "secret") {
				t.Fatalf("ParseEdgeFile(%q) = %v: the password is in the error", tc.yaml, err)
			}
			if tc.name != "local providers" && !errors.Is(err, edge.ErrInvalidConfig) {
				t.Fatalf("ParseEdgeFile(%q) = %v, want edge.ErrInvalidConfig", tc.yaml, err)
			}
		})
	}
	err := parseEdgeFileErr("listen: x\nmax_body_bytes: -1\nheartbeat_interval: -1s\n")
	for _, key := range []string{"listen", "max_body_bytes", "heartbeat_interval"} {
		if !strings.Contains(fmt.Sprint(err), key) {
			t.Errorf("three bad parts: %v, want %s named", err, key)
		}
	}
	f, err := ParseEdgeFile(nil)
	if err != nil || f.Listen != DefaultListen || f.NodeListen != DefaultNodeListen || f.DrainTimeout != DefaultDrainTimeout || f.LameDuck != DefaultLameDuck ||
		f.MaxBodyBytes != 32<<20 || f.WriteTimeout != time.Minute || f.Database != "" || f.HeartbeatInterval != edge.DefaultHeartbeatInterval {
		t.Fatalf("defaults %+v %v", f, err)
	}
}

// TestRetryAfterPastTheLameDuck: a stopping edge's Retry-After is the
// lame duck rounded up to whole seconds, plus one.
func TestRetryAfterPastTheLameDuck(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		lameDuck time.Duration
		want     string
	}{
		{10 * time.Millisecond, "2"},
		{time.Second, "2"},
		{1500 * time.Millisecond, "3"},
		{10 * time.Second, "11"},
		// Regression: d+time.Second-1 overflowed to a negative Retry-After.
		{time.Duration(math.MaxInt64), "9223372038"},
	} {
		if got := retryAfterPast(tc.lameDuck); got != tc.want {
			t.Errorf("retryAfterPast(%v) = %s, want %s", tc.lameDuck, got, tc.want)
		}
	}
}

// parseEdgeFileErr is the error of ParseEdgeFile alone.
func parseEdgeFileErr(data string) error {
	_, err := ParseEdgeFile([]byte(data))
	return err
}

// TestEdgeFileRestartOnly: a reload that changes a key of the process's
// parts (listeners, drain, HTTP limits, insecure_open, stores, tracing)
// names it as needing a restart; keys and the core's reloadable keys are
// not named.
func TestEdgeFileRestartOnly(t *testing.T) {
	t.Parallel()
	running := DefaultEdgeFile()
	next := DefaultEdgeFile()
	next.InsecureOpen = true
	next.DrainTimeout = time.Minute
	next.LameDuck = 5 * time.Second
	next.Name = "edge-b"
	next.Tracing.Endpoint = "http://127.0.0.1:4318"
	next.Keys = nil
	next.Models = map[string]edge.ModelConfig{"a": {Targets: []string{"x"}}}
	if got := fmt.Sprint(running.restartOnly(next)); got != "[database drain_timeout insecure_open lame_duck tracing]" {
		t.Fatalf("restart %s", got)
	}
	if got := running.restartOnly(DefaultEdgeFile()); len(got) != 0 {
		t.Fatalf("the running file again: restart %v", got)
	}
}

// TestRegression_EdgeStartRefusesWhatCheckRefuses: an edge does not start
// on a file iop check refuses (a negative lame_duck or drain_timeout); it
// started, and then refused every reload of that file.
func TestRegression_EdgeStartRefusesWhatCheckRefuses(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		key string
		set func(*EdgeFile)
	}{
		{"lame_duck", func(f *EdgeFile) { f.LameDuck = -time.Second }},
		{"drain_timeout", func(f *EdgeFile) { f.DrainTimeout = -5 * time.Second }},
	} {
		cfg := DefaultEdgeFile()
		cfg.Listen, cfg.NodeListen, cfg.Database = "127.0.0.1:0", "127.0.0.1:0", ":memory:"
		tc.set(&cfg)
		p, err := Start(context.Background(), Config{Mode: ModeEdge, Edge: cfg}, Deps{})
		if err == nil {
			p.Abort()
			_ = p.Wait()
			t.Fatalf("%s negative: the edge started", tc.key)
		}
		if !errors.Is(err, edge.ErrInvalidConfig) || !strings.Contains(err.Error(), tc.key) {
			t.Errorf("%s negative: %v, want edge.ErrInvalidConfig naming %s", tc.key, err, tc.key)
		}
	}
}

// TestLameDuckIsCutAtTheDrainTimeout: the lame duck, and so the Retry-After
// of the answers during it, is at most the drain timeout; unset, it is
// DefaultLameDuck.
func TestLameDuckIsCutAtTheDrainTimeout(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ lameDuck, drain, want time.Duration }{
		{0, 0, DefaultLameDuck},
		{10 * time.Second, 2 * time.Second, 2 * time.Second},
		{1000 * time.Hour, 0, DefaultDrainTimeout},
		{3 * time.Second, time.Minute, 3 * time.Second},
	} {
		e := &edgeProcess{cfg: EdgeFile{ServeConfig: ServeConfig{LameDuck: tc.lameDuck, DrainTimeout: tc.drain}}}
		if got := e.lameDuck(); got != tc.want {
			t.Errorf("lame_duck %v, drain_timeout %v: lame duck %v, want %v", tc.lameDuck, tc.drain, got, tc.want)
		}
	}
}
