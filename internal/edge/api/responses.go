package api

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"iop/internal/edge/contract"
	"iop/internal/responses"
	"iop/internal/runs"
	"iop/internal/translate"
)

// Paths of the Responses API.
const (
	responsesPath   = "/v1/responses"
	responsesPrefix = "/v1/responses/"
)

// ResponseStore keeps stored responses (Config.Responses); package
// responses' SQLite implements it. Every method but Save finds only the
// owner's responses: another owner's id is responses.ErrNotFound.
type ResponseStore interface {
	// Save inserts or replaces a response with its items.
	Save(ctx context.Context, rec responses.Record) error
	// SetStatus changes a stored response's status and object.
	SetStatus(ctx context.Context, owner, id, status string, response json.RawMessage) error
	// Get returns a stored response with its own items.
	Get(ctx context.Context, owner, id string) (responses.Record, error)
	// Conversation returns the items a response continuing a stored one
	// starts from, the whole chain's (responses.ErrChainTooLong past its
	// limits).
	Conversation(ctx context.Context, owner, id string) ([]responses.Item, error)
	// Delete removes a stored response.
	Delete(ctx context.Context, owner, id string) error
	// Item returns the JSON of the owner's latest stored input or output
	// item with that id.
	Item(ctx context.Context, owner, itemID string) (json.RawMessage, error)
}

var _ ResponseStore = (*responses.SQLite)(nil)

// responseNotFound is a response id the request's key has no stored
// response of: 404, as OpenAI answers an id it does not know.
type responseNotFound struct{ id string }

func (e *responseNotFound) Error() string {
	return fmt.Sprintf("Response with id '%s' not found.", Clip(e.id))
}

// responseObject is a Responses API response (OpenAI API reference, "The
// response object").
type responseObject struct {
	ID                 string                   `json:"id"`
	Object             string                   `json:"object"` // "response"
	CreatedAt          int64                    `json:"created_at"`
	Status             string                   `json:"status"`
	Background         bool                     `json:"background"`
	Error              *responseError           `json:"error"`
	IncompleteDetails  *incompleteDetails       `json:"incomplete_details"`
	Model              string                   `json:"model"`
	Output             []translate.ResponseItem `json:"output"`
	PreviousResponseID *string                  `json:"previous_response_id"`
	ServiceTier        string                   `json:"service_tier"`
	Store              bool                     `json:"store"`
	Usage              *responseUsage           `json:"usage,omitempty"` // left out until known: OpenAI's document has no null usage
	translate.ResponsesEcho
}

// responseError is a failed response's "error".
type responseError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

type incompleteDetails struct {
	Reason string `json:"reason"`
}

// responseUsage is a response's "usage", in tokens.
type responseUsage struct {
	InputTokens        int `json:"input_tokens"`
	InputTokensDetails struct {
		CachedTokens     int `json:"cached_tokens"`
		CacheWriteTokens int `json:"cache_write_tokens"`
	} `json:"input_tokens_details"`
	OutputTokens        int `json:"output_tokens"`
	OutputTokensDetails struct {
		ReasoningTokens int `json:"reasoning_tokens"`
	} `json:"output_tokens_details"`
	TotalTokens int `json:"total_tokens"`
}

func newResponseUsage(in, out int) *responseUsage {
	return &responseUsage{InputTokens: in, OutputTokens: out, TotalTokens: in + out}
}

// newItemID returns a new id with prefix: "<prefix>_<48 hex digits>", the
// form of OpenAI's ids.
func newItemID(prefix string) string {
	var b [24]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go ≥ 1.24)
	return prefix + "_" + hex.EncodeToString(b[:])
}

// itemPrefixes are the id prefixes given to input items that came without
// an id.
var itemPrefixes = map[string]string{
	translate.ItemMessage: "msg", translate.ItemFunctionCall: "fc", translate.ItemFunctionCallOutput: "fco",
	translate.ItemReasoning: "rs",
}

