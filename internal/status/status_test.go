package status

import (
	"bytes"
	"strings"
	"testing"
	"time"
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
