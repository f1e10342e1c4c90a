// Package responses keeps the edge's stored Responses API responses
// (POST /v1/responses with "store" true, the default): each response's
// object, the items of the conversation before it (from
// previous_response_id), its input items and its output items, and the
// API key that made it, in the edge's database (the SQLite file of the run
// records, its own tables "responses" and "response_items").
//
// A response belongs to its owner, the name of the key that created it
// ("" for an open API): Get, Delete and Item find only the owner's, so
// another key's id is as unknown as one never made (the HTTP API answers
// 404, as OpenAI does).
//
// # Concurrency
//
// A Store is safe for concurrent use: it is a database/sql pool, and each
// Save is one transaction. The package starts no goroutines and holds no
// locks of its own.
package responses
