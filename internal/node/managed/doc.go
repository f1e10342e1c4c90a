// Package managed runs the model servers of a managed provider: one
// OpenAI-compatible server process per model (llama-server, `vllm serve`,
// `iop sim`, ...), started by the node when a run for the model arrives
// and stopped when idle, the way llama-swap does it on one host. The
// Manager is the provider's adapter.Tunneler: it relays each run to its
// model's server as adapter.OpenAI does.
//
// # What lives where
//
//   - config.go: Server (cmd, env, url, health_url, ttl, start_timeout),
//     Config, the ${PORT} and ${MODEL} placeholders, validation.
//   - manager.go: Manager: acquire and release of a server per run, LRU
//     swap at MaxLoaded, TTL, Load and Unload (preload, admin), Close,
//     Tunnel.
//   - child.go: one server process: start, health polls, output to the
//     log, stop (SIGTERM, SIGKILL after KillGrace), exit.
//   - procattr_*.go: the process group, and Pdeathsig on Linux.
//
// # Invariants
//
//   - At most one server per model: a second run waits for the first's start.
//   - At most MaxLoaded servers, counting those still stopping.
//   - A server with a run in flight is never stopped for TTL or swap.
//   - A run waiting for a start may end; the start goes on for the next run.
//   - A server that exits is removed; the next run starts a new one.
//   - Every server runs in its own process group; a stop signals the group.
//   - A node killed with SIGKILL takes its servers along (Linux Pdeathsig).
//   - Close returns after every server has exited.
//
// # Concurrency
//
// Manager.mu guards the children map, each child's state, run count, TTL
// timer and startErr, and the changed channel. Each child has one
// supervisor goroutine (run): it starts the process, polls health, waits
// for the exit and removes the child; it alone closes exited, and ready
// closes under mu exactly once (healthy, or the start failed). One
// goroutine per child, locked to its OS thread, starts and waits for the
// process, so the thread Pdeathsig watches lives as long as the process.
// Two goroutines per child log its stdout and stderr, line by line.
// Clock callbacks (TTL, SIGKILL, timeouts) only lock mu briefly, signal or
// close a channel. SetOnChange's callback runs under mu: it takes only
// leaf locks.
package managed
