package api

import (
	"bytes"
	"encoding/json"
)

// maxUsageScanBytes bounds what is read of a tunnel answer: one SSE line
// or event (finalHold's reader; a longer event is not read), or a whole
// JSON body (usageScanner). Of a longer body only the last maxUsageTail
// bytes are kept (usage comes last in OpenAI's objects, after choices or
// data). The relayed bytes are never affected.
const (
	maxUsageScanBytes = 1 << 20  // 1 MiB
	maxUsageTail      = 64 << 10 // 64 KiB
)

// streamEvent is what one event of a tunnel event stream (an OpenAI chat
// or completion chunk, an error object or [DONE]) says to the edge, read
// once (readStreamEvent) by the stream's one reader (finalHold) and told
// to the observation (metrics, the usage ledger) and the runs recorder
// alike, so they agree on it.
type streamEvent struct {
	// data is the event's data as the provider sent it; valid only during
	// the call it is passed to.
	data []byte
	// done is set for OpenAI's end of stream, [DONE] (blanks around it
	// allowed), which is no JSON and carries nothing.
	done bool
	// content is set when the event carries generated content (hasContent).
	content bool
	// usage is the event's OpenAI "usage" object, when hasUsage (the final
	// chunk's, sent when the request set stream_options.include_usage).
	usage    usageObject
	hasUsage bool
}

// readStreamEvent reads the data of one event: whether it is [DONE],
// whether it carries content and its usage object.
func readStreamEvent(data []byte) streamEvent {
	ev := streamEvent{data: data}
	doc := bytes.TrimSpace(data)
	if string(doc) == "[DONE]" {
		ev.done = true
		return ev
	}
	if bytes.Contains(doc, []byte(`"usage"`)) {
		ev.usage, ev.hasUsage = parseUsage(doc)
	}
	ev.content = hasContent(doc)
	return ev
}

// usageScanner keeps the token usage of one tunnel-path answer (an OpenAI
// chat or completion response, SSE or JSON), never changing a byte of it.
// Usage is the OpenAI "usage" object: in a JSON answer at the top level
// (the body is kept, or its tail, until end), in a stream the latest
// event's that had one (event).
type usageScanner struct {
	sse  bool   // the answer is an event stream
	buf  []byte // JSON: the body so far, or its tail
	tail bool   // JSON: the body outgrew the bound; buf is its last maxUsageTail bytes

	found             bool
	prompt, completed int
}

// json keeps the next bytes of a JSON answer for end.
func (u *usageScanner) json(p []byte) {
	u.buf = append(u.buf, p...)
	if len(u.buf) > maxUsageScanBytes || u.tail && len(u.buf) > maxUsageTail {
		u.tail = true
		u.buf = append(u.buf[:0], u.buf[len(u.buf)-maxUsageTail:]...)
	}
}

// event records the usage of one event of a stream, if it had one.
func (u *usageScanner) event(ev *streamEvent) {
	if ev.hasUsage {
		u.found, u.prompt, u.completed = true, ev.usage.PromptTokens, ev.usage.CompletionTokens
	}
}

// usageObject is OpenAI's usage object, in tokens.
type usageObject struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
}

// parseUsage is the usage object of one JSON document, if it has one.
func parseUsage(doc []byte) (usageObject, bool) {
	var v struct {
		Usage *usageObject `json:"usage"`
	}
	if json.Unmarshal(doc, &v) == nil && v.Usage != nil {
		return *v.Usage, true
	}
	return usageObject{}, false
}

// end finishes the scan and returns the usage, if the answer had one: for
// a JSON answer, its top-level "usage" when the whole body was kept, else
// the object after the last `"usage":` key of the kept tail.
func (u *usageScanner) end() (prompt, completion int, ok bool) {
	if !u.sse && len(u.buf) > 0 {
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
