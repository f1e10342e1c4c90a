package api

import (
	"bytes"
	"encoding/json"

	"iop/internal/sse"
)

// maxUsageScanBytes bounds what usageScanner keeps: one SSE line or
// event, or a whole JSON body. A longer event or body is not scanned (its
// usage, if any, stays unknown); the relayed bytes are never affected.
const maxUsageScanBytes = 1 << 20 // 1 MiB

// usageScanner reads a copy of a tunnel-path answer (an OpenAI chat or
// completion response, SSE or JSON) for the token usage and for the events
// that carry generated content, without changing a byte of it. Usage is the
// OpenAI "usage" object: in a JSON answer at the top level, in a stream the
// final chunk's (sent when the request set stream_options.include_usage).
// A stream's events are read by package sse (the WHATWG rules).
type usageScanner struct {
	sse    bool
	events sse.Reader // SSE
	buf    []byte     // JSON: the body so far
	skip   bool       // JSON: the body outgrew the bound

	found             bool
	prompt, completed int
	// done is set once an SSE `data: [DONE]` went by: the client has the
	// whole answer even if the run had not ended yet.
	done bool
}

// write scans the next chunk of the answer and returns how many SSE events
// in it carry generated content, text or reasoning (always 0 for JSON).
func (u *usageScanner) write(p []byte) (contentEvents int) {
	if !u.sse {
		if !u.skip && len(u.buf)+len(p) <= maxUsageScanBytes {
			u.buf = append(u.buf, p...)
		} else {
			u.skip, u.buf = true, nil
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
		u.done = true
		return false
	}
	if bytes.Contains(data, []byte(`"usage"`)) {
		u.parse(data)
	}
	return hasContent(data)
}

// parse records the usage object of one JSON document, if it has one.
func (u *usageScanner) parse(doc []byte) {
	var v struct {
		Usage *struct {
			PromptTokens     int `json:"prompt_tokens"`
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}
	if json.Unmarshal(doc, &v) == nil && v.Usage != nil {
		u.found, u.prompt, u.completed = true, v.Usage.PromptTokens, v.Usage.CompletionTokens
	}
}

// end finishes the scan and returns the usage, if the answer had one.
func (u *usageScanner) end() (prompt, completion int, ok bool) {
	if !u.sse && !u.skip && len(u.buf) > 0 {
		u.parse(u.buf)
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
