package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"iop/internal/auth"
	"iop/internal/e2e/harness"
	"iop/internal/edge/adminwire"
	"iop/internal/node"
	"iop/internal/sim"
	"iop/internal/testenv"
)

// TestDashboardUsagePanelInBrowser: two keys' requests through a real
// edge, node and simulator land in the edge's usage ledger; the /ui usage
// panel, in headless Chromium, lists each key with the requests, tokens
// and GPU-seconds GET /admin/v1/usage gives, its tokens on today's bar,
// and one "(no team)" row per team (no key has a team); without GET
// /admin/v1/quotas (404) it says there are no quotas, and when a quotas
// answer names a key's per-day tokens, the key's row gets a quota line.
// Its screenshot, dashboard-usage.png, goes where artifactDir says.
func TestDashboardUsagePanelInBrowser(t *testing.T) {
	harness.Parallel(t)
	_, simURL := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOllama, Models: []string{"usage-ui"}, TTFT: 20 * time.Millisecond})
	alice, aliceHash := auth.Generate()
	bob, bobHash := auth.Generate()
	admin, adminHash := auth.Generate()
	cfg := harness.EdgeConfig(nil)
	cfg.Keys = []auth.Key{{Name: "alice", Hash: aliceHash}, {Name: "bob", Hash: bobHash}}
	cfg.AdminKeys = []auth.Key{{Name: "ops", Hash: adminHash}}
	ctx, cancel := context.WithCancel(context.Background())
	e := harness.Edge(t, ctx, cfg)
	t.Cleanup(cancel)
	harness.Node(t, ctx, node.Config{NodeID: "n1", Edge: e.NodeAddr, Providers: []node.ProviderConfig{
		{ID: "sim", Type: node.TypeOllama, BaseURL: simURL, Models: []string{"usage-ui"}, Capacity: 2}}})
	base := "http://" + e.HTTPAddr
	do := func(method, path, key, body string) (int, []byte) {
		req, _ := http.NewRequest(method, base+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		raw, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, raw
	}
	chat := func(key string, maxTokens int) {
		body := fmt.Sprintf(`{"model":"usage-ui","max_tokens":%d,"messages":[{"role":"user","content":"count"}]}`, maxTokens)
		if st, raw := do("POST", "/v1/chat/completions", key, body); st != 200 {
			t.Fatalf("chat: %d %s", st, raw)
		}
	}
	for range 3 {
		chat(alice, 5)
	}
	chat(bob, 7)
	usage := func(q url.Values) adminwire.Usage {
		st, raw := do("GET", "/admin/v1/usage?"+q.Encode(), admin, "")
		var u adminwire.Usage
		if st != 200 || json.Unmarshal(raw, &u) != nil {
			t.Fatalf("usage %s: %d %s", q.Encode(), st, raw)
		}
		return u
	}
	// A request's ledger entry is written after its answer.
	testenv.Eventually(t, "the ledger has the 4 requests", func() bool {
		u := usage(url.Values{})
		return len(u.Data) == 1 && u.Data[0].Requests == 4
	})

	page, waitJS := browserPage(t, 120*time.Second)
	if err := chromedp.Do(page, chromedp.Navigate("http://ops:"+admin+"@"+e.HTTPAddr+"/ui")); err != nil {
		t.Fatal(err)
	}
	waitJS("the usage panel's rows", `window.iopUsage && iopUsage.loaded > 0 && iopUsage.rows.length === 2`)
	var shown struct {
		TZ   string `json:"tz"`
		Days []string
		Rows []struct {
			Name        string  `json:"name"`
			Requests    int64   `json:"requests"`
			TotalTokens int64   `json:"total_tokens"`
			GPUSeconds  float64 `json:"gpu_seconds"`
			Daily       []struct {
				Day         string `json:"day"`
				TotalTokens int64  `json:"total_tokens"`
			} `json:"daily"`
		} `json:"rows"`
		Quotas string `json:"quotas"`
	}
	raw, err := chromedp.Run(page, chromedp.Evaluate[[]byte](`iopUsage`))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &shown); err != nil {
		t.Fatal(err)
	}
	want := usage(url.Values{"group_by": {"key"}, "tz": {shown.TZ}, "from": {shown.Days[0]}})
	if len(want.Data) != 2 {
		t.Fatalf("the API's usage by key: %+v", want)
	}
	for _, w := range want.Data {
		i := 0
		for i < len(shown.Rows) && shown.Rows[i].Name != w.Group {
			i++
		}
		if i == len(shown.Rows) {
			t.Errorf("the panel has no row for %s: %s", w.Group, raw)
			continue
		}
		r := shown.Rows[i]
		var daily int64
		for _, d := range r.Daily {
			daily += d.TotalTokens
		}
		if r.Requests != w.Requests || r.TotalTokens != w.TotalTokens || r.GPUSeconds != w.GPUSeconds || daily != w.TotalTokens || w.GPUSeconds <= 0 {
			t.Errorf("panel row %+v, the API says %+v", r, w)
		}
	}
	// Drawn: the cells say it.
	waitJS("alice's row", `document.querySelector('tr[data-usage="alice"] td.requests').textContent === "3"`)
	waitJS("bob's row", `document.querySelector('tr[data-usage="bob"] td.requests').textContent === "1"`)
	waitJS("no quota lines and why", `iopUsage.quotas === "none" && document.getElementById("usage-quotas").textContent.includes("No quotas") && !document.querySelector("tr.quota")`)

	// Per team: no key has a team, so one row holds them all.
	if _, err := chromedp.Run(page, chromedp.Evaluate[bool](`document.querySelector('#usage-view button[data-view="team"]').click(), true`)); err != nil {
		t.Fatal(err)
	}
	waitJS("one row of the keys in no team", `iopUsage.view === "team" && iopUsage.rows.length === 1 && iopUsage.rows[0].requests === 4 &&
		document.querySelector('tr[data-usage=""] td').textContent === "(no team)"`)

	// Quota lines, when GET /admin/v1/quotas lists a per-day quota (its
	// shape, admin.quotaJSON): the page through a proxy that answers it;
	// bob's per-minute quota draws no line.
	edgeURL, _ := url.Parse(base)
	proxy := httputil.NewSingleHostReverseProxy(edgeURL)
	proxy.FlushInterval = -1
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/admin/v1/quotas" {
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprint(w, `{"object":"list","data":[{"scope":"key","name":"alice","quota":{"tokens_per_day":100000},"windows":[]},`+
				`{"scope":"key","name":"bob","quota":{"tokens_per_minute":1000},"windows":[]}]}`)
			return
		}
		proxy.ServeHTTP(w, r)
	}))
	// The page's events stream through the proxy lasts while the browser
	// does: cut it, or Close waits for it.
	t.Cleanup(func() { srv.CloseClientConnections(); srv.Close() })
	if err := chromedp.Do(page, chromedp.Navigate("http://ops:"+admin+"@"+strings.TrimPrefix(srv.URL, "http://")+"/ui")); err != nil {
		t.Fatal(err)
	}
	waitJS("alice's quota line", `window.iopUsage && iopUsage.quotas === "on" && document.querySelector('tr[data-quota="alice"]') !== null &&
		document.querySelector('tr[data-quota="alice"]').textContent.includes("/ 100,000") && !document.querySelector('tr[data-quota="bob"]')`)
	png, err := chromedp.Run(page, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	shot := filepath.Join(artifactDir(t), "dashboard-usage.png")
	if err := os.WriteFile(shot, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s", shot)
}
