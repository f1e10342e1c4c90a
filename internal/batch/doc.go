// Package batch keeps batch jobs: uploaded files, batches of requests
// (OpenAI's Batch API, Anthropic's Message Batches) and each request's
// result, and runs the batches in the background at the batch priority.
//
// A Service owns a Store (SQL: SQLite in the edge's database file, or
// PostgreSQL shared by several edges) and the files' bytes (Contents: a
// directory beside SQLite, one file per id written through a temporary
// name; in PostgreSQL chunks of 1 MiB). Its Executor runs one line as an
// API request of the edge (package edge/api/batch runs it through the
// edge's own HTTP handler).
//
// # Leases
//
// A batch runs on the service holding its lease (Store.Claim): a runner
// name, an epoch that grows with every claim, an expiry on the database's
// clock. The creating service claims it; its job renews it every third of
// LeaseTTL and releases it when it stops. Every service claims, every
// third of LeaseTTL, the active batches whose lease lapsed or was let go.
//
// # States
//
// A batch moves validating → in_progress → finalizing → completed, or
// validating → failed (errors name input lines), or to expired when its
// completion window ends, or cancelling → cancelled. Anthropic's
// processing_status is in_progress, canceling or ended over the same.
//
// # Invariants
//
//   - A line's result is recorded once: FinishLine changes only a pending
//     line, and moves the batch's count in the same transaction.
//   - Only the lease's current epoch writes: FinishLine and UpdateBatch of
//     an older one are refused, so a late first answer is discarded.
//   - A cancel is stored (RequestCancel) by any service; the runner adopts
//     it at once if local, else at its next renewal.
//   - A line whose execution did not end in an answer stays pending; a
//     restarted service runs it again (Start resumes active batches).
//   - Refusals for load (429, 503) are retried up to MaxAttempts; in a
//     resumed batch an unknown model too, for StartGrace.
//   - Result files are written from the stored lines, in line order,
//     once the batch stops; a cancelled or expired batch keeps what
//     finished.
//
// # Concurrency
//
//   - Service.mu guards the executor, the running jobs and closed; one
//     goroutine (Start) claims idle batches.
//   - One goroutine per active batch (job.run), counted by Service.wg,
//     is the sole writer of its status, but for Cancel, which moves it
//     to cancelling under job.mu; job.save refuses to leave cancelling
//     except to cancelled.
//   - A job runs its lines on Concurrency worker goroutines, and renews
//     its lease on one more (keepLease); it waits for all of them.
//   - Close cancels every job's context and waits; statuses stay, so a
//     later Start resumes the batches.
package batch
