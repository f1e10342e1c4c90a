package status

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"iop/internal/edge/adminwire"
)

func TestBaseURL(t *testing.T) {
	for in, want := range map[string]string{
		"127.0.0.1:8080":         "http://127.0.0.1:8080",
		"http://edge:8080/":      "http://edge:8080",
		"https://edge.example/x": "https://edge.example/x",
	} {
		if got := BaseURL(in); got != want {
			t.Errorf("BaseURL(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestBar(t *testing.T) {
	for _, c := range []struct {
		inFlight, capacity int
		want               string
	}{
		{0, 4, "[          ]"}, {1, 4, "[##        ]"}, {4, 4, "[##########]"},
		{1, 100, "[#         ]"}, // any load shows
		{5, 4, "[##########]"},   // over a lowered capacity
	} {
		if got := bar(c.inFlight, c.capacity); got != c.want {
			t.Errorf("bar(%d, %d) = %q, want %q", c.inFlight, c.capacity, got, c.want)
		}
	}
}

func TestRenderAges(t *testing.T) {
	now := time.Date(2025, 1, 1, 0, 10, 0, 0, time.UTC)
	var q Queue
	q.Model, q.Queued, q.Policy.MaxQueue, q.Policy.QueueTimeoutMS = "m", 3, 16, 30000
	v := View{
		Nodes:  []Node{{ID: "n", Generation: 2, ConnectedSince: now.Add(-5 * time.Minute), LastHeartbeat: now.Add(-1500 * time.Millisecond)}},
		Queues: []Queue{q},
	}
	var buf bytes.Buffer
	if err := Render(&buf, v, now); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"5m0s ago", "2s ago", "m      3       16         30s"} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("render lacks %q:\n%s", want, buf.String())
		}
	}
}

// TestRenderProviderStates: a provider is shown "available" only when it
// takes new requests; otherwise its STATE says why (an open circuit, its
// node gone or draining, unhealthy), and a node that drains says so.
func TestRenderProviderStates(t *testing.T) {
	for _, c := range []struct {
		name                   string
		health, status, circut string
		wantHealth, wantState  string
	}{
		{"available", "healthy", "available", "closed", "healthy", "available"},
		{"circuit open", "healthy", "available", "open", "healthy", "circuit open"},
		{"circuit half-open", "healthy", "available", "half_open", "healthy", "circuit half-open (on trial)"},
		{"orphan", "unhealthy", "orphan", "closed", "-", "orphan (node gone)"},
		{"orphan with an open circuit", "unhealthy", "orphan", "open", "-", "orphan (node gone)"},
		{"unhealthy", "unhealthy", "available", "closed", "unhealthy", "unhealthy"},
		{"draining", "healthy", "draining", "closed", "healthy", "draining"},
		{"draining and open", "healthy", "draining", "open", "healthy", "draining, circuit open"},
		{"unknown status", "healthy", "retired", "closed", "healthy", "retired"},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := Provider{NodeID: "n1", ProviderID: "p1", Type: "sim", Capacity: 2, Health: c.health, Status: c.status, Circuit: c.circut, Models: []string{"m"}}
			if got := ProviderState(p); got != c.wantState {
				t.Errorf("ProviderState = %q, want %q", got, c.wantState)
			}
			var buf bytes.Buffer
			if err := Render(&buf, View{Providers: []Provider{p}}, time.Now()); err != nil {
				t.Fatal(err)
			}
			health, row := cell(t, buf.String(), "HEALTH", "n1 "), cell(t, buf.String(), "", "n1 ")
			if state := cell(t, buf.String(), "STATE", "n1 "); health != c.wantHealth || state != c.wantState {
				t.Errorf("row %q: health %q state %q, want %q and %q", row, health, state, c.wantHealth, c.wantState)
			}
			if c.wantState != "available" && strings.Contains(row, "available") {
				t.Errorf("row %q shows a provider out of rotation as available", row)
			}
		})
	}
	var buf bytes.Buffer
	if err := Render(&buf, View{Nodes: []Node{{ID: "n1", Draining: true}, {ID: "n2"}}}, time.Now()); err != nil {
		t.Fatal(err)
	}
	for id, want := range map[string]string{"n1 ": "draining", "n2 ": "connected"} {
		if got := cell(t, buf.String(), "STATE", id); got != want {
			t.Errorf("node %s: state %q, want %q", id, got, want)
		}
	}
}

