package request

import (
	"iop/internal/jsonvalue"
	"math"
	"strings"
)

// completionRequest is what the API reads from a legacy completions request
// body (OpenAI API reference, "Create completion"). Everything else travels
// to the provider untouched.
type completionRequest struct {
	Model        string
	Stream       bool
	IncludeUsage bool
	// EstimatedInputTokens is the prompt's token ids plus its characters / 4.
	EstimatedInputTokens int
	// Needs are NeedPromptBatch for more than one prompt, NeedTokenInput
	// for a prompt of token ids, NeedChoices for n or best_of above 1, in
	// that order; empty for one prompt string and one choice.
	Needs []string
	// ollama is the body's translate.ExtensionKey member.
	ollama ollamaMember
}

// decodeCompletionRequest reads and checks a completions request body, so a
// request every provider would reject is answered 400 before it waits in a
// queue. Checked values (absent or null is allowed unless said otherwise):
//
//	model                    a non-empty string, required
//	prompt                   required: a string, an array of strings, an array
//	                         of token ids or an array of token id arrays
//	                         (textInputOf)
//	stream, echo             booleans
//	stream_options           an object; include_usage a boolean
//	suffix, user             strings
//	max_tokens               an integer in [1, 2147483647]
//	n, best_of               integers in [1, 128]
//	logprobs                 an integer in [0, 5]
//	seed                     an integer in the int64 range
//	temperature, top_p,      numbers that fit a float64
//	presence_penalty,
//	frequency_penalty
//	stop                     a string, or an array of at most 4 strings
//
// More than one prompt makes the request need "prompt_batch", a prompt of
// token ids "token_input", and n or best_of above 1 "choices": only
// tunnel-path providers have them (Ollama takes one prompt string and
// answers one choice), so such a request goes only to them, or is answered
// 400 when no provider of the model is one. Whether a provider can honour echo, suffix
// and logprobs is the provider's to say: the tunnel path passes them on;
// the normalized path (Ollama) answers 400 naming the field it cannot
// honour (echo, logprobs). Errors are *FieldError naming the field.
func decodeCompletionRequest(body []byte) (completionRequest, error) {
	top, err := parseBody(body)
	if err != nil {
		return completionRequest{}, err
	}
	var req completionRequest
	if req.Model, err = modelOf(top); err != nil {
		return completionRequest{}, err
	}
	prompt, err := textInputOf(top.Get("prompt"), "prompt", false)
	if err != nil {
		return completionRequest{}, err
	}
	req.EstimatedInputTokens = prompt.estimatedTokens()
	req.Needs = prompt.needs(true)
	if req.Stream, err = boolOf(top.Get("stream"), "stream"); err != nil {
		return completionRequest{}, err
	}
	if req.IncludeUsage, err = includeUsageOf(top); err != nil {
		return completionRequest{}, err
	}
	if err := checkType(top.Get("echo"), "echo", WantBool); err != nil {
		return completionRequest{}, err
	}
	for _, name := range []string{"suffix", "user"} {
		if err := checkType(top.Get(name), name, WantString); err != nil {
			return completionRequest{}, err
		}
	}
	for _, f := range []struct {
		name     string
		min, max int64
	}{
		{"max_tokens", 1, math.MaxInt32},
		{"n", 1, maxChoices},
		{"best_of", 1, maxChoices},
		{"logprobs", 0, 5},
		{"seed", math.MinInt64, math.MaxInt64},
	} {
		if err := checkInteger(top.Get(f.name), f.name, f.min, f.max); err != nil {
			return completionRequest{}, err
		}
	}
	for _, name := range []string{"temperature", "top_p", "presence_penalty", "frequency_penalty"} {
		if err := checkNumber(top.Get(name), name); err != nil {
			return completionRequest{}, err
		}
	}
	if err := checkStop(top.Get("stop")); err != nil {
		return completionRequest{}, err
	}
	if severalChoicesOf(top.Get("n")) || severalChoicesOf(top.Get("best_of")) {
		req.Needs = append(req.Needs, NeedChoices)
	}
	if !top.Get("logprobs").Absent() {
		req.Needs = append(req.Needs, NeedLogprobs)
	}
	req.ollama = ollamaMemberOf(top)
	return req, nil
}

// modelOf reads the required, non-empty "model".
func modelOf(top *jsonvalue.Value) (string, error) {
	model, err := stringOf(top.Get("model"), "model")
	if err != nil {
		return "", err
	}
	if strings.TrimSpace(model) == "" {
		return "", &FieldError{Field: "model", Message: "you must provide a model parameter"}
	}
	return model, nil
}

// includeUsageOf reads "stream_options.include_usage".
func includeUsageOf(top *jsonvalue.Value) (bool, error) {
	opts := top.Get("stream_options")
	if err := checkType(opts, "stream_options", WantObject); err != nil {
		return false, err
	}
	return boolOf(opts.Get("include_usage"), "stream_options.include_usage")
}
