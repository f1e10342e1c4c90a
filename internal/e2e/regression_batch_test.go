package e2e

import (
	"net/http"
	"strings"
	"testing"

	"iop/internal/auth"
	"iop/internal/e2e/harness"
	"iop/internal/testenv"
)

// TestRegression_OwnBatchLeavesTheKeyItsInteractiveRequests: a key with
// max_concurrent 2 runs a batch on a slow model; meanwhile its
// interactive request for another model, on another provider, is
// answered. The batch's lines (running, or waiting in the batch band)
// held every one of the key's concurrency slots, so each interactive
// request of the key got 429 concurrency_limit_exceeded for the whole
// batch: batch work ran above the key's interactive work, not below it.
func TestRegression_OwnBatchLeavesTheKeysInteractiveRequests(t *testing.T) {
	harness.Parallel(t)
	carol, carolHash := auth.Generate()
	cfg := harness.EdgeConfig(nil)
	cfg.Keys = []auth.Key{{Name: "carol", Hash: carolHash, MaxConcurrent: 2}}
	c := batchRig(t, cfg)
	c.key = carol
	id := c.createBatch(c.uploadFile(chatLines("s", "slow", 40, 10)), "/v1/chat/completions")
	testenv.Eventually(t, "the batch to run its first line", func() bool {
		b := c.object(http.MethodGet, "/v1/batches/"+id, "")
		_, done, _ := counts(b)
		return b["status"] == "in_progress" && done >= 1
	})
	status, body := c.do(http.MethodPost, "/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"fast","max_tokens":4,"messages":[{"role":"user","content":"now"}]}`))
	b := c.object(http.MethodGet, "/v1/batches/"+id, "")
	total, done, failed := counts(b)
	if status != http.StatusOK {
		t.Errorf("interactive request while the key's batch runs (%d of %d lines done, %d failed): %d %s, want 200", done, total, failed, status, body)
	}
	c.object(http.MethodPost, "/v1/batches/"+id+"/cancel", "")
	c.waitBatch(id, "cancelled", "completed")
}