// cell returns the cell of column col (found by its header) in the first
// row of a table with that column starting with rowPrefix, trimmed; col ""
// gives the whole row.
func cell(t *testing.T, table, col, rowPrefix string) string {
	t.Helper()
	lines := strings.Split(table, "\n")
	for i, h := range lines {
		at := strings.Index(h, col)
		if col != "" && (at < 0 || !strings.Contains(h, "NODE")) {
			continue
		}
		end := len(h)
		if col != "" {
			if next := strings.IndexFunc(h[at+len(col):], func(r rune) bool { return r != ' ' }); next >= 0 {
				end = at + len(col) + next
			}
		}
		for _, row := range lines[i+1:] {
			if row == "" {
				break // the end of this table
			}
			if strings.HasPrefix(row, rowPrefix) {
				if col == "" {
					return row
				}
				end = min(end, len(row))
				return strings.TrimSpace(row[at:end])
			}
		}
	}
	t.Fatalf("no column %q with a row %q in\n%s", col, rowPrefix, table)
	return ""
}

// TestRenderResidency: a LOADED section lists what each provider whose
// node reads it holds loaded, since when, and whether keep_loaded keeps
// it; a provider holding none says "-"; without any such provider there
// is no section.
func TestRenderResidency(t *testing.T) {
	now := time.Date(2025, 1, 1, 0, 10, 0, 0, time.UTC)
	v := View{Providers: []Provider{
		{NodeID: "n1", ProviderID: "a", ReadsLoaded: true, Loaded: []adminwire.Loaded{
			{Model: "x", Since: now.Add(-3 * time.Minute).Format(time.RFC3339Nano), Kept: true}, {Model: "y"}}},
		{NodeID: "n1", ProviderID: "b", ReadsLoaded: true},
		{NodeID: "n2", ProviderID: "c"},
	}}
	var buf bytes.Buffer
	if err := Render(&buf, v, now); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, want := range []string{"LOADED", "n1    a         x      3m0s ago  yes", "n1    a         y      -         no", "n1    b         -      -         -"} {
		if !strings.Contains(out, want) {
			t.Errorf("render lacks %q:\n%s", want, out)
		}
	}
	buf.Reset()
	if err := Render(&buf, View{Providers: v.Providers[2:]}, now); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(buf.String(), "LOADED") {
		t.Errorf("a LOADED section without residency:\n%s", buf.String())
	}
}

// TestRenderUsage: a row per group, "(none)" for an empty group value, the
// zone of the days in the header, a TOTAL row only for several groups.
func TestRenderUsage(t *testing.T) {
	var buf bytes.Buffer
	u := Usage{GroupBy: "day", TZ: "Europe/Berlin", Data: []UsageGroup{
		{Group: "2026-06-01", Requests: 2, Completed: 1, PromptTokens: 3, CompletionTokens: 4, TotalTokens: 7, GPUSeconds: 1.25},
		{Group: "2026-06-02", Requests: 1, Completed: 1, TotalTokens: 1, GPUSeconds: 0.5},
	}}
	if err := RenderUsage(&buf, u); err != nil {
		t.Fatal(err)
	}
	want := `DAY (Europe/Berlin)  REQUESTS  COMPLETED  PROMPT TOKENS  COMPLETION TOKENS  TOTAL TOKENS  GPU-SECONDS
2026-06-01           2         1          3              4                  7             1.2
2026-06-02           1         1          0              0                  1             0.5
TOTAL                3         2          3              4                  8             1.8
`
	if buf.String() != want {
		t.Errorf("got\n%s\nwant\n%s", buf.String(), want)
	}
	buf.Reset()
	if err := RenderUsage(&buf, Usage{GroupBy: "team", Data: []UsageGroup{{Group: "", Requests: 4}}}); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(buf.String(), "TEAM") || !strings.Contains(buf.String(), "(none)  4") || strings.Contains(buf.String(), "\nTOTAL") {
		t.Errorf("one group of keys in no team:\n%s", buf.String())
	}
}

// TestRegression_RenderQueueNamesItsBatchLines: a queue holding a
// batch's lines showed QUEUED 62 beside MAX QUEUE 16, as if over its
// bound; the batch band has its own bound, and the row says how many of
// the queued are batch lines.
func TestRegression_RenderQueueNamesItsBatchLines(t *testing.T) {
	q := Queue{Model: "m", Queued: 62, Batch: 60}
	q.Policy.MaxQueue = 16
	var buf bytes.Buffer
	if err := Render(&buf, View{Queues: []Queue{q}}, time.Now()); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), "62 (60 batch)") {
		t.Errorf("render lacks %q:\n%s", "62 (60 batch)", buf.String())
	}
}
