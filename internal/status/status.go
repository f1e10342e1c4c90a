// Package status reads an edge's admin API (GET /admin/v1/nodes,
// /providers, /queues) into one View and renders it as text tables for
// `iop status`. It holds no state and starts no goroutine.
package status

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"text/tabwriter"
	"time"

	"iop/internal/edge/adminwire"
)

// View is the edge's state as its admin API reports it; its JSON form is
// what `iop status --json` prints.
type View struct {
	Nodes     []Node     `json:"nodes"`
	Providers []Provider `json:"providers"`
	Queues    []Queue    `json:"queues"`
}

// The admin API's entries (package adminwire).
type (
	Node     = adminwire.Node
	Provider = adminwire.Provider
	Queue    = adminwire.Queue
)

// BaseURL turns an --edge value into the HTTP API's base URL: a bare
// host:port gets "http://"; a trailing slash goes.
func BaseURL(edge string) string {
	if !strings.Contains(edge, "://") {
		edge = "http://" + edge
	}
	return strings.TrimRight(edge, "/")
}

// Fetch reads the three admin routes of the edge at base (see BaseURL)
// with client. Errors: the request's, a non-200 answer (with its status),
// or a body that is not the route's JSON array.
func Fetch(ctx context.Context, client *http.Client, base string) (View, error) {
	var v View
	for _, r := range []struct {
		path string
		into any
	}{{"/admin/v1/nodes", &v.Nodes}, {"/admin/v1/providers", &v.Providers}, {"/admin/v1/queues", &v.Queues}} {
		if err := getJSON(ctx, client, base+r.path, r.into); err != nil {
			return View{}, err
		}
	}
	return v, nil
}

func getJSON(ctx context.Context, client *http.Client, url string, into any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusUnauthorized, http.StatusForbidden:
		return fmt.Errorf("GET %s: %s (the edge has API keys: give an admin key with --api-key or $IOP_ADMIN_KEY)", url, resp.Status)
	default:
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(into); err != nil {
		return fmt.Errorf("GET %s: %w", url, err)
	}
	return nil
}

// barWidth is the width of a load bar, in characters.
const barWidth = 10

// Render writes v as three tables (nodes, providers, queues); times are
// shown as ages relative to now. It returns the first write error.
func Render(w io.Writer, v View, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "NODES (%d)\n", len(v.Nodes))
	fmt.Fprintln(tw, "NODE\tLABEL\tGENERATION\tCONNECTED\tLAST HEARTBEAT\tVERSION\tPROVIDERS")
	for _, n := range v.Nodes {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s ago\t%s ago\t%s\t%s\n", n.ID, dash(n.Label), n.Generation,
			age(now, n.ConnectedSince), age(now, n.LastHeartbeat), dash(n.Version), strings.Join(n.Providers, ","))
	}
	fmt.Fprintf(tw, "\nPROVIDERS (%d)\n", len(v.Providers))
	fmt.Fprintln(tw, "NODE\tPROVIDER\tTYPE\tIN-FLIGHT\tLOAD\tQUEUED\tHEALTH\tSTATUS\tMODELS")
	for _, p := range v.Providers {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d/%d\t%s\t%d\t%s\t%s\t%s\n", p.NodeID, p.ProviderID, dash(p.Type),
			p.InFlight, p.Capacity, bar(p.InFlight, p.Capacity), p.Queued, p.Health, p.Status, strings.Join(p.Models, ","))
	}
	fmt.Fprintf(tw, "\nQUEUES (%d)\n", len(v.Queues))
	fmt.Fprintln(tw, "MODEL\tQUEUED\tMAX QUEUE\tQUEUE TIMEOUT")
	for _, q := range v.Queues {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\n", q.Model, q.Queued, q.Policy.MaxQueue, time.Duration(q.Policy.QueueTimeoutMS)*time.Millisecond)
	}
	return tw.Flush()
}

// bar draws inFlight/capacity as "[####      ]"; over capacity (a capacity
// lowered under load) fills it.
func bar(inFlight, capacity int) string {
	filled := barWidth
	if capacity > 0 && inFlight < capacity {
		filled = inFlight * barWidth / capacity
		if inFlight > 0 && filled == 0 {
			filled = 1
		}
	}
	return "[" + strings.Repeat("#", filled) + strings.Repeat(" ", barWidth-filled) + "]"
}

// age is now - t rounded to the second, "-" for a zero t.
func age(now, t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return max(now.Sub(t), 0).Round(time.Second).String()
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
