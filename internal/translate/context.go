package translate

import (
	"bytes"
	"compress/flate"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// Turn is one message of a conversation carried in an Ollama "context":
// its role ("user" or "assistant") and text.
type Turn struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// Ollama's /api/generate answers a non-raw request with "context", the
// token ids of the conversation so far (the rendered prompt and the
// answer), which a client may send back in its next /api/generate to keep
// a short conversational memory (Ollama detokenizes it and puts it before
// the new prompt). iop has no tokenizer, and its providers may not be
// Ollama, so its context is its own encoding of the conversation as
// integers: contextMagic, the payload's length in bytes, then the
// payload (the raw DEFLATE of the turns' JSON) three bytes per integer,
// big-endian, the last one zero-padded. Every integer is in [0, 2^24),
// except contextMagic, which is above any real vocabulary's token ids, so
// a real Ollama's context is never taken for one of iop's.
const (
	contextMagic = 0x696f7001 // "iop", version 1
	// maxContextTurnsBytes bounds a decoded context's JSON: a context is
	// client input, and DEFLATE expands.
	maxContextTurnsBytes = 16 << 20
)

// ErrForeignContext is DecodeContext's error for a context iop did not
// make: token ids of another server (a real Ollama), or a damaged one.
var ErrForeignContext = errors.New("not a context iop gave")

// EncodeContext encodes a conversation as an Ollama "context" (see
// contextMagic); DecodeContext reads it back.
func EncodeContext(turns []Turn) []int {
	raw, _ := json.Marshal(turns) // strings only: cannot fail
	var buf bytes.Buffer
	zw, _ := flate.NewWriter(&buf, flate.BestCompression) // a valid level: cannot fail
	zw.Write(raw)
	zw.Close()
	payload := buf.Bytes()
	out := make([]int, 0, 2+(len(payload)+2)/3)
	out = append(out, contextMagic, len(payload))
	for i := 0; i < len(payload); i += 3 {
		v := 0
		for j := range 3 {
			v <<= 8
			if i+j < len(payload) {
				v |= int(payload[i+j])
			}
		}
		out = append(out, v)
	}
	return out
}

// DecodeContext reads a context EncodeContext made. Errors wrap
// ErrForeignContext: a context of another server, a damaged one, one whose
// conversation is over 16 MiB, or one whose turns are not user and
// assistant messages.
func DecodeContext(ctx []int64) ([]Turn, error) {
	if len(ctx) < 2 || ctx[0] != contextMagic {
		return nil, ErrForeignContext
	}
	n := ctx[1]
	if n < 0 || int64(len(ctx)-2) != (n+2)/3 {
		return nil, fmt.Errorf("%w: its length does not match", ErrForeignContext)
	}
	payload := make([]byte, 0, 3*(len(ctx)-2))
	for _, v := range ctx[2:] {
		if v < 0 || v >= 1<<24 {
			return nil, fmt.Errorf("%w: a value out of range", ErrForeignContext)
		}
		payload = append(payload, byte(v>>16), byte(v>>8), byte(v))
	}
	payload = payload[:n]
	raw, err := io.ReadAll(io.LimitReader(flate.NewReader(bytes.NewReader(payload)), maxContextTurnsBytes+1))
	if err != nil || len(raw) > maxContextTurnsBytes {
		return nil, fmt.Errorf("%w: it does not decode", ErrForeignContext)
	}
	var turns []Turn
	if err := json.Unmarshal(raw, &turns); err != nil {
		return nil, fmt.Errorf("%w: it does not decode", ErrForeignContext)
	}
	for _, t := range turns {
		if t.Role != "user" && t.Role != "assistant" {
			return nil, fmt.Errorf("%w: a turn of role %q", ErrForeignContext, clip(t.Role))
		}
	}
	return turns, nil
}
