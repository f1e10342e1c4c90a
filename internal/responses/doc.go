// Package responses keeps the edge's stored Responses API responses
// (POST /v1/responses with "store" true, the default): each response's
// object, the id of the response it continued (previous_response_id),
// its own input items and output items, and the API key that made it, in
// the edge's database (the SQLite file of the run records, its own tables
// "responses" and "response_items"). A conversation is the chain of its
// responses: each item is stored once, with the response that brought
// it, and Conversation walks the chain (at most MaxChainDepth responses,
// MaxChainItems items). A response deleted while a later one continues
// it is marked deleted, its items kept for the later one's conversation
// until the last response continuing it is deleted.
//
// A response belongs to its owner, the name of the key that created it
// ("" for an open API): Get, Delete and Item find only the owner's, so
// another key's id is as unknown as one never made (the HTTP API answers
// 404, as OpenAI does).
//
// # Concurrency
//
// A Store is safe for concurrent use. Writes (Save, SetStatus, Delete)
// run one at a time on one connection, each one IMMEDIATE transaction,
// after a FIFO write turn (a channel of one slot: its blocked senders are
// served in order), so a small save waits only for the writes that came
// before it; reads (Get, Item) use a pool of their own, which in WAL mode
// neither waits for the writer nor blocks it (an in-memory database has
// one connection for both). The package starts no goroutines and holds
// no locks but the write turn.
package responses
