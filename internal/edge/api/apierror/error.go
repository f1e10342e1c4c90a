package apierror

import "encoding/json"

// Error is an OpenAI error response: HTTP status, an optional Retry-After
// (seconds), and the body's fields.
type Error struct {
	status     int
	retryAfter string
	Message    string  `json:"message"`
	Type       string  `json:"type"`
	Param      *string `json:"param"`
	Code       *string `json:"code"`
}

// Body is the OpenAI error shape, {"error":{...}}.
type Body struct {
	Error *Error `json:"error"`
}

// Retry-After values, in seconds. A full queue frees up as soon as any run
// ends; a timed-out queue or a missing provider takes longer.
const (
	RetryAfterQueueFull   = "1"
	RetryAfterUnavailable = "5"
)

// New is an error answered with status, of type typ and code (none when
// ""), naming param (none when "").
func New(status int, typ, param, code, message string) *Error {
	e := &Error{status: status, Message: message, Type: typ}
	if param != "" {
		e.Param = &param
	}
	if code != "" {
		e.Code = &code
	}
	return e
}

// WithRetryAfter sets the error's Retry-After, in seconds ("" for none),
// and returns it.
func (e *Error) WithRetryAfter(seconds string) *Error {
	e.retryAfter = seconds
	return e
}

// Status is the HTTP status of the error.
func (e *Error) Status() int { return e.status }

// RetryAfter is the error's Retry-After header value in seconds, or "".
func (e *Error) RetryAfter() string { return e.retryAfter }

// JSON is the OpenAI error body {"error":{...}} of type typ, code and
// message, with no param.
func JSON(typ, code, message string) []byte {
	b, _ := json.Marshal(Body{Error: New(0, typ, "", code, message)})
	return b
}
