package process

import "errors"

// ErrKeysEmptied is a reload refused because the new config has no client
// keys (or no admin keys) while the running one has some, and does not set
// insecure_open.
var ErrKeysEmptied = errors.New("reload would remove every key")
