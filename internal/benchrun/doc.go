// Package benchrun is the overhead benchmark behind `make bench` (`iop bench
// --overhead`): it runs `iop sim`, `iop edge` and `iop node` as separate
// processes on one machine, measures the same load directly against the
// simulator and through edge + node with internal/loadgen (the workloads of
// its targets: non-streamed at 1 and 32 clients, streamed with 20 chunks per
// answer at 1 and 8 clients, on the tunnel and the normalized path), reads
// the CPU time and resident memory of the edge and node processes from
// /proc and the edge runtime's memory statistics from its pprof endpoint,
// checks that a non-streamed tunnel answer keeps its Content-Length, and
// reports added latency, throughput, CPU time per request (edge + node) and
// memory per queued request against its targets (report.go), with the
// scheduler's figures read from `go test -bench` output (ParseGoBench). It
// is Linux-only (/proc) and is not run by `make test`.
//
// # Concurrency
//
// Overhead runs its steps one after another on the caller's goroutine. Each
// child process has one goroutine waiting for it to exit; a profile fetch
// runs on two short-lived goroutines during a measured run; the memory
// phase runs its load on one goroutine while the caller polls the edge.
package benchrun
