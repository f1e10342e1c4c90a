// Package admin serves the edge's admin routes on the HTTP API's frame
// (package edge/api): Routes returns them for api.Config.Routes, and the
// frame guards them with the admin keys, caps their bodies and answers
// their errors in OpenAI's shape.
//
// What lives here, each route on when its Config field is set:
//
//	GET /admin/v1/nodes, /providers, /queues, /cluster  Snapshots (admin.go)
//	GET /admin/v1/events   lifecycle events as SSE        Events (events.go)
//	GET /ui, /ui/<file>    the dashboard, embedded        Events (ui.go)
//	GET /admin/v1/usage    the usage ledger's sums        Usage, TeamOf (usage.go)
//	GET /admin/v1/history  per-second aggregates          History (history.go)
//
// Invariants:
//   - Every answer is built from one snapshot or one query: the routes keep
//     no state of their own.
//   - Times are RFC 3339 UTC and lists are never null (adminwire's shapes).
//   - A slow events subscriber is dropped, never waited for.
//
// # Concurrency
//
// Routes' server is read-only after Routes returns; each events stream
// runs on its request's goroutine and ends with the request, the hub's
// close or its drop. The package starts no goroutines.
package admin
