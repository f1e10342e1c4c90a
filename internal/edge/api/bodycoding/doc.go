// Package bodycoding undoes a request body's Content-Encoding (RFC 9110
// section 8.4) as the body is read: gzip (x-gzip) and deflate (zlib, or a
// raw DEFLATE stream). The frame (package api) caps the decoded body and
// maps the failures to answers.
//
// # Where things live
//
//	bodycoding.go  Parse: the codings a header lists; NewReader: the body with them undone; ErrCorrupt
//
// # Invariants
//
//   - Nothing is read from the body before the first Read (a client
//     waiting for a 100 Continue is asked for it only then).
//   - A decoder's failure wraps ErrCorrupt; the connection's (its limit,
//     its deadline, a client gone) never does.
package bodycoding
