package translate

import (
	"bytes"
	"encoding/json"
	"slices"

	"iop/internal/jsonscan"
)

// chatMembers are the top-level members of a chat completions body that
// openAIChatRequest decodes, by json tag.
var chatMembers = []string{
	"max_tokens", "max_completion_tokens", "temperature", "top_p", "stop", "seed",
	"frequency_penalty", "presence_penalty", "n", "messages", "response_format",
	"tools", "tool_choice", "parallel_tool_calls", "logprobs", "top_logprobs",
	"reasoning_effort", "reasoning",
}

// messageMembers are the members of a message openAIMessage decodes.
var messageMembers = []string{
	"role", "content", "name", "tool_calls", "tool_call_id", "reasoning_content", "reasoning",
}

// span is a value's bytes [start, end) in a body; end 0 when absent.
type span struct{ start, end int }

// memberIndex is the index in names of key (a JSON string, quotes
// included, with jsonscan.String's flags): -1 when key names none of them,
// and ok false when encoding/json could match it to one and this cannot
// tell (an escaped or non-ASCII key, another case of a name).
func memberIndex(key []byte, flags int, names []string) (i int, ok bool) {
	if flags != 0 {
		return -1, false
	}
	k := key[1 : len(key)-1]
	for i, name := range names {
		if string(k) == name {
			return i, true
		}
	}
	for _, name := range names {
		if bytes.EqualFold(k, []byte(name)) {
			return -1, false
		}
	}
	return -1, true
}

// scanChatRequest decodes body into in as json.Unmarshal(body, in) does,
// reading it in place (jsonscan) and decoding only the small members with
// encoding/json: a message's content, reasoning and the tools stay spans
// of body, not copies. It reports false, in left in any state, when it
// cannot be sure of that: the body is not a valid JSON object, a member
// encoding/json would match is spelled otherwise or given twice, a message
// is not an object, a member has a type encoding/json refuses. The caller
// then decodes with encoding/json, which also says what is wrong.
func scanChatRequest(body []byte, in *openAIChatRequest) bool {
	var spans [18]span
	open := jsonscan.SkipSpace(body, 0)
	if open >= len(body) || body[open] != '{' {
		return false
	}
	// One walk: the messages are read as they are checked.
	end, _ := jsonscan.MembersFunc(body, open, 1, func(key []byte, flags int, vstart int) int {
		i, known := memberIndex(key, flags, chatMembers)
		if !known || i >= 0 && spans[i].end != 0 {
			return -1
		}
		var vend int
		if i == messagesMember {
			vend = scanMessages(body, vstart, in)
		} else {
			vend = jsonscan.Value(body, vstart, 1)
		}
		if i >= 0 {
			spans[i] = span{vstart, vend}
		}
		return vend
	})
	if end < 0 || jsonscan.SkipSpace(body, end) != len(body) {
		return false
	}
	for i, s := range spans {
		if s.end == 0 || i == messagesMember {
			continue
		}
		v := body[s.start:s.end]
		var err error
		switch chatMembers[i] {
		case "max_tokens":
			err = json.Unmarshal(v, &in.MaxTokens)
		case "max_completion_tokens":
			err = json.Unmarshal(v, &in.MaxCompletionTokens)
		case "temperature":
			err = json.Unmarshal(v, &in.Temperature)
		case "top_p":
			err = json.Unmarshal(v, &in.TopP)
		case "stop":
			in.Stop = v
		case "seed":
			err = json.Unmarshal(v, &in.Seed)
		case "frequency_penalty":
			err = json.Unmarshal(v, &in.FrequencyPenalty)
		case "presence_penalty":
			err = json.Unmarshal(v, &in.PresencePenalty)
		case "n":
			err = json.Unmarshal(v, &in.N)
		case "response_format":
			err = json.Unmarshal(v, &in.ResponseFormat)
		case "tools":
			in.Tools = v
		case "tool_choice":
			in.ToolChoice = v
		case "parallel_tool_calls":
			err = json.Unmarshal(v, &in.ParallelToolCalls)
		case "logprobs":
			err = json.Unmarshal(v, &in.Logprobs)
		case "top_logprobs":
			in.TopLogprobs = v
		case "reasoning_effort":
			err = json.Unmarshal(v, &in.ReasoningEffort)
		case "reasoning":
			err = json.Unmarshal(v, &in.Reasoning)
		}
		if err != nil {
			return false
		}
	}
	return true
}

// messagesMember is the index of "messages" in chatMembers.
var messagesMember = slices.Index(chatMembers, "messages")

// scanMessages checks the messages array that starts at body[start] and
// decodes it into in.Messages, as scanChatRequest does; end is the index
// just past it, -1 when it is not valid or cannot be read so (see
// scanChatRequest).
func scanMessages(body []byte, start int, in *openAIChatRequest) (end int) {
	if body[start] != '[' {
		end = jsonscan.Value(body, start, 1)
		if end < 0 || string(body[start:end]) != "null" {
			return -1
		}
		return end // null leaves Messages nil
	}
	in.Messages = []openAIMessage{}
	return objects(body, start, func(start int) (end int) {
		in.Messages = append(in.Messages, openAIMessage{})
		return scanMessage(body, start, &in.Messages[len(in.Messages)-1])
	})
}

