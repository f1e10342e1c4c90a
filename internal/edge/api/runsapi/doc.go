// Package runsapi is iop's runs API on the edge's HTTP API frame
// (package api): POST and GET /v1/runs, GET and DELETE /v1/runs/{id},
// GET /v1/runs/{id}/events. Routes(Config) makes it an api.API for
// api.Config.APIs, over the runs manager (package iop/internal/runs)
// that keeps the records and runs the runs. Its errors are OpenAI's
// (api.Frame.WriteError).
//
// A run is a chat completion: its body is a chat completion request
// where "prompt" may replace "messages", plus "background",
// "session_id" and "metadata". The edge always streams it from the
// provider; its events are the chat.completion.chunk events a streaming
// client of POST /v1/chat/completions gets.
//
// # Where things live
//
//	runs.go  Routes; the routes; a submission decoded; records rendered, listed, replayed
//	exec.go  execute: a run's chat request served detached (api.Frame.ServeDetached); runRecorder: its answer in the run
//
// # Invariants
//
//   - A run's chat request is one detached API request of operation
//     "runs", named by its submission's request id; its outcome is the
//     run record's, and the run is complete exactly when it completed.
//   - The run's events are what a chat client reads: the normalized path
//     rendered by the frame's chunk renderer (stream.ChatChunks), the tunnel
//     path the events the frame's relay releases (Answer.RelayRecorded);
//     a stream that fails ends with one error event, never [DONE].
//   - A refusal by the gateway (nothing dispatched) is answered to a
//     synchronous submitter as the chat route answers it.
//   - A run holds its key's request slot until its answer is finished,
//     also in the background (api.KeepPermit).
//   - A key sees only its own runs; another key's is 404.
//
// # Concurrency
//
// The request goroutine serves each route. A run is owned by its
// runs.Run goroutine (execute): the only caller of its Run and writer of
// its runRecorder. A synchronous submitter waits on the run (runs.Run.Wait)
// and cancels it when it leaves; refused is a one-slot channel written by
// the run's goroutine before the run finishes.
package runsapi
