package httpconn

import "net/http"

// hopHeaders are response headers of the provider's connection, not of its
// answer, so they are not relayed. Content-Length goes too: the edge sets
// its own from what the node says of the body (the head's ContentLength,
// or the whole body in one message), and a length that no longer matched
// would corrupt the response.
var hopHeaders = map[string]bool{
	"Connection":          true,
	"Keep-Alive":          true,
	"Proxy-Authenticate":  true,
	"Proxy-Authorization": true,
	"Te":                  true,
	"Trailer":             true,
	"Transfer-Encoding":   true,
	"Upgrade":             true,
	"Content-Length":      true,
}

// IsHopHeader reports whether name (canonical) is a response header of a
// connection rather than of its answer (hopHeaders): one not relayed.
func IsHopHeader(name string) bool { return hopHeaders[name] }

// ClientGone reports whether the request's client has gone away (or the
// server is shutting the request down): then nothing more is written.
func ClientGone(r *http.Request) bool {
	return r.Context().Err() != nil
}
