// Package runs keeps the edge's runs submitted through the runs API
// (POST /v1/runs): their records, persisted in a Store (SQLite by default),
// and, while they are live or recently finished, their event logs, which
// late readers replay from the start.
//
// A run's state moves queued → running → complete | error | cancelled,
// never back. A record is saved when the run is submitted, when it is
// dispatched and when it ends; an edge that stops with runs in flight marks
// them error "edge restarted" when it next opens the store (Store.Interrupt).
//
// Several edges may share one store (Shared: Postgres, the edge's
// runs_dsn): each record carries the name of the edge that holds it (so
// Interrupt ends only that edge's), the holding edge publishes the run's
// event log to the store as it grows, every event before the final
// record, and any edge replays and follows it (Manager.Follow) and asks
// the holding edge to cancel it (Manager.CancelRemote: the store carries
// the request by a NOTIFY, with a one-second poll behind it).
//
// # Concurrency
//
// A Manager and its Runs are safe for concurrent use. Goroutines and
// timers:
//
//   - Start runs each run's execution in a goroutine of its own, counted by
//     Manager.wg; Close cancels the live runs and waits for every one of
//     them to return (its final record saved).
//   - Finish schedules the expiry of the run's event log with
//     Config.Clock's AfterFunc (Manager.timers, one per finished run kept);
//     the callback takes Manager.mu and drops the run from Manager.live.
//     With clock.Real it runs in a goroutine of package time's; Close stops
//     the pending ones.
//   - save, when the Store fails, waits out its backoff on the calling
//     goroutine (an execution's, or a caller of Dispatched or Finish) on
//     a Config.Clock timer; nothing else waits on time.
//   - With a Shared store, Start also runs publish for each run (counted
//     by Manager.wg): the only writer of the run's log to the store, it
//     reads the log as Next does and ends once the log is complete (its
//     end written); Finish waits for it to have written every event before
//     it saves the final record. A run's log expiry deletes its shared
//     copy on a goroutine of its own (dropSharedLog, Manager.wg).
//     Postgres runs one listener goroutine from OpenPostgres to Close.
//
// The package starts no other goroutine. Two mutexes:
//
//   - Manager.mu guards live, sessions, closed and timers, and orders
//     wg.Add after the closed check in Start before the wg.Wait of Close
//     and of Drain (both set closed first).
//   - Run.mu guards the run's record, output, event log, its done and
//     finishing flags, its attached value, and the changed channel, which wake closes and
//     replaces under it; Wait and Next take the channel under Run.mu and
//     wait on it without the lock.
//
// Neither mutex is held while the other is taken, nor across a Store call,
// a Clock call that may run a callback, or a cancellation: Dispatched and
// Finish drop Run.mu before they reach the Manager (remember, expireLater)
// and the Store (save); Live returns a Run before its lock is taken; Close
// cancels the runs after dropping Manager.mu. The Store is called from many
// goroutines at once and must be safe for concurrent use (SQLite is: it is
// a database/sql pool). A clock.Fake's Advance runs a due expiry on the
// caller's goroutine, so a test must not call it holding Manager.mu.
package runs
