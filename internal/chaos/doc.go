// Package chaos is the several-edges chaos suite: real processes, real
// faults, and invariants judged by the model servers' own counters.
//
// Its tests run only with IOP_CHAOS=1 (`make chaos`; one scenario with
// `make chaos SCENARIO=name RUNS=n`). Each run of a scenario starts, on
// loopback ports chosen by the OS: a three-member etcd (etcdtest), three
// `iop edge` processes with `cluster:` sharing one PostgreSQL (runs and
// ledger), two `iop node` processes listing every edge, three `iop sim`
// processes, and 36 streaming clients spread over the edges. Every
// edge-to-edge and node-to-edge link passes through a TCP proxy of the
// test (proxy_test.go) that can pass, stall, drop or cut it; an edge's
// `cluster.advertise` is its proxy, so a follower's link to the leader
// can be stalled alone.
//
// The faults: SIGKILL of the leader, SIGSTOP of the leader (1, 3.5, 10,
// 20 s), loss of etcd quorum (2 of 3 members down 8 s), a follower whose
// link to the leader stalls, a restarted follower, a restarted node, and
// an edge of another deployment on the same etcd.
//
// The invariants, checked after every run: no model server above its
// capacity; no request run twice (the sims count repeated prompts, every
// prompt carries a unique id); every request answered (a result, or 429 or
// 503 with Retry-After) within queue_timeout + 5 s; no lease at any edge
// once the nodes run nothing (one heartbeat later); no open circuit (the
// providers never fail); admission resumed on every live edge within
// session_ttl + 2 s of the fault; a key's max_concurrent and
// requests_per_minute exact across edges. The table of worst figures is
// printed and written to bin/chaos-table.md.
//
// # Concurrency
//
// A run's clients, its proxy pipes and its monitor are goroutines of the
// run; each records into its own mutex-guarded tally. The run waits for
// all of them before it judges. Processes are stopped at the run's cleanup.
package chaos
