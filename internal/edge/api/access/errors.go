package access

import "errors"

// ErrModelNotAllowed refuses a model the request's key may not use (403).
var ErrModelNotAllowed = errors.New("model not allowed for this API key")
