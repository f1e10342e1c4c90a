package responses

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"iop/internal/edge/api"
	"iop/internal/edge/api/request"
	"iop/internal/edge/contract"
	respstore "iop/internal/responses"
	"iop/internal/runs"
	"iop/internal/translate"
)

// Paths of the Responses API.
const (
	responsesPath   = "/v1/responses"
	responsesPrefix = "/v1/responses/"
)

// server serves the Responses API on the frame. Its fields are set by
// Routes and only read after (streaming is safe for concurrent use).
type server struct {
	f      *api.Frame
	logger *slog.Logger
	// store keeps the stored responses; nil: none is kept.
	store ResponseStore
	// runs runs background responses; nil: they are refused.
	runs *runs.Manager
	// seal makes and opens reasoning items' encrypted_content.
	seal *reasoningSeal
	// streaming holds the stored responses being streamed now (id ->
	// *liveResponse): GET finds them in progress, DELETE cancels and
	// deletes them.
	streaming sync.Map
}

// Config is what the Responses API keeps its responses and runs its
// background responses with.
type Config struct {
	// Store, when set, keeps the stored responses (POST /v1/responses
	// with store true; GET, DELETE, input_items and previous_response_id
	// read them). Nil: nothing is kept, every stored id is unknown (404),
	// and background responses are refused.
	Store ResponseStore
	// Runs, when set with Store, runs background responses (background
	// true) as runs of the runs API. Nil: they are refused (400).
	Runs *runs.Manager
	// ReasoningSecret is the secret the encrypted_content of reasoning
	// items is sealed under (AES-256-GCM, its key derived with
	// HKDF-SHA256): edges given the same secret open each other's tokens,
	// across restarts. Empty: a random key made at start, so a token opens
	// only on the edge that made it, until it restarts.
	ReasoningSecret []byte
}

// Routes returns the Responses API with cfg (an api.API for
// api.Config.APIs): POST /v1/responses, and under /v1/responses/ GET and
// DELETE /v1/responses/{id}, GET /v1/responses/{id}/input_items and POST
// /v1/responses/{id}/cancel. Its errors are OpenAI's.
func Routes(cfg Config) api.API {
	return func(f *api.Frame) map[string]api.Route {
		s := &server{f: f, logger: f.Logger(), store: cfg.Store, runs: cfg.Runs, seal: newReasoningSeal(cfg.ReasoningSecret)}
		return map[string]api.Route{
			responsesPath:   {Method: http.MethodPost, Serve: s.responsesCreate, Operation: "responses"},
			responsesPrefix: {Serve: s.responsesRoute},
		}
	}
}

// ResponseStore keeps stored responses (Config.Store); package
// responses' SQLite implements it. Every method but Save finds only the
// owner's responses: another owner's id is respstore.ErrNotFound.
type ResponseStore interface {
	// Save inserts or replaces a response with its items.
	Save(ctx context.Context, rec respstore.Record) error
	// SetStatus changes a stored response's status and object.
	SetStatus(ctx context.Context, owner, id, status string, response json.RawMessage) error
	// Get returns a stored response with its own items.
	Get(ctx context.Context, owner, id string) (respstore.Record, error)
	// Conversation returns the items a response continuing a stored one
	// starts from, the whole chain's (respstore.ErrChainTooLong past its
	// limits).
	Conversation(ctx context.Context, owner, id string) ([]respstore.Item, error)
	// Delete removes a stored response.
	Delete(ctx context.Context, owner, id string) error
	// Item returns the JSON of the owner's latest stored input or output
	// item with that id.
	Item(ctx context.Context, owner, itemID string) (json.RawMessage, error)
}

var _ ResponseStore = (*respstore.SQLite)(nil)

// responseNotFound is a response id the request's key has no stored
// response of: 404, as OpenAI answers an id it does not know.
type responseNotFound struct{ id string }

func (e *responseNotFound) Error() string {
	return fmt.Sprintf("Response with id '%s' not found.", api.Clip(e.id))
}

