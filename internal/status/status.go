// Package status reads an edge's admin API (GET /admin/v1/nodes,
// /providers, /queues, /batches) into one View and renders it as text tables for
// `iop status`, and reads GET /admin/v1/usage into a table for `iop
// usage` (usage.go). It holds no state and starts no goroutine.
package status

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
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
	// Batches are the batches in progress (GET /admin/v1/batches); nil
	// from an edge without the batch API.
	Batches []Batch `json:"batches,omitempty"`
}

// Batch is one batch in progress (package edge/api/batch's Progress).
type Batch struct {
	ID             string  `json:"id"`
	Owner          string  `json:"owner"`
	API            string  `json:"api"`
	Status         string  `json:"status"`
	Total          int     `json:"total"`
	Done           int     `json:"done"`
	Failed         int     `json:"failed"`
	LinesPerSecond float64 `json:"lines_per_second"`
	ETASeconds     float64 `json:"eta_seconds"`
	// Waiting is why its lines do not run ("quota"), WaitingUntil when
	// the key's window holds one again, Unix seconds.
	Waiting      string `json:"waiting"`
	WaitingUntil int64  `json:"waiting_until"`
	// Runner is the edge running the batch: its name, a slash and its
	// process's suffix; "" while none does.
	Runner string `json:"runner"`
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
	if err := getJSON(ctx, client, base+"/admin/v1/batches", &v.Batches); err != nil && !errors.Is(err, errNotFound) {
		return View{}, err
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
	case http.StatusNotFound:
		return fmt.Errorf("GET %s: %w", url, errNotFound)
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

// errNotFound is a route the edge does not serve (404).
var errNotFound = errors.New("not found")

// barWidth is the width of a load bar, in characters.
const barWidth = 10

// Render writes v as three tables (nodes, providers, queues); times are
// shown as ages relative to now. A node's STATE is "connected" or
// "draining"; a provider's HEALTH is what its node reports ("-" once the
// node is gone) and its STATE says whether it takes new requests (see
// ProviderState). It returns the first write error.
func Render(w io.Writer, v View, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "NODES (%d)\n", len(v.Nodes))
	fmt.Fprintln(tw, "NODE\tLABEL\tSTATE\tGENERATION\tCONNECTED\tLAST HEARTBEAT\tVERSION\tPROVIDERS")
	for _, n := range v.Nodes {
		state := "connected"
		if n.Draining {
			state = "draining"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s ago\t%s ago\t%s\t%s\n", n.ID, dash(n.Label), state, n.Generation,
			age(now, n.ConnectedSince), age(now, n.LastHeartbeat), dash(n.Version), strings.Join(n.Providers, ","))
	}
	fmt.Fprintf(tw, "\nPROVIDERS (%d)\n", len(v.Providers))
	fmt.Fprintln(tw, "NODE\tPROVIDER\tTYPE\tIN-FLIGHT\tLOAD\tQUEUED\tHEALTH\tSTATE\tMODELS")
	for _, p := range v.Providers {
		health := p.Health
		if p.Status == StatusOrphan {
			health = "-" // nobody reports it any more
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d/%d\t%s\t%d\t%s\t%s\t%s\n", p.NodeID, p.ProviderID, dash(p.Type),
			p.InFlight, p.Capacity, bar(p.InFlight, p.Capacity), p.Queued, health, ProviderState(p), strings.Join(p.Models, ","))
	}
	renderResidency(tw, v.Providers, now)
	fmt.Fprintf(tw, "\nQUEUES (%d)\n", len(v.Queues))
	fmt.Fprintln(tw, "MODEL\tQUEUED\tMAX QUEUE\tQUEUE TIMEOUT\tFAIRNESS\tFLOWS")
	for _, q := range v.Queues {
		flows := make([]string, 0, len(q.Flows))
		for _, f := range q.Flows {
			name := f.Flow
			if name == "" {
				name = "(default)"
			}
			if f.Priority != "standard" {
				name += "/" + f.Priority
			}
			flows = append(flows, fmt.Sprintf("%s=%d", name, f.Queued))
		}
		queued := strconv.Itoa(q.Queued)
		if q.Batch > 0 {
			queued += fmt.Sprintf(" (%d batch)", q.Batch) // the batch band has its own bound
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\n", q.Model, queued, q.Policy.MaxQueue, time.Duration(q.Policy.QueueTimeoutMS)*time.Millisecond,
			dash(q.Policy.Fairness), dash(strings.Join(flows, ",")))
	}
	if len(v.Batches) > 0 {
		fmt.Fprintf(tw, "\nBATCHES (%d)\n", len(v.Batches))
		fmt.Fprintln(tw, "BATCH\tAPI\tOWNER\tSTATUS\tDONE\tFAILED\tTOTAL\tRATE\tETA\tEDGE")
		for _, b := range v.Batches {
			rate, eta := "-", "-"
			if b.LinesPerSecond > 0 {
				rate = fmt.Sprintf("%.1f/s", b.LinesPerSecond)
				eta = (time.Duration(b.ETASeconds) * time.Second).String()
			}
			if b.Waiting != "" {
				eta = "waiting: " + b.Waiting
				if b.WaitingUntil > 0 {
					eta += " until " + time.Unix(b.WaitingUntil, 0).UTC().Format("15:04:05Z")
				}
			}
			edgeName, _, _ := strings.Cut(b.Runner, "/")
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%d\t%s\t%s\t%s\n", b.ID, b.API, dash(b.Owner), b.Status, b.Done, b.Failed, b.Total, rate, eta, dash(edgeName))
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	return renderUnmatched(w, v.Queues)
}

// renderResidency writes, when some provider's node reads what its
// server holds loaded, a LOADED section: one line per model loaded, with
// how long since and whether keep_loaded keeps it; a provider holding
// none says "-".
func renderResidency(w io.Writer, providers []Provider, now time.Time) {
	var lines []string
	for _, p := range providers {
		if !p.ReadsLoaded {
			continue
		}
		if len(p.Loaded) == 0 {
			lines = append(lines, fmt.Sprintf("%s\t%s\t-\t-\t-\n", p.NodeID, p.ProviderID))
		}
		for _, m := range p.Loaded {
			since := "-"
			if t, err := time.Parse(time.RFC3339Nano, m.Since); err == nil {
				since = age(now, t) + " ago"
			}
			kept := "no"
			if m.Kept {
				kept = "yes"
			}
			lines = append(lines, fmt.Sprintf("%s\t%s\t%s\t%s\t%s\n", p.NodeID, p.ProviderID, m.Model, since, kept))
		}
	}
	if len(lines) == 0 {
		return
	}
	fmt.Fprintln(w, "\nLOADED")
	fmt.Fprintln(w, "NODE\tPROVIDER\tMODEL\tSINCE\tKEPT")
	for _, l := range lines {
		fmt.Fprint(w, l)
	}
}

// renderUnmatched writes, when some alias has targets no node serves, a
// warning per alias naming them (adminwire.Queue.UnmatchedTargets).
func renderUnmatched(w io.Writer, queues []Queue) error {
	for _, q := range queues {
		if len(q.UnmatchedTargets) == 0 {
			continue
		}
		what := "its targets " + strings.Join(q.UnmatchedTargets, ", ") + " match"
		if len(q.UnmatchedTargets) == 1 {
			what = "its target " + q.UnmatchedTargets[0] + " matches"
		}
		what += " no model any node serves"
		if len(q.UnmatchedTargets) == len(q.Targets) {
			what += " (every target: its requests get 404)"
		}
		if _, err := fmt.Fprintf(w, "\nWARNING: alias %s: %s; check the spelling in the edge's models\n", q.Model, what); err != nil {
			return err
		}
	}
	return nil
}

// Provider statuses and circuit states of the admin API (adminwire.Provider).
const (
	StatusAvailable = "available"
	StatusDraining  = "draining"
	StatusOrphan    = "orphan"
	CircuitOpen     = "open"
	CircuitHalfOpen = "half_open"
)

// ProviderState says whether p takes new requests: "available" when it
// does, else why not, every reason that applies, joined by ", ": "orphan
// (node gone)" alone, or among "draining" (its node is shutting down),
// "unhealthy" (its node says so) and "circuit open" (failing: out of
// rotation for a cool-down); "circuit half-open (on trial)" when one
// trial request at a time may go to it. A provider is "available" only
// when none of these holds.
func ProviderState(p Provider) string {
	if p.Status == StatusOrphan {
		return "orphan (node gone)"
	}
	var why []string
	if p.Status == StatusDraining {
		why = append(why, "draining")
	}
	if p.Health != "healthy" {
		why = append(why, "unhealthy")
	}
	switch p.Circuit {
	case CircuitOpen:
		why = append(why, "circuit open")
	case CircuitHalfOpen:
		why = append(why, "circuit half-open (on trial)")
	}
	if p.Status != StatusAvailable && p.Status != StatusDraining {
		why = append(why, dash(p.Status)) // a status this version does not know
	}
	if len(why) == 0 {
		return StatusAvailable
	}
	return strings.Join(why, ", ")
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
