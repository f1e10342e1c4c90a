package request

import "errors"

// What a decoder's error wraps: errors.Is tells a body that is not one
// JSON object from a field of the wrong type or value.
var (
	// ErrInvalidBody is a body that is not one JSON object.
	ErrInvalidBody = errors.New("invalid request body")
	// ErrInvalidField is a field of the wrong type or value.
	ErrInvalidField = errors.New("invalid request field")
)

// FieldError is a request that cannot be served as sent, every
// decoder's error: Field names the offending field in the form
// "messages[2].content[0].type", "" when the body as a whole is bad.
// Its Error text, "field: message", is the message the client gets (the
// frame answers it 400 invalid_request_error naming Field), so the
// message says which field is wrong even where a client shows only it.
type FieldError struct {
	Field, Message string
}

func (e *FieldError) Error() string {
	if e.Field == "" {
		return e.Message
	}
	return e.Field + ": " + e.Message
}

// Unwrap is ErrInvalidBody for an error with no Field, else
// ErrInvalidField.
func (e *FieldError) Unwrap() error {
	if e.Field == "" {
		return ErrInvalidBody
	}
	return ErrInvalidField
}
