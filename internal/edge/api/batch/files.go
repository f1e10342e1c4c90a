package batch

import (
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"

	"iop/internal/batch"
	"iop/internal/edge/api"
)

// maxFieldBytes bounds a multipart form field other than the file.
const maxFieldBytes = 1 << 10

// fileObject is a file as the OpenAI Files API shapes it.
func fileObject(f batch.File) map[string]any {
	return map[string]any{
		"id": f.ID, "object": "file", "bytes": f.Bytes, "created_at": f.CreatedAt.Unix(),
		"filename": f.Filename, "purpose": f.Purpose, "status": "processed",
		"expires_at": nil, "status_details": nil,
	}
}

// files serves POST /v1/files (upload) and GET /v1/files (list).
func (s *server) files(w http.ResponseWriter, r *http.Request) {
	switch r.Method {
	case http.MethodPost:
		s.upload(w, r)
	case http.MethodGet, http.MethodHead:
		limit, err := limitParam(r, 10000, 10000)
		if err != nil {
			s.writeError(w, r, err)
			return
		}
		q := r.URL.Query()
		files, more, err := s.svc.Files(r.Context(), owner(r.Context()), q.Get("purpose"), q.Get("after"), limit)
		if err != nil {
			s.writeError(w, r, err)
			return
		}
		data := make([]map[string]any, len(files))
		for i, f := range files {
			data[i] = fileObject(f)
		}
		api.WriteJSON(w, http.StatusOK, listObject(data, more))
	default:
		methodNotAllowed(w, "GET, POST")
	}
}

// listObject is an OpenAI list of data (objects with an "id").
func listObject(data []map[string]any, more bool) map[string]any {
	out := map[string]any{"object": "list", "data": data, "has_more": more, "first_id": nil, "last_id": nil}
	if len(data) > 0 {
		out["first_id"], out["last_id"] = data[0]["id"], data[len(data)-1]["id"]
	}
	return out
}

// upload reads a multipart form (fields purpose and file, in either
// order) as a stream: the file's bytes go to storage as they arrive,
// never whole in memory. Over the size limit: 413.
func (s *server) upload(w http.ResponseWriter, r *http.Request) {
	mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil || mt != "multipart/form-data" {
		s.writeError(w, r, fmt.Errorf("%w: the body must be multipart/form-data with fields file and purpose", batch.ErrInvalid))
		return
	}
	mr, err := r.MultipartReader()
	if err != nil {
		s.writeError(w, r, fmt.Errorf("%w: the body must be multipart/form-data with fields file and purpose", batch.ErrInvalid))
		return
	}
	var (
		purpose string
		up      *batch.Upload
	)
	defer func() {
		if up != nil {
			up.Discard() // not committed
		}
	}()
	for {
		part, err := mr.NextPart()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			s.writeError(w, r, multipartError(err))
			return
		}
		switch part.FormName() {
		case "purpose":
			b, err := io.ReadAll(io.LimitReader(part, maxFieldBytes))
			if err != nil {
				s.writeError(w, r, multipartError(err))
				return
			}
			purpose = string(b)
		case "file":
			if up != nil {
				s.writeError(w, r, fmt.Errorf("%w: file: only one file per upload", batch.ErrInvalid))
				return
			}
			name := part.FileName()
			if name == "" {
				name = "upload.jsonl"
			}
			if up, err = s.svc.Stage(owner(r.Context()), name, part); err != nil {
				if errors.Is(err, batch.ErrBodyRead) {
					err = multipartError(err)
				}
				s.writeError(w, r, err) // a store that failed is a 500, logged
				return
			}
		}
		part.Close()
	}
	if up == nil {
		s.writeError(w, r, fmt.Errorf("%w: file: missing required field", batch.ErrInvalid))
		return
	}
	f, err := up.Commit(r.Context(), purpose)
	up = nil // committed, or discarded by Commit
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	api.WriteJSON(w, http.StatusOK, fileObject(f))
}

// multipartError is a failure reading the form: over a size limit as
// is, anything else a malformed form.
func multipartError(err error) error {
	if _, ok := errors.AsType[*http.MaxBytesError](err); ok || errors.Is(err, batch.ErrTooLarge) {
		return err
	}
	return fmt.Errorf("%w: the multipart form could not be read", batch.ErrInvalid)
}

// file serves GET and DELETE /v1/files/{id} and GET
// /v1/files/{id}/content.
func (s *server) file(w http.ResponseWriter, r *http.Request) {
	segs := split(r.URL.Path, filesPath+"/")
	ctx, who := r.Context(), owner(r.Context())
	switch {
	case len(segs) == 1 && (r.Method == http.MethodGet || r.Method == http.MethodHead):
		f, err := s.svc.File(ctx, who, segs[0])
		if err != nil {
			s.writeError(w, r, err)
			return
		}
		api.WriteJSON(w, http.StatusOK, fileObject(f))
	case len(segs) == 1 && r.Method == http.MethodDelete:
		if err := s.svc.DeleteFile(ctx, who, segs[0]); err != nil {
			s.writeError(w, r, err)
			return
		}
		api.WriteJSON(w, http.StatusOK, map[string]any{"id": segs[0], "object": "file", "deleted": true})
	case len(segs) == 2 && segs[1] == "content" && (r.Method == http.MethodGet || r.Method == http.MethodHead):
		f, rc, err := s.svc.Content(ctx, who, segs[0])
		if err != nil {
			s.writeError(w, r, err)
			return
		}
		defer rc.Close()
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Length", strconv.FormatInt(f.Bytes, 10))
		w.WriteHeader(http.StatusOK)
		if r.Method == http.MethodGet {
			_, _ = io.Copy(w, rc)
		}
	case len(segs) == 1 || len(segs) == 2 && segs[1] == "content":
		methodNotAllowed(w, "GET, DELETE")
	default:
		s.writeError(w, r, fmt.Errorf("%w: no route %s", batch.ErrNotFound, r.URL.Path))
	}
}
