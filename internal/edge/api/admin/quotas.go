package admin

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"time"

	"iop/internal/edge/api"
	"iop/internal/edge/api/httpconn"
	"iop/internal/quota"
)

// Quotas is what /admin/v1/quotas needs of the quota ledger (package
// quota); *quota.Ledger is one.
type Quotas interface {
	Describe(scope, name string) (quota.ScopeStatus, bool)
	DescribeAll() []quota.ScopeStatus
	SetLimits(scope, name string, lim quota.Limits) error
}

var _ Quotas = (*quota.Ledger)(nil)

// quotaJSON is one key's or team's quota in the admin API.
type quotaJSON struct {
	Scope   string       `json:"scope"`
	Name    string       `json:"name"`
	Team    string       `json:"team,omitempty"`
	Quota   quota.Limits `json:"quota"`
	Windows []windowJSON `json:"windows"`
}

// windowJSON is one limited window now, in its unit (tokens, requests,
// gpu_ms, micros).
type windowJSON struct {
	Window    string    `json:"window"`
	Unit      string    `json:"unit"`
	Limit     int64     `json:"limit"`
	Used      int64     `json:"used"`
	Remaining int64     `json:"remaining"`
	ResetAt   time.Time `json:"reset_at"`
}

func renderQuota(s quota.ScopeStatus) quotaJSON {
	out := quotaJSON{Scope: s.Scope, Name: s.Name, Team: s.Team, Quota: s.Limits, Windows: make([]windowJSON, 0, len(s.Windows))}
	for _, w := range s.Windows {
		out.Windows = append(out.Windows, windowJSON{Window: w.Window.Name, Unit: w.Window.Unit, Limit: w.Limit, Used: w.Used,
			Remaining: w.Remaining(), ResetAt: w.ResetAt.UTC()})
	}
	return out
}

// quotas serves /admin/v1/quotas:
//
//	GET                   {"object":"list","data":[quota...]}: every key, then every team
//	GET ?key=K | ?team=T  one quota: {"scope","name","team","quota":{...},"windows":[{"window",
//	                      "unit","limit","used","remaining","reset_at"}]}
//	PUT ?key=K | ?team=T  body: the quota's windows (the keys file's quota: fields); answers the quota
//
// A PUT applies at once and lasts until the keys are reloaded (the keys
// file stays the source of truth). 404 for a key or team that is not
// configured, 400 for invalid limits, 405 for another method.
func (s *server) quotas(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	scope, name := quota.ScopeKey, q.Get("key")
	if q.Has("team") {
		if q.Has("key") {
			api.WriteError(w, r, api.InvalidParam("team", "name a key (?key=) or a team (?team=), not both"))
			return
		}
		scope, name = quota.ScopeTeam, q.Get("team")
	}
	switch {
	case r.Method == http.MethodGet && name == "":
		all := s.cfg.Quotas.DescribeAll()
		out := struct {
			Object string      `json:"object"`
			Data   []quotaJSON `json:"data"`
		}{Object: "list", Data: make([]quotaJSON, 0, len(all))}
		for _, st := range all {
			out.Data = append(out.Data, renderQuota(st))
		}
		httpconn.WriteJSON(w, http.StatusOK, out)
		return
	case name == "":
		api.WriteError(w, r, api.InvalidParam("key", "name a key (?key=) or a team (?team=)"))
		return
	case r.Method == http.MethodPut:
		body, err := io.ReadAll(r.Body)
		if err != nil {
			api.WriteError(w, r, api.InvalidParam("", "reading the body failed"))
			return
		}
		if b := bytes.TrimSpace(body); len(b) == 0 || b[0] != '{' {
			// null would decode as no change and clear every limit.
			api.WriteError(w, r, api.InvalidParam("", `the body must be a quota object ({} removes every limit)`))
			return
		}
		var lim quota.Limits
		dec := json.NewDecoder(bytes.NewReader(body))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&lim); err != nil {
			api.WriteError(w, r, api.InvalidParam("", "the body must be a quota object: "+err.Error()))
			return
		}
		if _, err := dec.Token(); err != io.EOF {
			api.WriteError(w, r, api.InvalidParam("", "the body must be one quota object, with nothing after it"))
			return
		}
		if err := s.cfg.Quotas.SetLimits(scope, name, lim); err != nil {
			if errors.Is(err, quota.ErrUnknownScope) {
				notFound(w, scope, name)
				return
			}
			api.WriteError(w, r, api.InvalidParam("", err.Error()))
			return
		}
		s.logger.Info("quota changed by the admin API", "scope", scope, "name", name)
	case r.Method != http.MethodGet:
		w.Header().Set("Allow", "GET, PUT")
		httpconn.WriteJSON(w, http.StatusMethodNotAllowed, errorJSON("method_not_allowed", "use GET or PUT"))
		return
	}
	st, ok := s.cfg.Quotas.Describe(scope, name)
	if !ok {
		notFound(w, scope, name)
		return
	}
	httpconn.WriteJSON(w, http.StatusOK, renderQuota(st))
}

func notFound(w http.ResponseWriter, scope, name string) {
	httpconn.WriteJSON(w, http.StatusNotFound, errorJSON("not_found", "no "+scope+" named "+name+" is configured"))
}

// errorJSON is an OpenAI-shaped error body.
func errorJSON(code, message string) any {
	type e struct {
		Message string `json:"message"`
		Type    string `json:"type"`
		Code    string `json:"code"`
	}
	return struct {
		Error e `json:"error"`
	}{e{message, "invalid_request_error", code}}
}
