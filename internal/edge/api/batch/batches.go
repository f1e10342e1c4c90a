package batch

import (
	"fmt"
	"net/http"

	"iop/internal/batch"
	"iop/internal/edge/api"
)

// batchObject is a batch as the OpenAI Batch API shapes it.
func batchObject(b batch.Batch) map[string]any {
	nullable := func(v string) any {
		if v == "" {
			return nil
		}
		return v
	}
	var errs any
	if len(b.Errors) > 0 {
		errs = map[string]any{"object": "list", "data": b.Errors}
	}
	var metadata any
	if b.Metadata != nil {
		metadata = b.Metadata
	}
	return map[string]any{
		"id": b.ID, "object": "batch", "endpoint": b.Endpoint, "errors": errs,
		"input_file_id": b.InputFileID, "completion_window": b.CompletionWindow, "status": b.Status,
		"output_file_id": nullable(b.OutputFileID), "error_file_id": nullable(b.ErrorFileID),
		"created_at": b.CreatedAt.Unix(), "in_progress_at": unix(b.InProgressAt), "expires_at": unix(b.ExpiresAt),
		"finalizing_at": unix(b.FinalizingAt), "completed_at": unix(b.CompletedAt), "failed_at": unix(b.FailedAt),
		"expired_at": unix(b.ExpiredAt), "cancelling_at": unix(b.CancellingAt), "cancelled_at": unix(b.CancelledAt),
		"request_counts": map[string]int{"total": b.Total, "completed": b.Completed, "failed": b.Failed},
		"metadata":       metadata,
	}
}

// batches serves POST /v1/batches (create) and GET /v1/batches (list,
// newest first, paged by after and limit).
func (s *server) batches(w http.ResponseWriter, r *http.Request) {
	ctx, who := r.Context(), owner(r.Context())
	switch r.Method {
	case http.MethodPost:
		var req batch.CreateRequest
		if err := decodeJSON(r, &req); err != nil {
			s.writeError(w, r, err)
			return
		}
		b, err := s.svc.CreateBatch(ctx, who, req)
		if err != nil {
			s.writeError(w, r, err)
			return
		}
		api.WriteJSON(w, http.StatusOK, batchObject(b))
	case http.MethodGet, http.MethodHead:
		limit, err := limitParam(r, 20, 100)
		if err != nil {
			s.writeError(w, r, err)
			return
		}
		list, more, err := s.svc.Batches(ctx, who, batch.KindOpenAI, r.URL.Query().Get("after"), limit)
		if err != nil {
			s.writeError(w, r, err)
			return
		}
		data := make([]map[string]any, len(list))
		for i, b := range list {
			data[i] = batchObject(b)
		}
		api.WriteJSON(w, http.StatusOK, listObject(data, more))
	default:
		methodNotAllowed(w, "GET, POST")
	}
}

// batch serves GET /v1/batches/{id} and POST /v1/batches/{id}/cancel.
func (s *server) batch(w http.ResponseWriter, r *http.Request) {
	segs := split(r.URL.Path, batchesPath+"/")
	ctx, who := r.Context(), owner(r.Context())
	var (
		b   batch.Batch
		err error
	)
	switch {
	case len(segs) == 1 && (r.Method == http.MethodGet || r.Method == http.MethodHead):
		b, err = s.svc.Batch(ctx, who, batch.KindOpenAI, segs[0])
	case len(segs) == 2 && segs[1] == "cancel" && r.Method == http.MethodPost:
		b, err = s.svc.Cancel(ctx, who, batch.KindOpenAI, segs[0])
	case len(segs) == 1:
		methodNotAllowed(w, "GET")
		return
	case len(segs) == 2 && segs[1] == "cancel":
		methodNotAllowed(w, "POST")
		return
	default:
		err = fmt.Errorf("%w: no route %s", batch.ErrNotFound, r.URL.Path)
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	api.WriteJSON(w, http.StatusOK, batchObject(b))
}
