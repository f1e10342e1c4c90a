package admin

import (
	"fmt"
	"math"
	"net/http"
	"slices"
	"time"

	"iop/internal/edge/adminwire"
	"iop/internal/edge/api"
	"iop/internal/edge/api/httpconn"
	"iop/internal/ledger"
)

// usage serves GET
// /admin/v1/usage?key=&team=&model=&batch=&from=&to=&group_by=&tz=: the
// ledger's sums as adminwire.Usage. from and to are RFC 3339 times, dates
// (YYYY-MM-DD, midnight in tz) or Unix seconds; from is inclusive, to
// exclusive. group_by is key, team, model, provider (node/provider),
// node, day, batch ("batch" for batch lines, else "interactive") or
// empty (one total); batch=batch or batch=interactive selects those. team selects the keys Config.TeamOf
// puts in that team now, and group_by=team sums by it ("" for keys in no
// team); without TeamOf no key is in a team. tz is an IANA time zone
// (default UTC) naming group_by=day's dates and the dates of from and to.
// 400 for a bad parameter.
func (s *server) usage(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	query := ledger.Query{Key: q.Get("key"), Team: q.Get("team"), Model: q.Get("model"), GroupBy: q.Get("group_by"), TeamOf: s.cfg.TeamOf,
		Batch: q.Get("batch")}
	if query.Batch != ledger.BatchAll && query.Batch != ledger.BatchOnly && query.Batch != ledger.BatchInteractive {
		api.WriteError(w, r, api.InvalidParam("batch", "must be batch or interactive"))
		return
	}
	loc := time.UTC
	if tz := q.Get("tz"); tz != "" {
		var err error
		// LoadLocation also reads a file path relative to the zone
		// database: names only.
		if loc, err = time.LoadLocation(tz); err != nil || tz == "Local" {
			api.WriteError(w, r, api.InvalidParam("tz", "must be an IANA time zone such as UTC or Europe/Berlin"))
			return
		}
	}
	query.Location = loc
	for _, p := range []struct {
		name string
		dst  *time.Time
	}{{"from", &query.From}, {"to", &query.To}} {
		if s := q.Get(p.name); s != "" {
			t, ok := parseTime(s, loc)
			if !ok {
				api.WriteError(w, r, api.InvalidParam(p.name, "must be an RFC 3339 time, a date (YYYY-MM-DD) or Unix seconds"))
				return
			}
			*p.dst = t
		}
	}
	if !query.From.IsZero() && !query.To.IsZero() && !query.From.Before(query.To) {
		api.WriteError(w, r, api.InvalidParam("to", "must be after from (from is inclusive, to exclusive)"))
		return
	}
	groups := []string{ledger.GroupNone, ledger.GroupKey, ledger.GroupTeam, ledger.GroupModel, ledger.GroupProvider, ledger.GroupNode, ledger.GroupDay, ledger.GroupBatch}
	if !slices.Contains(groups, query.GroupBy) {
		api.WriteError(w, r, api.InvalidParam("group_by", "must be one of key, team, model, provider, node, day, batch"))
		return
	}
	sums, err := s.cfg.Usage.Aggregate(r.Context(), query)
	if err != nil {
		s.logger.Error("reading the usage ledger failed", "err", err)
		api.WriteError(w, r, err)
		return
	}
	out := adminwire.Usage{Object: "list", GroupBy: query.GroupBy, TZ: loc.String(), Data: make([]adminwire.UsageGroup, 0, len(sums))}
	for _, g := range sums {
		out.Data = append(out.Data, adminwire.UsageGroup{
			Group: g.Group, Requests: g.Requests, Completed: g.Completed,
			PromptTokens: g.PromptTokens, CompletionTokens: g.CompletionTokens, TotalTokens: g.PromptTokens + g.CompletionTokens,
			DurationMs: g.Duration.Milliseconds(), GPUSeconds: math.Round(g.GPUTime.Seconds()*1000) / 1000,
		})
	}
	httpconn.WriteJSON(w, http.StatusOK, out)
}

// parseTime reads an RFC 3339 time, a date (midnight in loc) or Unix
// seconds.
func parseTime(s string, loc *time.Location) (time.Time, bool) {
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, true
	}
	if t, err := time.ParseInLocation(time.DateOnly, s, loc); err == nil {
		return t, true
	}
	var sec int64
	if _, err := fmt.Sscanf(s, "%d", &sec); err == nil && fmt.Sprint(sec) == s {
		return time.Unix(sec, 0), true
	}
	return time.Time{}, false
}
