package api

import (
	"bytes"
	"encoding/json"

	"iop/internal/sse"
)

// maxUsageScanBytes bounds what usageScanner keeps: one SSE event, or a
// whole JSON body. A longer event is not scanned; of a longer body only the
// last maxUsageTail bytes are kept (usage comes last in OpenAI's objects,
// after choices or data). The relayed bytes are never affected.
const (
	maxUsageScanBytes = 1 << 20  // 1 MiB
	maxUsageTail      = 64 << 10 // 64 KiB
)

// usageScanner reads a copy of a tunnel-path answer (an OpenAI chat or
// completion response, SSE or JSON) for the token usage and for the events
// that carry generated content, without changing a byte of it. Usage is the
// OpenAI "usage" object: in a JSON answer at the top level, in a stream the
// final chunk's (sent when the request set stream_options.include_usage).
// A stream's events are read by package sse (the WHATWG rules).
type usageScanner struct {
	sse    bool
	events sse.Reader // SSE
	buf    []byte     // JSON: the body so far, or its tail
	tail   bool       // JSON: the body outgrew the bound; buf is its last maxUsageTail bytes

	found             bool
	prompt, completed int
}

// write scans the next chunk of the answer and returns how many SSE events
// in it carry generated content (always 0 for JSON).
func (u *usageScanner) write(p []byte) (contentEvents int) {
	if !u.sse {
		u.buf = append(u.buf, p...)
		if len(u.buf) > maxUsageScanBytes || u.tail && len(u.buf) > maxUsageTail {
			u.tail = true
			u.buf = append(u.buf[:0], u.buf[len(u.buf)-maxUsageTail:]...)
		}
		return 0
	}
	if u.events.MaxSize == 0 {
		u.events.MaxSize, u.events.SkipTooLong = maxUsageScanBytes, true
	}
	// With SkipTooLong, Feed fails only with the callback's error: never.
	_ = u.events.Feed(p, func(e sse.Event) error {
		if u.event(e.Data) {
			contentEvents++
		}
		return nil
	})
	return contentEvents
}

// event scans the data of one SSE event and reports whether it carries
// content.
func (u *usageScanner) event(data []byte) bool {
	data = bytes.TrimSpace(data)
	if string(data) == "[DONE]" {
		return false
	}
	if bytes.Contains(data, []byte(`"usage"`)) {
		u.parse(data)
	}
	return hasContent(data)
}

// usageObject is OpenAI's usage object, in tokens.
type usageObject struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
}

// parse records the usage object of one JSON document, if it has one.
func (u *usageScanner) parse(doc []byte) {
	var v struct {
		Usage *usageObject `json:"usage"`
	}
	if json.Unmarshal(doc, &v) == nil && v.Usage != nil {
		u.found, u.prompt, u.completed = true, v.Usage.PromptTokens, v.Usage.CompletionTokens
	}
}

// end finishes the scan and returns the usage, if the answer had one: for
// a JSON answer, its top-level "usage" when the whole body was kept, else
// the object after the last `"usage":` key of the kept tail.
func (u *usageScanner) end() (prompt, completion int, ok bool) {
	if !u.sse && len(u.buf) > 0 {
		if !u.tail {
			u.parse(u.buf)
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
