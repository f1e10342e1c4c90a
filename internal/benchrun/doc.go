// Package benchrun is the overhead benchmark behind `make bench` (`iop bench
// --overhead`): it runs `iop sim`, `iop edge` and `iop node` as separate
// processes on one machine, measures the same load directly against the
// simulator and through edge + node with internal/loadgen, reads the CPU
// time and resident memory of the edge and node processes from /proc, and
// reports added latency, throughput ratio, chunk rate, CPU time per request
// and memory per queued request against the targets of the benchmarks
// issue. It is Linux-only (/proc) and is not run by `make test`.
//
// # Concurrency
//
// Overhead runs its steps one after another on the caller's goroutine. Each
// child process has one goroutine waiting for it to exit; a profile fetch
// runs on two short-lived goroutines during a measured run; the memory
// phase runs its load on one goroutine while the caller polls the edge.
package benchrun
