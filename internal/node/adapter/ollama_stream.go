package adapter

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"strconv"

	"iop/internal/jsonscan"
	"iop/internal/translate"
	"iop/internal/wire/nodev1"
)

// maxLineBytes caps one line of an Ollama NDJSON stream.
const maxLineBytes = MaxAnswerBytes

// ollamaLine is one line of an Ollama /api/chat or /api/generate stream
// (Ollama API doc, "Generate a chat completion", streaming response).
type ollamaLine struct {
	// Text is the generated text of this line: message.content (chat) or
	// response (generate).
	Text string
	// Thinking is the line's reasoning text: message.thinking (chat) or
	// thinking (generate), sent by a thinking model apart from its text
	// (Ollama API doc, "think").
	Thinking string
	// Done marks the final line; it carries the counters below.
	Done bool
	// DoneReason is Ollama's done_reason: "stop", "length", "load", ...
	DoneReason string
	// PromptTokens and CompletionTokens are prompt_eval_count and
	// eval_count, clamped to [0, MaxInt32].
	PromptTokens, CompletionTokens int32
	// Err is the line's "error" text, "" when it has none.
	Err string
	// ToolCalls are message.tool_calls: Ollama sends each call whole, in
	// one line.
	ToolCalls []ollamaLineToolCall
	// Logprobs are the line's "logprobs" (asked for with logprobs or
	// top_logprobs), nil when it has none.
	Logprobs []*nodev1.TokenLogprob
}

// ollamaLogprob is one entry of a line's "logprobs" (Ollama's api.Logprob)
// or of its "top_logprobs" (api.TokenLogprob).
type ollamaLogprob struct {
	Token       string          `json:"token"`
	Logprob     float64         `json:"logprob"`
	Bytes       []int           `json:"bytes"`
	TopLogprobs []ollamaLogprob `json:"top_logprobs"`
}

// wireLogprobs is lps as the protocol's; a byte outside 0..255 is cut to
// its low 8 bits (Ollama sends bytes).
func wireLogprobs(lps []ollamaLogprob) []*nodev1.TokenLogprob {
	if len(lps) == 0 {
		return nil
	}
	out := make([]*nodev1.TokenLogprob, len(lps))
	for i, lp := range lps {
		w := &nodev1.TokenLogprob{Token: lp.Token, Logprob: lp.Logprob, TopLogprobs: wireLogprobs(lp.TopLogprobs)}
		if len(lp.Bytes) > 0 {
			w.Bytes = make([]byte, len(lp.Bytes))
			for j, b := range lp.Bytes {
				w.Bytes[j] = byte(b)
			}
		}
		out[i] = w
	}
	return out
}

// ollamaLineToolCall is one tool call of a chat stream line.
type ollamaLineToolCall struct {
	// ID is the call's id when Ollama gives one (recent versions do not
	// always), else "".
	ID string
	// Name is function.name.
	Name string
	// Arguments is function.arguments as JSON text: Ollama sends an
	// object; a string is taken as already-encoded JSON text.
	Arguments string
}

// errMalformedLine is returned by parseLine for a line that is not an Ollama
// stream object.
var errMalformedLine = errors.New("malformed ndjson line")

// parseLine decodes one NDJSON line (outside input; fuzzed by
// FuzzParseOllamaLine). Unknown fields are ignored; an "error" that is not a
// string is rendered as its JSON text, or its "message" field if it has one.
// The lines a stream is made of (text, thinking, the final counters) are
// read in place by scanLine; any other line is decoded by decodeLine, with
// the same result (FuzzScanLineEqualsDecode).
func parseLine(line []byte) (ollamaLine, error) {
	if l, ok := scanLine(line); ok {
		return l, nil
	}
	return decodeLine(line)
}

// Members of an Ollama stream line scanLine reads, as bits of a set.
const (
	lineMessage = 1 << iota
	lineResponse
	lineThinking
	lineDone
	lineDoneReason
	linePromptEvalCount
	lineEvalCount
	lineContent // of message
	lineMessageThinking
)

