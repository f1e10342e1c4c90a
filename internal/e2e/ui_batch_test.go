package e2e

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"iop/internal/e2e/harness"
)

// TestDashboardBatchPanelInBrowser: a batch of thirty lines on a model
// of capacity 1 (about 3 s a line) runs on a real edge, node and
// simulator; the /ui batch panel, in headless Chromium, lists it while it
// runs with the lines done and total GET /admin/v1/batches gives, a rate
// and an ETA once a line is done, and says no batch runs once it is
// cancelled. Its screenshot, dashboard-batches.png, goes where
// artifactDir says.
func TestDashboardBatchPanelInBrowser(t *testing.T) {
	harness.Parallel(t)
	c := batchRig(t, harness.EdgeConfig(nil))
	page, waitJS := browserPage(t, 180*time.Second)
	if err := chromedp.Do(page, chromedp.Navigate(c.base+"/ui")); err != nil {
		t.Fatal(err)
	}
	waitJS("the empty batch panel", `window.iopBatches && iopBatches.loaded > 0 && !document.getElementById("batches-empty").hidden`)
	id := c.createBatch(c.uploadFile(chatLines("ui", "slow", 30, 60)), "/v1/chat/completions")
	row := `document.querySelector('tr[data-batch="` + id + `"]')`
	waitJS("the batch's row with a line done", `window.iopBatches && iopBatches.rows.length === 1 && iopBatches.rows[0].id === "`+id+`" &&
		iopBatches.rows[0].total === 30 && iopBatches.rows[0].done >= 1 && `+row+` !== null &&
		`+row+`.querySelector(".lines").textContent.includes("of 30") && `+row+`.querySelector(".rate").textContent.endsWith("/s") &&
		`+row+`.querySelector(".eta").textContent !== "–"`)
	raw, err := chromedp.Run(page, chromedp.Evaluate[[]byte](`iopBatches.rows[0]`))
	if err != nil {
		t.Fatal(err)
	}
	var shown struct {
		ID, Status, API string
		Total, Done     int
	}
	if err := json.Unmarshal(raw, &shown); err != nil || shown.API != "openai" || shown.Status != "in_progress" {
		t.Fatalf("the panel's row: %s %v", raw, err)
	}
	png, err := chromedp.Run(page, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	shot := filepath.Join(artifactDir(t), "dashboard-batches.png")
	if err := os.WriteFile(shot, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s", shot)

	c.object(http.MethodPost, "/v1/batches/"+id+"/cancel", "")
	c.waitBatch(id, "cancelled")
	waitJS("no batch running", `iopBatches.rows.length === 0 && !document.getElementById("batches-empty").hidden && `+row+` === null`)
}
