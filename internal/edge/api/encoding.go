package api

import "fmt"

// encodingError is a request body in a Content-Encoding the edge does not
// decode (bodycoding.Parse's unsupported): 415, naming it.
type encodingError struct{ coding string }

func (e *encodingError) Error() string {
	return fmt.Sprintf("unsupported Content-Encoding %q: send the body as identity, gzip or deflate", Clip(e.coding))
}
