// Package harness starts the parts of an iop deployment for end-to-end
// tests and stops them when the test ends. Only tests import it.
//
// # What lives here
//
//   - In-process parts: Sim (an `iop sim` server), Edge and Dev (a
//     process.Process from process.Start on loopback ports the system
//     picks), Node (a node.Agent dialing an edge, or, for a test that
//     chose LinkMemory with UseLink, in the edge's process on its
//     in-memory link: link.go).
//   - Child processes: IOP builds cmd/iop once per test binary; Start runs
//     it as a Command with its output kept.
//   - Logs: Logger gives a component a logger whose lines are printed only
//     if the test fails.
//   - Waiting: testenv.Eventually (package internal/testenv) polls a
//     condition with one generous deadline; waits here use it.
//   - Parallel tests: Parallel, ParallelLong and ParallelOllama take one
//     of -parallel's slots, which Main takes over from go test: the
//     real-Ollama tests one at a time and first, then the longest and
//     the long ones;
//     while cores are idle the limit grows, up to twice -parallel
//     (parallel.go).
//   - A browser: Tab opens a tab in the one headless Chromium the test
//     binary's browser tests share (browser.go).
//   - Main wraps TestMain: goleak, building the binary beside the first
//     tests of a full run, and removing it and the browser.
//   - Env: a provider's API key in an environment variable of the test's
//     own, so the test stays parallel (t.Setenv forbids it).
//   - A test that needs the whole process (counts goroutines, changes
//     directory) runs alone in a child: testenv.RunInOwnProcess.
//
// A real etcd is etcdtest.Start (internal/testenv/etcdtest), a real
// Ollama ollamatest.Start (internal/ollamatest), PostgreSQL
// testenv.Postgres.
//
// # Rules
//
//   - Every part listens on 127.0.0.1 with a port the system picks, so
//     tests that each start their own parts can run in parallel.
//   - Every part is stopped by a t.Cleanup registered when it starts;
//     cleanups run last-started first, so nodes stop before their edge.
//   - A part's logs reach the test output only when the test failed.
//
// # Concurrency
//
// Every function is safe for parallel tests. The shared state: the built
// binary and the browser (each started once, under a sync.Once) and the
// slots (under their mutex). A Command's output
// buffer is written by the child's pipes and read by the test under its
// own lock.
package harness
