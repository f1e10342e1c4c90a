package request

// Capabilities a request can need of its provider (contract.Request.Needs).
const (
	NeedTools  = "tools"
	NeedVision = "vision"
	// NeedChoices is a request for more than one choice ("n", or a
	// completion's "best_of", above 1). No provider declares it: the edge
	// finds it in tunnel-path (OpenAI-compatible) providers only, as Ollama
	// and command-line providers answer one choice per request.
	NeedChoices = "choices"
	// NeedToolChoice is a request whose tool use only an OpenAI-compatible
	// provider can keep to: parallel_tool_calls false without a forced
	// call (an Ollama provider serves a forced call, as one call, through
	// a format). Like NeedChoices, no provider declares it: tunnel-path
	// providers have it (the request reaches them as sent).
	NeedToolChoice = "tool_choice"
	// NeedRemoteImages is a request with an image given by an http(s)
	// URL: only a provider that fetches it itself (an OpenAI-compatible
	// one, on the tunnel path) can take it; iop fetches nothing for
	// Ollama providers.
	NeedRemoteImages = "remote_images"
	// NeedThinking is a request that asks the model to think: Ollama's
	// "think" true or a level, OpenAI's reasoning_effort (or
	// reasoning.effort) other than "none", or reasoning.enabled true. A
	// served model whose server said its capabilities (Ollama's /api/show)
	// has it only when they list "thinking": Ollama refuses think for any
	// other ("does not support thinking"), so such a request goes to a
	// provider whose model thinks.
	NeedThinking = "thinking"
	// NeedPromptBatch is a completions request with more than one prompt
	// (an array of strings or of token arrays): one request, several
	// answers. Ollama's /api/generate (and its own /v1/completions) takes
	// one prompt string, so like NeedChoices only tunnel-path providers
	// have it.
	NeedPromptBatch = "prompt_batch"
	// NeedTokenInput is a completions prompt or an embeddings input given
	// as token ids: Ollama takes text only (/api/generate a string,
	// /api/embed a string or strings), so only tunnel-path providers have
	// it.
	NeedTokenInput = "token_input"
	// NeedLogprobs is a request for log probabilities (chat's logprobs true
	// or top_logprobs, a completion's logprobs): the translation to
	// Ollama's API returns none, so only tunnel-path providers have it.
	NeedLogprobs = "logprobs"
	// NeedOllamaLogprobs is an Ollama client's request for log
	// probabilities (/api/chat's or /api/generate's logprobs true or
	// top_logprobs above 0): only a provider that speaks Ollama's API
	// returns them (the node relays them as they come).
	NeedOllamaLogprobs = "ollama_logprobs"
)
