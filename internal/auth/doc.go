// Package auth holds who may call the edge: client and admin API keys,
// stored only as SHA-256 hashes (Hash, Generate), looked up per request
// (Keyring.Authenticate, Credential), and each client key's limits: the
// models it may request (Caller.Allows), its requests in flight
// (max_concurrent) and its requests per minute (a token bucket,
// golang.org/x/time/rate). It imports no HTTP server code beyond
// http.Header; the edge's HTTP API (package edge/api) decides which routes
// need which keyring and maps refusals to statuses.
//
// # Concurrency
//
// A Keyring's keys are one immutable table behind an atomic pointer;
// Replace builds a new table and swaps it, so Authenticate never locks.
// A key's live state (keyState: in-flight count, per-minute bucket) is
// shared by the Callers of its name across Replace; its mutex (keyState.mu)
// is held while Admit checks
// both limits and takes both, so two concurrent requests can never both
// take a key's last slot. rate.Limiter is safe for concurrent use; it is
// only called under Caller.mu so a refused request can give its token back
// atomically. A Permit's Release runs once (sync.Once), from whichever
// goroutine ends the request. No goroutines are started.
package auth