// responsesRoute serves /v1/responses/{id}, /v1/responses/{id}/input_items
// and /v1/responses/{id}/cancel.
func (h *handler) responsesRoute(w http.ResponseWriter, r *http.Request) {
	rest := strings.TrimPrefix(r.URL.Path, responsesPrefix)
	id, sub, _ := strings.Cut(rest, "/")
	method := http.MethodGet
	switch {
	case id == "" || strings.Contains(sub, "/"):
		h.writeError(w, r, errNotFound, nil)
		return
	case sub == "":
		method = r.Method
		if method != http.MethodDelete && method != http.MethodHead {
			method = http.MethodGet
		}
	case sub == "input_items":
	case sub == "cancel":
		method = http.MethodPost
	default:
		h.writeError(w, r, errNotFound, nil)
		return
	}
	if r.Method != method && !(method == http.MethodGet && r.Method == http.MethodHead) {
		allow := method
		if sub == "" {
			allow = "GET, DELETE"
		}
		w.Header().Set("Allow", allow)
		h.writeError(w, r, errMethodNotAllowed, nil)
		return
	}
	switch {
	case sub == "input_items":
		h.responseInputItems(w, r, id)
	case sub == "cancel":
		h.cancelResponse(w, r, id)
	case r.Method == http.MethodDelete:
		h.deleteResponse(w, r, id)
	default:
		h.getResponse(w, r, id)
	}
}

// storedResponse returns the request key's stored response id: a
// *responseNotFound for none (also for another key's, or with no store).
func (h *handler) storedResponse(ctx context.Context, id string) (responses.Record, error) {
	if h.cfg.Responses == nil {
		return responses.Record{}, &responseNotFound{id}
	}
	rec, err := h.cfg.Responses.Get(ctx, keyName(ctx), id)
	if errors.Is(err, responses.ErrNotFound) {
		return responses.Record{}, &responseNotFound{id}
	}
	if err == nil && (rec.Status == "queued" || rec.Status == "in_progress") && (h.cfg.Runs == nil || h.cfg.Runs.Live(id) == nil) && !h.isStreaming(id) {
		rec = h.orphaned(ctx, rec)
	}
	return rec, err
}

// liveResponse is a stored response being streamed (handler.streaming).
type liveResponse struct {
	owner string
	// cancel ends its request (its run) with a cause.
	cancel context.CancelCauseFunc
	// done is closed once its request stored its last state.
	done chan struct{}
}

// errResponseDeleted ends a streamed response deleted while it streams.
var errResponseDeleted = errors.New("the response was deleted")

// isStreaming reports whether the stored response id is being streamed
// by this edge process now.
func (h *handler) isStreaming(id string) bool {
	_, ok := h.streaming.Load(id)
	return ok
}

// errResponseOrphaned is the error of a background response whose run no
// edge process runs any more: the one that ran it stopped before it ended
// (a crash; a stop ends it failed itself).
const errResponseOrphaned = "the edge restarted while the response was in flight"

// orphaned ends a stored response left queued or in progress by an edge
// process that is gone: failed, with errResponseOrphaned, saved so.
func (h *handler) orphaned(ctx context.Context, rec responses.Record) responses.Record {
	var obj map[string]any
	if json.Unmarshal(rec.Response, &obj) != nil {
		return rec
	}
	obj["status"] = "failed"
	obj["error"] = responseError{Code: "server_error", Message: errResponseOrphaned}
	doc, err := json.Marshal(obj)
	if err != nil {
		return rec
	}
	if err := h.cfg.Responses.SetStatus(ctx, rec.Owner, rec.ID, "failed", doc); err != nil {
		h.logger.Warn("marking an orphaned response failed", "response_id", rec.ID, "err", err)
	}
	rec.Status, rec.Response = "failed", doc
	return rec
}

// getResponse serves GET /v1/responses/{id}: the stored response object
// (of a background response, its state now); with stream=true its event
// stream (streamResponse). 404 for an id the key has none of.
func (h *handler) getResponse(w http.ResponseWriter, r *http.Request, id string) {
	if v := r.URL.Query().Get("stream"); v != "" && v != "false" {
		h.streamResponse(w, r, id)
		return
	}
	rec, err := h.storedResponse(r.Context(), id)
	if err != nil {
		h.writeError(w, r, err, nil)
		return
	}
	writeRawJSON(w, http.StatusOK, rec.Response)
}

