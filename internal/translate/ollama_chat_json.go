package translate

import (
	"encoding/json"
	"strconv"
)

// appendJSON appends r as json.Marshal writes it, byte for byte, but
// with each message's rawContent copied rather than decoded and escaped
// again (appendRawString).
func (r *ollamaChatRequest) appendJSON(dst []byte) ([]byte, error) {
	var err error
	dst = append(dst, `{"model":`...)
	dst = appendJSONString(dst, r.Model)
	if len(r.Messages) > 0 {
		dst = append(dst, `,"messages":[`...)
		for i := range r.Messages {
			if i > 0 {
				dst = append(dst, ',')
			}
			if dst, err = r.Messages[i].appendJSON(dst); err != nil {
				return nil, err
			}
		}
		dst = append(dst, ']')
	}
	dst = append(dst, `,"stream":`...)
	dst = strconv.AppendBool(dst, r.Stream)
	if len(r.Format) > 0 {
		dst = append(dst, `,"format":`...)
		if dst, err = appendCompactRaw(dst, r.Format); err != nil {
			return nil, err
		}
	}
	if r.Options != nil {
		opts, err := json.Marshal(r.Options)
		if err != nil {
			return nil, err
		}
		dst = append(dst, `,"options":`...)
		dst = append(dst, opts...)
	}
	if len(r.Tools) > 0 {
		dst = append(dst, `,"tools":`...)
		if dst, err = appendCompactRaw(dst, r.Tools); err != nil {
			return nil, err
		}
	}
	if len(r.Think) > 0 {
		dst = append(dst, `,"think":`...)
		if dst, err = appendCompactRaw(dst, r.Think); err != nil {
			return nil, err
		}
	}
	return append(dst, '}'), nil
}

// appendJSON appends m as json.Marshal writes it, its rawContent (when
// set) copied as appendRawString says.
func (m *ollamaMessage) appendJSON(dst []byte) ([]byte, error) {
	dst = append(dst, `{"role":`...)
	dst = appendJSONString(dst, m.Role)
	dst = append(dst, `,"content":`...)
	if m.rawContent != nil {
		dst = appendRawString(dst, m.rawContent)
	} else {
		dst = appendJSONString(dst, m.Content)
	}
	if len(m.Images) > 0 {
		dst = append(dst, `,"images":[`...)
		for i, img := range m.Images {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = appendJSONString(dst, img)
		}
		dst = append(dst, ']')
	}
	if len(m.ToolCalls) > 0 {
		dst = append(dst, `,"tool_calls":[`...)
		for i, c := range m.ToolCalls {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = append(dst, `{"function":{"name":`...)
			dst = appendJSONString(dst, c.Function.Name)
			dst = append(dst, `,"arguments":`...)
			if c.Function.Arguments == nil {
				dst = append(dst, "null"...)
			} else {
				var err error
				if dst, err = appendCompactRaw(dst, c.Function.Arguments); err != nil {
					return nil, err
				}
			}
			dst = append(dst, "}}"...)
		}
		dst = append(dst, ']')
	}
	if m.ToolName != "" {
		dst = append(dst, `,"tool_name":`...)
		dst = appendJSONString(dst, m.ToolName)
	}
	if m.Thinking != "" {
		dst = append(dst, `,"thinking":`...)
		dst = appendJSONString(dst, m.Thinking)
	}
	return append(dst, '}'), nil
}

// MarshalJSON is appendJSON, so that json.Marshal of a message writes its
// rawContent too.
func (m ollamaMessage) MarshalJSON() ([]byte, error) { return m.appendJSON(nil) }

// jsonAppender is an Ollama request that writes itself as json.Marshal
// would (ollamaChatRequest), with sizeHint the bytes to reserve.
type jsonAppender interface {
	appendJSON(dst []byte) ([]byte, error)
	sizeHint() int
}

// marshal is json.Marshal(out), by out's own appendJSON when it has one.
func marshal(out any) ([]byte, error) {
	if a, ok := out.(jsonAppender); ok {
		return a.appendJSON(make([]byte, 0, a.sizeHint()))
	}
	return json.Marshal(out)
}
