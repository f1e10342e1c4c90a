// Package loadgen is a load generator for OpenAI-compatible
// (POST /v1/chat/completions) and Ollama-compatible (POST /api/chat) chat
// endpoints: `iop bench` and the overhead benchmark (internal/benchrun) drive
// it.
//
// It offers load in one of two ways. Closed loop (Config.Concurrency
// workers, each sending its next request when the previous one ends) finds
// the throughput a server sustains. Open loop (Config.Rate requests per
// second on a fixed schedule, whatever the server does) shows queueing: a
// request's latency is measured from the instant the schedule said it should
// start, so a server that falls behind is charged for the wait
// ("coordinated omission"). A run ends after Config.Requests requests or
// after Config.Duration, whichever is set.
//
// It reports throughput, latency percentiles, time to first token and
// inter-token latency (streaming), content chunks per second, and the outcome
// of every request by HTTP status or failure kind (Result).
//
// # Concurrency
//
// Run starts one goroutine per closed-loop worker, or one per request in
// open loop, plus a progress ticker; it returns after every one of them has
// ended. Each request goroutine owns its request and response; the only
// shared state is the recorder (its mutex guards the samples, taken once per
// finished request) and atomic counters read by the progress ticker.
package loadgen
