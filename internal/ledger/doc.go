// Package ledger is the edge's usage ledger: one Entry per finished API
// request (request id, key name, model, run, node, provider, prompt and
// completion tokens, duration, slot time and GPU-time, outcome and error
// code, the outcome being
// the one its log line and metrics say), kept in an SQL Store — the
// edge's SQLite run database by default (table usage_ledger), or
// PostgreSQL through a DSN when several edges share one ledger — and
// summed by key, model, provider, node, day (in any time zone) or team
// (from a key→team map given at query time; Aggregate, served as GET
// /admin/v1/usage). A table made by an earlier version gains the columns
// it lacks when it is opened.
//
// Usage attribution is bookkeeping only: nothing here is read by the
// scheduler, so who calls never changes which provider serves.
//
// # Concurrency
//
// Ledger.Record may be called from any goroutine; it hands the entry to
// one writer goroutine (started by New, ended by Close), the sole caller
// of Store.Insert, which writes whatever is waiting in one transaction.
// Ledger.mu (a RWMutex) makes Close exclusive with sends: senders hold it
// for reading while they send, Close takes it to close the channel, so no
// send ever hits a closed channel. A Flush is answered by the writer after
// every entry sent before it was written. The SQL stores are safe for
// concurrent use (database/sql).
package ledger
