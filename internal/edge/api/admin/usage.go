package admin

import (
	"fmt"
	"net/http"
	"slices"
	"time"

	"iop/internal/edge/api"
	"iop/internal/ledger"
)

// usage serves GET /admin/v1/usage?key=&model=&from=&to=&group_by=:
// the ledger's sums, {"object":"list","group_by","data":[{"group",
// "requests","completed","prompt_tokens","completion_tokens",
// "total_tokens","duration_ms"}]}. from and to are RFC 3339 times, dates
// (YYYY-MM-DD, UTC midnight) or Unix seconds; from is inclusive, to
// exclusive. group_by is key, model, provider (node/provider), node, day
// or empty (one total). 400 for a bad parameter.
func (s *server) usage(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	query := ledger.Query{Key: q.Get("key"), Model: q.Get("model"), GroupBy: q.Get("group_by")}
	for _, p := range []struct {
		name string
		dst  *time.Time
	}{{"from", &query.From}, {"to", &query.To}} {
		if s := q.Get(p.name); s != "" {
			t, ok := parseTime(s)
			if !ok {
				api.WriteError(w, r, api.InvalidParam(p.name, "must be an RFC 3339 time, a date (YYYY-MM-DD) or Unix seconds"))
				return
			}
			*p.dst = t
		}
	}
	groups := []string{ledger.GroupNone, ledger.GroupKey, ledger.GroupModel, ledger.GroupProvider, ledger.GroupNode, ledger.GroupDay}
	if !slices.Contains(groups, query.GroupBy) {
		api.WriteError(w, r, api.InvalidParam("group_by", "must be one of key, model, provider, node, day"))
		return
	}
	sums, err := s.cfg.Usage.Aggregate(r.Context(), query)
	if err != nil {
		s.logger.Error("reading the usage ledger failed", "err", err)
		api.WriteError(w, r, err)
		return
	}
	type groupJSON struct {
		Group            string `json:"group"`
		Requests         int64  `json:"requests"`
		Completed        int64  `json:"completed"`
		PromptTokens     int64  `json:"prompt_tokens"`
		CompletionTokens int64  `json:"completion_tokens"`
		TotalTokens      int64  `json:"total_tokens"`
		DurationMs       int64  `json:"duration_ms"`
	}
	out := struct {
		Object  string      `json:"object"`
		GroupBy string      `json:"group_by"`
		Data    []groupJSON `json:"data"`
	}{Object: "list", GroupBy: query.GroupBy, Data: make([]groupJSON, 0, len(sums))}
	for _, g := range sums {
		out.Data = append(out.Data, groupJSON{g.Group, g.Requests, g.Completed, g.PromptTokens, g.CompletionTokens,
			g.PromptTokens + g.CompletionTokens, g.Duration.Milliseconds()})
	}
	api.WriteJSON(w, http.StatusOK, out)
}

// parseTime reads an RFC 3339 time, a date (UTC) or Unix seconds.
func parseTime(s string) (time.Time, bool) {
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, true
	}
	if t, err := time.Parse(time.DateOnly, s); err == nil {
		return t, true
	}
	var sec int64
	if _, err := fmt.Sscanf(s, "%d", &sec); err == nil && fmt.Sprint(sec) == s {
		return time.Unix(sec, 0), true
	}
	return time.Time{}, false
}