// deleteResponse serves DELETE /v1/responses/{id}: {"id","object":
// "response","deleted":true}. A background response still running is
// cancelled first. 404 for an id the key has none of.
func (h *handler) deleteResponse(w http.ResponseWriter, r *http.Request, id string) {
	if _, err := h.storedResponse(r.Context(), id); err != nil {
		h.writeError(w, r, err, nil)
		return
	}
	if h.cfg.Runs != nil {
		if run := h.cfg.Runs.Live(id); run != nil && run.Record().KeyName == keyName(r.Context()) {
			run.Cancel("the response was deleted")
			_, _ = run.Wait(r.Context())
		}
	}
	if v, ok := h.streaming.Load(id); ok && v.(*liveResponse).owner == keyName(r.Context()) {
		// Streamed now: its request ends (the run is cancelled, the
		// client's stream cut) and stores its last state, then it is
		// deleted, so the delete is not undone by that last save.
		live := v.(*liveResponse)
		live.cancel(errResponseDeleted)
		select {
		case <-live.done:
		case <-r.Context().Done():
			h.writeError(w, r, context.Cause(r.Context()), nil)
			return
		}
	}
	if err := h.cfg.Responses.Delete(r.Context(), keyName(r.Context()), id); err != nil {
		if errors.Is(err, responses.ErrNotFound) {
			err = &responseNotFound{id}
		}
		h.writeError(w, r, err, nil)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"id": id, "object": "response", "deleted": true})
}

// Paging of input_items (OpenAI API reference, "List input items").
const (
	defaultItemsLimit = 20
	maxItemsLimit     = 100
)

// responseInputItems serves GET /v1/responses/{id}/input_items?limit=&
// order=&after=&before=: {"object":"list","data":[items],"first_id",
// "last_id","has_more"}, the response's own input items (not those of
// the responses it continued), order "desc" (newest first, the default)
// or "asc", limit 1 to 100 (default 20), after and before naming an item
// of the list (exclusive). 400 for a bad parameter, 404 for an id the key
// has none of.
func (h *handler) responseInputItems(w http.ResponseWriter, r *http.Request, id string) {
	rec, err := h.storedResponse(r.Context(), id)
	if err != nil {
		h.writeError(w, r, err, nil)
		return
	}
	q := r.URL.Query()
	limit := defaultItemsLimit
	if s := q.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > maxItemsLimit {
			h.writeError(w, r, &requestError{param: "limit", message: fmt.Sprintf("must be an integer in [1, %d]", maxItemsLimit)}, nil)
			return
		}
		limit = n
	}
	items := slices.Clone(rec.Input)
	switch q.Get("order") {
	case "", "desc":
		slices.Reverse(items)
	case "asc":
	default:
		h.writeError(w, r, &requestError{param: "order", message: `must be "asc" or "desc"`}, nil)
		return
	}
	index := func(param string) (int, bool) {
		v := q.Get(param)
		if v == "" {
			return -1, true
		}
		i := slices.IndexFunc(items, func(it responses.Item) bool { return it.ID == v })
		if i < 0 {
			h.writeError(w, r, &requestError{param: param, message: fmt.Sprintf("no input item of this response has the id %q", Clip(v))}, nil)
			return 0, false
		}
		return i, true
	}
	after, ok := index("after")
	if !ok {
		return
	}
	before, ok := index("before")
	if !ok {
		return
	}
	start, end := after+1, len(items)
	if before >= 0 {
		end = before
	}
	if end < start {
		end = start
	}
	page := items[start:end]
	more := len(page) > limit
	if more {
		page = page[:limit]
	}
	data := make([]json.RawMessage, 0, len(page))
	for _, it := range page {
		data = append(data, it.JSON)
	}
	list := map[string]any{"object": "list", "data": data, "has_more": more, "first_id": nil, "last_id": nil}
	if len(page) > 0 {
		list["first_id"], list["last_id"] = page[0].ID, page[len(page)-1].ID
	}
	writeJSON(w, http.StatusOK, list)
}

// cancelResponse serves POST /v1/responses/{id}/cancel: a background
// response still queued or in progress is cancelled, and the answer is
// its object once its run has ended (status "cancelled"); one already
// finished is answered as it is. 400 for a response that is not a
// background one, 404 for an id the key has none of.
func (h *handler) cancelResponse(w http.ResponseWriter, r *http.Request, id string) {
	rec, err := h.storedResponse(r.Context(), id)
	if err != nil {
		h.writeError(w, r, err, nil)
		return
	}
	var obj struct {
		Background bool `json:"background"`
	}
	_ = json.Unmarshal(rec.Response, &obj)
	if !obj.Background {
		h.writeError(w, r, &requestError{message: "Only responses created with background true can be cancelled."}, nil)
		return
	}
	if h.cfg.Runs != nil {
		if run := h.cfg.Runs.Live(id); run != nil && run.Record().KeyName == keyName(r.Context()) {
			run.Cancel("the response was cancelled")
			if _, err := run.Wait(r.Context()); err != nil {
				h.writeError(w, r, err, nil) // the client is gone
				return
			}
		}
	}
	if rec, err = h.storedResponse(r.Context(), id); err != nil {
		h.writeError(w, r, err, nil)
		return
	}
	writeRawJSON(w, http.StatusOK, rec.Response)
}

