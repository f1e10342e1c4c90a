package batch

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"iop/internal/batch"
	"iop/internal/edge/api"
)

// messageBatchObject is a batch as Anthropic's Message Batches API
// shapes it; resultsURL is where its results are read once it ended.
func messageBatchObject(b batch.Batch, resultsURL string) map[string]any {
	rfc := func(t time.Time) any {
		if t.IsZero() {
			return nil
		}
		return t.UTC().Format(time.RFC3339)
	}
	status, ended := "in_progress", time.Time{}
	switch b.Status {
	case batch.StatusCancelling, batch.StatusFinalizing:
		if !b.CancellingAt.IsZero() {
			status = "canceling"
		}
	case batch.StatusCompleted:
		status, ended = "ended", b.CompletedAt
	case batch.StatusCancelled:
		status, ended = "ended", b.CancelledAt
	case batch.StatusExpired:
		status, ended = "ended", b.ExpiredAt
	case batch.StatusFailed:
		status, ended = "ended", b.FailedAt
	}
	counts := map[string]int{"processing": b.Total - b.Completed - b.Failed, "succeeded": b.Completed,
		"errored": b.Failed, "canceled": b.Canceled, "expired": b.ExpiredCount}
	var results any
	if status == "ended" {
		counts["processing"] = 0
		if b.ResultsFileID != "" {
			results = resultsURL
		}
	}
	return map[string]any{
		"id": b.ID, "type": "message_batch", "processing_status": status, "request_counts": counts,
		"ended_at": rfc(ended), "created_at": rfc(b.CreatedAt), "expires_at": rfc(b.ExpiresAt),
		"archived_at": nil, "cancel_initiated_at": rfc(b.CancellingAt), "results_url": results,
	}
}

// resultsURL is the absolute URL of batch id's results, as the request
// reached this edge.
func resultsURL(r *http.Request, id string) string {
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	return scheme + "://" + r.Host + messagesPath + "/" + id + "/results"
}

// messageBatches serves POST /v1/messages/batches (create) and GET (list,
// newest first, paged by after_id or before_id, and limit).
func (s *server) messageBatches(w http.ResponseWriter, r *http.Request) {
	ctx, who := r.Context(), owner(r.Context())
	switch r.Method {
	case http.MethodPost:
		var body struct {
			Requests []struct {
				CustomID string          `json:"custom_id"`
				Params   json.RawMessage `json:"params"`
			} `json:"requests"`
		}
		if err := decodeJSON(r, &body); err != nil {
			s.writeAnthropicError(w, r, err)
			return
		}
		reqs := make([]batch.MessageRequest, len(body.Requests))
		for i, q := range body.Requests {
			if len(q.Params) == 0 || q.Params[0] != '{' {
				s.writeAnthropicError(w, r, fmt.Errorf("%w: requests.%d.params: must be an object", batch.ErrInvalid, i))
				return
			}
			reqs[i] = batch.MessageRequest{CustomID: q.CustomID, Params: q.Params}
		}
		b, err := s.svc.CreateMessageBatch(ctx, who, reqs)
		if err != nil {
			s.writeAnthropicError(w, r, err)
			return
		}
		api.WriteJSON(w, http.StatusOK, messageBatchObject(b, resultsURL(r, b.ID)))
	case http.MethodGet, http.MethodHead:
		limit, err := limitParam(r, 20, 1000)
		if err != nil {
			s.writeAnthropicError(w, r, err)
			return
		}
		var list []batch.Batch
		var more bool
		if before := r.URL.Query().Get("before_id"); before != "" {
			list, more, err = s.newerThan(r, before, limit)
		} else if after := r.URL.Query().Get("after_id"); after == "" {
			list, more, err = s.svc.Batches(ctx, who, batch.KindAnthropic, "", limit)
		} else if _, err = s.svc.Batch(ctx, who, batch.KindAnthropic, after); err == nil { // an unknown cursor is 404, as before_id's
			list, more, err = s.svc.Batches(ctx, who, batch.KindAnthropic, after, limit)
		}
		if err != nil {
			s.writeAnthropicError(w, r, err)
			return
		}
		data := make([]map[string]any, len(list))
		for i, b := range list {
			data[i] = messageBatchObject(b, resultsURL(r, b.ID))
		}
		out := map[string]any{"data": data, "has_more": more, "first_id": nil, "last_id": nil}
		if len(data) > 0 {
			out["first_id"], out["last_id"] = data[0]["id"], data[len(data)-1]["id"]
		}
		api.WriteJSON(w, http.StatusOK, out)
	default:
		anthropicMethodNotAllowed(w, "GET, POST")
	}
}

