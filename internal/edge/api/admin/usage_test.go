package admin

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"iop/internal/edge/api"
	"iop/internal/ledger"
)

func TestUsageRoute(t *testing.T) {
	t.Parallel()
	store, err := ledger.OpenSQLite(":memory:")
	if err != nil {
		t.Fatal(err)
	}
	led := ledger.New(store, nil)
	t.Cleanup(func() { led.Close() })
	at := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	led.Record(ledger.Entry{Time: at, Key: "alice", Model: "m", NodeID: "n", ProviderID: "p", PromptTokens: 1, CompletionTokens: 2, Duration: time.Second, Outcome: "completed"})
	led.Record(ledger.Entry{Time: at.Add(48 * time.Hour), Key: "bob", Model: "m", PromptTokens: 10, Outcome: "queue_full"})
	led.Flush()
	f := newKeys(t)
	env := newEnv(t, api.Config{Keys: f.keys, AdminKeys: f.admin}, Config{Usage: led})
	get := func(q string) rawResponse { return env.send(t, "GET", "/admin/v1/usage"+q, bearer(f.adminKey)) }
	resp := get("?group_by=key")
	want := `{"object":"list","group_by":"key","data":[{"group":"alice","requests":1,"completed":1,"prompt_tokens":1,"completion_tokens":2,"total_tokens":3,"duration_ms":1000},{"group":"bob","requests":1,"completed":0,"prompt_tokens":10,"completion_tokens":0,"total_tokens":10,"duration_ms":0}]}`
	if resp.status != 200 || strings.TrimSpace(resp.body) != want {
		t.Errorf("group_by=key: %d\n%s\nwant\n%s", resp.status, resp.body, want)
	}
	for q, wantGroups := range map[string]string{
		"?group_by=day":                                 "2026-03-01,2026-03-03",
		"?group_by=provider&key=alice":                  "n/p",
		"?from=2026-03-02&group_by=key":                 "bob",
		"?to=2026-03-01T13:00:00Z&group_by=key":         "alice",
		"?from=1772323200&to=1772409600&group_by=model": "m", // 2026-03-01, Unix seconds
		"?model=other&group_by=key":                     "",
	} {
		resp := get(q)
		var body struct {
			Data []struct {
				Group string `json:"group"`
			} `json:"data"`
		}
		if resp.status != 200 || json.Unmarshal([]byte(resp.body), &body) != nil {
			t.Errorf("%s: %d %s", q, resp.status, resp.body)
			continue
		}
		var groups []string
		for _, d := range body.Data {
			groups = append(groups, d.Group)
		}
		if strings.Join(groups, ",") != wantGroups {
			t.Errorf("%s: groups %v, want %s", q, groups, wantGroups)
		}
	}
	for _, q := range []string{"?group_by=user", "?from=yesterday", "?to=1e9"} {
		if resp := get(q); resp.status != 400 {
			t.Errorf("%s: %d, want 400", q, resp.status)
		}
	}
	if resp := env.send(t, "GET", "/admin/v1/usage", bearer(f.alice)); resp.status != 403 {
		t.Errorf("usage with a client key: %d", resp.status)
	}
}
