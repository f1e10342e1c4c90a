package api

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"strconv"
	"strings"
	"time"

	"iop/internal/edge/contract"
	"iop/internal/runs"
	"iop/internal/sse"
)

// The runs API (served when Config.Runs is set):
//
//	POST   /v1/runs              submit a run; 202 and its record when
//	                             background, else 200 and its final record
//	                             (a run that never reached a provider: the
//	                             chat route's error answer, e.g. 404
//	                             model_not_found, with Location naming it)
//	GET    /v1/runs              list records: ?state=&model=&session_id=&limit=&after=
//	GET    /v1/runs/{id}         one record
//	GET    /v1/runs/{id}/events  its events as SSE, replayed from the start
//	DELETE /v1/runs/{id}         cancel it; 200 and its record
//
// A run is a chat completion: its body is a chat completion request
// (model, messages, max_tokens, tools, ...) where "prompt" (a string) may
// replace "messages" (as one user message), plus "background" (bool),
// "session_id" (string) and "metadata" (an object of string values). The
// edge always streams it from the provider; its events are OpenAI
// chat.completion.chunk objects (`data: {...}`), ending `data: [DONE]`
// when it completes, or with one `data: {"error":{...}}` event when it
// fails or is cancelled.
const (
	runsPath   = "/v1/runs"
	runsPrefix = "/v1/runs/"
)

// Limits on a run's submission fields, after OpenAI's metadata limits.
const (
	maxSessionIDBytes = 256
	maxMetadataKeys   = 16
	maxMetadataKey    = 64
	maxMetadataValue  = 512
)

// errRunNotFound: no run has the requested id. 404.
var errRunNotFound = errors.New("run not found")

// runSubmission is a decoded POST /v1/runs body.
type runSubmission struct {
	chatBody   []byte // the chat completion request to run (stream on, usage on)
	chat       chatRequest
	background bool
	sessionID  string
	metadata   map[string]string
}

// decodeRunSubmission checks a POST /v1/runs body and derives the chat
// completion request it runs. Errors are *requestError (400) naming the
// field.
func decodeRunSubmission(body []byte) (runSubmission, error) {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(body, &top); err != nil || top == nil {
		// decodeChatRequest words every way a body fails to be an object.
		_, derr := decodeChatRequest(body)
		if derr == nil {
			derr = &requestError{message: "the request body must be a JSON object"}
		}
		return runSubmission{}, derr
	}
	var s runSubmission
	if err := decodeField(top, "background", wantBool, &s.background); err != nil {
		return runSubmission{}, err
	}
	if err := decodeField(top, "session_id", wantString, &s.sessionID); err != nil {
		return runSubmission{}, err
	}
	if len(s.sessionID) > maxSessionIDBytes || strings.ContainsAny(s.sessionID, "\r\n") {
		return runSubmission{}, &requestError{param: "session_id", message: fmt.Sprintf("must be at most %d bytes, without line breaks", maxSessionIDBytes)}
	}
	if err := decodeMetadata(top["metadata"], &s.metadata); err != nil {
		return runSubmission{}, err
	}
	if prompt, ok := top["prompt"]; ok && !isAbsent(prompt) {
		if _, both := top["messages"]; both {
			return runSubmission{}, &requestError{param: "prompt", message: "give either prompt or messages, not both"}
		}
		var text string
		if err := decodeValue(prompt, "prompt", wantString, &text); err != nil {
			return runSubmission{}, err
		}
		msgs, _ := json.Marshal([]map[string]string{{"role": "user", "content": text}})
		top["messages"] = msgs
	}
	for _, name := range []string{"prompt", "background", "session_id", "metadata", "stream", "stream_options"} {
		delete(top, name)
	}
	top["stream"] = json.RawMessage("true")
	top["stream_options"] = json.RawMessage(`{"include_usage":true}`)
	chatBody, err := json.Marshal(top)
	if err != nil {
		return runSubmission{}, &requestError{message: "the request body cannot be re-encoded: " + err.Error()}
	}
	chat, err := decodeChatRequest(chatBody)
	if err != nil {
		return runSubmission{}, err
	}
	s.chatBody, s.chat = chatBody, chat
	return s, nil
}