// newerThan is the page of the request's key's message batches just
// before batch id in the list (newest first): the limit batches created
// right after it, newest first, and whether newer ones remain. Anthropic's
// before_id; an id the key has none of is ErrNotFound.
func (s *server) newerThan(r *http.Request, id string, limit int) ([]batch.Batch, bool, error) {
	ctx, who := r.Context(), owner(r.Context())
	if _, err := s.svc.Batch(ctx, who, batch.KindAnthropic, id); err != nil {
		return nil, false, err
	}
	var newer []batch.Batch
	for after := ""; ; {
		page, more, err := s.svc.Batches(ctx, who, batch.KindAnthropic, after, 1000)
		if err != nil {
			return nil, false, err
		}
		for i, b := range page {
			if b.ID == id {
				newer = append(newer, page[:i]...)
				start := max(len(newer)-limit, 0)
				return newer[start:], start > 0, nil
			}
		}
		newer = append(newer, page...)
		if !more || len(page) == 0 {
			return nil, false, fmt.Errorf("%w: no batch %s", batch.ErrNotFound, id)
		}
		after = page[len(page)-1].ID
	}
}

// anthropicMethodNotAllowed answers a method the path does not take, in
// Anthropic's error shape.
func anthropicMethodNotAllowed(w http.ResponseWriter, allow string) {
	w.Header().Set("Allow", allow)
	api.WriteJSON(w, http.StatusMethodNotAllowed, map[string]any{"type": "error",
		"error": map[string]string{"type": "invalid_request_error", "message": "Method not allowed; this path takes " + allow + "."}})
}

// messageBatch serves GET /v1/messages/batches/{id}, DELETE (an ended
// batch), POST .../cancel and GET .../results (the results as JSON Lines,
// once the batch ended).
func (s *server) messageBatch(w http.ResponseWriter, r *http.Request) {
	segs := split(r.URL.Path, messagesPath+"/")
	ctx, who := r.Context(), owner(r.Context())
	var (
		b   batch.Batch
		err error
	)
	switch {
	case len(segs) == 1 && (r.Method == http.MethodGet || r.Method == http.MethodHead):
		b, err = s.svc.Batch(ctx, who, batch.KindAnthropic, segs[0])
	case len(segs) == 1 && r.Method == http.MethodDelete:
		if err := s.svc.DeleteMessageBatch(ctx, who, segs[0]); err != nil {
			if errors.Is(err, batch.ErrState) {
				err = fmt.Errorf("%w: message batch %s is still processing; cancel it and delete it once it has ended", batch.ErrInvalid, segs[0])
			}
			s.writeAnthropicError(w, r, err)
			return
		}
		api.WriteJSON(w, http.StatusOK, map[string]any{"id": segs[0], "type": "message_batch_deleted"})
		return
	case len(segs) == 2 && segs[1] == "cancel" && r.Method == http.MethodPost:
		b, err = s.svc.Cancel(ctx, who, batch.KindAnthropic, segs[0])
		if errors.Is(err, batch.ErrState) {
			err = fmt.Errorf("%w: message batch %s has ended; only a batch in progress can be canceled", batch.ErrInvalid, segs[0])
		}
	case len(segs) == 2 && segs[1] == "results" && (r.Method == http.MethodGet || r.Method == http.MethodHead):
		s.results(w, r, segs[0])
		return
	case len(segs) == 1:
		anthropicMethodNotAllowed(w, "GET, DELETE")
		return
	case len(segs) == 2 && segs[1] == "cancel":
		anthropicMethodNotAllowed(w, "POST")
		return
	case len(segs) == 2 && segs[1] == "results":
		anthropicMethodNotAllowed(w, "GET")
		return
	default:
		err = fmt.Errorf("%w: no route %s", batch.ErrNotFound, r.URL.Path)
	}
	if err != nil {
		s.writeAnthropicError(w, r, err)
		return
	}
	api.WriteJSON(w, http.StatusOK, messageBatchObject(b, resultsURL(r, b.ID)))
}

// results streams an ended batch's results file.
func (s *server) results(w http.ResponseWriter, r *http.Request, id string) {
	ctx, who := r.Context(), owner(r.Context())
	b, err := s.svc.Batch(ctx, who, batch.KindAnthropic, id)
	if err == nil && b.ResultsFileID == "" {
		err = fmt.Errorf("%w: batch %s has not ended; its results are ready when processing_status is ended", batch.ErrState, id)
	}
	if err != nil {
		s.writeAnthropicError(w, r, err)
		return
	}
	f, rc, err := s.svc.Content(ctx, who, b.ResultsFileID)
	if err != nil {
		s.writeAnthropicError(w, r, err)
		return
	}
	defer rc.Close()
	w.Header().Set("Content-Type", "application/x-jsonl")
	w.Header().Set("Content-Length", strconv.FormatInt(f.Bytes, 10))
	w.WriteHeader(http.StatusOK)
	if r.Method == http.MethodGet {
		_, _ = io.Copy(w, rc)
	}
}