// Unwrap makes it the frame's 404 (api.NotFound).
func (e *responseNotFound) Unwrap() error { return api.NotFound(e.Error()) }

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
func (s *server) responsesRoute(w http.ResponseWriter, r *http.Request) {
	rest := strings.TrimPrefix(r.URL.Path, responsesPrefix)
	id, sub, _ := strings.Cut(rest, "/")
	method := http.MethodGet
	switch {
	case id == "" || strings.Contains(sub, "/"):
		s.f.WriteError(w, r, api.ErrNotFound, nil)
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
		s.f.WriteError(w, r, api.ErrNotFound, nil)
		return
	}
	if r.Method != method && !(method == http.MethodGet && r.Method == http.MethodHead) {
		allow := method
		if sub == "" {
			allow = "GET, DELETE"
		}
		w.Header().Set("Allow", allow)
		s.f.WriteError(w, r, api.ErrMethodNotAllowed, nil)
		return
	}
	switch {
	case sub == "input_items":
		s.responseInputItems(w, r, id)
	case sub == "cancel":
		s.cancelResponse(w, r, id)
	case r.Method == http.MethodDelete:
		s.deleteResponse(w, r, id)
	default:
		s.getResponse(w, r, id)
	}
}

// storedResponse returns the request key's stored response id: a
// *responseNotFound for none (also for another key's, or with no store).
func (s *server) storedResponse(ctx context.Context, id string) (respstore.Record, error) {
	if s.store == nil {
		return respstore.Record{}, &responseNotFound{id}
	}
	rec, err := s.store.Get(ctx, api.KeyName(ctx), id)
	if errors.Is(err, respstore.ErrNotFound) {
		return respstore.Record{}, &responseNotFound{id}
	}
	if err == nil && (rec.Status == "queued" || rec.Status == "in_progress") && (s.runs == nil || s.runs.Live(id) == nil) && !s.isStreaming(id) {
		rec = s.orphaned(ctx, rec)
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
func (s *server) isStreaming(id string) bool {
	_, ok := s.streaming.Load(id)
	return ok
}

// errResponseOrphaned is the error of a background response whose run no
// edge process runs any more: the one that ran it stopped before it ended
// (a crash; a stop ends it failed itself).
const errResponseOrphaned = "the edge restarted while the response was in flight"

// orphaned ends a stored response left queued or in progress by an edge
// process that is gone: failed, with errResponseOrphaned, saved so.
func (s *server) orphaned(ctx context.Context, rec respstore.Record) respstore.Record {
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
	if err := s.store.SetStatus(ctx, rec.Owner, rec.ID, "failed", doc); err != nil {
		s.logger.Warn("marking an orphaned response failed", "response_id", rec.ID, "err", err)
	}
	rec.Status, rec.Response = "failed", doc
	return rec
}

// getResponse serves GET /v1/responses/{id}: the stored response object
// (of a background response, its state now); with stream=true its event
// stream (streamResponse). 404 for an id the key has none of.
func (s *server) getResponse(w http.ResponseWriter, r *http.Request, id string) {
	if v := r.URL.Query().Get("stream"); v != "" && v != "false" {
		s.streamResponse(w, r, id)
		return
	}
	rec, err := s.storedResponse(r.Context(), id)
	if err != nil {
		s.f.WriteError(w, r, err, nil)
		return
	}
	writeRawJSON(w, http.StatusOK, rec.Response)
}

// deleteResponse serves DELETE /v1/responses/{id}: {"id","object":
// "response","deleted":true}. A background response still running is
// cancelled first. 404 for an id the key has none of.
func (s *server) deleteResponse(w http.ResponseWriter, r *http.Request, id string) {
	if _, err := s.storedResponse(r.Context(), id); err != nil {
		s.f.WriteError(w, r, err, nil)
		return
	}
	if s.runs != nil {
		if run := s.runs.Live(id); run != nil && run.Record().KeyName == api.KeyName(r.Context()) {
			run.Cancel("the response was deleted")
			_, _ = run.Wait(r.Context())
		}
	}
	if v, ok := s.streaming.Load(id); ok && v.(*liveResponse).owner == api.KeyName(r.Context()) {
		// Streamed now: its request ends (the run is cancelled, the
		// client's stream cut) and stores its last state, then it is
		// deleted, so the delete is not undone by that last save.
		live := v.(*liveResponse)
		live.cancel(errResponseDeleted)
		select {
		case <-live.done:
		case <-r.Context().Done():
			s.f.WriteError(w, r, context.Cause(r.Context()), nil)
			return
		}
	}
	if err := s.store.Delete(r.Context(), api.KeyName(r.Context()), id); err != nil {
		if errors.Is(err, respstore.ErrNotFound) {
			err = &responseNotFound{id}
		}
		s.f.WriteError(w, r, err, nil)
		return
	}
	api.WriteJSON(w, http.StatusOK, map[string]any{"id": id, "object": "response", "deleted": true})
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
func (s *server) responseInputItems(w http.ResponseWriter, r *http.Request, id string) {
	rec, err := s.storedResponse(r.Context(), id)
	if err != nil {
		s.f.WriteError(w, r, err, nil)
		return
	}
	q := r.URL.Query()
	limit := defaultItemsLimit
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxItemsLimit {
			s.f.WriteError(w, r, api.InvalidParam("limit", fmt.Sprintf("must be an integer in [1, %d]", maxItemsLimit)), nil)
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
		s.f.WriteError(w, r, api.InvalidParam("order", `must be "asc" or "desc"`), nil)
		return
	}
	index := func(param string) (int, bool) {
		v := q.Get(param)
		if v == "" {
			return -1, true
		}
		i := slices.IndexFunc(items, func(it respstore.Item) bool { return it.ID == v })
		if i < 0 {
			s.f.WriteError(w, r, api.InvalidParam(param, fmt.Sprintf("no input item of this response has the id %q", api.Clip(v))), nil)
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
	api.WriteJSON(w, http.StatusOK, list)
}

// cancelResponse serves POST /v1/responses/{id}/cancel: a background
// response still queued or in progress is cancelled, and the answer is
// its object once its run has ended (status "cancelled"); one already
// finished is answered as it is. 400 for a response that is not a
// background one, 404 for an id the key has none of.
func (s *server) cancelResponse(w http.ResponseWriter, r *http.Request, id string) {
	rec, err := s.storedResponse(r.Context(), id)
	if err != nil {
		s.f.WriteError(w, r, err, nil)
		return
	}
	var obj struct {
		Background bool `json:"background"`
	}
	_ = json.Unmarshal(rec.Response, &obj)
	if !obj.Background {
		s.f.WriteError(w, r, api.InvalidParam("", "Only responses created with background true can be cancelled."), nil)
		return
	}
	if s.runs != nil {
		if run := s.runs.Live(id); run != nil && run.Record().KeyName == api.KeyName(r.Context()) {
			run.Cancel("the response was cancelled")
			if _, err := run.Wait(r.Context()); err != nil {
				s.f.WriteError(w, r, err, nil) // the client is gone
				return
			}
		}
	}
	if rec, err = s.storedResponse(r.Context(), id); err != nil {
		s.f.WriteError(w, r, err, nil)
		return
	}
	writeRawJSON(w, http.StatusOK, rec.Response)
}

// writeRawJSON answers with a JSON document as it is.
func writeRawJSON(w http.ResponseWriter, status int, doc json.RawMessage) {
	api.WriteJSON(w, status, doc)
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
func (s *server) responsesCreate(w http.ResponseWriter, r *http.Request) {
	api.Begin(r, "responses")
	start := s.f.Now()
	body, err := s.f.ReadBody(r)
	if err != nil {
		s.f.WriteError(w, r, err, nil)
		return
	}
	rq, err := translate.DecodeResponsesRequest(body)
	if err != nil {
		s.f.WriteError(w, r, fieldError(err), nil)
		return
	}
	if err := s.openReasoning(rq.Input); err != nil {
		s.f.WriteError(w, r, err, nil)
		return
	}
	api.ClientStreams(r, rq.Stream)
	ctx := r.Context()
	owner := api.KeyName(ctx)
	store := rq.Store && s.store != nil
	if rq.Background && (s.runs == nil || s.store == nil) {
		s.f.WriteError(w, r, api.InvalidParam("background", "background responses are not served by this edge (it keeps no run records)"), nil)
		return
	}
	// The conversation so far: the previous response's items.
	var history []respstore.Item
	if rq.PreviousResponseID != "" {
		prev, err := s.storedResponse(ctx, rq.PreviousResponseID)
		if err != nil {
			if errors.As(err, new(*responseNotFound)) {
				err = api.InvalidParam("previous_response_id",
					fmt.Sprintf("Previous response with id '%s' not found.", api.Clip(rq.PreviousResponseID)))
			}
			s.f.WriteError(w, r, err, nil)
			return
		}
		if prev.Status == "queued" || prev.Status == "in_progress" {
			// Its answer is not there yet: a conversation continued from
			// it would miss it.
			s.f.WriteError(w, r, api.InvalidParam("previous_response_id",
				fmt.Sprintf("Previous response with id '%s' is still %s: wait until it is no longer queued or in_progress.", api.Clip(rq.PreviousResponseID), prev.Status)), nil)
			return
		}
		if history, err = s.store.Conversation(ctx, owner, rq.PreviousResponseID); err != nil {
			switch {
			case errors.Is(err, respstore.ErrNotFound):
				err = api.InvalidParam("previous_response_id",
					fmt.Sprintf("Previous response with id '%s' not found.", api.Clip(rq.PreviousResponseID)))
			case errors.Is(err, respstore.ErrChainTooLong):
				err = api.InvalidParam("previous_response_id",
					fmt.Sprintf("Previous response with id '%s' continues a conversation longer than iop keeps (%d responses, %d items): start a new one.", api.Clip(rq.PreviousResponseID), respstore.MaxChainDepth, respstore.MaxChainItems))
			}
			s.f.WriteError(w, r, err, nil)
			return
		}
	}
	input, err := s.resolveItems(ctx, owner, rq.Input)
	if err != nil {
		s.f.WriteError(w, r, err, nil)
		return
	}
	conversation := make([]translate.ResponseItem, 0, len(history)+len(input))
	for _, it := range history {
		var item translate.ResponseItem
		if err := json.Unmarshal(it.JSON, &item); err != nil {
			s.f.WriteError(w, r, fmt.Errorf("a stored item of %s: %w", rq.PreviousResponseID, err), nil)
			return
		}
		conversation = append(conversation, item)
	}
	conversation = append(conversation, input...)
	chat, err := rq.ChatBody(rq.Model, conversation)
	if err != nil {
		s.f.WriteError(w, r, fieldError(err), nil)
		return
	}
	req := contract.Request{
		Model:                rq.Model,
		Operation:            contract.OperationChat,
		Stream:               true, // the canonical body always streams
		Body:                 chat.Body,
		Needs:                responsesNeeds(&rq, chat),
		EstimatedInputTokens: (chat.Chars + 3) / 4,
		Headers:              api.ForwardHeaders(r.Header),
	}
	resp := &responseObject{
		ID: newItemID("resp"), Object: "response", CreatedAt: start.Unix(), Status: "in_progress",
		Background: rq.Background, Model: rq.Model, Output: []translate.ResponseItem{}, ServiceTier: "default",
		Store: rq.Store, ResponsesEcho: rq.Echo,
	}
	if rq.PreviousResponseID != "" {
		resp.PreviousResponseID = &rq.PreviousResponseID
	}
	rec := respstore.Record{ID: resp.ID, Owner: owner, CreatedAt: start, Previous: rq.PreviousResponseID, Input: storedItems(input)}
	o := &responsesRender{logger: s.logger, resp: resp, stream: rq.Stream || rq.Background, noThinking: rq.NoThinking}
	if rq.EncryptedReasoning {
		o.b.Seal = s.seal.seal
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
			return s.store.Save(ctx, rec)
		}
	}
	if rq.Background {
		s.responsesBackground(w, r, &req, o, rq.Stream)
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
		s.streaming.Store(resp.ID, live)
		r = r.WithContext(rctx)
		defer func() {
			if o.created && !o.saved {
				o.resp.Status = "cancelled"
				_ = o.store(rctx)
			}
			s.streaming.Delete(resp.ID)
			close(live.done)
			cancel(nil)
		}()
	}
	s.f.Serve(w, r, &req, api.Renderer{
		WriteError: s.f.WriteError,
		Tunnel:     func(rr *api.Answer, _ contract.DispatchInfo) string { o.begin(rr); return o.tunnel() },
		Normalized: func(rr *api.Answer, _ contract.DispatchInfo) string { o.begin(rr); return o.normalized() },
	})
}

// fieldError is a translate.FieldError as this package's 400.
func fieldError(err error) error {
	var fe *translate.FieldError
	if errors.As(err, &fe) {
		return api.InvalidParam(fe.Field, fe.Message)
	}
	return err
}

// responsesNeeds lists what a Responses request needs of its provider,
// as request.DecodeChat does for a chat request: tools, tool_choice,
// vision, remote_images, thinking.
func responsesNeeds(rq *translate.ResponsesRequest, chat translate.ResponsesChat) []string {
	var needs []string
	for _, n := range []struct {
		need string
		on   bool
	}{
		{request.NeedTools, rq.NeedsTools}, {request.NeedToolChoice, rq.NeedsToolChoice}, {request.NeedVision, chat.Vision},
		{request.NeedRemoteImages, chat.RemoteImages}, {request.NeedThinking, rq.Thinks},
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
func (s *server) resolveItems(ctx context.Context, owner string, in []translate.ResponseItem) ([]translate.ResponseItem, error) {
	out := make([]translate.ResponseItem, 0, len(in))
	for i, it := range in {
		if it.Type == translate.ItemReference {
			var doc json.RawMessage
			err := respstore.ErrNotFound
			if s.store != nil {
				doc, err = s.store.Item(ctx, owner, it.ID)
			}
			if errors.Is(err, respstore.ErrNotFound) {
				return nil, api.InvalidParam(fmt.Sprintf("input[%d].id", i), fmt.Sprintf("Item with id '%s' not found.", api.Clip(it.ID)))
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
func storedItems(items []translate.ResponseItem) []respstore.Item {
	out := make([]respstore.Item, 0, len(items))
	for _, it := range items {
		doc, err := json.Marshal(it)
		if err != nil {
			continue // a type MarshalJSON has no shape for is never built
		}
		out = append(out, respstore.Item{ID: it.ID, JSON: doc})
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
func (s *server) responsesBackground(w http.ResponseWriter, r *http.Request, req *contract.Request, o *responsesRender, stream bool) {
	resp := o.resp
	resp.Status = "queued"
	ctx := r.Context()
	if err := o.save(ctx, resp); err != nil {
		s.f.WriteError(w, r, err, nil)
		return
	}
	o.b.NewID, o.b.Emit = newItemID, o.emit
	snap := *resp
	_ = o.b.Event("response.created", map[string]any{"response": &snap})
	_ = o.b.Event("response.queued", map[string]any{"response": &snap})
	requestID := api.RecordRequest(r, req)
	owner := api.KeyName(ctx)
	release := api.KeepPermit(ctx)
	started := make(chan struct{})
	rec := runs.Record{ID: resp.ID, Model: req.Model, Background: true, KeyName: owner, Metadata: resp.Metadata}
	run, err := s.runs.Start(ctx, rec, func(ctx context.Context, run *runs.Run) {
		defer release()
		<-started // the create's answer is written first
		s.runBackground(ctx, run, requestID, req, o)
	})
	if err != nil {
		release()
		s.f.WriteError(w, r, err, nil)
		return
	}
	run.Attach(o.events)
	api.HandOff(r)
	if stream {
		close(started)
		s.followResponse(w, r, o.events, -1)
		return
	}
	doc, _ := json.Marshal(resp)
	writeRawJSON(w, http.StatusOK, doc)
	close(started)
}

// runBackground is the execution of a background response's run.
func (s *server) runBackground(ctx context.Context, run *runs.Run, requestID string, req *contract.Request, o *responsesRender) {
	req.RunID = run.Record().ID
	o.background = true
	o.log = newResponseRunLog(run, o.resp.ID, o.resp.CreatedAt, req.Model)
	d := s.f.ServeDetached(ctx, requestID, "responses", responsesPath, req, api.Renderer{
		WriteError: s.f.WriteError,
		Tunnel: func(rr *api.Answer, info contract.DispatchInfo) string {
			o.begin(rr)
			o.inProgress(info)
			return o.tunnel()
		},
		Normalized: func(rr *api.Answer, info contract.DispatchInfo) string {
			o.begin(rr)
			o.inProgress(info)
			return o.normalized()
		},
	})
	outcome := runs.Outcome{State: runs.StateComplete, Status: d.Status, Outcome: d.Outcome}
	if u := o.resp.Usage; u != nil {
		outcome.PromptTokens, outcome.CompletionTokens = u.InputTokens, u.OutputTokens
	}
	// The run's log ends as a POST /v1/runs run's does (responseRunLog).
	defer func() {
		if outcome.State == runs.StateComplete {
			outcome.FinishReason = o.finishReason
			o.log.complete(o.finishReason, outcome.PromptTokens, outcome.CompletionTokens)
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
		var body errorAnswer
		_ = json.Unmarshal(d.ErrorBody, &body)
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

// errorAnswer is what runBackground reads of an OpenAI error answer
// ({"error":{...}}).
type errorAnswer struct {
	Error *struct {
		Message string  `json:"message"`
		Code    *string `json:"code"`
	} `json:"error"`
}

// responsesStoreTimeout bounds saving a response whose request context
// has ended.
const responsesStoreTimeout = 10 * time.Second

// openReasoning turns the encrypted_content of input's reasoning items
// back into their reasoning text (a reasoning_text part, unless the item
// has content of its own). A token this edge did not make, or one
// altered, is a 400 naming input[i].encrypted_content.
func (s *server) openReasoning(input []translate.ResponseItem) error {
	for i := range input {
		it := &input[i]
		if it.Type != translate.ItemReasoning || it.EncryptedContent == "" {
			continue
		}
		text, err := s.seal.open(it.EncryptedContent)
		if err != nil {
			return api.InvalidParam(fmt.Sprintf("input[%d].encrypted_content", i), err.Error())
		}
		if len(it.Content) == 0 {
			it.Content = []translate.ResponsePart{{Type: translate.PartReasoningText, Text: text}}
		}
	}
	return nil
}
