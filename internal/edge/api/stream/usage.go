package stream

import (
	"bytes"
	"encoding/json"
	"strconv"
	"unicode/utf8"

	"iop/internal/jsonscan"
)

// MaxScanBytes bounds what is read of a tunnel answer: one SSE line or
// event (FinalHold's reader; a longer event is not read), or a whole JSON
// body (UsageScanner). Of a longer body only the last maxUsageTail bytes
// are kept (usage comes last in OpenAI's objects, after choices or data).
// The relayed bytes are never affected.
const MaxScanBytes = 1 << 20 // 1 MiB

// maxUsageTail is what a UsageScanner keeps of a JSON body over
// MaxScanBytes: its tail.
const maxUsageTail = 64 << 10 // 64 KiB

// Event is what one event of a tunnel event stream (an OpenAI chat or
// completion chunk, an error object or [DONE]) says to the edge, read
// once (ReadEvent) by the stream's one reader (FinalHold) and told to the
// observation (metrics, the usage ledger) and the runs recorder alike, so
// they agree on it.
type Event struct {
	// Data is the event's data as the provider sent it; valid only during
	// the call it is passed to.
	Data []byte
	// Done is set for OpenAI's end of stream, [DONE] (blanks around it
	// allowed), which is no JSON and carries nothing.
	Done bool
	// Content is set when the event carries generated content (a non-empty
	// content, text or reasoning string, or a tool call).
	Content bool
	// HasUsage is set when the event has OpenAI's "usage" object (the
	// final chunk's, sent when the request set
	// stream_options.include_usage); PromptTokens and CompletionTokens are
	// its counts, in tokens.
	HasUsage                       bool
	PromptTokens, CompletionTokens int
}

// ReadEvent reads the data of one event: whether it is [DONE], whether it
// carries content and its usage object.
func ReadEvent(data []byte) Event {
	ev := Event{Data: data}
	doc := bytes.TrimSpace(data)
	if string(doc) == "[DONE]" {
		ev.Done = true
		return ev
	}
	if bytes.Contains(doc, []byte(`"usage"`)) {
		var u usageObject
		if u, ev.HasUsage = parseUsage(doc); ev.HasUsage {
			ev.PromptTokens, ev.CompletionTokens = u.PromptTokens, u.CompletionTokens
		}
	}
	ev.Content = hasContent(doc)
	return ev
}

// UsageScanner keeps the token usage of one tunnel-path answer (an OpenAI
// chat or completion response, SSE or JSON), never changing a byte of it.
// Usage is the OpenAI "usage" object: in a JSON answer at the top level
// (the body is kept, or its tail, until End), in a stream the latest
// event's that had one (Event). The zero value scans a JSON answer.
type UsageScanner struct {
	buf  []byte // JSON: the body so far, or its tail
	tail bool   // JSON: the body outgrew the bound; buf is its last maxUsageTail bytes

	found             bool
	prompt, completed int
}

// Body keeps the next bytes of a JSON answer for End.
func (u *UsageScanner) Body(p []byte) {
	u.buf = append(u.buf, p...)
	if len(u.buf) > MaxScanBytes || u.tail && len(u.buf) > maxUsageTail {
		u.tail = true
		u.buf = append(u.buf[:0], u.buf[len(u.buf)-maxUsageTail:]...)
	}
}

// Event records the usage of one event of a stream, if it had one.
func (u *UsageScanner) Event(ev *Event) {
	if ev.HasUsage {
		u.found, u.prompt, u.completed = true, ev.PromptTokens, ev.CompletionTokens
	}
}

// usageObject is OpenAI's usage object, in tokens.
type usageObject struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
}

