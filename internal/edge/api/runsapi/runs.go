package runsapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"strconv"
	"strings"
	"time"

	"iop/internal/edge/api"
	"iop/internal/edge/api/request"
	"iop/internal/edge/contract"
	"iop/internal/runs"
	"iop/internal/sse"
)

// The runs API (Routes):
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

// Config is the runs API's configuration.
type Config struct {
	// Runs keeps the run records and runs the runs; nil: the runs API is
	// off (its paths are 404).
	Runs *runs.Manager
}

// Routes makes the runs API an api.API on the frame: POST and GET
// /v1/runs, GET and DELETE /v1/runs/{id}, GET /v1/runs/{id}/events.
// Its errors are OpenAI's (api.Frame.WriteError).
func Routes(cfg Config) api.API {
	return func(f *api.Frame) map[string]api.Route {
		if cfg.Runs == nil {
			return nil
		}
		s := &server{f: f, runs: cfg.Runs}
		return map[string]api.Route{
			runsPath:   {Serve: s.runsRoute, Operation: "runs"},
			runsPrefix: {Serve: s.runRoute},
		}
	}
}

// server serves the runs API's routes; read-only after Routes.
type server struct {
	f    *api.Frame
	runs *runs.Manager
}

// runSubmission is a decoded POST /v1/runs body.
type runSubmission struct {
	// chat is the chat completion request to run (stream on, usage on;
	// the chat route's decoding).
	chat       contract.Request
	background bool
	sessionID  string
	metadata   map[string]string
}