// writeRawJSON answers with a JSON document as it is.
func writeRawJSON(w http.ResponseWriter, status int, doc json.RawMessage) {
	writeJSON(w, status, doc)
}

// responsesCreate serves POST /v1/responses (OpenAI API reference,
// "Create a model response"): it decodes and checks the body
// (translate.DecodeResponsesRequest), continues the stored conversation
// of previous_response_id and resolves item references against the key's
// stored items, translates the conversation into a canonical chat
// completions request (translate's ChatBody) and dispatches it as the
// chat route does (admission, queue, keys, ledger), its Needs and
// estimated tokens from that decode; the run is rendered as a response
// object or the Responses event stream (responsesRender), from the run
// events (normalized path) or from the provider's chat answer (tunnel
// path). With store (the default) the response is kept before its final
// event or body is written. With background it runs as a background run
// (runs.Manager) and the answer is at once its object, status "queued".
//
// Statuses: 400 invalid_request_error naming the param (a bad field, a
// built-in tool, a previous_response_id or item_reference the key has
// no stored response or item of), 413, 415, then whatever classify maps a
// dispatch or upstream failure to (404 unknown model, 429 queue full, 503
// no provider, ...).
func (h *handler) responsesCreate(w http.ResponseWriter, r *http.Request) {
	obs := obsOf(r)
	obs.begin("responses")
	start := h.cfg.Now()
	body, err := h.readBody(r)
	if err != nil {
		h.writeError(w, r, err, nil)
		return
	}
	rq, err := translate.DecodeResponsesRequest(body)
	if err != nil {
		h.writeError(w, r, fieldError(err), nil)
		return
	}
	if err := h.openReasoning(rq.Input); err != nil {
		h.writeError(w, r, err, nil)
		return
	}
	obs.clientStreams(rq.Stream)
	ctx := r.Context()
	owner := keyName(ctx)
	store := rq.Store && h.cfg.Responses != nil
	if rq.Background && (h.cfg.Runs == nil || h.cfg.Responses == nil) {
		h.writeError(w, r, &requestError{param: "background", message: "background responses are not served by this edge (it keeps no run records)"}, nil)
		return
	}
	// The conversation so far: the previous response's items.
	var history []responses.Item
	if rq.PreviousResponseID != "" {
		prev, err := h.storedResponse(ctx, rq.PreviousResponseID)
		if err != nil {
			if errors.As(err, new(*responseNotFound)) {
				err = &requestError{param: "previous_response_id",
					message: fmt.Sprintf("Previous response with id '%s' not found.", Clip(rq.PreviousResponseID))}
			}
			h.writeError(w, r, err, nil)
			return
		}
		if prev.Status == "queued" || prev.Status == "in_progress" {
			// Its answer is not there yet: a conversation continued from
			// it would miss it.
			h.writeError(w, r, &requestError{param: "previous_response_id",
				message: fmt.Sprintf("Previous response with id '%s' is still %s: wait until it is no longer queued or in_progress.", Clip(rq.PreviousResponseID), prev.Status)}, nil)
			return
		}
		if history, err = h.cfg.Responses.Conversation(ctx, owner, rq.PreviousResponseID); err != nil {
			switch {
			case errors.Is(err, responses.ErrNotFound):
				err = &requestError{param: "previous_response_id",
					message: fmt.Sprintf("Previous response with id '%s' not found.", Clip(rq.PreviousResponseID))}
			case errors.Is(err, responses.ErrChainTooLong):
				err = &requestError{param: "previous_response_id",
					message: fmt.Sprintf("Previous response with id '%s' continues a conversation longer than iop keeps (%d responses, %d items): start a new one.", Clip(rq.PreviousResponseID), responses.MaxChainDepth, responses.MaxChainItems)}
			}
			h.writeError(w, r, err, nil)
			return
		}
	}
	input, err := h.resolveItems(ctx, owner, rq.Input)
	if err != nil {
		h.writeError(w, r, err, nil)
		return
	}
	conversation := make([]translate.ResponseItem, 0, len(history)+len(input))
	for _, it := range history {
		var item translate.ResponseItem
		if err := json.Unmarshal(it.JSON, &item); err != nil {
			h.writeError(w, r, fmt.Errorf("a stored item of %s: %w", rq.PreviousResponseID, err), nil)
			return
		}
		conversation = append(conversation, item)
	}
	conversation = append(conversation, input...)
	chat, err := rq.ChatBody(rq.Model, conversation)
	if err != nil {
		h.writeError(w, r, fieldError(err), nil)
		return
	}
	req := contract.Request{
		Model:                rq.Model,
		Operation:            contract.OperationChat,
		Stream:               true, // the canonical body always streams
		Body:                 chat.Body,
		Needs:                responsesNeeds(&rq, chat),
		EstimatedInputTokens: (chat.Chars + 3) / 4,
		Headers:              forwardHeaders(r.Header),
	}
	resp := &responseObject{
		ID: newItemID("resp"), Object: "response", CreatedAt: start.Unix(), Status: "in_progress",
		Background: rq.Background, Model: rq.Model, Output: []translate.ResponseItem{}, ServiceTier: "default",
		Store: rq.Store, ResponsesEcho: rq.Echo,
	}
	if rq.PreviousResponseID != "" {
		resp.PreviousResponseID = &rq.PreviousResponseID
	}
	rec := responses.Record{ID: resp.ID, Owner: owner, CreatedAt: start, Previous: rq.PreviousResponseID, Input: storedItems(input)}
	o := &responsesRender{resp: resp, stream: rq.Stream || rq.Background, noThinking: rq.NoThinking}
	if rq.EncryptedReasoning {
		o.b.Seal = h.seal.seal
	}
	if rq.Background {
		o.events = newResponseEventLog()
	}
	if store {
		o.save = func(ctx context.Context, resp *responseObject) error {
			doc, err := json.Marshal(resp)
			if err != nil {
				return err
			}
			rec.Status, rec.Response, rec.Output = resp.Status, doc, storedItems(resp.Output)
			return h.cfg.Responses.Save(ctx, rec)
		}
	}
	if rq.Background {
		h.responsesBackground(w, r, &req, o, rq.Stream)
		return
	}
	if store && o.stream {
		// Stored at response.created (responsesRender.open); a DELETE
		// meanwhile cancels it (deleteResponse); a stream that ends
		// without its final state stored (its client left, a DELETE) is
		// stored "cancelled". Deferred: a cut stream panics
		// (http.ErrAbortHandler).
		rctx, cancel := context.WithCancelCause(ctx)
		live := &liveResponse{owner: owner, cancel: cancel, done: make(chan struct{})}
		h.streaming.Store(resp.ID, live)
		r = r.WithContext(rctx)
		defer func() {
			if o.created && !o.saved {
				o.resp.Status = "cancelled"
				_ = o.store(rctx)
			}
			h.streaming.Delete(resp.ID)
			close(live.done)
			cancel(nil)
		}()
	}
	h.serveRunWith(w, r, &req, runRenderer{
		writeError: h.writeError,
		tunnel:     func(rr *Answer, _ contract.DispatchInfo) string { o.begin(rr); return o.tunnel() },
		normalized: func(rr *Answer, _ contract.DispatchInfo) string { o.begin(rr); return o.normalized() },
	})
}

