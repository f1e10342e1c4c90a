package access

import "errors"

// Access refusals, which the frame maps (api.Classify): 401 (with
// WWW-Authenticate: Bearer) for a missing or unknown key, 403 for a key
// of the wrong class or a model the key may not use. A key over its
// limits is an *auth.LimitError (429), over its quota a *quota.Refusal.
var (
	ErrMissingKey      = errors.New("missing API key")
	ErrWrongKey        = errors.New("incorrect API key")
	ErrNotAdminKey     = errors.New("this API key may not use the admin API")
	ErrAdminKeyOnAPI   = errors.New("an admin key cannot call the model API; use a client key")
	ErrModelNotAllowed = errors.New("model not allowed for this API key")
)

// BodyError is a request body a key's quota cannot read or needs changed:
// the frame answers it 400 invalid_request_error, naming Param ("" for
// none) with Message.
type BodyError struct {
	Param, Message string
}

func (e *BodyError) Error() string { return e.Message }
