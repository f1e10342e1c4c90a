package e2e

// The charts test drives a real edge, a node and iop sim (in-process, over
// real TCP, HTTP and gRPC) and checks, in headless Chromium, that the
// dashboard's charts drew exactly what GET /admin/v1/history says, and
// drew it: the canvas has each series' colour where its highest point is.
// Its screenshot, dashboard-charts.png, goes where artifactDir says
// ($IOP_ARTIFACTS, else the test's artifact directory: kept with
// `go test -artifacts -outputdir DIR`); the test logs the path.

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/packages/ssestream"

	"iop/internal/e2e/harness"
	"iop/internal/edge/adminwire"
	"iop/internal/node"
	"iop/internal/process"
	"iop/internal/sim"
)

// browserPage opens a tab in the shared headless Chromium (1280 × 1100)
// whose actions time out after timeout; waitJS(what, expr) waits, in the
// page, until the JavaScript expression is true, failing the test after
// 30 s.
func browserPage(t *testing.T, timeout time.Duration) (page context.Context, waitJS func(what, expr string)) {
	t.Helper()
	page = harness.Tab(t, 1280, 1100, timeout)
	return page, func(what, expr string) {
		t.Helper()
		if _, err := chromedp.Run(page, chromedp.Poll[bool](expr, chromedp.WithPollingTimeout(30*time.Second))); err != nil {
			text, _ := chromedp.Run(page, chromedp.Evaluate[string]("document.body.innerText"))
			t.Fatalf("page never showed %s: %v\npage text:\n%s", what, err, text)
		}
	}
}

// drawnSeries is one series as a chart drew it: [time, value] points.
type drawnSeries struct {
	Name   string       `json:"name"`
	Color  string       `json:"color"`
	Points [][2]float64 `json:"points"`
}

// expectedSeries computes, from the history's seconds up to through, the
// series each chart of the page must draw (charts.js's definitions, from
// the rule: a line per outcome or reason seen, p50/p95 where a first token
// was seen, tokens each second, in-flight and queued per provider where
// sampled).
func expectedSeries(h adminwire.History, through int64) map[string]map[string][][2]float64 {
	var secs []adminwire.Second
	for _, s := range h.Data {
		if s.Time <= through {
			secs = append(secs, s)
		}
	}
	out := map[string]map[string][][2]float64{"requests": {}, "ttft": {}, "tokens": {}, "providers": {}, "refusals": {}}
	perSecond := func(chart, name string, v func(adminwire.Second) (float64, bool)) {
		var pts [][2]float64
		for _, s := range secs {
			if x, ok := v(s); ok {
				pts = append(pts, [2]float64{float64(s.Time), x})
			}
		}
		out[chart][name] = pts
	}
	for _, o := range h.Outcomes {
		if slices.ContainsFunc(secs, func(s adminwire.Second) bool { return s.Requests[o] > 0 }) {
			perSecond("requests", o, func(s adminwire.Second) (float64, bool) { return float64(s.Requests[o]), true })
		}
	}
	for _, r := range h.Reasons {
		if slices.ContainsFunc(secs, func(s adminwire.Second) bool { return s.Refusals[r] > 0 }) {
			perSecond("refusals", r, func(s adminwire.Second) (float64, bool) { return float64(s.Refusals[r]), true })
		}
	}
	perSecond("ttft", "p50", func(s adminwire.Second) (float64, bool) {
		return ifSet(s.TimeToFirstToken, func(q *adminwire.Quantiles) float64 { return q.P50 })
	})
	perSecond("ttft", "p95", func(s adminwire.Second) (float64, bool) {
		return ifSet(s.TimeToFirstToken, func(q *adminwire.Quantiles) float64 { return q.P95 })
	})
	perSecond("tokens", "output tokens", func(s adminwire.Second) (float64, bool) { return float64(s.OutputTokens), true })
	for _, s := range secs {
		for _, p := range s.Providers {
			key := p.NodeID + "/" + p.ProviderID
			for field, v := range map[string]int{"in-flight": p.InFlight, "queued": p.Queued} {
				out["providers"][key+" "+field] = append(out["providers"][key+" "+field], [2]float64{float64(s.Time), float64(v)})
			}
		}
	}
	return out
}