// objects walks the array at body[start] ('['), whose elements must be
// objects, calling object with the index of each one's '{'; object checks
// it and returns the index just past it, -1 to stop. end is the index
// just past the array, -1 when it is not valid, an element is not an
// object or object stopped.
func objects(body []byte, start int, object func(start int) (end int)) (end int) {
	i := jsonscan.SkipSpace(body, start+1)
	if i < len(body) && body[i] == ']' {
		return i + 1
	}
	for {
		if i >= len(body) || body[i] != '{' {
			return -1
		}
		end := object(i)
		if end < 0 {
			return -1
		}
		i = jsonscan.SkipSpace(body, end)
		if i >= len(body) {
			return -1
		}
		switch body[i] {
		case ',':
			i = jsonscan.SkipSpace(body, i+1)
		case ']':
			return i + 1
		default:
			return -1
		}
	}
}

// scanMessage decodes the message object at body[start] into m; end is
// the index just past it, -1 when it cannot (see scanChatRequest).
func scanMessage(body []byte, start int, m *openAIMessage) (end int) {
	var spans [7]span
	ok := true
	end, _ = jsonscan.Members(body, start, 3, func(key []byte, flags int, vstart, vend int) {
		i, known := memberIndex(key, flags, messageMembers)
		switch {
		case !known || i >= 0 && spans[i].end != 0:
			ok = false
		case i >= 0:
			spans[i] = span{vstart, vend}
		}
	})
	if !ok || end < 0 {
		return -1
	}
	for i, s := range spans {
		if s.end == 0 {
			continue
		}
		v := body[s.start:s.end]
		switch messageMembers[i] {
		case "role":
			ok = stringMember(v, &m.Role)
		case "content":
			m.Content = v
		case "name":
			ok = stringMember(v, &m.Name)
		case "tool_calls":
			ok = scanToolCalls(body, s, &m.ToolCalls)
		case "tool_call_id":
			ok = stringMember(v, &m.ToolCallID)
		case "reasoning_content":
			m.ReasoningContent = v
		case "reasoning":
			m.Reasoning = v
		}
		if !ok {
			return -1
		}
	}
	return end
}

// toolCallMembers are the members of a tool call openAIToolCall decodes,
// and functionMembers those of its function.
var (
	toolCallMembers = []string{"id", "function"}
	functionMembers = []string{"name", "arguments"}
)

// scanToolCalls decodes the tool_calls array at s of body into *dst as
// json.Unmarshal does; false when it cannot (see scanChatRequest).
func scanToolCalls(body []byte, s span, dst *[]openAIToolCall) bool {
	if body[s.start] != '[' {
		return string(body[s.start:s.end]) == "null"
	}
	calls := []openAIToolCall{}
	ok := true
	walked := objects(body, s.start, func(start int) int {
		calls = append(calls, openAIToolCall{})
		c := &calls[len(calls)-1]
		var id bool
		var fn span
		end, _ := jsonscan.Members(body, start, 5, func(key []byte, flags int, vstart, vend int) {
			i, known := memberIndex(key, flags, toolCallMembers)
			switch {
			case !known:
				ok = false
			case i == 0:
				ok = ok && !id && stringMember(body[vstart:vend], &c.ID)
				id = true
			case i == 1:
				ok = ok && fn.end == 0
				fn = span{vstart, vend}
			}
		})
		if !ok || end < 0 {
			return -1
		}
		if fn.end == 0 || body[fn.start] == 'n' {
			return end // function absent or null
		}
		if body[fn.start] != '{' {
			return -1
		}
		var name, args bool
		jsonscan.Members(body, fn.start, 6, func(key []byte, flags int, vstart, vend int) {
			i, known := memberIndex(key, flags, functionMembers)
			switch {
			case !known:
				ok = false
			case i == 0:
				ok = ok && !name && stringMember(body[vstart:vend], &c.Function.Name)
				name = true
			case i == 1:
				ok = ok && !args && stringMember(body[vstart:vend], &c.Function.Arguments)
				args = true
			}
		})
		if !ok {
			return -1
		}
		return end
	})
	if walked < 0 || !ok {
		return false
	}
	*dst = calls
	return true
}

// stringMember decodes v, a valid JSON value, into *dst as json.Unmarshal
// decodes it into a string: null leaves *dst alone; false for another
// type.
func stringMember(v []byte, dst *string) bool {
	switch v[0] {
	case 'n':
		return true
	case '"':
		if _, flags := jsonscan.String(v, 0); flags == 0 {
			*dst = internRole(v[1 : len(v)-1])
			return true
		}
		*dst = string(jsonscan.AppendString(nil, v))
		return true
	}
	return false
}

// internRole is string(b), without allocating for the roles of OpenAI's
// messages.
func internRole(b []byte) string {
	switch string(b) {
	case "system":
		return "system"
	case "user":
		return "user"
	case "assistant":
		return "assistant"
	case "tool":
		return "tool"
	case "developer":
		return "developer"
	}
	return string(b)
}