// lineKeys are the members scanLine reads at the top level; decodeLine
// reads these and "error", "logprobs" (which scanLine leaves to it).
var lineKeys = []struct {
	name string
	bit  int
}{
	{"message", lineMessage}, {"response", lineResponse}, {"thinking", lineThinking}, {"done", lineDone},
	{"done_reason", lineDoneReason}, {"prompt_eval_count", linePromptEvalCount}, {"eval_count", lineEvalCount},
}

// messageKeys are the members of "message" scanLine reads.
var messageKeys = []struct {
	name string
	bit  int
}{{"content", lineContent}, {"thinking", lineMessageThinking}}

// scanLine reads line as decodeLine would, without decoding it into Go
// values, when it is a plain stream line: one valid object whose keys are
// unescaped, each member decodeLine reads appears once with a value of its
// type (no null), and there is no "error", "logprobs" or "tool_calls" —
// then ok. Any other line is decodeLine's (ok false): encoding/json
// matches keys case-insensitively and merges duplicates, which scanLine
// does not repeat.
func scanLine(line []byte) (l ollamaLine, ok bool) {
	seen, plain := 0, true
	var message [2]int // the span of "message"'s value
	member := func(key []byte, flags, vstart, vend int) {
		if !plain {
			return
		}
		bit, known := lineKey(key, flags, lineKeys[:])
		if !known {
			plain = false
			return
		}
		if bit == 0 {
			return
		}
		if seen&bit != 0 {
			plain = false
			return
		}
		seen |= bit
		v := line[vstart:vend]
		switch bit {
		case lineMessage:
			plain = v[0] == '{'
			message = [2]int{vstart, vend}
		case lineResponse:
			l.Text, plain = lineString(v)
		case lineThinking:
			l.Thinking, plain = lineString(v)
		case lineDoneReason:
			l.DoneReason, plain = lineString(v)
		case lineDone:
			l.Done, plain = string(v) == "true", string(v) == "true" || string(v) == "false"
		case linePromptEvalCount, lineEvalCount:
			f, err := strconv.ParseFloat(string(v), 64)
			if plain = err == nil && (v[0] == '-' || v[0] >= '0' && v[0] <= '9'); plain {
				if bit == linePromptEvalCount {
					l.PromptTokens = clampCount(f)
				} else {
					l.CompletionTokens = clampCount(f)
				}
			}
		}
	}
	if _, _, valid := jsonscan.Object(line, member); !valid || !plain {
		return ollamaLine{}, false
	}
	if seen&lineMessage == 0 {
		return l, true
	}
	var content, thinking string
	inner := func(key []byte, flags, vstart, vend int) {
		if !plain {
			return
		}
		bit, known := lineKey(key, flags, messageKeys[:])
		if !known || seen&bit != 0 {
			plain = false
			return
		}
		seen |= bit
		switch bit {
		case lineContent:
			content, plain = lineString(line[vstart:vend])
		case lineMessageThinking:
			thinking, plain = lineString(line[vstart:vend])
		}
	}
	if end, _ := jsonscan.Members(line, message[0], 2, inner); end != message[1] || !plain {
		return ollamaLine{}, false
	}
	if content != "" {
		l.Text = content
	}
	if thinking != "" {
		l.Thinking = thinking
	}
	return l, true
}

// lineKey is the bit of key among keys (0 for a key that is none of
// them nor any line member decodeLine reads), known false for a key
// scanLine leaves to decodeLine: escaped or non-ASCII, another case of a
// member's name (encoding/json would take it), "error", "logprobs" or
// "tool_calls".
func lineKey(key []byte, flags int, keys []struct {
	name string
	bit  int
}) (bit int, known bool) {
	if flags != 0 {
		return 0, false
	}
	name := key[1 : len(key)-1]
	for _, k := range keys {
		if string(name) == k.name {
			return k.bit, true
		}
	}
	for _, other := range [...]string{"error", "logprobs", "tool_calls", "message", "response", "thinking", "done",
		"done_reason", "prompt_eval_count", "eval_count", "content"} {
		if bytes.EqualFold(name, []byte(other)) {
			return 0, false
		}
	}
	return 0, true
}

