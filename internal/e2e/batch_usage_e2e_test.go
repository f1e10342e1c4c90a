package e2e

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"iop/internal/e2e/harness"
	"iop/internal/edge/adminwire"
	"iop/internal/testenv"
)

// TestBatchLinesMarkedInTheLedger: a batch's lines land in the usage
// ledger marked as batch, a client's own request as interactive:
// GET /admin/v1/usage groups them by group_by=batch and selects them by
// batch=; /metrics counts the batches by status (iop_batches).
func TestBatchLinesMarkedInTheLedger(t *testing.T) {
	harness.Parallel(t)
	c := batchRig(t, harness.EdgeConfig(nil))
	if status, b := c.do(http.MethodPost, "/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"fast","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`)); status != http.StatusOK {
		t.Fatalf("interactive request: %d %s", status, b)
	}
	id := c.createBatch(c.uploadFile(chatLines("u", "fast", 3, 4)), "/v1/chat/completions")
	c.waitBatch(id, "completed")
	usage := func(query string) map[string]int64 {
		status, b := c.do(http.MethodGet, "/admin/v1/usage?"+query, "", nil)
		var u adminwire.Usage
		if status != http.StatusOK || json.Unmarshal(b, &u) != nil {
			t.Fatalf("usage?%s: %d %s", query, status, b)
		}
		out := map[string]int64{}
		for _, g := range u.Data {
			out[g.Group] = g.Requests
		}
		return out
	}
	// A request's ledger entry is written after its answer.
	testenv.Eventually(t, "the ledger to hold the 3 batch lines and the 1 request", func() bool {
		by := usage("group_by=batch")
		return by["batch"] == 3 && by["interactive"] == 1
	})
	if got := usage("batch=batch"); got[""] != 3 {
		t.Fatalf("batch=batch: %v", got)
	}
	if got := usage("batch=interactive&group_by=model"); len(got) != 1 || got["fast"] != 1 {
		t.Fatalf("batch=interactive by model: %v", got)
	}
	if status, b := c.do(http.MethodGet, "/admin/v1/usage?batch=sometimes", "", nil); status != http.StatusBadRequest {
		t.Fatalf("batch=sometimes: %d %s", status, b)
	}
	if status, metrics := c.do(http.MethodGet, "/metrics", "", nil); status != http.StatusOK ||
		!strings.Contains(string(metrics), `iop_batches{status="completed"} 1`) ||
		!strings.Contains(string(metrics), `iop_batches{status="in_progress"} 0`) {
		t.Fatalf("metrics: %d\n%s", status, metrics)
	}
}
