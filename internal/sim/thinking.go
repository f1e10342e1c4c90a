package sim

import (
	"encoding/json"
	"fmt"
	"strings"
)

// The fields an OpenAI answer may carry its reasoning in (Config.ReasoningField).
const (
	// ReasoningContent is vLLM's and DeepSeek's name.
	ReasoningContent = "reasoning_content"
	// ReasoningPlain is the name Ollama's OpenAI API and OpenRouter use.
	ReasoningPlain = "reasoning"
)

// How many tokens a thinking model reasons for, by effort: Ollama's think
// levels and OpenAI's reasoning_effort ("minimal" and "xhigh" are
// OpenAI's only). Thinking true, or no setting at all, is medium.
const (
	thinkingMinimal = 2
	thinkingLow     = 4
	thinkingMedium  = 8
	thinkingHigh    = 16
)

// thinkingError is a request a model refuses for its think setting, worded
// as Ollama words it (its Error is the whole message); it is a 400.
type thinkingError struct{ msg string }

func (e *thinkingError) Error() string { return e.msg }
func (e *thinkingError) Unwrap() error { return errInvalidRequest }

// ollamaThinking is how many reasoning tokens the answer to an Ollama
// request starts with, following Ollama's server (v0.17.4, server/routes.go,
// ChatHandler and GenerateHandler): "think" is true, false, "low",
// "medium" or "high" (api.ThinkValue); a thinking model (Config.Thinking)
// thinks unless think is false (an unset think is true for it); a model
// that cannot think refuses think true ("%q does not support thinking");
// a level is taken only with Config.ThinkLevels (gpt-oss's harmony
// parser) and refused otherwise ("think value %q is not supported for
// this model"; chat checks the capability first, generate the level
// first). A raw generate prompt (no template) has no thinking.
func (s *Server) ollamaThinking(req request, chat bool) (int, error) {
	if len(req.think) == 0 || string(req.think) == "null" {
		if s.cfg.Thinking && !req.raw {
			return thinkingMedium, nil
		}
		return 0, nil
	}
	var on bool
	level := ""
	if json.Unmarshal(req.think, &on) != nil {
		if json.Unmarshal(req.think, &level) != nil || (level != "low" && level != "medium" && level != "high") {
			return 0, &thinkingError{fmt.Sprintf(`invalid think value: %s (must be "high", "medium", "low", true, or false)`, req.think)}
		}
		on = true
	}
	levelRefused := level != "" && !s.cfg.ThinkLevels
	if levelRefused && !chat {
		return 0, &thinkingError{fmt.Sprintf("think value %q is not supported for this model", level)}
	}
	if !s.cfg.Thinking {
		if on {
			return 0, &thinkingError{fmt.Sprintf("%q does not support thinking", req.model)}
		}
		return 0, nil
	}
	if levelRefused {
		return 0, &thinkingError{fmt.Sprintf("think value %q is not supported for this model", level)}
	}
	switch {
	case !on || req.raw:
		return 0, nil
	case level == "low":
		return thinkingLow, nil
	case level == "high":
		return thinkingHigh, nil
	}
	return thinkingMedium, nil
}

// openaiThinking is how many reasoning tokens the answer to an OpenAI
// chat request starts with: a thinking model reasons by default, as a
// reasoning model does, for as long as reasoning_effort (or
// reasoning.effort) says, and not at all for "none"; a model that cannot
// think ignores the setting, as vLLM does for one without a reasoning
// parser. A value outside OpenAI's set is refused, as OpenAI-compatible
// servers refuse it.
func (s *Server) openaiThinking(req request) (int, error) {
	n := thinkingMedium
	if req.effort != nil {
		switch *req.effort {
		case "none":
			n = 0
		case "minimal":
			n = thinkingMinimal
		case "low":
			n = thinkingLow
		case "medium":
		case "high", "xhigh":
			n = thinkingHigh
		default:
			return 0, fmt.Errorf(`%w: reasoning_effort %q: want "none", "minimal", "low", "medium", "high" or "xhigh"`, errInvalidRequest, *req.effort)
		}
	}
	if !s.cfg.Thinking {
		return 0, nil
	}
	return n, nil
}

// thinkingTokens is the reasoning of an answer: n words drawn, like its
// text, from the vocabulary by a PRNG seeded with (seed, prompt, key), so
// it is deterministic and differs from the text. Reasoning tokens come
// before the text, count in eval_count and completion_tokens and are paced
// like the others; a request's token limit applies to the text only.
func thinkingTokens(seed int64, prompt, key string, n int) []string {
	if n == 0 {
		return nil
	}
	rng := rngFor(seed, "\x00thinking\x00"+key+"\x00"+prompt)
	words := make([]string, n)
	for i := range words {
		words[i] = spacedVocabulary[rng.IntN(len(spacedVocabulary))]
	}
	return words
}

// reasoningMessage sets text as msg's reasoning under the configured
// field (Config.ReasoningField).
func (s *Server) reasoningMessage(msg *openaiMessage, text string) {
	if s.cfg.ReasoningField == ReasoningPlain {
		msg.Reasoning = &text
	} else {
		msg.ReasoningContent = &text
	}
}

func joinTokens(tokens []string) string { return strings.Join(tokens, "") }