// fieldError is a translate.FieldError as this package's 400.
func fieldError(err error) error {
	var fe *translate.FieldError
	if errors.As(err, &fe) {
		return &requestError{param: fe.Field, message: fe.Message}
	}
	return err
}

// responsesNeeds lists what a Responses request needs of its provider,
// as decodeChatRequest does for a chat request: tools, tool_choice,
// vision, remote_images, thinking.
func responsesNeeds(rq *translate.ResponsesRequest, chat translate.ResponsesChat) []string {
	var needs []string
	for _, n := range []struct {
		need string
		on   bool
	}{
		{NeedTools, rq.NeedsTools}, {NeedToolChoice, rq.NeedsToolChoice}, {NeedVision, chat.Vision},
		{NeedRemoteImages, chat.RemoteImages}, {NeedThinking, rq.Thinks},
	} {
		if n.on {
			needs = append(needs, n.need)
		}
	}
	return needs
}

// resolveItems gives every input item an id (its own, or a new one) and
// replaces each item_reference by the owner's stored item it names (400
// naming the input item for one it names none of).
func (h *handler) resolveItems(ctx context.Context, owner string, in []translate.ResponseItem) ([]translate.ResponseItem, error) {
	out := make([]translate.ResponseItem, 0, len(in))
	for i, it := range in {
		if it.Type == translate.ItemReference {
			var doc json.RawMessage
			err := responses.ErrNotFound
			if h.cfg.Responses != nil {
				doc, err = h.cfg.Responses.Item(ctx, owner, it.ID)
			}
			if errors.Is(err, responses.ErrNotFound) {
				return nil, &requestError{param: fmt.Sprintf("input[%d].id", i), message: fmt.Sprintf("Item with id '%s' not found.", Clip(it.ID))}
			}
			if err != nil {
				return nil, err
			}
			if err := json.Unmarshal(doc, &it); err != nil {
				return nil, err
			}
		}
		if it.ID == "" {
			it.ID = newItemID(itemPrefixes[it.Type])
		}
		if it.Type == translate.ItemMessage && it.Status == "" {
			it.Status = "completed"
		}
		out = append(out, it)
	}
	return out, nil
}

