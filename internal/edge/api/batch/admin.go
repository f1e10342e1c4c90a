package batch

import (
	"net/http"
	"time"

	"iop/internal/batch"
	"iop/internal/edge/api"
)

// adminPath lists the batches in progress; under /admin, so the frame
// guards it with the admin keys.
const adminPath = "/admin/v1/batches"

// Progress is one batch in progress as GET /admin/v1/batches lists it
// (and `iop status` shows it).
type Progress struct {
	ID     string `json:"id"`
	Owner  string `json:"owner"`
	API    string `json:"api"` // openai or anthropic
	Status string `json:"status"`
	Total  int    `json:"total"`
	Done   int    `json:"done"`
	Failed int    `json:"failed"`
	// Runner names the edge whose service holds the batch's lease (its
	// name, a slash and that process's own suffix); "" while none does.
	Runner string `json:"runner"`
	// CreatedAt is Unix seconds.
	CreatedAt int64 `json:"created_at"`
	// LinesPerSecond is the lines finished per second of the time since
	// the batch started running that its lines could run (its waits for
	// its key's quota not counted); ETASeconds the time the rest take at
	// that rate (0 when unknown, and while Waiting).
	LinesPerSecond float64 `json:"lines_per_second"`
	ETASeconds     float64 `json:"eta_seconds"`
	// Waiting is why the lines do not run, when they do not: "quota"
	// while a line waits out a refusal of the batch's key's quota or
	// request rate (no ETA: the rate does not hold). WaitingUntil is when the latest
	// refusal said the key's window holds a line again, Unix seconds (0
	// when not waiting).
	Waiting      string `json:"waiting,omitempty"`
	WaitingUntil int64  `json:"waiting_until,omitempty"`
}

// progressOf is b's progress at now.
func progressOf(b batch.Batch, now time.Time) Progress {
	p := Progress{ID: b.ID, Owner: b.Owner, API: b.Kind, Status: b.Status, Total: b.Total,
		Done: b.Completed, Failed: b.Failed, CreatedAt: b.CreatedAt.Unix()}
	if b.Leased {
		p.Runner = b.Runner
	}
	finished := b.Completed + b.Failed
	running := now.Sub(b.InProgressAt) - b.Waited
	if b.Waiting != "" && !b.WaitingSince.IsZero() {
		running -= now.Sub(b.WaitingSince)
	}
	if secs := running.Seconds(); !b.InProgressAt.IsZero() && secs > 0 && finished > 0 {
		p.LinesPerSecond = float64(finished) / secs
		p.ETASeconds = float64(b.Total-finished) / p.LinesPerSecond
	}
	if b.Waiting != "" && b.Status == batch.StatusInProgress {
		p.Waiting, p.ETASeconds = b.Waiting, 0
		if !b.WaitingUntil.IsZero() {
			p.WaitingUntil = b.WaitingUntil.Unix()
		}
	}
	return p
}

// progress serves GET /admin/v1/batches: the batches in progress, oldest
// first.
func (s *server) progress(w http.ResponseWriter, r *http.Request) {
	active, err := s.svc.Active(r.Context())
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	now := time.Now()
	out := make([]Progress, len(active))
	for i, b := range active {
		out[i] = progressOf(b, now)
	}
	api.WriteJSON(w, http.StatusOK, out)
}
