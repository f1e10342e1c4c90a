package status

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"text/tabwriter"

	"iop/internal/edge/adminwire"
)

// Usage is the answer of GET /admin/v1/usage (package adminwire); its JSON
// form is what `iop usage --json` prints.
type (
	Usage      = adminwire.Usage
	UsageGroup = adminwire.UsageGroup
)

// UsageQuery is what `iop usage` asks GET /admin/v1/usage for: each
// non-empty field is the query parameter of its name (key, team, model,
// from, to, group_by, tz), passed as given.
type UsageQuery struct {
	Key, Team, Model, From, To, GroupBy, TZ string
}

// FetchUsage reads GET /admin/v1/usage of the edge at base (see BaseURL)
// with client. Errors: the request's, a non-200 answer (with its status
// and the API's error message: a bad parameter says which), or a body
// that is not the route's JSON.
func FetchUsage(ctx context.Context, client *http.Client, base string, q UsageQuery) (Usage, error) {
	v := url.Values{}
	for name, val := range map[string]string{"key": q.Key, "team": q.Team, "model": q.Model, "from": q.From, "to": q.To, "group_by": q.GroupBy, "tz": q.TZ} {
		if val != "" {
			v.Set(name, val)
		}
	}
	u := base + "/admin/v1/usage"
	if len(v) > 0 {
		u += "?" + v.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return Usage{}, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return Usage{}, err
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusUnauthorized, http.StatusForbidden:
		return Usage{}, fmt.Errorf("GET %s: %s (the edge has API keys: give an admin key with --api-key or $IOP_ADMIN_KEY)", u, resp.Status)
	case http.StatusNotFound:
		return Usage{}, fmt.Errorf("GET %s: %s (this edge keeps no usage ledger)", u, resp.Status)
	default:
		var e struct {
			Error struct {
				Message string `json:"message"`
			} `json:"error"`
		}
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		if json.Unmarshal(body, &e) == nil && e.Error.Message != "" {
			return Usage{}, fmt.Errorf("GET %s: %s: %s", u, resp.Status, e.Error.Message)
		}
		return Usage{}, fmt.Errorf("GET %s: %s", u, resp.Status)
	}
	var out Usage
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return Usage{}, fmt.Errorf("GET %s: %w", u, err)
	}
	return out, nil
}

// RenderUsage writes u as a table: one row per group (headed by what it
// groups by, with "(none)" for an empty value: the open API's key, the
// keys in no team), its requests, completed requests, prompt, completion
// and total tokens and GPU-seconds, then a TOTAL row when there are
// several. It returns the first write error.
func RenderUsage(w io.Writer, u Usage) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	head := strings.ToUpper(u.GroupBy)
	if head == "" {
		head = "ALL"
	}
	if u.GroupBy == "day" && u.TZ != "" && u.TZ != "UTC" {
		head += " (" + u.TZ + ")"
	}
	row := func(name string, cells ...string) {
		fmt.Fprintf(tw, "%s\t%s\n", name, strings.Join(cells, "\t"))
	}
	row(head, "REQUESTS", "COMPLETED", "PROMPT TOKENS", "COMPLETION TOKENS", "TOTAL TOKENS", "GPU-SECONDS")
	var total UsageGroup
	for _, g := range u.Data {
		row(groupName(u, g), usageCells(g)...)
		total.Requests += g.Requests
		total.Completed += g.Completed
		total.PromptTokens += g.PromptTokens
		total.CompletionTokens += g.CompletionTokens
		total.TotalTokens += g.TotalTokens
		total.GPUSeconds += g.GPUSeconds
	}
	if len(u.Data) > 1 {
		row("TOTAL", usageCells(total)...)
	}
	if len(u.Data) == 0 {
		fmt.Fprintln(tw, "(no usage in the ledger for this query)")
	}
	return tw.Flush()
}

func groupName(u Usage, g UsageGroup) string {
	if g.Group == "" && u.GroupBy != "" {
		return "(none)"
	}
	if u.GroupBy == "" {
		return "all"
	}
	return g.Group
}

func usageCells(g UsageGroup) []string {
	n := func(v int64) string { return strconv.FormatInt(v, 10) }
	return []string{n(g.Requests), n(g.Completed), n(g.PromptTokens), n(g.CompletionTokens), n(g.TotalTokens),
		strconv.FormatFloat(g.GPUSeconds, 'f', 1, 64)}
}
