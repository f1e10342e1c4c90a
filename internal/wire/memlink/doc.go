// Package memlink is the in-memory link between an edge and a node in one
// process: a nodev1.NodeGatewayClient (Link) whose Connect and Run streams
// the edge's NodeGatewayServer serves directly, with no gRPC, no socket
// and no encoding. The node and the edge run the same code on it as on
// gRPC, so every guarantee of the remote path (generations, exactly-once
// release, cancellation both ways, drain, per-run back-pressure) holds by
// construction; docs/architecture.md ("The node link") explains the seam.
//
// # What crosses, and how
//
//   - Down (edge to node): EdgeMessage, RunDown by pointer, never copied;
//     a request body reaches the node as the edge holds it. So the edge
//     changes no message it sent, and the HTTP API neither reuses nor
//     changes a body it dispatched (each request's body is its own).
//   - Up (node to edge): NodeMessage, RunUp copied on Send (the node reuses
//     its messages and its data buffers once Send returns).
//   - No metadata and no context values cross; cancellation does.
//
// # Concurrency
//
//   - Each stream is a pipe: two queues of streamBuffer messages, one per
//     direction, so a slow reader holds up its own stream alone.
//   - The client's goroutines send up and receive down; the handler's
//     goroutine (one per stream, started by open) the reverse. As on gRPC,
//     one goroutine sends and one receives on a side at a time.
//   - The handler's context ends when the client's does or the handler
//     returns; the client's Recv then drains what was sent and returns
//     the handler's status (io.EOF for none).
//   - Link.wg counts handler goroutines; Close waits for them.
package memlink
