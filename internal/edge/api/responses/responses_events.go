package responses

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"sync"

	"iop/internal/edge/api"
	"iop/internal/edge/api/access"
	"iop/internal/runs"
	"iop/internal/sse"
)

// responseEventLog is the Responses API event stream of a background
// response, kept for a client that streams it (background and stream
// true) or resumes it (GET /v1/responses/{id}?stream=true&starting_after=N,
// OpenAI API reference, "Retrieve a model response"). events[i] is the
// whole SSE event whose sequence_number is i: response.created (status
// queued) when the response is created, response.in_progress when it is
// dispatched, its items' events, then one final event: response.completed,
// response.incomplete or response.failed, or for a response cancelled (POST
// /cancel, DELETE) an "error" event with code "response_cancelled". It is
// attached to the response's run (runs.Run.Attach) and lives as long as
// the run is Live: while it runs, then the runs manager's retention; a
// response of another edge, or one older, is not streamed. The log keeps
// at most runs.MaxEventBytes; past that it ends with an "error" event
// (code "events_truncated") and its response runs on. The run's goroutine
// is its only writer; followers read it under mu.
type responseEventLog struct {
	mu      sync.Mutex // guards the fields below
	events  [][]byte
	size    int
	done    bool          // the final event is in; nothing more is added
	changed chan struct{} // closed and replaced when events or done change
}

func newResponseEventLog() *responseEventLog {
	return &responseEventLog{changed: make(chan struct{})}
}

// add appends one whole SSE event, the next sequence number's; final ends
// the log with it. After the end it does nothing.
func (l *responseEventLog) add(ev []byte, final bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.done {
		return
	}
	if l.size+len(ev) > runs.MaxEventBytes {
		seq := len(l.events)
		l.events = append(l.events, sse.AppendEvent(nil, "error", fmt.Appendf(nil, `{"type":"error","code":"events_truncated","message":"the response's events exceed the edge's limit; the rest is not kept: retrieve the response without stream once it is done","param":null,"sequence_number":%d}`, seq)))
		final = true
	} else {
		l.events = append(l.events, ev)
		l.size += len(ev)
	}
	if final {
		l.done = true
	}
	close(l.changed)
	l.changed = make(chan struct{})
}

// ended reports whether the final event is in.
func (l *responseEventLog) ended() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.done
}

// next returns the events from sequence number from on, waiting while
// there are none and the log has not ended; done is true when they reach
// its end. Errors: ctx's, when it ends first.
func (l *responseEventLog) next(ctx context.Context, from int) (evs [][]byte, done bool, err error) {
	for {
		l.mu.Lock()
		if from < len(l.events) {
			evs = l.events[from:len(l.events):len(l.events)]
		}
		done, ch := l.done, l.changed
		l.mu.Unlock()
		if len(evs) > 0 || done {
			return evs, done, nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, false, ctx.Err()
		}
	}
}

// responseEventsOf returns the event log of the request key's background
// response id that this edge keeps; nil for none.
func (s *server) responseEventsOf(ctx context.Context, id string) *responseEventLog {
	if s.runs == nil {
		return nil
	}
	run := s.runs.Live(id)
	if run == nil || run.Record().KeyName != access.KeyName(ctx) {
		return nil
	}
	l, _ := run.Attached().(*responseEventLog)
	return l
}

// streamResponse serves GET /v1/responses/{id}?stream=true: the
// response's events after sequence number starting_after (an integer ≥
// 0; without it, every event), those kept first, then the rest as they
// come, until the final one. 400 for a bad starting_after, or a response
// whose events this edge does not keep (not a background one, another
// edge's, or one ended longer ago than the runs' retention); 404 for an
// id the key has no response of.
func (s *server) streamResponse(w http.ResponseWriter, r *http.Request, id string) {
	after := -1
	if v := r.URL.Query().Get("starting_after"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			s.f.WriteError(w, r, api.InvalidParam("starting_after", "must be an integer ≥ 0, the sequence number of an event"), nil)
			return
		}
		after = n
	}
	if _, err := s.storedResponse(r.Context(), id); err != nil {
		s.f.WriteError(w, r, err, nil)
		return
	}
	l := s.responseEventsOf(r.Context(), id)
	if l == nil {
		s.f.WriteError(w, r, api.InvalidParam("stream", "this edge keeps no events of this response (only of a background response it runs, until some time after it ended): retrieve it without stream"), nil)
		return
	}
	s.followResponse(w, r, l, after)
}

// followResponse writes the events of l after sequence number after as an
// SSE stream, flushed as they come, until the log's end or the client
// goes away (the response runs on either way). A write that fails, or a
// client gone, aborts the connection.
func (s *server) followResponse(w http.ResponseWriter, r *http.Request, l *responseEventLog, after int) {
	access.AnswerFinished(r.Context()) // following a response occupies no provider
	header := w.Header()
	header.Set("Content-Type", "text/event-stream")
	header.Set("Cache-Control", "no-cache")
	header.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	_ = rc.Flush()
	for next := after + 1; ; {
		evs, done, err := l.next(r.Context(), next)
		if err != nil {
			panic(http.ErrAbortHandler) // the client is gone
		}
		for _, ev := range evs {
			if _, err := w.Write(ev); err != nil {
				panic(http.ErrAbortHandler)
			}
		}
		next += len(evs)
		if err := rc.Flush(); err != nil {
			panic(http.ErrAbortHandler)
		}
		if done {
			return
		}
	}
}