// lineString is the JSON string v decoded as encoding/json decodes it; ok
// false when v is not a string.
func lineString(v []byte) (string, bool) {
	if v[0] != '"' {
		return "", false
	}
	if len(v) == 2 {
		return "", true
	}
	if _, flags := jsonscan.String(v, 0); flags == 0 {
		return string(v[1 : len(v)-1]), true
	}
	return string(jsonscan.AppendString(nil, v)), true
}

// decodeLine is parseLine by encoding/json.
func decodeLine(line []byte) (ollamaLine, error) {
	var raw struct {
		Message *struct {
			Content   string `json:"content"`
			Thinking  string `json:"thinking"`
			ToolCalls []struct {
				ID       string `json:"id"`
				Function struct {
					Name      string          `json:"name"`
					Arguments json.RawMessage `json:"arguments"`
				} `json:"function"`
			} `json:"tool_calls"`
		} `json:"message"`
		Response        string          `json:"response"`
		Thinking        string          `json:"thinking"`
		Done            bool            `json:"done"`
		DoneReason      string          `json:"done_reason"`
		PromptEvalCount float64         `json:"prompt_eval_count"`
		EvalCount       float64         `json:"eval_count"`
		Error           json.RawMessage `json:"error"`
		Logprobs        []ollamaLogprob `json:"logprobs"`
	}
	line = bytes.TrimSpace(line)
	if len(line) == 0 || line[0] != '{' {
		return ollamaLine{}, errMalformedLine
	}
	if err := json.Unmarshal(line, &raw); err != nil {
		return ollamaLine{}, errMalformedLine
	}
	l := ollamaLine{
		Text:             raw.Response,
		Thinking:         raw.Thinking,
		Done:             raw.Done,
		DoneReason:       raw.DoneReason,
		PromptTokens:     clampCount(raw.PromptEvalCount),
		CompletionTokens: clampCount(raw.EvalCount),
		Err:              errorText(raw.Error),
		Logprobs:         wireLogprobs(raw.Logprobs),
	}
	if raw.Message != nil && raw.Message.Content != "" {
		l.Text = raw.Message.Content
	}
	if raw.Message != nil && raw.Message.Thinking != "" {
		l.Thinking = raw.Message.Thinking
	}
	if raw.Message != nil {
		for _, tc := range raw.Message.ToolCalls {
			l.ToolCalls = append(l.ToolCalls, ollamaLineToolCall{
				ID: tc.ID, Name: tc.Function.Name, Arguments: translate.ArgumentsText(tc.Function.Arguments),
			})
		}
	}
	return l, nil
}

// clampCount turns a JSON token count into an int32 in [0, MaxInt32].
func clampCount(f float64) int32 {
	switch {
	case !(f > 0): // also NaN
		return 0
	case f >= math.MaxInt32:
		return math.MaxInt32
	default:
		return int32(f)
	}
}

// errorText renders an Ollama "error" value: a string as is, an object by
// its "message" (or "error") field, anything else as JSON text; absent,
// null, false and "" are "" (no error).
func errorText(raw json.RawMessage) string {
	if isNull(raw) || string(bytes.TrimSpace(raw)) == "false" {
		return ""
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var obj struct {
		Message string `json:"message"`
		Error   string `json:"error"`
	}
	if json.Unmarshal(raw, &obj) == nil {
		if obj.Message != "" {
			return obj.Message
		}
		if obj.Error != "" {
			return obj.Error
		}
	}
	return string(bytes.TrimSpace(raw))
}