// parseUsage is the usage object of one JSON document, if it has one: what
// json.Unmarshal of the whole document into struct{ Usage *usageObject }
// leaves, read in place (jsonscan), without decoding or allocating. As
// encoding/json does, it matches keys under Unicode case folding, lets
// each "usage" member in turn decode into what the ones before it left
// (null resets it), and reports nothing when the document is not valid
// JSON or a usage member or count has a value of the wrong type (a count
// must be an integer that fits an int).
func parseUsage(doc []byte) (usageObject, bool) {
	var (
		usage   usageObject
		found   bool
		bad     bool
		scratch [32]byte // an escaped key, decoded
	)
	keyIs := func(quoted []byte, flags int, name string) bool {
		key := quoted[1 : len(quoted)-1]
		if flags&jsonscan.Escaped != 0 || flags&jsonscan.High != 0 && !utf8.Valid(key) {
			key = jsonscan.AppendString(scratch[:0], quoted)
		}
		return bytes.EqualFold(key, []byte(name))
	}
	count := func(v []byte, n *int) {
		switch v[0] {
		case 'n': // null leaves the count as it was
		case '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
			i, err := strconv.ParseInt(string(v), 10, strconv.IntSize)
			if err != nil {
				bad = true
				return
			}
			*n = int(i)
		default:
			bad = true
		}
	}
	_, _, ok := jsonscan.Object(doc, func(quoted []byte, flags int, vstart, vend int) {
		if !keyIs(quoted, flags, "usage") {
			return
		}
		switch doc[vstart] {
		case 'n':
			usage, found = usageObject{}, false
		case '{':
			if !found {
				usage, found = usageObject{}, true
			}
			jsonscan.Members(doc, vstart, 2, func(quoted []byte, flags int, vstart, vend int) {
				switch {
				case keyIs(quoted, flags, "prompt_tokens"):
					count(doc[vstart:vend], &usage.PromptTokens)
				case keyIs(quoted, flags, "completion_tokens"):
					count(doc[vstart:vend], &usage.CompletionTokens)
				}
			})
		default:
			bad = true
		}
	})
	if !ok || bad || !found {
		return usageObject{}, false
	}
	return usage, true
}

// End finishes the scan and returns the usage in tokens, if the answer had
// one: for a JSON answer (bytes given to Body), its top-level "usage" when
// the whole body was kept, else the object after the last `"usage":` key
// of the kept tail; for a stream, the latest event's.
func (u *UsageScanner) End() (prompt, completion int, ok bool) {
	if len(u.buf) > 0 {
		if !u.tail {
			if v, ok := parseUsage(u.buf); ok {
				u.found, u.prompt, u.completed = true, v.PromptTokens, v.CompletionTokens
			}
		} else if i := bytes.LastIndex(u.buf, []byte(`"usage"`)); i > 0 && u.buf[i-1] != '\\' {
			rest := bytes.TrimLeft(u.buf[i+len(`"usage"`):], " \t\r\n")
			if r, ok := bytes.CutPrefix(rest, []byte(":")); ok {
				var v *usageObject
				if json.NewDecoder(bytes.NewReader(r)).Decode(&v) == nil && v != nil {
					u.found, u.prompt, u.completed = true, v.PromptTokens, v.CompletionTokens
				}
			}
		}
		u.buf = nil
	}
	return u.prompt, u.completed, u.found
}

// contentKeys are the JSON keys whose non-empty string value is generated
// text: chat deltas, completion choices, reasoning (under both of its
// names). Reasoning counts: it is the first output a reasoning model
// produces, so its first token is the time to first token.
var contentKeys = [][]byte{[]byte(`"content"`), []byte(`"text"`), []byte(`"reasoning_content"`), []byte(`"reasoning"`)}

// hasContent reports whether an SSE data payload carries generated content:
// a non-empty string under a content key, or a tool call. It looks at the
// bytes only, without decoding the JSON.
func hasContent(data []byte) bool {
	if bytes.Contains(data, []byte(`"tool_calls":[{`)) {
		return true
	}
	for _, key := range contentKeys {
		rest := data
		for {
			i := bytes.Index(rest, key)
			if i < 0 {
				break
			}
			rest = rest[i+len(key):]
			v := bytes.TrimLeft(rest, " ")
			if len(v) > 0 && v[0] == ':' {
				v = bytes.TrimLeft(v[1:], " ")
				if len(v) > 1 && v[0] == '"' && v[1] != '"' {
					return true
				}
			}
		}
	}
	return false
}
