// Package observe is the observation of one request the HTTP API frame
// (package api) serves: its RequestRecord, decided once, and what is
// made of it at its end: the log line, the usage ledger's entry, the
// Observer's call (metrics, history) and a server span.
//
// # Where things live
//
//	record.go   RequestRecord, Observer, ObserverFunc: what every finished API request hands on
//	request.go  Request: the record being collected (Start, Detached), its outcome (Decide), its end (Record, Finish)
//	log.go      Log: the request's one log line; LedgerEntry: its usage ledger row
//	span.go     span: a server span per request, continuing the client's traceparent (GenAI names)
//
// # Invariants
//
//   - A request's outcome is decided once (Request.Decide); every later
//     call returns it. The log line, the Observer, the ledger, the span
//     and the run's RunEnded event read the one record.
//   - Only a request marked Begin (and not HandOff) gets a record.
//   - A quota reservation handed over (SetQuota) is settled or cancelled
//     once, at Finish (or by CancelQuota).
//   - The log line and the span carry ids, names, counts and outcomes:
//     never a header value, a body, a prompt or an answer.
//
// # Concurrency
//
// None of its own: a Request is touched by one goroutine only, the
// request's (for a run of the runs API, the run's). The frame calls
// Observer.RequestDone on that goroutine after the response ended.
package observe
