package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"iop/internal/auth"
	"iop/internal/e2e/harness"
	"iop/internal/quota"
	"iop/internal/status"
	"iop/internal/testenv"
)

// TestBatchWaitingForItsKeysQuota: a batch of a key allowed 2 requests a
// minute runs 2 lines on a real edge and node, then its key's quota
// refuses the rest (429 quota_exceeded with a Retry-After); GET
// /admin/v1/batches then lists it with no ETA, waiting for its quota
// until a time to come, and iop status says so in its ETA column. A
// cancel ends it.
func TestBatchWaitingForItsKeysQuota(t *testing.T) {
	harness.Parallel(t)
	key, hash := auth.Generate()
	admin, adminHash := auth.Generate()
	cfg := harness.EdgeConfig(nil)
	cfg.Keys = []auth.Key{{Name: "q", Hash: hash, Quota: quota.Limits{RequestsPerMinute: 2}}}
	cfg.AdminKeys = []auth.Key{{Name: "admin", Hash: adminHash}}
	c := batchRig(t, cfg)
	c.key = key
	id := c.createBatch(c.uploadFile(chatLines("q", "fast", 5, 4)), "/v1/chat/completions")
	client := &http.Client{Transport: bearer(admin)}
	var p status.Batch
	testenv.EventuallyWithin(t, time.Minute, "the batch listed waiting for its quota", func() bool {
		var list []status.Batch
		req, _ := http.NewRequest(http.MethodGet, c.base+"/admin/v1/batches", nil)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&list) != nil || len(list) != 1 {
			t.Fatalf("GET /admin/v1/batches: %d %v", resp.StatusCode, list)
		}
		p = list[0]
		return p.Waiting != "" && p.Done == 2
	})
	if p.ID != id || p.Waiting != "quota" || p.ETASeconds != 0 || p.Done != 2 || p.WaitingUntil < time.Now().Add(-time.Second).Unix() {
		t.Fatalf("batch while its key's quota refuses its lines: %+v; want 2 done, waiting quota until a time to come, no ETA", p)
	}
	v, err := status.Fetch(context.Background(), client, c.base)
	if err != nil {
		t.Fatal(err)
	}
	var table strings.Builder
	if err := status.Render(&table, v, time.Now()); err != nil || !strings.Contains(table.String(), "waiting: quota until ") {
		t.Fatalf("status table: %v\n%s", err, table.String())
	}
	c.object(http.MethodPost, "/v1/batches/"+id+"/cancel", "")
	c.waitBatch(id, "cancelled")
}
