// Package access is what a request's API key may do, as the HTTP API
// frame (package api) asks it before and while a request runs: which
// paths need which key, the key's request slot, the models it may use,
// its flow and priority in the queue, and its quota's reservation.
//
// # Where things live
//
//	errors.go  the access refusals (ErrMissingKey, ErrWrongKey, ...), BodyError
//	keys.go    Authenticate (which key a path needs), admin and public paths, CheckModel/Allowed/Models, KeyName, RetryAfterSeconds
//	permit.go  a key's request slot: Admit (local or at the scheduler leader), WithPermit, AnswerFinished, KeepPermit
//	flow.go    flow sources and names (FlowName, BodyUser, FlowHeader), PriorityHeader, PriorityName
//	quota.go   Quota, Reserve (a request's worst case, the clamp of an uncapped answer), RateLimitHeaders, QuotaMessage
//
// The frame keeps the glue: admit (the order: key, quota, request slot),
// reserveQuota (reading and giving back the body), assignFlow, and the
// one mapping of these errors to answers (api.Classify).
//
// # Invariants
//
//   - A request slot is given back once, however often AnswerFinished or
//     the release func is called; one KeepPermit took over is given back
//     by the run, not by the request's end.
//   - A quota reservation is taken before anything is queued; a refused
//     or failed one counts nothing.
//   - A flow name is valid UTF-8 of at most 64 bytes (a metric label).
//
// # Concurrency
//
// No goroutines and no locks of its own: a request's permit is touched by
// its request goroutine (or the run that kept it); auth.Caller and the
// quota ledger guard their own state.
package access
