package api

import (
	"bytes"
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
		param := "metadata." + clip(k)
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
		ID:         newRunID(),
		Model:      sub.chat.Model,
		SessionID:  sub.sessionID,
		Background: sub.background,
		Metadata:   sub.metadata,
		KeyName:    keyName(r.Context()),
	}
	obs.request(&Request{Model: rec.Model})
	if err := checkModel(r.Context(), rec.Model); err != nil {
		h.writeError(w, r, err, &Request{Model: rec.Model})
		return
	}
	nodeID, providerID := h.cfg.Runs.Affinity(sub.sessionID)
	// The run holds its key's request slot until it ends, also in the
	// background after this request answered.
	release := keepPermit(r.Context())
	// Set by the run's goroutine before the run finishes, read here only
	// after run.Wait saw it finish.
	var dispatchErr error
	requestID := obs.requestID()
	run, err := h.cfg.Runs.Start(r.Context(), rec, func(ctx context.Context, run *runs.Run) {
		defer release()
		h.execute(ctx, run, requestID, sub.chatBody, nodeID, providerID, &dispatchErr)
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
	if final.State == runs.StateError && dispatchErr != nil {
		// It never reached a provider (an unknown model, a full queue, ...):
		// answered as the chat route answers it; the record stays listed.
		w.Header().Set("Location", runsPrefix+rec.ID)
		h.writeError(w, r, dispatchErr, &Request{Model: sub.chat.Model, Needs: sub.chat.Needs})
		return
	}
	writeJSON(w, http.StatusOK, renderRecord(final))
}

// execute runs a submitted run: it serves its chat completion request with
// the chat handler, into a writer that records the answer's events in the
// run, with a gateway that names the run and records its dispatch. ctx
// ends when the run is cancelled. The chat request is an API request of
// operation "runs" named requestID (the submission's): its outcome is
// decided once and is the run record's too (runWriter.outcome).
func (h *handler) execute(ctx context.Context, run *runs.Run, requestID string, chatBody []byte, preferNode, preferProvider string, dispatchErr *error) {
	inner := *h
	inner.gw = runGateway{Gateway: h.gw, run: run, preferNode: preferNode, preferProvider: preferProvider, dispatchErr: dispatchErr}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "/v1/chat/completions", bytes.NewReader(chatBody))
	if err != nil {
		run.Finish(runs.Outcome{State: runs.StateError, Error: err.Error()})
		return
	}
	req.Header.Set("Content-Type", "application/json")
	// Its own observation: ctx carries the submitting request's values, and
	// that request may finish first.
	req, obs := h.observe(req)
	obs.rec.API, obs.rec.RequestID, obs.rec.Key = "runs", requestID, keyName(ctx)
	rw := &runWriter{run: run, header: make(http.Header)}
	defer func() { h.finish(ctx, obs, rw.status) }()
	func() {
		defer func() {
			// The chat handler aborts a response cut short; here that
			// just ends the recording.
			if v := recover(); v != nil && v != http.ErrAbortHandler {
				panic(v)
			}
		}()
		inner.chatCompletions(rw, req)
	}()
	// The run's answer is finished (answerFinished also ran in the chat
	// handler, before its last event, unless the run never started).
	answerFinished(ctx)
	run.Finish(rw.outcome(ctx, obs.decide(rw.status)))
}

// runGateway is the Gateway a run's chat request goes through: it gives
// the dispatch the run's id and session preference, and records where the
// run went, or, in dispatchErr, why it went nowhere.
type runGateway struct {
	Gateway
	run                        *runs.Run
	preferNode, preferProvider string
	dispatchErr                *error
}

func (g runGateway) Dispatch(ctx context.Context, req Request) (Run, error) {
	req.RunID = g.run.Record().ID
	req.PreferNodeID, req.PreferProviderID = g.preferNode, g.preferProvider
	r, err := g.Gateway.Dispatch(ctx, req)
	if err != nil {
		*g.dispatchErr = err
		return nil, err
	}
	info := r.Info()
	g.run.Dispatched(runs.Record{
		NodeID: info.NodeID, ProviderID: info.ProviderID, ServedModel: info.ServedModel,
		Path: info.Path.String(), QueueReason: info.QueueReason, QueueWait: info.QueueWait,
	})
	return r, nil
}

// maxErrorBody caps the error body a runWriter keeps.
const maxErrorBody = 64 << 10

// runWriter is the http.ResponseWriter a run's chat request is served
// into. It splits an SSE answer into events (package sse, the WHATWG
// rules), appends each to the run's log
// as `data: <payload>\n\n`, and reads from it the output text, finish
// reason, usage, an in-stream error and the closing [DONE]. A non-SSE
// answer (an error) is kept for its message.
type runWriter struct {
	run    *runs.Run
	header http.Header
	status int
	sse    bool
	events sse.Reader // the SSE answer's events
	body   []byte     // a non-SSE body, up to maxErrorBody

	done                           bool
	errMsg, finishReason           string
	promptTokens, completionTokens int
}

func (w *runWriter) Header() http.Header { return w.header }

