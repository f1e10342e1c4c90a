package translate

import (
	"encoding/json"
	"strings"
)

// ThinkAsBool returns body, an Ollama /api/chat or /api/generate request,
// with its "think" level ("low", "medium", "high") replaced by true, and
// whether it had a level; without one, body comes back unchanged. Ollama
// takes levels only from models it parses with its harmony parser
// (gpt-oss; Ollama v0.17.4 server/routes.go, ChatHandler and
// GenerateHandler) and refuses them from every other model with 400
// "think value %q is not supported for this model" (IsThinkLevelRefusal),
// while true asks any thinking model to think.
func ThinkAsBool(body []byte) ([]byte, bool) {
	var top map[string]json.RawMessage
	if json.Unmarshal(body, &top) != nil {
		return body, false
	}
	var level string
	if json.Unmarshal(top["think"], &level) != nil || level == "" {
		return body, false
	}
	top["think"] = json.RawMessage(`true`)
	out, err := json.Marshal(top)
	if err != nil {
		return body, false
	}
	return out, true
}

// IsThinkLevelRefusal reports whether msg is Ollama's refusal of a think
// level by a model that takes booleans only (see ThinkAsBool).
func IsThinkLevelRefusal(msg string) bool {
	return strings.HasPrefix(msg, "think value ") && strings.HasSuffix(msg, " is not supported for this model")
}

// DropReasoningEffort returns body, an OpenAI chat completions request,
// without its "reasoning_effort" and "reasoning" fields, and whether it
// had either; without them, body comes back unchanged. Ollama's
// OpenAI-compatible API turns both into a think level, which it refuses
// from a model that takes booleans only (IsThinkLevelRefusal); without
// them such a model thinks as it does by default.
func DropReasoningEffort(body []byte) ([]byte, bool) {
	var top map[string]json.RawMessage
	if json.Unmarshal(body, &top) != nil {
		return body, false
	}
	_, effort := top["reasoning_effort"]
	_, reasoning := top["reasoning"]
	if !effort && !reasoning {
		return body, false
	}
	delete(top, "reasoning_effort")
	delete(top, "reasoning")
	out, err := json.Marshal(top)
	if err != nil {
		return body, false
	}
	return out, true
}