func decodeMetadata(raw json.RawMessage, dst *map[string]string) error {
	if isAbsent(raw) {
		return nil
	}
	var obj map[string]json.RawMessage
	if err := decodeValue(raw, "metadata", wantObject, &obj); err != nil {
		return err
	}
	if len(obj) > maxMetadataKeys {
		return &requestError{param: "metadata", message: fmt.Sprintf("at most %d keys", maxMetadataKeys)}
	}
	out := make(map[string]string, len(obj))
	for k, v := range obj {
		param := "metadata." + Clip(k)
		if len(k) > maxMetadataKey || k == "" {
			return &requestError{param: param, message: fmt.Sprintf("keys must be 1-%d bytes", maxMetadataKey)}
		}
		var s string
		if err := decodeValue(v, param, wantString, &s); err != nil {
			return err
		}
		if len(s) > maxMetadataValue {
			return &requestError{param: param, message: fmt.Sprintf("values must be at most %d bytes", maxMetadataValue)}
		}
		out[k] = s
	}
	*dst = out
	return nil
}

// runsRoute serves /v1/runs: POST submits, GET lists.
func (h *handler) runsRoute(w http.ResponseWriter, r *http.Request) {
	switch r.Method {
	case http.MethodPost:
		h.submitRun(w, r)
	case http.MethodGet, http.MethodHead:
		h.listRuns(w, r)
	default:
		w.Header().Set("Allow", "GET, POST")
		h.writeError(w, r, errMethodNotAllowed, nil)
	}
}

// runRoute serves /v1/runs/{id} (GET, DELETE) and /v1/runs/{id}/events (GET).
func (h *handler) runRoute(w http.ResponseWriter, r *http.Request) {
	rest := strings.TrimPrefix(r.URL.Path, runsPrefix)
	id, events := strings.CutSuffix(rest, "/events")
	if id == "" || strings.Contains(id, "/") {
		h.writeError(w, r, errNotFound, nil)
		return
	}
	allow := "GET, DELETE"
	if events {
		allow = "GET"
	}
	switch {
	case events && (r.Method == http.MethodGet || r.Method == http.MethodHead):
		h.runEvents(w, r, id)
	case !events && (r.Method == http.MethodGet || r.Method == http.MethodHead):
		h.getRun(w, r, id)
	case !events && r.Method == http.MethodDelete:
		h.cancelRun(w, r, id)
	default:
		w.Header().Set("Allow", allow)
		h.writeError(w, r, errMethodNotAllowed, nil)
	}
}

// submitRun serves POST /v1/runs. A submission refused before its run
// starts is recorded as a request of operation "runs"; a run that starts
// is recorded by its own chat request (execute), under the same request
// id, when it ends.
func (h *handler) submitRun(w http.ResponseWriter, r *http.Request) {
	obs := obsOf(r)
	obs.begin("runs")
	body, err := h.readBody(r)
	if err != nil {
		h.writeError(w, r, err, nil)
		return
	}
	sub, err := decodeRunSubmission(body)
	if err != nil {
		h.writeError(w, r, err, nil)
		return
	}
	rec := runs.Record{
		ID:         NewRunID(),
		Model:      sub.chat.Model,
		SessionID:  sub.sessionID,
		Background: sub.background,
		Metadata:   sub.metadata,
		KeyName:    keyName(r.Context()),
	}
	obs.request(&contract.Request{Model: rec.Model})
	if err := checkModel(r.Context(), rec.Model); err != nil {
		h.writeError(w, r, err, &contract.Request{Model: rec.Model})
		return
	}
	nodeID, providerID := h.cfg.Runs.Affinity(sub.sessionID)
	// The run holds its key's request slot until it ends, also in the
	// background after this request answered.
	release := keepPermit(r.Context())
	// The run's refusal by the gateway, if it got one: sent before the
	// run finishes, so it is there once run.Wait saw it finish.
	refused := make(chan error, 1)
	requestID := obs.requestID()
	run, err := h.cfg.Runs.Start(r.Context(), rec, func(ctx context.Context, run *runs.Run) {
		defer release()
		h.execute(ctx, run, runTarget{requestID: requestID, sub: sub, preferNode: nodeID, preferProvider: providerID}, refused)
	})
	if err != nil {
		release()
		h.logger.Error("starting a run failed", "err", err)
		h.writeError(w, r, err, nil)
		return
	}
	obs.handOff()
	if sub.background {
		w.Header().Set("Location", runsPrefix+rec.ID)
		writeJSON(w, http.StatusAccepted, renderRecord(run.Record()))
		return
	}
	// The run belongs to this request: it ends when the submitter leaves.
	stop := context.AfterFunc(r.Context(), func() { run.Cancel("submitter gone") })
	defer stop()
	final, err := run.Wait(r.Context())
	if err != nil {
		h.writeError(w, r, err, nil) // the client is gone: nothing is written
		return
	}
	var dispatchErr error
	select {
	case dispatchErr = <-refused:
	default:
	}
	if final.State == runs.StateError && dispatchErr != nil {
		// It never reached a provider (an unknown model, a full queue, ...):
		// answered as the chat route answers it; the record stays listed.
		w.Header().Set("Location", runsPrefix+rec.ID)
		h.writeError(w, r, dispatchErr, &contract.Request{Model: sub.chat.Model, Needs: sub.chat.Needs})
		return
	}
	writeJSON(w, http.StatusOK, renderRecord(final))
}