// decodeRunSubmission checks a POST /v1/runs body and derives the chat
// completion request it runs. Errors are 400s naming the field
// (api.InvalidParam, *request.FieldError).
func decodeRunSubmission(body []byte) (runSubmission, error) {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(body, &top); err != nil || top == nil {
		// The chat route's decoding words every way a body fails to be an
		// object.
		_, derr := request.DecodeChat(body)
		if derr == nil {
			derr = api.InvalidParam("", "the request body must be a JSON object")
		}
		return runSubmission{}, derr
	}
	var s runSubmission
	if err := request.DecodeValue(top["background"], "background", request.WantBool, &s.background); err != nil {
		return runSubmission{}, err
	}
	if err := request.DecodeValue(top["session_id"], "session_id", request.WantString, &s.sessionID); err != nil {
		return runSubmission{}, err
	}
	if len(s.sessionID) > maxSessionIDBytes || strings.ContainsAny(s.sessionID, "\r\n") {
		return runSubmission{}, api.InvalidParam("session_id", fmt.Sprintf("must be at most %d bytes, without line breaks", maxSessionIDBytes))
	}
	if err := decodeMetadata(top["metadata"], &s.metadata); err != nil {
		return runSubmission{}, err
	}
	if prompt, ok := top["prompt"]; ok && !isAbsent(prompt) {
		if _, both := top["messages"]; both {
			return runSubmission{}, api.InvalidParam("prompt", "give either prompt or messages, not both")
		}
		var text string
		if err := request.DecodeValue(prompt, "prompt", request.WantString, &text); err != nil {
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
		return runSubmission{}, api.InvalidParam("", "the request body cannot be re-encoded: "+err.Error())
	}
	chat, err := request.DecodeChat(chatBody)
	if err != nil {
		return runSubmission{}, err
	}
	s.chat = chat.Request
	return s, nil
}

// isAbsent reports whether a raw value is missing or JSON null.
func isAbsent(raw json.RawMessage) bool {
	raw = bytes.TrimLeft(raw, " \t\r\n")
	return len(raw) == 0 || raw[0] == 'n'
}

func decodeMetadata(raw json.RawMessage, dst *map[string]string) error {
	if isAbsent(raw) {
		return nil
	}
	var obj map[string]json.RawMessage
	if err := request.DecodeValue(raw, "metadata", request.WantObject, &obj); err != nil {
		return err
	}
	if len(obj) > maxMetadataKeys {
		return api.InvalidParam("metadata", fmt.Sprintf("at most %d keys", maxMetadataKeys))
	}
	out := make(map[string]string, len(obj))
	for k, v := range obj {
		param := "metadata." + api.Clip(k)
		if len(k) > maxMetadataKey || k == "" {
			return api.InvalidParam(param, fmt.Sprintf("keys must be 1-%d bytes", maxMetadataKey))
		}
		var s string
		if err := request.DecodeValue(v, param, request.WantString, &s); err != nil {
			return err
		}
		if len(s) > maxMetadataValue {
			return api.InvalidParam(param, fmt.Sprintf("values must be at most %d bytes", maxMetadataValue))
		}
		out[k] = s
	}
	*dst = out
	return nil
}

// runsRoute serves /v1/runs: POST submits, GET lists.
func (s *server) runsRoute(w http.ResponseWriter, r *http.Request) {
	switch r.Method {
	case http.MethodPost:
		s.submitRun(w, r)
	case http.MethodGet, http.MethodHead:
		s.listRuns(w, r)
	default:
		w.Header().Set("Allow", "GET, POST")
		s.f.WriteError(w, r, api.ErrMethodNotAllowed, nil)
	}
}

// runRoute serves /v1/runs/{id} (GET, DELETE) and /v1/runs/{id}/events (GET).
func (s *server) runRoute(w http.ResponseWriter, r *http.Request) {
	rest := strings.TrimPrefix(r.URL.Path, runsPrefix)
	id, events := strings.CutSuffix(rest, "/events")
	if id == "" || strings.Contains(id, "/") {
		s.f.WriteError(w, r, api.ErrNotFound, nil)
		return
	}
	allow := "GET, DELETE"
	if events {
		allow = "GET"
	}
	switch {
	case events && (r.Method == http.MethodGet || r.Method == http.MethodHead):
		s.runEvents(w, r, id)
	case !events && (r.Method == http.MethodGet || r.Method == http.MethodHead):
		s.getRun(w, r, id)
	case !events && r.Method == http.MethodDelete:
		s.cancelRun(w, r, id)
	default:
		w.Header().Set("Allow", allow)
		s.f.WriteError(w, r, api.ErrMethodNotAllowed, nil)
	}
}

// submitRun serves POST /v1/runs. A submission refused before its run
// starts is recorded as a request of operation "runs"; a run that starts
// is recorded by its own chat request (execute), under the same request
// id, when it ends.
func (s *server) submitRun(w http.ResponseWriter, r *http.Request) {
	api.Begin(r, "runs")
	body, err := s.f.ReadBody(r)
	if err != nil {
		s.f.WriteError(w, r, err, nil)
		return
	}
	sub, err := decodeRunSubmission(body)
	if err != nil {
		s.f.WriteError(w, r, err, nil)
		return
	}
	rec := runs.Record{
		ID:         api.NewRunID(),
		Model:      sub.chat.Model,
		SessionID:  sub.sessionID,
		Background: sub.background,
		Metadata:   sub.metadata,
		KeyName:    api.KeyName(r.Context()),
	}
	requestID := api.RecordRequest(r, &contract.Request{Model: rec.Model})
	if err := api.CheckModel(r.Context(), rec.Model); err != nil {
		s.f.WriteError(w, r, err, &contract.Request{Model: rec.Model})
		return
	}
	nodeID, providerID := s.runs.Affinity(sub.sessionID)
	// The run holds its key's request slot until it ends, also in the
	// background after this request answered.
	release := api.KeepPermit(r.Context())
	// The run's refusal by the gateway, if it got one: sent before the
	// run finishes, so it is there once run.Wait saw it finish.
	refused := make(chan error, 1)
	run, err := s.runs.Start(r.Context(), rec, func(ctx context.Context, run *runs.Run) {
		defer release()
		s.execute(ctx, run, runTarget{requestID: requestID, sub: sub, preferNode: nodeID, preferProvider: providerID}, refused)
	})
	if err != nil {
		release()
		s.f.Logger().Error("starting a run failed", "err", err)
		s.f.WriteError(w, r, err, nil)
		return
	}
	api.HandOff(r)
	if sub.background {
		w.Header().Set("Location", runsPrefix+rec.ID)
		api.WriteJSON(w, http.StatusAccepted, renderRecord(run.Record()))
		return
	}
	// The run belongs to this request: it ends when the submitter leaves.
	stop := context.AfterFunc(r.Context(), func() { run.Cancel("submitter gone") })
	defer stop()
	final, err := run.Wait(r.Context())
	if err != nil {
		s.f.WriteError(w, r, err, nil) // the client is gone: nothing is written
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
		s.f.WriteError(w, r, dispatchErr, &contract.Request{Model: sub.chat.Model, Needs: sub.chat.Needs})
		return
	}
	api.WriteJSON(w, http.StatusOK, renderRecord(final))
}

// getRun serves GET /v1/runs/{id}.
func (s *server) getRun(w http.ResponseWriter, r *http.Request, id string) {
	rec, err := s.ownRun(r, id)
	if err != nil {
		s.f.WriteError(w, r, runError(err), nil)
		return
	}
	api.WriteJSON(w, http.StatusOK, renderRecord(rec))
}

// cancelRun serves DELETE /v1/runs/{id}: it cancels a live run, waits for
// it to end (the node has been told to stop it; its slot is free) and
// answers its record. A finished run is answered as it is. With runs
// shared between edges, a run another edge holds is cancelled there (the
// store carries the request; runs.Manager.CancelRemote) and answered once
// it ended.
func (s *server) cancelRun(w http.ResponseWriter, r *http.Request, id string) {
	run := s.runs.Live(id)
	if run == nil && s.runs.Shared() {
		if _, err := s.ownRun(r, id); err != nil {
			s.f.WriteError(w, r, runError(err), nil)
			return
		}
		rec, err := s.runs.CancelRemote(r.Context(), id, "cancelled by DELETE /v1/runs/"+id)
		if err != nil {
			s.f.WriteError(w, r, runError(err), nil)
			return
		}
		api.WriteJSON(w, http.StatusOK, renderRecord(rec))
		return
	}
	if run == nil || !ownedBy(r, run.Record()) {
		s.getRun(w, r, id)
		return
	}
	run.Cancel("cancelled by DELETE /v1/runs/" + id)
	rec, err := run.Wait(r.Context())
	if err != nil {
		s.f.WriteError(w, r, err, nil)
		return
	}
	api.WriteJSON(w, http.StatusOK, renderRecord(rec))
}

// runEvents serves GET /v1/runs/{id}/events: the run's events from the
// start, then live ones until it ends. A run whose log has expired (or
// that a previous edge process ran) is replayed from its record: one chunk
// with its whole output, a usage chunk and [DONE], or its error event.
// With runs shared between edges, the log of a run another edge holds is
// read from the store, from the start, and followed live
// (runs.Manager.Follow).
func (s *server) runEvents(w http.ResponseWriter, r *http.Request, id string) {
	run := s.runs.Live(id)
	if run == nil || !ownedBy(r, run.Record()) {
		rec, err := s.ownRun(r, id)
		if err != nil {
			s.f.WriteError(w, r, runError(err), nil)
			return
		}
		startSSE(w)
		if s.runs.Shared() {
			rc := http.NewResponseController(w)
			if err := rc.Flush(); err != nil {
				return
			}
			streamed, err := s.runs.Follow(r.Context(), id, func(p []byte) error {
				if _, err := w.Write(p); err != nil {
					return err
				}
				return rc.Flush()
			})
			if streamed || err != nil {
				return
			}
			if rec, err = s.runs.Get(r.Context(), id); err != nil {
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
	event(json.RawMessage(api.ErrorJSON("server_error", code, msg)))
	return out
}

// listRuns serves GET /v1/runs.
func (s *server) listRuns(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	f := runs.Filter{State: runs.State(q.Get("state")), Model: q.Get("model"), SessionID: q.Get("session_id"), After: q.Get("after"),
		KeyName: api.KeyName(r.Context())}
	switch f.State {
	case "", runs.StateQueued, runs.StateRunning, runs.StateComplete, runs.StateError, runs.StateCancelled:
	default:
		s.f.WriteError(w, r, api.InvalidParam("state", "must be one of queued, running, complete, error, cancelled"), nil)
		return
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > runs.MaxLimit {
			s.f.WriteError(w, r, api.InvalidParam("limit", fmt.Sprintf("must be an integer from 1 to %d", runs.MaxLimit)), nil)
			return
		}
		f.Limit = n
	}
	recs, more, err := s.runs.List(r.Context(), f)
	if errors.Is(err, runs.ErrNotFound) {
		s.f.WriteError(w, r, api.InvalidParam("after", "no run has this id"), nil)
		return
	}
	if err != nil {
		s.f.Logger().Error("listing runs failed", "err", err)
		s.f.WriteError(w, r, err, nil)
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
	api.WriteJSON(w, http.StatusOK, page)
}

// ownRun returns the record of run id if the request's key submitted it
// (any run on an open API); a run of another key is ErrNotFound, as if it
// did not exist.
func (s *server) ownRun(r *http.Request, id string) (runs.Record, error) {
	rec, err := s.runs.Get(r.Context(), id)
	if err == nil && !ownedBy(r, rec) {
		return runs.Record{}, fmt.Errorf("%w: %q", runs.ErrNotFound, id)
	}
	return rec, err
}

// ownedBy reports whether the request's key may see rec.
func ownedBy(r *http.Request, rec runs.Record) bool {
	name := api.KeyName(r.Context())
	return name == "" || rec.KeyName == name
}

func runError(err error) error {
	if errors.Is(err, runs.ErrNotFound) {
		return api.ErrRunNotFound
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
