// Package ollamatest runs a real Ollama server for tests: the `ollama serve`
// binary that `make test` builds (test/ollama/build.sh), on its own loopback
// port with its models in a temporary folder, and tiny random-weight models
// generated in the test itself, so no test downloads anything.
//
// It is a test helper: only _test.go files import it, never production code.
//
// # Finding the binary
//
// [Binary] takes the path from $IOP_OLLAMA_BIN, else the build script's
// cache (~/.cache/iop/ollama-[Version]/ollama). When neither is there, a test
// that needs Ollama is skipped with a message saying how to build it — unless
// $IOP_REQUIRE_OLLAMA is 1, as `make test` sets it, and then it fails: `make
// test` never skips a real-server test.
//
// # The server
//
// [Start] starts `ollama serve` with OLLAMA_HOST on a free loopback port,
// OLLAMA_MODELS and HOME in t.TempDir(), and waits until it answers GET
// /api/version. [Server.Stop] and [Server.Restart] stop it and start it again
// on the same port and models folder (for tests of an unreachable server that
// comes back). Its output (Ollama's log, with OLLAMA_DEBUG set) is kept: see
// [Server.Log]; when the test fails, its tail is written to the test log.
//
// # Models
//
// [Server.CreateModel] writes a llama GGUF with random weights (2 layers, 32
// dimensions, a byte-fallback SentencePiece vocabulary of a few hundred
// tokens; about 200 KB) with Ollama's own GGUF writer, uploads it as a blob
// and creates the model with POST /api/create and a template of the chosen
// [Variant]. Ollama derives a model's capabilities (in /api/show) from the
// file and the template; each variant's are listed with its constant. The
// weights are fixed (a seeded generator); the file differs only in its
// general.name, the model's name, so each model has a runner of its own.
//
// The model never emits its end-of-sequence token (its output projection
// gives it a logit far below every other), so an answer ends only at its
// token limit (done_reason "length"), a stop sequence, a cancel, or Ollama's
// repeat limit (a greedy answer loops after a few dozen tokens; see
// [WriteGGUF]); the limit is [DefaultNumPredict] tokens unless the request
// sets num_predict / max_tokens. Its text is random word pieces, about 500
// to 7000 tokens a second on one thread (each model runs with num_thread 1).
// A model loads in about 0.3 s.
//
// # Concurrency
//
// A Server's methods may be called from any goroutine. Its mu guards the
// running process (cmd, its exit channel and its log); Stop and Restart hold
// it for the whole stop or start, so two of them never interleave. The
// goroutine that waits for the process is the sole writer of its exit status
// and closes the exit channel. The log buffer has its own lock, written by the
// process's output copier and read by Log.
package ollamatest