func (w *runWriter) WriteHeader(status int) {
	if w.status != 0 {
		return
	}
	w.status = status
	w.sse = isEventStream(w.header.Get("Content-Type"))
}

func (w *runWriter) Flush() {}

func (w *runWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	if !w.sse {
		if room := maxErrorBody - len(w.body); room > 0 {
			w.body = append(w.body, p[:min(room, len(p))]...)
		}
		return len(p), nil
	}
	// The chat handler writes events of bounded size; an event over the
	// reader's bound is not recorded.
	w.events.SkipTooLong = true
	_ = w.events.Feed(p, func(e sse.Event) error { w.dispatch(e.Data); return nil })
	return len(p), nil
}

// dispatch handles one complete event, whose data is payload.
func (w *runWriter) dispatch(payload []byte) {
	text := ""
	if string(payload) == "[DONE]" {
		w.done = true
	} else {
		var chunk struct {
			Choices []struct {
				Index int `json:"index"`
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
				FinishReason string `json:"finish_reason"`
			} `json:"choices"`
			Usage *struct {
				PromptTokens     int `json:"prompt_tokens"`
				CompletionTokens int `json:"completion_tokens"`
			} `json:"usage"`
			Error json.RawMessage `json:"error"`
		}
		if json.Unmarshal(payload, &chunk) == nil {
			for _, c := range chunk.Choices {
				if c.Index != 0 {
					continue
				}
				text += c.Delta.Content
				if c.FinishReason != "" {
					w.finishReason = c.FinishReason
				}
			}
			if chunk.Usage != nil {
				w.promptTokens, w.completionTokens = chunk.Usage.PromptTokens, chunk.Usage.CompletionTokens
			}
			if !isAbsent(chunk.Error) {
				w.errMsg = errorMessage(chunk.Error)
			}
		}
	}
	event := make([]byte, 0, len(payload)+8)
	event = append(append(append(event, "data: "...), payload...), "\n\n"...)
	w.run.Append(event, text)
}

// errorMessage is the message of an OpenAI error object, or its JSON.
func errorMessage(raw json.RawMessage) string {
	var e struct {
		Message string `json:"message"`
	}
	if json.Unmarshal(raw, &e) == nil && e.Message != "" {
		return e.Message
	}
	return clipTo(string(raw), maxQuotedBytes)
}

// outcome is how the recorded answer ended; ctx is the run's context and
// requestOutcome the outcome decided for the run's chat request (an
// Outcome* value), which the record keeps and which decides a complete
// state: the run is complete exactly when its request completed.
func (w *runWriter) outcome(ctx context.Context, requestOutcome contract.Outcome) runs.Outcome {
	o := runs.Outcome{Status: w.status, FinishReason: w.finishReason, PromptTokens: w.promptTokens, CompletionTokens: w.completionTokens,
		Outcome: string(requestOutcome)}
	switch {
	case requestOutcome == OutcomeCompleted:
		o.State = runs.StateComplete
	case errors.Is(context.Cause(ctx), runs.ErrStopping) || requestOutcome == OutcomeEdgeStopped:
		o.State, o.Error = runs.StateError, runs.ErrStopping.Error()
		w.appendError(o.Error, "edge_stopped")
	case ctx.Err() != nil:
		o.State = runs.StateCancelled
		o.Error = "cancelled: " + context.Cause(ctx).Error()
		w.appendError(o.Error, "run_cancelled")
	case w.errMsg != "":
		o.State, o.Error = runs.StateError, w.errMsg
	case !w.sse && w.status >= 400:
		var body struct {
			Error json.RawMessage `json:"error"`
		}
		o.State, o.Error = runs.StateError, http.StatusText(w.status)
		if json.Unmarshal(w.body, &body) == nil && !isAbsent(body.Error) {
			o.Error = errorMessage(body.Error)
			w.run.Append(append(append([]byte("data: "), bytes.TrimSpace(w.body)...), "\n\n"...), "")
		} else {
			w.appendError(o.Error, "upstream_error")
		}
	default:
		o.State, o.Error = runs.StateError, errUpstreamEnded.Error()
		w.appendError(o.Error, "upstream_error")
	}
	return o
}

// appendError ends the run's log with an OpenAI error event.
func (w *runWriter) appendError(message, code string) {
	b, _ := json.Marshal(errorBody{Error: newAPIError(0, "server_error", "", code, message)})
	w.run.Append(append(append([]byte("data: "), b...), "\n\n"...), "")
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
// answers its record. A finished run is answered as it is.
func (h *handler) cancelRun(w http.ResponseWriter, r *http.Request, id string) {
	run := h.cfg.Runs.Live(id)
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
func (h *handler) runEvents(w http.ResponseWriter, r *http.Request, id string) {
	run := h.cfg.Runs.Live(id)
	if run == nil || !ownedBy(r, run.Record()) {
		rec, err := h.ownRun(r, id)
		if err != nil {
			h.writeError(w, r, runError(err), nil)
			return
		}
		startSSE(w)
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
		out = append(append(append(out, "data: "...), b...), "\n\n"...)
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
		return append(out, "data: [DONE]\n\n"...)
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

func newRunID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go ≥ 1.24)
	return "run_" + hex.EncodeToString(b[:])
}
