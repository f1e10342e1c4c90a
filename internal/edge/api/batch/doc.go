// Package batch serves the batch APIs on the edge's HTTP frame (package
// edge/api): OpenAI's Files (/v1/files) and Batch (/v1/batches) APIs and
// Anthropic's Message Batches (/v1/messages/batches). Routes returns the
// routes for api.Config.Routes (those ending in "/" serve paths under an id).
//
// Files and batches belong to the key that made them (its name; "" on an
// open API): another key gets 404, as for one that does not exist.
// Uploads are read as a stream (multipart.Reader), never whole.
//
// Executor runs a batch's lines through the frame's own handler in
// process, as the batch's key at contract.PriorityBatch
// (api.WithInternalCaller): a line takes the same route, limits,
// admission, dispatch, observation and ledger as a client's request.
//
// # Concurrency
//
// The server is read-only after Routes; net/http calls it on one
// goroutine per request. Executor.Execute is called by the batch
// service's workers, each with its own in-memory answer.
package batch