// getRun serves GET /v1/runs/{id}.
func (h *handler) getRun(w http.ResponseWriter, r *http.Request, id string) {
	rec, err := h.ownRun(r, id)
	if err != nil {
		h.writeError(w, r, runError(err), nil)
		return
	}
	writeJSON(w, http.StatusOK, renderRecord(rec))
}

// cancelRun serves DELETE /v1/runs/{id}: it cancels a live run, waits for
// it to end (the node has been told to stop it; its slot is free) and
// answers its record. A finished run is answered as it is. With runs
// shared between edges, a run another edge holds is cancelled there (the
// store carries the request; runs.Manager.CancelRemote) and answered once
// it ended.
func (h *handler) cancelRun(w http.ResponseWriter, r *http.Request, id string) {
	run := h.cfg.Runs.Live(id)
	if run == nil && h.cfg.Runs.Shared() {
		if _, err := h.ownRun(r, id); err != nil {
			h.writeError(w, r, runError(err), nil)
			return
		}
		rec, err := h.cfg.Runs.CancelRemote(r.Context(), id, "cancelled by DELETE /v1/runs/"+id)
		if err != nil {
			h.writeError(w, r, runError(err), nil)
			return
		}
		writeJSON(w, http.StatusOK, renderRecord(rec))
		return
	}
	if run == nil || !ownedBy(r, run.Record()) {
		h.getRun(w, r, id)
		return
	}
	run.Cancel("cancelled by DELETE /v1/runs/" + id)
	rec, err := run.Wait(r.Context())
	if err != nil {
		h.writeError(w, r, err, nil)
		return
	}
	writeJSON(w, http.StatusOK, renderRecord(rec))
}

// runEvents serves GET /v1/runs/{id}/events: the run's events from the
// start, then live ones until it ends. A run whose log has expired (or
// that a previous edge process ran) is replayed from its record: one chunk
// with its whole output, a usage chunk and [DONE], or its error event.
// With runs shared between edges, the log of a run another edge holds is
// read from the store, from the start, and followed live
// (runs.Manager.Follow).
func (h *handler) runEvents(w http.ResponseWriter, r *http.Request, id string) {
	run := h.cfg.Runs.Live(id)
	if run == nil || !ownedBy(r, run.Record()) {
		rec, err := h.ownRun(r, id)
		if err != nil {
			h.writeError(w, r, runError(err), nil)
			return
		}
		startSSE(w)
		if h.cfg.Runs.Shared() {
			rc := http.NewResponseController(w)
			if err := rc.Flush(); err != nil {
				return
			}
			streamed, err := h.cfg.Runs.Follow(r.Context(), id, func(p []byte) error {
				if _, err := w.Write(p); err != nil {
					return err
				}
				return rc.Flush()
			})
			if streamed || err != nil {
				return
			}
			if rec, err = h.cfg.Runs.Get(r.Context(), id); err != nil {
				return
			}
		}
		_, _ = w.Write(replayRecord(rec))
		return
	}
	startSSE(w)
	rc := http.NewResponseController(w)
	if err := rc.Flush(); err != nil {
		return
	}
	for offset := 0; ; {
		p, done, err := run.Next(r.Context(), offset)
		if err != nil {
			return // the reader left
		}
		if len(p) > 0 {
			if _, err := w.Write(p); err != nil {
				return
			}
			if err := rc.Flush(); err != nil {
				return
			}
			offset += len(p)
		}
		if done && len(p) == 0 {
			return
		}
	}
}

