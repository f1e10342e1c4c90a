package anthropic

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"iop/internal/edge/api"
	"iop/internal/edge/api/access"
	"iop/internal/edge/api/httpconn"
	"iop/internal/edge/contract"
)

// anthropicModelObject is one model of Anthropic's Models API (Anthropic
// API reference, "Models"): type "model", the id, a display name (iop
// has none but the id) and created_at, an RFC 3339 time.
type anthropicModelObject struct {
	Type        string `json:"type"`
	ID          string `json:"id"`
	DisplayName string `json:"display_name"`
	CreatedAt   string `json:"created_at"`
}

// anthropicModel is id as Anthropic's Models API shows a model; its
// created_at is the time of the answer, as OpenAI's created is (iop keeps
// no release date of a model).
func (s *server) model(id string) anthropicModelObject {
	return anthropicModelObject{Type: "model", ID: id, DisplayName: id,
		CreatedAt: s.f.Now().UTC().Format(time.RFC3339)}
}

// Paging of Anthropic's list of models ("List Models": limit 1 to 1000,
// default 20).
const (
	defaultAnthropicModelsLimit = 20
	maxAnthropicModelsLimit     = 1000
)

// listModels answers GET /v1/models in Anthropic's shape to a request
// that names an anthropic-version, else in OpenAI's (the frame's):
// {"data":[model...],"has_more","first_id","last_id"} (first_id and
// last_id null for an empty page), the names in the listing's order,
// paged by limit (1 to 1000, default 20), after_id and before_id (a name
// of the list; exclusive; with before_id, the page is the limit names
// just before it). 400, in Anthropic's error shape, for a bad parameter
// or an id the list does not hold.
func (s *server) listModels(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get(versionHeader) == "" {
		s.f.ServeModels(w, r)
		return
	}
	names := s.f.Models(r)
	q := r.URL.Query()
	limit := defaultAnthropicModelsLimit
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxAnthropicModelsLimit {
			s.writeError(w, r, api.InvalidParam("limit", fmt.Sprintf("must be an integer in [1, %d]", maxAnthropicModelsLimit)), nil)
			return
		}
		limit = n
	}
	index := func(param string) (int, bool) {
		v := q.Get(param)
		if v == "" {
			return -1, true
		}
		i := slices.Index(names, v)
		if i < 0 {
			s.writeError(w, r, api.InvalidParam(param, fmt.Sprintf("no model of this list has the id %q", api.Clip(v))), nil)
		}
		return i, i >= 0
	}
	after, ok := index("after_id")
	if !ok {
		return
	}
	before, ok := index("before_id")
	if !ok {
		return
	}
	start, end := after+1, len(names)
	if before >= 0 {
		end = before
	}
	end = max(end, start)
	more := false
	if before >= 0 && after < 0 {
		// The names just before before_id.
		if end-start > limit {
			start, more = end-limit, true
		}
	} else if end-start > limit {
		end, more = start+limit, true
	}
	page := names[start:end]
	data := make([]anthropicModelObject, 0, len(page))
	for _, name := range page {
		data = append(data, s.model(name))
	}
	var first, last *string
	if len(page) > 0 {
		first, last = &page[0], &page[len(page)-1]
	}
	httpconn.WriteJSON(w, http.StatusOK, struct {
		Data    []anthropicModelObject `json:"data"`
		HasMore bool                   `json:"has_more"`
		FirstID *string                `json:"first_id"`
		LastID  *string                `json:"last_id"`
	}{data, more, first, last})
}

// getModel answers GET /v1/models/{model} in Anthropic's shape (model)
// to a request that names an anthropic-version, with Anthropic's errors
// (404 for a name the chat and Messages routes do not take, also one the
// key may not use, which the listing leaves out), else in OpenAI's (the
// frame's).
func (s *server) getModel(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get(versionHeader) == "" {
		s.f.ServeModel(w, r)
		return
	}
	id := strings.TrimPrefix(r.URL.Path, modelsPath+"/")
	if _, err := s.f.ResolveModel(r, id); err != nil {
		if errors.Is(err, access.ErrModelNotAllowed) {
			err = api.ErrUnknownModel // as the listing, which leaves it out
		}
		s.writeError(w, r, err, &contract.Request{Model: id})
		return
	}
	httpconn.WriteJSON(w, http.StatusOK, s.model(id))
}
