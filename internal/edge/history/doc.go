// Package history keeps the edge's short history: one aggregate per
// second for the last Window seconds (15 minutes), for the dashboard's
// charts (GET /admin/v1/history, served by package edge/api; the JSON
// shape is adminwire.History).
//
// Each second holds the API requests that ended in it, by outcome (the
// RequestRecord's, as the log line and iop_requests_total carry it), the
// refused ones by reason (their admission, or their key's limit: the
// reason the events stream's request_refused says), the time to first
// token of those that saw one, in fixed buckets (four to an octave from
// 1 ms to 131 s, 68 counters, plus the second's smallest and largest),
// from which the median and the 95th percentile are read, and the output
// tokens of those whose usage is known. At the end of each second a
// sampler reads the scheduler's counters of every provider (in-flight,
// queued, capacity) from the edge's snapshot, once, as a metrics scrape
// does.
//
// A request counts in the second its RequestRecord reaches RequestDone
// (by the History's clock): that is when the edge knows its outcome, its
// tokens and its time to first token, as the metrics do.
//
// # Memory
//
// The history is bounded: Window slots of request aggregates, allocated
// once (380 KiB), and Window provider samples of 16 bytes per
// provider (about 14 KiB per provider), reusing their arrays; a
// provider's name is kept once, and forgotten Window seconds after its
// last sample (Bytes reports the total).
//
// # Concurrency
//
// A History is safe for concurrent use. RequestDone, called on each
// request's goroutine, takes only the mutex of its second's slot, for a
// few additions (BenchmarkRequestDone): requests ending in different
// seconds never meet, and no other lock is on that path. The sampler
// runs on the clock's timer callbacks (one at a time: each schedules the
// next), started by Start and ended by Stop. At each tick it seals the
// seconds that are over: a sealed slot takes no more additions (a request
// whose slot was sealed while it got there counts in the next second), so
// a second that was served never changes. History.mu guards what the
// sampler owns (the seconds sealed, the provider samples, the provider
// names) and is held by Since while it reads; it is taken before a slot's
// mutex, never after. The edge's Snapshot is read with no lock of this
// package held.
package history
