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
	led.Record(ledger.Entry{Time: at, Key: "alice", Model: "m", NodeID: "n", ProviderID: "p", PromptTokens: 1, CompletionTokens: 2,
		Duration: time.Second, SlotTime: 800 * time.Millisecond, CostWeight: 2.5, Outcome: "completed"})
	led.Record(ledger.Entry{Time: at.Add(48 * time.Hour), Key: "bob", Model: "m", PromptTokens: 10, Outcome: "queue_full"})
	led.Record(ledger.Entry{Time: at.Add(36 * time.Hour), Key: "carol", Model: "m", PromptTokens: 100, SlotTime: time.Second, Outcome: "completed"})
	led.Flush()
	f := newKeys(t)
	teams := map[string]string{"alice": "red", "carol": "red", "bob": "blue"}
	env := newEnv(t, api.Config{Keys: f.keys, AdminKeys: f.admin}, Config{Usage: led, TeamOf: func(k string) string { return teams[k] }})
	get := func(q string) rawResponse { return env.send(t, "GET", "/admin/v1/usage"+q, bearer(f.adminKey)) }
	resp := get("?group_by=key")
	want := `{"object":"list","group_by":"key","tz":"UTC","data":[` +
		`{"group":"alice","requests":1,"completed":1,"prompt_tokens":1,"completion_tokens":2,"total_tokens":3,"duration_ms":1000,"gpu_seconds":2},` +
		`{"group":"bob","requests":1,"completed":0,"prompt_tokens":10,"completion_tokens":0,"total_tokens":10,"duration_ms":0,"gpu_seconds":0},` +
		`{"group":"carol","requests":1,"completed":1,"prompt_tokens":100,"completion_tokens":0,"total_tokens":100,"duration_ms":0,"gpu_seconds":1}]}`
	if resp.status != 200 || strings.TrimSpace(resp.body) != want {
		t.Errorf("group_by=key: %d\n%s\nwant\n%s", resp.status, resp.body, want)
	}
	for q, wantGroups := range map[string]string{
		"?group_by=day":                                     "2026-03-01,2026-03-03",
		"?group_by=day&tz=America/New_York":                 "2026-03-01,2026-03-02,2026-03-03", // carol at midnight UTC is 19:00 the day before there
		"?group_by=day&tz=Asia/Tokyo":                       "2026-03-01,2026-03-03",
		"?group_by=provider&key=alice":                      "n/p",
		"?from=2026-03-02&group_by=key":                     "bob,carol",
		"?from=2026-03-03T00:00:01Z&group_by=key":           "bob",
		"?from=2026-03-03&group_by=key":                     "bob,carol",
		"?from=2026-03-03&group_by=key&tz=America/New_York": "bob", // midnight there: 05:00 UTC
		"?group_by=team":                                    "blue,red",
		"?team=red&group_by=key":                            "alice,carol",
		"?team=blue&group_by=day":                           "2026-03-03",
		"?team=green&group_by=key":                          "",
		"?to=2026-03-01T13:00:00Z&group_by=key":             "alice",
		"?from=1772323200&to=1772409600&group_by=model":     "m", // 2026-03-01, Unix seconds
		"?model=other&group_by=key":                         "",
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
	// A team's sums are those of its keys; GPU-time is the slot time
	// weighted by the cost weight (1 when not known).
	resp = get("?team=red")
	var total struct {
		Data []struct {
			Requests   int64   `json:"requests"`
			Prompt     int64   `json:"prompt_tokens"`
			GPUSeconds float64 `json:"gpu_seconds"`
		} `json:"data"`
	}
	if err := json.Unmarshal([]byte(resp.body), &total); err != nil || len(total.Data) != 1 ||
		total.Data[0].Requests != 2 || total.Data[0].Prompt != 101 || total.Data[0].GPUSeconds != 3 {
		t.Errorf("team=red: %s, want 2 requests, 101 prompt tokens, 3 GPU-seconds", resp.body)
	}
	for _, q := range []string{"?group_by=user", "?from=yesterday", "?to=1e9", "?tz=Mars/Olympus", "?tz=Local", "?tz=../../etc/passwd"} {
		if resp := get(q); resp.status != 400 {
			t.Errorf("%s: %d, want 400", q, resp.status)
		}
	}
	if resp := env.send(t, "GET", "/admin/v1/usage", bearer(f.alice)); resp.status != 403 {
		t.Errorf("usage with a client key: %d", resp.status)
	}
}
