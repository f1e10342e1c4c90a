package admin

import (
	"encoding/json"
	"net/http"
	"time"

	"iop/internal/edge/lifecycle"
	"iop/internal/sse"
)

// Events is what GET /admin/v1/events needs: a subscription to the edge's
// lifecycle events. *lifecycle.Hub is one.
type Events interface {
	// Subscribe returns a subscription with room for buffer events.
	Subscribe(buffer int) *lifecycle.Subscription
}

// Defaults of the events stream.
const (
	// eventsBuffer is each subscriber's buffer, in events.
	eventsBuffer = 256
	// DefaultEventsKeepAlive is how often an idle events stream gets a
	// comment line, so proxies and clients see it alive.
	DefaultEventsKeepAlive = 15 * time.Second
	// eventsRetryMS is the reconnection delay the stream asks an
	// EventSource for, in milliseconds (the SSE "retry" field).
	eventsRetryMS = 1000
)

// events serves GET /admin/v1/events: Server-Sent Events
// (html.spec.whatwg.org "Server-sent events"), one `data: <JSON>` event per
// lifecycle.Event, its type in the object's "type" field, as they happen
// from the moment of subscription (no history: a client reads the admin
// routes for the state, then applies events). An idle stream gets a
// `: keepalive` comment every Config.EventsKeepAlive.
//
// Slow subscribers: each has a buffer of 256 events; one that falls that
// far behind is dropped, never slowing the edge: its stream ends with
// `event: dropped` and `data: {"reason":"slow subscriber"}`. An EventSource
// reconnects by itself (after the `retry: 1000` ms the stream announces)
// and should then re-read the state. The stream also ends when the edge
// shuts down.
func (s *server) events(w http.ResponseWriter, r *http.Request) {
	sub := s.cfg.Events.Subscribe(eventsBuffer)
	defer sub.Close()
	rc := http.NewResponseController(w)
	// A server-wide write deadline is for answers, not for a stream that
	// lasts as long as its client wants.
	_ = rc.SetWriteDeadline(time.Time{})
	header := w.Header()
	header.Set("Content-Type", "text/event-stream")
	header.Set("Cache-Control", "no-cache")
	header.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	if !writeFlush(w, rc, []byte("retry: 1000\n: iop lifecycle events\n\n")) {
		return
	}
	keepAlive := time.NewTicker(s.cfg.EventsKeepAlive)
	defer keepAlive.Stop()
	for {
		select {
		case e, ok := <-sub.Events():
			if !ok {
				if sub.Dropped() {
					writeFlush(w, rc, sse.AppendEvent(nil, "dropped", []byte(`{"reason":"slow subscriber"}`)))
				}
				return
			}
			buf, err := appendEvent(nil, e)
			// Send what else is already waiting in the same write.
			for more := true; more && err == nil; {
				select {
				case e, ok := <-sub.Events():
					if !ok {
						more = false
						break
					}
					buf, err = appendEvent(buf, e)
				default:
					more = false
				}
			}
			if err != nil {
				s.logger.Warn("encoding an event failed", "err", err)
				return
			}
			if !writeFlush(w, rc, buf) {
				return
			}
		case <-keepAlive.C:
			if !writeFlush(w, rc, []byte(": keepalive\n\n")) {
				return
			}
		case <-r.Context().Done():
			return
		}
	}
}

// appendEvent appends e as one SSE event, `data: <json>\n\n`.
func appendEvent(buf []byte, e lifecycle.Event) ([]byte, error) {
	b, err := json.Marshal(e)
	if err != nil {
		return buf, err
	}
	return sse.AppendEvent(buf, "", b), nil
}

// writeFlush writes p and flushes it, reporting success.
func writeFlush(w http.ResponseWriter, rc *http.ResponseController, p []byte) bool {
	if _, err := w.Write(p); err != nil {
		return false
	}
	return rc.Flush() == nil
}
