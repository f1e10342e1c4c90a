package admin

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"iop/internal/edge/api"
	"iop/internal/edge/contract"
)

// newAdminEnv serves the state routes over snap.
func newAdminEnv(t *testing.T, snap contract.Snapshot) *testEnv {
	t.Helper()
	return newEnv(t, api.Config{}, Config{Snapshots: snapshot(snap)})
}

func TestAdminRoutes(t *testing.T) {
	t.Parallel()
	connected := time.Date(2025, 3, 1, 12, 0, 0, 0, time.FixedZone("CET", 3600))
	seen := time.Date(2025, 3, 1, 11, 5, 30, 250e6, time.UTC)
	snap := contract.Snapshot{
		Nodes: []contract.NodeSnapshot{
			{NodeID: "gpu-1", Label: "rack a", Version: "0.3.0", Generation: 4, ConnectedAt: connected, LastSeen: seen, Providers: []string{"ollama-1", "vllm-1"}},
			{NodeID: "gpu-2", Generation: 1, ConnectedAt: connected, LastSeen: seen, Draining: true}, // no providers: []
		},
		Providers: []contract.ProviderSnapshot{
			{
				NodeID: "gpu-1", ProviderID: "ollama-1", Type: "ollama", Generation: 4,
				Models: []string{"llama3:8b"}, Capabilities: []string{"tools"}, Path: contract.PathNormalized, Healthy: true,
				Capacity: 4, LongCapacity: 1, InFlight: 3, LongInFlight: 1, Queued: 2, Load: 0.75, Status: "available",
				Circuit: "closed", ModelCapabilities: map[string][]string{"llama3:8b": {"completion", "tools"}},
			},
			// A provider whose node is gone while runs drain: no node
			// details, so models and capabilities are [].
			{NodeID: "gpu-3", ProviderID: "p", Generation: 2, Capacity: 2, InFlight: 1, Load: 0.5, Status: "orphan", Circuit: "open"},
		},
		Queues: []contract.QueueSnapshot{{Model: "chat", MaxQueue: 64, QueueTimeout: 30 * time.Second, Queued: 2, Fairness: "on",
			Flows: []contract.FlowQueue{{Flow: "alice", Priority: "critical", Queued: 1}, {Flow: "bob", Priority: "standard", Queued: 1}}}},
	}
	tests := []struct {
		path string
		snap contract.Snapshot
		want string
	}{
		{"/admin/v1/nodes", snap, `[` +
			`{"id":"gpu-1","label":"rack a","generation":4,"connected_since":"2025-03-01T11:00:00Z","last_heartbeat":"2025-03-01T11:05:30.25Z","version":"0.3.0","providers":["ollama-1","vllm-1"],"draining":false},` +
			`{"id":"gpu-2","label":"","generation":1,"connected_since":"2025-03-01T11:00:00Z","last_heartbeat":"2025-03-01T11:05:30.25Z","version":"","providers":[],"draining":true}]`},
		{"/admin/v1/providers", snap, `[` +
			`{"node_id":"gpu-1","provider_id":"ollama-1","type":"ollama","capacity":4,"in_flight":3,"long_capacity":1,"long_in_flight":1,"queued":2,"load_ratio":0.75,"health":"healthy","models":["llama3:8b"],"capabilities":["tools"],"status":"available","circuit":"closed","model_capabilities":{"llama3:8b":["completion","tools"]}},` +
			`{"node_id":"gpu-3","provider_id":"p","type":"","capacity":2,"in_flight":1,"long_capacity":0,"long_in_flight":0,"queued":0,"load_ratio":0.5,"health":"unhealthy","models":[],"capabilities":[],"status":"orphan","circuit":"open"}]`},
		{"/admin/v1/queues", snap, `[{"model":"chat","policy":{"max_queue":64,"queue_timeout_ms":30000,"fairness":"on"},"queued":2,` +
			`"batch":0,"flows":[{"flow":"alice","priority":"critical","queued":1},{"flow":"bob","priority":"standard","queued":1}]}]`},
		{"/admin/v1/nodes", contract.Snapshot{}, `[]`},
		{"/admin/v1/providers", contract.Snapshot{}, `[]`},
		{"/admin/v1/queues", contract.Snapshot{}, `[]`},
	}
	for _, tt := range tests {
		name := tt.path
		if len(tt.snap.Nodes) == 0 {
			name += "/empty"
		}
		t.Run(name, func(t *testing.T) {
			env := newAdminEnv(t, tt.snap)
			resp := env.get(t, tt.path)
			if resp.status != http.StatusOK {
				t.Fatalf("status = %d, want 200 (%s)", resp.status, resp.body)
			}
			if ct := resp.header.Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type = %q", ct)
			}
			if got := strings.TrimSuffix(resp.body, "\n"); got != tt.want {
				t.Errorf("body\n got %s\nwant %s", got, tt.want)
			}
		})
	}
}

func TestAdminRoutesMethodAndAbsence(t *testing.T) {
	t.Parallel()
	withAdmin := newAdminEnv(t, contract.Snapshot{})
	// Without Config.Snapshots the state routes are not served.
	without := newEnv(t, api.Config{}, Config{})

	tests := []struct {
		name, method, path string
		env                *testEnv
		wantStatus         int
		wantCode           string
		wantAllow          string
	}{
		{"providers by POST", "POST", "/admin/v1/providers", withAdmin, 405, "method_not_allowed", "GET"},
		{"nodes by DELETE", "DELETE", "/admin/v1/nodes", withAdmin, 405, "method_not_allowed", "GET"},
		{"unknown admin path", "GET", "/admin/v1/events", withAdmin, 404, "unknown_url", ""},
		{"nodes without Snapshots", "GET", "/admin/v1/nodes", without, 404, "unknown_url", ""},
		{"providers without Snapshots", "GET", "/admin/v1/providers", without, 404, "unknown_url", ""},
		{"queues without Snapshots", "GET", "/admin/v1/queues", without, 404, "unknown_url", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp := tt.env.send(t, tt.method, tt.path, nil)
			if resp.status != tt.wantStatus {
				t.Fatalf("status = %d, want %d (%s)", resp.status, tt.wantStatus, resp.body)
			}
			if code := errorCode(t, resp.body); code != tt.wantCode {
				t.Errorf("code = %s, want %s", code, tt.wantCode)
			}
			if got := resp.header.Get("Allow"); got != tt.wantAllow {
				t.Errorf("Allow = %q, want %q", got, tt.wantAllow)
			}
		})
	}
}
