package adapter

import "bytes"

// minStreamSecret is the shortest API key streamRedactor looks for in a
// relayed body: a shorter one would blank ordinary text (and is no real
// key).
const minStreamSecret = 8

// redactedKey replaces the provider's API key wherever it is relayed.
var redactedKey = []byte("[redacted]")

// streamRedactor replaces the provider's API key in a body relayed chunk
// by chunk, even when a chunk boundary splits the key: a chunk's tail
// that could begin the key is held back until the next chunk (or the end)
// shows whether it does. Nothing else is held, so a stream without the key
// passes at once and byte for byte. A provider that echoes its key (in an
// error event inside a 200 stream, say) thus never hands it to a client.
// The zero value with secret set is ready; a nil or short secret relays
// everything unchanged.
type streamRedactor struct {
	secret []byte
	held   []byte // a tail of the stream so far that is a proper prefix of secret
}

func newStreamRedactor(apiKey string) *streamRedactor {
	if len(apiKey) < minStreamSecret {
		return &streamRedactor{}
	}
	return &streamRedactor{secret: []byte(apiKey)}
}

// write takes the next chunk and returns what may be relayed now. The
// result may alias p.
func (r *streamRedactor) write(p []byte) []byte {
	if r.secret == nil {
		return p
	}
	buf := p
	if len(r.held) > 0 {
		buf = append(r.held, p...)
		r.held = nil
	}
	if bytes.Contains(buf, r.secret) {
		buf = bytes.ReplaceAll(buf, r.secret, redactedKey)
	}
	// Hold back the longest tail of buf that is a proper prefix of the key.
	from := max(0, len(buf)-(len(r.secret)-1))
	for i := from; i < len(buf); i++ {
		if buf[i] == r.secret[0] && bytes.HasPrefix(r.secret, buf[i:]) {
			r.held = append([]byte(nil), buf[i:]...)
			return buf[:i]
		}
	}
	return buf
}

// flush returns the bytes held back at the end of the stream (a partial
// key is not the key: they are relayed as they are).
func (r *streamRedactor) flush() []byte {
	out := r.held
	r.held = nil
	return out
}