func startSSE(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
}

// replayRecord renders a finished run's record as its event stream.
func replayRecord(rec runs.Record) []byte {
	var out []byte
	event := func(v any) {
		b, _ := json.Marshal(v)
		out = sse.AppendEvent(out, "", b)
	}
	base := map[string]any{"id": "chatcmpl-" + rec.ID, "object": "chat.completion.chunk", "created": rec.CreatedAt.Unix(), "model": rec.Model}
	if rec.Output != "" || rec.State == runs.StateComplete {
		chunk := maps.Clone(base)
		var finish any
		if rec.FinishReason != "" {
			finish = rec.FinishReason
		}
		chunk["choices"] = []any{map[string]any{"index": 0, "delta": map[string]any{"role": "assistant", "content": rec.Output}, "finish_reason": finish}}
		event(chunk)
	}
	if rec.State == runs.StateComplete {
		usage := maps.Clone(base)
		usage["choices"] = []any{}
		usage["usage"] = map[string]int{"prompt_tokens": rec.PromptTokens, "completion_tokens": rec.CompletionTokens, "total_tokens": rec.PromptTokens + rec.CompletionTokens}
		event(usage)
		return sse.AppendDone(out)
	}
	msg := rec.Error
	if msg == "" {
		msg = "the run did not complete"
	}
	code := "upstream_error"
	if rec.State == runs.StateCancelled {
		code = "run_cancelled"
	}
	event(errorBody{Error: newAPIError(0, "server_error", "", code, msg)})
	return out
}

// listRuns serves GET /v1/runs.
func (h *handler) listRuns(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	f := runs.Filter{State: runs.State(q.Get("state")), Model: q.Get("model"), SessionID: q.Get("session_id"), After: q.Get("after"),
		KeyName: keyName(r.Context())}
	switch f.State {
	case "", runs.StateQueued, runs.StateRunning, runs.StateComplete, runs.StateError, runs.StateCancelled:
	default:
		h.writeError(w, r, &requestError{param: "state", message: "must be one of queued, running, complete, error, cancelled"}, nil)
		return
	}
	if s := q.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > runs.MaxLimit {
			h.writeError(w, r, &requestError{param: "limit", message: fmt.Sprintf("must be an integer from 1 to %d", runs.MaxLimit)}, nil)
			return
		}
		f.Limit = n
	}
	recs, more, err := h.cfg.Runs.List(r.Context(), f)
	if errors.Is(err, runs.ErrNotFound) {
		h.writeError(w, r, &requestError{param: "after", message: "no run has this id"}, nil)
		return
	}
	if err != nil {
		h.logger.Error("listing runs failed", "err", err)
		h.writeError(w, r, err, nil)
		return
	}
	page := struct {
		Object  string       `json:"object"`
		Data    []recordJSON `json:"data"`
		HasMore bool         `json:"has_more"`
		LastID  *string      `json:"last_id"`
	}{Object: "list", Data: make([]recordJSON, 0, len(recs)), HasMore: more}
	for _, rec := range recs {
		item := renderRecord(rec)
		item.Output = nil // lists leave the output out
		page.Data = append(page.Data, item)
	}
	if len(recs) > 0 {
		page.LastID = &recs[len(recs)-1].ID
	}
	writeJSON(w, http.StatusOK, page)
}

// ownRun returns the record of run id if the request's key submitted it
// (any run on an open API); a run of another key is ErrNotFound, as if it
// did not exist.
func (h *handler) ownRun(r *http.Request, id string) (runs.Record, error) {
	rec, err := h.cfg.Runs.Get(r.Context(), id)
	if err == nil && !ownedBy(r, rec) {
		return runs.Record{}, fmt.Errorf("%w: %q", runs.ErrNotFound, id)
	}
	return rec, err
}

