// Package quota is the reservation ledger of key and team quotas: tokens,
// requests, GPU-time and currency per sliding window (a minute, a day, a
// 30-day month). It is pure logic driven by calls and an injected clock
// (internal/clock); it knows no HTTP, no auth and no database.
//
// The life of a request's quota:
//
//	Reserve (or ReserveUpTo)  the worst case: estimated prompt + max output
//	                          tokens, expected slot time, their price
//	Settle(actual) | Cancel   exactly once; later calls are counted no-ops
//
// Invariants, one line each:
//   - For every window of a key and of its team: settled + reserved ≤ limit,
//     as long as no settlement exceeds its reservation (Stats.Overruns).
//   - GPU windows hold only what admission can know: a request is admitted
//     while its window has room and charged its slot time when it settles.
//   - A settlement counts for at least its window's length, at most one
//     granule (length/60) more; so what a provider produced in any window
//     is at most settled + reserved there.
//   - A team's windows bound the sum of its keys' usage.
//   - An unknown model price never refuses: its tokens count, its cost is 0,
//     logged once per model.
//   - A new leader rebuilds the windows: Reset, Restore (settled usage,
//     from the usage ledger), Adopt (reservations in flight, taken whether
//     or not they fit), and, after another leader, Fill of the minute
//     windows (what the old leader let run last is unknown: refuse).
//   - A reservation another ledger holds (Held) settles there, once.
//
// # Concurrency
//
// One mutex (Ledger.mu) guards every scope's state and every reservation's
// settled flag; no goroutines are started. Settle and Cancel may come from
// any goroutine; the first one settles.
package quota