func ifSet(q *adminwire.Quantiles, f func(*adminwire.Quantiles) float64) (float64, bool) {
	if q == nil {
		return 0, false
	}
	return f(q), true
}

// getHistory reads GET /admin/v1/history of the edge at base.
func getHistory(t *testing.T, base string, since int64) adminwire.History {
	t.Helper()
	resp, err := http.Get(base + "/admin/v1/history?since=" + strconv.FormatInt(since, 10))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var h adminwire.History
	if err := json.NewDecoder(resp.Body).Decode(&h); err != nil || resp.StatusCode != 200 {
		t.Fatalf("history: %d %v", resp.StatusCode, err)
	}
	return h
}

// TestDashboardChartsInBrowser: load through a real edge, node and
// simulator (completed answers, answers whose client left, refusals, two
// held streams in flight); the page's charts draw, live, exactly the
// series GET /admin/v1/history gives for the seconds the page has, the
// totals are those of the load, and each series' colour is on the canvas
// at its highest point.
func TestDashboardChartsInBrowser(t *testing.T) {
	harness.ParallelLong(t)
	_, simURL := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOllama, Models: []string{"chart-m"},
		TTFT: 30 * time.Millisecond, TokensPerSecond: 200, DefaultMaxTokens: 100_000})
	ctx, cancel := context.WithCancel(context.Background())
	e := harness.Edge(t, ctx, harness.EdgeConfig(nil))
	t.Cleanup(cancel)
	harness.Node(t, ctx, node.Config{NodeID: "n1", Edge: e.NodeAddr, Providers: []node.ProviderConfig{
		{ID: "sim", Type: node.TypeOllama, BaseURL: simURL, Models: []string{"chart-m"}, Capacity: 3}}})
	base := "http://" + e.HTTPAddr
	page, waitJS := browserPage(t, 120*time.Second)
	if err := chromedp.Do(page, chromedp.Navigate(base+"/ui")); err != nil {
		t.Fatal(err)
	}
	waitJS("the history loaded", `window.iopCharts && iopCharts.through > 0`)
	waitJS("the provider sampled idle", `(iopCharts.charts.providers.series.find(s => s.name === "n1/sim in-flight") || {points: []}).points.length > 0`)

	// Two long answers held open: the sampler sees 2 in flight.
	client := newClient(e)
	var held []*ssestream.Stream[openai.ChatCompletionChunk]
	for i := range 2 {
		s := client.Chat.Completions.NewStreaming(context.Background(), limitedChat("chart-m", 100_000))
		if !s.Next() {
			t.Fatalf("held stream %d: %v", i, s.Err())
		}
		held = append(held, s)
	}
	waitJS("2 in flight on n1/sim", `iopCharts.charts.providers.series.find(s => s.name === "n1/sim in-flight").points.some(p => p[1] === 2)`)
	const completedN, tokensEach, refusedN = 12, 10, 3
	for i := range completedN {
		resp, err := client.Chat.Completions.New(context.Background(), limitedChat("chart-m", tokensEach))
		if err != nil || resp.Usage.CompletionTokens != tokensEach {
			t.Fatalf("request %d: %v (usage %+v)", i, err, resp)
		}
	}
	for range refusedN {
		if _, err := client.Chat.Completions.New(context.Background(), limitedChat("no-such-model", 1)); err == nil {
			t.Fatal("an unknown model answered")
		}
	}
	for _, s := range held {
		s.Close()
	}
	sum := func(chart, series string) string {
		return fmt.Sprintf(`(iopCharts.charts[%q].series.find(s => s.name === %q) || {points: []}).points.reduce((a, p) => a + p[1], 0)`, chart, series)
	}
	// The held streams end client_gone (or write_failed, if a write hit
	// the closed connection before the edge saw it close).
	all := `iopCharts.charts.requests.series.reduce((a, s) => a + s.points.reduce((b, p) => b + p[1], 0), 0)`
	waitJS("every request charted", fmt.Sprintf(`%s === %d && %s === %d && %s === %d && %s === %d`,
		sum("requests", "completed"), completedN, sum("requests", "refused"), refusedN,
		all, completedN+refusedN+len(held), sum("refusals", "unknown_model"), refusedN))

	// What the page drew, and the history as the edge serves it now.
	var drawn struct {
		Through int64                    `json:"through"`
		Charts  map[string][]drawnSeries `json:"charts"`
	}
	raw, err := chromedp.Run(page, chromedp.Evaluate[[]byte](`({through: iopCharts.through,
		charts: Object.fromEntries(Object.entries(iopCharts.charts).map(([k, c]) => [k, c.series]))})`))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &drawn); err != nil {
		t.Fatal(err)
	}
	hist := getHistory(t, base, 0)
	if hist.Through < drawn.Through || len(hist.Data) == 0 {
		t.Fatalf("history through %d with %d seconds, page through %d", hist.Through, len(hist.Data), drawn.Through)
	}
	want := expectedSeries(hist, drawn.Through)
	for chart, series := range want {
		got := map[string][][2]float64{}
		for _, s := range drawn.Charts[chart] {
			got[s.Name] = s.Points
		}
		for name, pts := range series {
			if fmt.Sprint(got[name]) != fmt.Sprint(pts) {
				t.Errorf("chart %s, series %s: drew\n%v\nthe history says\n%v", chart, name, got[name], pts)
			}
		}
		for name := range got {
			if _, ok := series[name]; !ok {
				t.Errorf("chart %s drew series %s, which the history has not", chart, name)
			}
		}
	}
	// The totals are the load's: every answer of 10 tokens counted once,
	// each with a time to first token of at least the simulator's 30 ms.
	var tokens, ttftCount int
	for _, s := range hist.Data {
		tokens += int(s.OutputTokens)
		if q := s.TimeToFirstToken; q != nil {
			ttftCount += q.Count
			if q.P50 < 30 || q.P95 < q.P50 {
				t.Errorf("second %d: time to first token %+v, want p50 ≥ 30 ms ≤ p95", s.Time, q)
			}
		}
	}
	if tokens < completedN*tokensEach || ttftCount < completedN {
		t.Errorf("history: %d output tokens, %d times to first token; want at least %d and %d", tokens, ttftCount, completedN*tokensEach, completedN)
	}

	// Drawn, not only computed: around each series' highest point (5×5
	// pixels) the canvas has the colour of a series with a point there
	// (dots are drawn over every line; another series' dot may cover part
	// of this one's, or all of it at the same place).
	var pixels []struct {
		Chart, Series string
		RGBA          [][4]int
		Colors        []string
	}
	raw, err = chromedp.Run(page, chromedp.Evaluate[[]byte](`Object.entries(iopCharts.charts).flatMap(([name, c]) => {
		const cv = document.getElementById("chart-" + name), dpr = window.devicePixelRatio || 1, ctx = cv.getContext("2d");
		return c.series.flatMap(s => {
			const top = s.points.reduce((a, p) => p[1] > a[1] ? p : a, [0, 0]);
			if (!(top[1] > 0)) return [];
			const [x, y] = c.px(top[0], top[1]);
			const near = c.series.filter(o => o.points.some(p => { const [ox, oy] = c.px(p[0], p[1]); return Math.hypot(ox - x, oy - y) < 3; }));
			const d = ctx.getImageData(Math.round(x * dpr) - 2, Math.round(y * dpr) - 2, 5, 5).data, rgba = [];
			for (let i = 0; i < d.length; i += 4) rgba.push([d[i], d[i + 1], d[i + 2], d[i + 3]]);
			return [{chart: name, series: s.name, rgba, colors: near.map(o => o.color)}];
		});
	})`))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &pixels); err != nil {
		t.Fatal(err)
	}
	charted := map[string]bool{}
	for _, p := range pixels {
		charted[p.Chart] = true
		if !slices.ContainsFunc(p.RGBA, func(px [4]int) bool {
			return slices.ContainsFunc(p.Colors, func(c string) bool { return sameColor(c, px) })
		}) {
			t.Errorf("chart %s, series %s: around its highest point the canvas has %v, none of the colours %v", p.Chart, p.Series, p.RGBA, p.Colors)
		}
	}
	for _, chart := range []string{"requests", "ttft", "tokens", "providers", "refusals"} {
		if !charted[chart] {
			t.Errorf("chart %s has no point above zero to look at", chart)
		}
	}

	png, err := chromedp.Run(page, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	shot := filepath.Join(artifactDir(t), "dashboard-charts.png")
	if err := os.WriteFile(shot, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s", shot)

	// ?since= gives only the seconds after it.
	if later := getHistory(t, base, drawn.Through); len(later.Data) > 0 && later.Data[0].Time <= drawn.Through {
		t.Errorf("since %d listed second %d", drawn.Through, later.Data[0].Time)
	}
}

// sameColor reports whether the pixel rgba is the CSS colour hex (#rrggbb),
// opaque, within a little antialiasing.
func sameColor(hex string, rgba [4]int) bool {
	v, err := strconv.ParseUint(hex[1:], 16, 32)
	if err != nil || len(hex) != 7 {
		return false
	}
	c := [3]int{int(v >> 16), int(v >> 8 & 0xff), int(v & 0xff)}
	for i := range c {
		if d := c[i] - rgba[i]; d > 24 || d < -24 {
			return false
		}
	}
	return rgba[3] == 255
}

// TestRegression_UIWithCredentialsInURL: the dashboard opened as
// http://user:KEY@edge/ui (admin key as the Basic password, any user
// name) loads its data. It did not: the page fetched URLs relative to its
// own, which holds the credentials, and fetch refuses those ("Request
// cannot be constructed from a URL that includes credentials"), so it
// showed nothing but that error.
func TestRegression_UIWithCredentialsInURL(t *testing.T) {
	harness.Parallel(t)
	const key = "admin-secret-key"
	ctx, cancel := context.WithCancel(context.Background())
	d, err := process.Start(ctx, process.Config{Mode: process.ModeDev, Dev: process.DevConfig{Listen: "127.0.0.1:0", NodeListen: "127.0.0.1:0", ForceSim: true,
		APIKey: key, SimCapacity: 2, SimTokensPerSecond: 100, SimTTFT: 10 * time.Millisecond}}, process.Deps{Logger: harness.Logger(t, "iop dev")})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		cancel()
		if err := d.Wait(); err != nil {
			t.Errorf("iop dev: %v", err)
		}
	}()
	// Without the key the dashboard is refused: the key is what opens it.
	if resp, err := http.Get("http://" + d.HTTPAddr + "/admin/v1/history"); err != nil || resp.StatusCode != 401 {
		t.Fatalf("history without a key: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	page, waitJS := browserPage(t, 90*time.Second)
	if err := chromedp.Do(page, chromedp.Navigate("http://anyone:"+key+"@"+d.HTTPAddr+"/ui")); err != nil {
		t.Fatal(err)
	}
	waitJS("the node (GET /admin/v1/nodes)", `document.querySelector('[data-node="dev"]') !== null`)
	waitJS("the providers (GET /admin/v1/providers)", `document.querySelector('[data-provider="dev/sim-ollama"]') !== null`)
	waitJS("the live events stream", `document.querySelector('#conn.live') !== null`)
	waitJS("the history (GET /admin/v1/history)", `window.iopCharts && iopCharts.through > 0 && iopCharts.charts.providers.series.length > 0`)
}

// TestRegression_DashboardAxisSpansTheRealWindow: the charts' time axis
// showed 1970 before the first history arrived (a time axis ending at
// second 0), and always spanned 15 minutes, so a young edge's data was
// squeezed into the chart's last pixels. The page is served through a
// proxy that holds GET /admin/v1/history back at first: the charts draw
// no axis while they wait. Once the history flows, the axis ends at the
// history's through and starts at the edge's start (at least 10 s back),
// with every tick inside it, and the edge's first second is at the plot's
// left edge.
func TestRegression_DashboardAxisSpansTheRealWindow(t *testing.T) {
	harness.Parallel(t)
	ctx, cancel := context.WithCancel(context.Background())
	e := harness.Edge(t, ctx, harness.EdgeConfig(nil))
	t.Cleanup(cancel)
	edgeURL, err := url.Parse("http://" + e.HTTPAddr)
	if err != nil {
		t.Fatal(err)
	}
	var open atomic.Bool
	proxy := httputil.NewSingleHostReverseProxy(edgeURL)
	proxy.FlushInterval = -1 // the events stream
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/admin/v1/history" && !open.Load() {
			http.Error(w, "held back by the test", http.StatusServiceUnavailable)
			return
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)

	page, waitJS := browserPage(t, 90*time.Second)
	if err := chromedp.Do(page, chromedp.Navigate(srv.URL+"/ui")); err != nil {
		t.Fatal(err)
	}
	waitJS("the charts waiting, with no axis", `window.iopCharts && iopCharts.charts.requests && iopCharts.charts.requests.axis === null && iopCharts.through === 0`)
	if _, err := chromedp.Run(page, chromedp.Evaluate[bool](`window.dispatchEvent(new Event("resize")), true`)); err != nil {
		t.Fatal(err)
	}
	waitJS("no axis after a redraw either", `Object.values(iopCharts.charts).every(c => c.axis === null)`)

	open.Store(true)
	hist := getHistory(t, "http://"+e.HTTPAddr, 0)
	if hist.Start <= 0 || hist.Through < hist.Start-1 {
		t.Fatalf("history start %d through %d", hist.Start, hist.Through)
	}
	// Wait until the edge has more than the axis' 10 s minimum.
	waitJS("an axis of more than 10 s", fmt.Sprintf(`iopCharts.through > %d`, hist.Start+11))
	var got struct {
		Through int64 `json:"through"`
		Axes    []struct {
			T0    int64 `json:"t0"`
			T1    int64 `json:"t1"`
			Ticks []struct {
				T     int64  `json:"t"`
				Label string `json:"label"`
			} `json:"ticks"`
			Left float64 `json:"left"` // px of the edge's first second
		} `json:"axes"`
	}
	raw, err := chromedp.Run(page, chromedp.Evaluate[[]byte](fmt.Sprintf(`({through: iopCharts.through,
		axes: Object.values(iopCharts.charts).map(c => ({...c.axis, left: c.px(%d, 0)[0]}))})`, hist.Start)))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &got); err != nil {
		t.Fatal(err)
	}
	if len(got.Axes) != 5 {
		t.Fatalf("%d charts with an axis, want 5", len(got.Axes))
	}
	for i, a := range got.Axes {
		if a.T1 != got.Through || a.T0 != hist.Start {
			t.Errorf("chart %d: axis [%d, %d], want [%d (the edge's start), %d (through)]", i, a.T0, a.T1, hist.Start, got.Through)
		}
		if len(a.Ticks) < 2 {
			t.Errorf("chart %d: ticks %v", i, a.Ticks)
		}
		for _, tk := range a.Ticks {
			if tk.T < a.T0 || tk.T > a.T1 || tk.Label == "" {
				t.Errorf("chart %d: tick %+v outside [%d, %d]", i, tk, a.T0, a.T1)
			}
		}
		if a.Left > 48.5 { // the plot's left margin
			t.Errorf("chart %d: the edge's first second is at x %.1f, not at the plot's left edge (48)", i, a.Left)
		}
	}
}
