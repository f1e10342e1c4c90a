package admin

import (
	"net/http"
	"strconv"

	"iop/internal/edge/adminwire"
	"iop/internal/edge/api"
	"iop/internal/edge/api/httpconn"
)

// History is the edge's short history of per-second aggregates, for GET
// /admin/v1/history and the dashboard's charts; package edge/history's
// *History is one.
type History interface {
	// Since returns the seconds after since (Unix seconds; 0: all it
	// keeps) that are over, oldest first.
	Since(since int64) adminwire.History
}

// serveHistory serves GET /admin/v1/history?since=UNIX_SECONDS: the
// seconds after since (all the history keeps without it), as
// adminwire.History. 400 for a since that is not an integer.
func (s *server) history(w http.ResponseWriter, r *http.Request) {
	var since int64
	if q := r.URL.Query().Get("since"); q != "" {
		n, err := strconv.ParseInt(q, 10, 64)
		if err != nil {
			api.WriteError(w, r, api.InvalidParam("since", "must be Unix seconds (an integer)"))
			return
		}
		since = n
	}
	w.Header().Set("Cache-Control", "no-store")
	httpconn.WriteJSON(w, http.StatusOK, s.cfg.History.Since(since))
}
