package api

import (
	"fmt"

	"iop/internal/edge/contract"
	"iop/internal/sse"
)

// What package openai serves its routes with, beyond frame.go (its
// bodies are decoded and checked by package request): the Answer's
// tunnel relay, SSE writer, flush hold and OpenAI error event.

// RelayTunnel relays a tunnel-path run's answer unchanged: the provider's
// status and headers (but its connection's), then its body, each part
// flushed as it comes; the bytes that end it wait for the run's end. It
// returns the rendering's reason.
func (rr *Answer) RelayTunnel() string { return rr.tunnel() }

// EventWriter is the SSE writer of the answer's body; its writes go
// through Write (and a Hold).
func (rr *Answer) EventWriter() *sse.Writer { return rr.events() }

// Hold makes Write leave its flushes to Release: what is written until
// then reaches the client with one flush.
func (rr *Answer) Hold() { rr.hold = true }

// Release ends a Hold and flushes what was written under it.
func (rr *Answer) Release() error { return rr.release() }

// FailStream ends a started event stream that failed with err: one
// OpenAI error event, data {"error":{...}} as Classify maps err, and no
// [DONE]; the connection is aborted when the client is gone or the event
// cannot be written. It returns the rendering's reason.
func (rr *Answer) FailStream(err error) string { return rr.failStarted(err, true) }

// ReadVectors reads a normalized-path embeddings run to its end: the
// vectors of its delta events, in order, and its prompt tokens. A run
// that sends other than inputs vectors failed (ErrUpstreamProtocol);
// else ReadEvents' errors.
func (rr *Answer) ReadVectors(inputs int) (vectors [][]float32, promptTokens int, err error) {
	er := &eventReader{Answer: rr}
	vectors = make([][]float32, 0, inputs)
	_, err = er.next(func(ev *contract.Event) error {
		for _, vec := range ev.Embeddings {
			if len(vectors) == inputs {
				return fmt.Errorf("%w: more vectors than inputs", ErrUpstreamProtocol)
			}
			vectors = append(vectors, vec)
		}
		return nil
	})
	if err == nil && len(vectors) != inputs {
		err = fmt.Errorf("%w: %d vectors for %d inputs", ErrUpstreamProtocol, len(vectors), inputs)
	}
	return vectors, er.usage.PromptTokens, err
}