// storedItems is items as the store keeps them.
func storedItems(items []translate.ResponseItem) []responses.Item {
	out := make([]responses.Item, 0, len(items))
	for _, it := range items {
		doc, err := json.Marshal(it)
		if err != nil {
			continue // a type MarshalJSON has no shape for is never built
		}
		out = append(out, responses.Item{ID: it.ID, JSON: doc})
	}
	return out
}

// responsesBackground runs a background response (background true): its
// request runs in a run of Config.Runs (the response's id is the run's),
// on the run's goroutine, rendered into no connection (backgroundWriter) and
// kept in the store as it goes: "queued" at once, "in_progress" once
// dispatched, then its final object (completed, incomplete, failed, or
// "cancelled" when POST /cancel or DELETE ended it). Its events go to its
// event log (responseEventLog, attached to the run). The answer is at once
// the queued object, or with stream the event stream, followed on the
// request goroutine (followResponse) until its end or the client leaves;
// the response runs on either way. The run keeps its key's request slot
// until it ends.
func (h *handler) responsesBackground(w http.ResponseWriter, r *http.Request, req *contract.Request, o *responsesRender, stream bool) {
	resp := o.resp
	resp.Status = "queued"
	ctx := r.Context()
	if err := o.save(ctx, resp); err != nil {
		h.writeError(w, r, err, nil)
		return
	}
	o.b.NewID, o.b.Emit = newItemID, o.emit
	snap := *resp
	_ = o.b.Event("response.created", map[string]any{"response": &snap})
	_ = o.b.Event("response.queued", map[string]any{"response": &snap})
	obs := obsOf(r)
	obs.request(req)
	requestID := obs.requestID()
	owner := keyName(ctx)
	release := keepPermit(ctx)
	started := make(chan struct{})
	rec := runs.Record{ID: resp.ID, Model: req.Model, Background: true, KeyName: owner, Metadata: resp.Metadata}
	run, err := h.cfg.Runs.Start(ctx, rec, func(ctx context.Context, run *runs.Run) {
		defer release()
		<-started // the create's answer is written first
		h.runBackground(ctx, run, requestID, req, o)
	})
	if err != nil {
		release()
		h.writeError(w, r, err, nil)
		return
	}
	run.Attach(o.events)
	obs.handOff()
	if stream {
		close(started)
		h.followResponse(w, r, o.events, -1)
		return
	}
	doc, _ := json.Marshal(resp)
	writeRawJSON(w, http.StatusOK, doc)
	close(started)
}

