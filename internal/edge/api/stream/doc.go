// Package stream holds the pieces of an answer's relay that know OpenAI's
// stream formats but not the HTTP frame: the one reader of a relayed
// tunnel answer, the usage it carries, and the chat.completion.chunk
// renderer of a normalized run. The frame (package api) and the client
// API packages use it; it imports no part of the edge but the contract's
// run events and package sse.
//
// # Where things live
//
//	hold.go    FinalHold: one reader of a tunnel answer's body, holding the bytes that end it; Observer
//	usage.go   Event, ReadEvent: what one event of a tunnel stream says; UsageScanner: a JSON answer's or a stream's usage
//	chunks.go  ChatChunks: a normalized run as chat.completion.chunk events, to a sink (the chat route, the runs API, a response's run log)
//
// # Invariants
//
//   - The relayed bytes are never changed: what FinalHold.Split returns,
//     followed by FinalHold.Rest, is what was fed, in order.
//   - An event stream is read once: each byte fed to one sse.Reader
//     (FinalHold.Fed), each event read once (ReadEvent) and told to the
//     Observer as read, to Record once the bytes that complete it are
//     released.
//   - What is read is bounded: one event, or a whole JSON body, up to
//     MaxScanBytes; of a longer JSON body only its tail is kept.
//   - A chunk's bytes are json.Marshal's of it.
//
// # Concurrency
//
// A FinalHold, a UsageScanner and a ChatChunks each belong to one
// goroutine: the request's, or a detached run's.
package stream
