package api

import (
	"encoding/json"
	"testing"

	"iop/internal/edge/api/request"
)

// TestClassifyFieldError: a decoder's *request.FieldError is answered as
// the frame's own invalid parameter: 400 invalid_request_error, code
// invalid_request, param the field (null for the body as a whole), the
// message "field: message".
func TestClassifyFieldError(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		field, message, want string
	}{
		{"messages[2].content[0].type", "each content part must have a type",
			`{"error":{"message":"messages[2].content[0].type: each content part must have a type","type":"invalid_request_error","param":"messages[2].content[0].type","code":"invalid_request"}}`},
		{"", "the request body must be a JSON object, got null",
			`{"error":{"message":"the request body must be a JSON object, got null","type":"invalid_request_error","param":null,"code":"invalid_request"}}`},
	} {
		e := Classify(&request.FieldError{Field: c.field, Message: c.message}, nil)
		body, err := json.Marshal(errorBody{Error: e})
		if err != nil || e.status != 400 || string(body) != c.want {
			t.Errorf("%q: status %d, body %s (%v); want 400 %s", c.field, e.status, body, err, c.want)
		}
		same := Classify(InvalidParam(c.field, c.message), nil)
		if sameBody, _ := json.Marshal(errorBody{Error: same}); string(sameBody) != string(body) || same.status != e.status {
			t.Errorf("%q: %s, InvalidParam's %s", c.field, body, sameBody)
		}
	}
}