// ownedBy reports whether the request's key may see rec.
func ownedBy(r *http.Request, rec runs.Record) bool {
	name := keyName(r.Context())
	return name == "" || rec.KeyName == name
}

func runError(err error) error {
	if errors.Is(err, runs.ErrNotFound) {
		return errRunNotFound
	}
	return err
}

// recordJSON is a run record as the runs API shows it. Times are Unix
// seconds (null until they happen); durations are milliseconds.
type recordJSON struct {
	ID         string            `json:"id"`
	Object     string            `json:"object"` // "run"
	State      runs.State        `json:"state"`
	Model      string            `json:"model"`
	SessionID  *string           `json:"session_id"`
	Background bool              `json:"background"`
	Metadata   map[string]string `json:"metadata"`
	CreatedAt  int64             `json:"created_at"`
	StartedAt  *int64            `json:"started_at"`
	FinishedAt *int64            `json:"finished_at"`
	Dispatch   *dispatchJSON     `json:"dispatch"`
	Usage      usageJSON         `json:"usage"`
	Timing     timingJSON        `json:"timing"`
	// Output is the answer's text; lists leave it out (nil).
	Output *string `json:"output,omitempty"`
	// OutputTruncated says the run produced more output (or events) than
	// the edge keeps for one run.
	OutputTruncated bool    `json:"output_truncated,omitempty"`
	FinishReason    *string `json:"finish_reason"`
	Error           *string `json:"error"`
	Status          int     `json:"status,omitempty"`
	// Outcome is how the run's request ended (an Outcome* value; the same
	// its log line, metrics, usage ledger entry and run_ended event say);
	// null until it ended.
	Outcome *string `json:"outcome"`
}

type dispatchJSON struct {
	NodeID        string `json:"node_id"`
	ProviderID    string `json:"provider_id"`
	ServedModel   string `json:"served_model"`
	ExecutionPath string `json:"execution_path"`
	QueueReason   string `json:"queue_reason"`
	QueueWaitMs   int64  `json:"queue_wait_ms"`
}

type usageJSON struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

type timingJSON struct {
	QueueWaitMs        *int64 `json:"queue_wait_ms"`
	TimeToFirstTokenMs *int64 `json:"time_to_first_token_ms"` // from submission
	DurationMs         *int64 `json:"duration_ms"`            // from submission to the end
}

func renderRecord(r runs.Record) recordJSON {
	out := recordJSON{
		ID: r.ID, Object: "run", State: r.State, Model: r.Model, Background: r.Background,
		Metadata: r.Metadata, CreatedAt: r.CreatedAt.Unix(), StartedAt: unixOrNil(r.StartedAt),
		FinishedAt: unixOrNil(r.FinishedAt), Output: &r.Output, OutputTruncated: r.OutputTruncated, Status: r.Status,
		Usage: usageJSON{r.PromptTokens, r.CompletionTokens, r.PromptTokens + r.CompletionTokens},
	}
	if out.Metadata == nil {
		out.Metadata = map[string]string{}
	}
	if r.SessionID != "" {
		out.SessionID = &r.SessionID
	}
	if r.NodeID != "" {
		out.Dispatch = &dispatchJSON{r.NodeID, r.ProviderID, r.ServedModel, r.Path, r.QueueReason, r.QueueWait.Milliseconds()}
		out.Timing.QueueWaitMs = msOf(r.QueueWait)
	}
	if !r.FirstTokenAt.IsZero() {
		out.Timing.TimeToFirstTokenMs = msOf(r.FirstTokenAt.Sub(r.CreatedAt))
	}
	if !r.FinishedAt.IsZero() {
		out.Timing.DurationMs = msOf(r.FinishedAt.Sub(r.CreatedAt))
	}
	if r.FinishReason != "" {
		out.FinishReason = &r.FinishReason
	}
	if r.Error != "" {
		out.Error = &r.Error
	}
	if r.Outcome != "" {
		out.Outcome = &r.Outcome
	}
	return out
}

func unixOrNil(t time.Time) *int64 {
	if t.IsZero() {
		return nil
	}
	s := t.Unix()
	return &s
}

func msOf(d time.Duration) *int64 {
	ms := d.Milliseconds()
	return &ms
}

func NewRunID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go ≥ 1.24)
	return "run_" + hex.EncodeToString(b[:])
}