// runBackground is the execution of a background response's run.
func (h *handler) runBackground(ctx context.Context, run *runs.Run, requestID string, req *contract.Request, o *responsesRender) {
	obs := &observation{now: h.cfg.Now}
	obs.rec.Start = obs.now()
	obs.rec.API, obs.rec.RequestID, obs.rec.Key = "responses", requestID, keyName(ctx)
	ctx = context.WithValue(ctx, observationKey{}, obs)
	dw := &backgroundWriter{header: http.Header{}}
	hr := (&http.Request{Method: http.MethodPost, URL: &url.URL{Path: responsesPath}, Header: http.Header{}}).WithContext(ctx)
	req.RunID = run.Record().ID
	o.background = true
	o.log = newResponseRunLog(run, o.resp.ID, o.resp.CreatedAt, req.Model)
	func() {
		defer func() {
			// A rendering cut short aborts its (here absent) connection.
			if p := recover(); p != nil && p != http.ErrAbortHandler {
				panic(p)
			}
		}()
		h.serveRunWith(dw, hr, req, runRenderer{
			writeError: h.writeError,
			tunnel: func(rr *Answer, info contract.DispatchInfo) string {
				o.begin(rr)
				o.inProgress(info)
				return o.tunnel()
			},
			normalized: func(rr *Answer, info contract.DispatchInfo) string {
				o.begin(rr)
				o.inProgress(info)
				return o.normalized()
			},
		})
	}()
	h.finish(ctx, obs, dw.status)
	outcome := runs.Outcome{State: runs.StateComplete, Status: dw.status, Outcome: string(obs.rec.Outcome)}
	if u := o.resp.Usage; u != nil {
		outcome.PromptTokens, outcome.CompletionTokens = u.InputTokens, u.OutputTokens
	}
	// The run's log ends as a POST /v1/runs run's does (responseRunLog).
	defer func() {
		if outcome.State == runs.StateComplete {
			outcome.FinishReason = o.finishReason
			o.log.complete(o.finishReason, usage{PromptTokens: outcome.PromptTokens, CompletionTokens: outcome.CompletionTokens,
				TotalTokens: outcome.PromptTokens + outcome.CompletionTokens})
		} else {
			code := "run_failed"
			if outcome.State == runs.StateCancelled {
				code = "run_cancelled"
			}
			o.log.fail(outcome.Error, code)
		}
		run.Finish(outcome)
	}()
	switch {
	case o.saved && o.resp.Status == "failed":
		outcome.State, outcome.Error = runs.StateError, o.resp.Error.Message
	case o.saved:
	case ctx.Err() != nil:
		// Cancelled (POST /cancel, DELETE) or the edge stopping.
		o.resp.Status = "cancelled"
		outcome.State, outcome.Error = runs.StateCancelled, "cancelled"
		if errors.Is(context.Cause(ctx), runs.ErrStopping) {
			o.resp.Status, outcome.State = "failed", runs.StateError
			o.resp.Error = &responseError{Code: "server_error", Message: runs.ErrStopping.Error()}
		}
		_ = o.store(context.WithoutCancel(ctx))
	default:
		// Refused before it reached a provider: the error answer's message.
		var body errorBody
		_ = json.Unmarshal(dw.body, &body)
		e := &responseError{Code: "server_error", Message: "the response failed"}
		if body.Error != nil {
			e.Message = body.Error.Message
			if body.Error.Code != nil {
				e.Code = *body.Error.Code
			}
		}
		o.resp.Status, o.resp.Error = "failed", e
		outcome.State, outcome.Error = runs.StateError, e.Message
		_ = o.store(ctx)
	}
	o.endEvents()
}

// backgroundWriter is the http.ResponseWriter of a background response: it
// keeps the status and, for an error answer, the body.
type backgroundWriter struct {
	header http.Header
	status int
	body   []byte
}

func (d *backgroundWriter) Header() http.Header { return d.header }

func (d *backgroundWriter) WriteHeader(status int) {
	if d.status == 0 {
		d.status = status
	}
}

func (d *backgroundWriter) Write(p []byte) (int, error) {
	if d.status == 0 {
		d.status = http.StatusOK
	}
	if d.status >= 300 && len(d.body) < maxErrorBody {
		d.body = append(d.body, p...)
	}
	return len(p), nil
}

// responsesStoreTimeout bounds saving a response whose request context
// has ended.
const responsesStoreTimeout = 10 * time.Second

// openReasoning turns the encrypted_content of input's reasoning items
// back into their reasoning text (a reasoning_text part, unless the item
// has content of its own). A token this edge did not make, or one
// altered, is a 400 naming input[i].encrypted_content.
func (h *handler) openReasoning(input []translate.ResponseItem) error {
	for i := range input {
		it := &input[i]
		if it.Type != translate.ItemReasoning || it.EncryptedContent == "" {
			continue
		}
		text, err := h.seal.open(it.EncryptedContent)
		if err != nil {
			return &requestError{param: fmt.Sprintf("input[%d].encrypted_content", i), message: err.Error()}
		}
		if len(it.Content) == 0 {
			it.Content = []translate.ResponsePart{{Type: translate.PartReasoningText, Text: text}}
		}
	}
	return nil
}
