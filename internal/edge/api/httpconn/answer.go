package httpconn

import (
	"encoding/json"
	"net/http"
	"strconv"
)

// WriteJSON answers with v as JSON (and a newline) and its Content-Length,
// so that the client can read the whole answer even while the frame still
// lingers on the request body (Body.Linger).
func WriteJSON(w http.ResponseWriter, status int, v any) {
	WriteJSONAs(w, status, "application/json", v)
}

// WriteJSONAs is WriteJSON with another Content-Type. A v that cannot be
// encoded (a bug, not bad input) is answered 500 with OpenAI's
// internal_error body.
func WriteJSONAs(w http.ResponseWriter, status int, contentType string, v any) {
	data, err := json.Marshal(v)
	if err != nil {
		// Only the edge's own values are written: a bug, not bad input.
		status, data = http.StatusInternalServerError, []byte(`{"error":{"message":"Internal server error","type":"server_error","param":null,"code":"internal_error"}}`)
	}
	data = append(data, '\n')
	w.Header().Set("Content-Type", contentType)
	w.Header().Set("Content-Length", strconv.Itoa(len(data)))
	w.WriteHeader(status)
	_, _ = w.Write(data)
}

// WriteText answers with s as text/plain.
func WriteText(w http.ResponseWriter, status int, s string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(s))
}

// SentStatus is the status already written to w: the Writer's under any
// wrapping that unwraps to it, else 200 (what a started answer sends
// unless it said otherwise).
func SentStatus(w http.ResponseWriter) int {
	for w != nil {
		if tw, ok := w.(*Writer); ok && tw.Status() != 0 {
			return tw.Status()
		}
		u, ok := w.(interface{ Unwrap() http.ResponseWriter })
		if !ok {
			break
		}
		w = u.Unwrap()
	}
	return http.StatusOK
}
