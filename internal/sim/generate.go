package sim

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Finish reasons, shared by both protocols (OpenAI finish_reason, Ollama
// done_reason).
const (
	finishStop   = "stop"
	finishLength = "length"
	// finishToolCalls is OpenAI's finish_reason of an answer that calls a
	// tool (Ollama reports done_reason "stop" for it, as Ollama does).
	finishToolCalls = "tool_calls"
)

// maxChoices bounds OpenAI's "n" (the OpenAI API allows 1-128).
const maxChoices = 128

// noLimit is request.maxTokens when the request sets no token limit.
const noLimit = -1

// request is a generation or embedding request after a protocol's parser
// has read it; every protocol-specific field the simulator honours is here.
type request struct {
	model        string
	prompt       string   // all prompt text, the output is derived from it
	prompts      []string // an OpenAI completions batch of more than one prompt, else nil
	inputs       []string // embedding inputs, one vector each
	maxTokens    int      // noLimit, or >= 0 tokens
	dimensions   int      // embedding length; 0 = embedDims
	stream       bool
	includeUsage bool // OpenAI stream_options.include_usage
	base64       bool // OpenAI embeddings encoding_format "base64"
	loadOnly     bool // Ollama: no prompt at all, the request only loads the model
	unload       bool // Ollama: loadOnly with keep_alive 0: the request unloads it
	// keepAlive is Ollama's keep_alive of the request (negative: for
	// ever), nil when it sets none; it becomes the model's (resident).
	keepAlive *time.Duration
	seq       uint64 // admission number, set by Server.accept; makes ids unique
	// prefill is the time its uncached prompt tokens take (Server.prefill),
	// set by Server.accept; it adds to Config.TTFT.
	prefill time.Duration
	// load is how long it waited for its model to load (residency), set
	// by Server.accept: Ollama's load_duration.
	load time.Duration
	n    int // OpenAI "n": choices to answer; 0 means 1
	// tools are the function tools the request defines and lastUser the
	// text of its last message if that is a user message: together they
	// decide whether the answer is a tool call (see chooseTool).
	tools    []simTool
	lastUser string
	// toolChoice is an OpenAI request's tool_choice ("" when absent).
	toolChoice toolChoice
	// think is an Ollama request's "think" (nil: absent), raw its generate
	// "raw" flag, and effort an OpenAI request's reasoning effort
	// (reasoning_effort, or reasoning.effort; nil: none set): together
	// they decide whether and how long the answer reasons (thinking.go).
	think  json.RawMessage
	raw    bool
	effort *string
	// format is the JSON the request asks for (structured output): a
	// JSON schema, jsonAny, or nil for text (openaiFormat, ollamaFormat).
	format json.RawMessage
	// logprobs and topLogprobs are an Ollama request's "logprobs" and
	// "top_logprobs": the answer then carries each token's log
	// probability (simLogprobs).
	logprobs    bool
	topLogprobs int
	// stop are the request's stop sequences (OpenAI "stop", Ollama
	// "options.stop"): the answer ends before the first one its text
	// contains (applyStop).
	stop []string
}

// choices is the number of choices to answer, at least 1.
func (r request) choices() int { return max(r.n, 1) }

// completion is the deterministic answer to a request.
type completion struct {
	tokens       []string // each a word with a leading space
	promptTokens int
	finishReason string // finishStop or finishLength
	// stopSequence is the stop sequence that ended the answer, if one
	// did (applyStop).
	stopSequence string
}

func (c completion) text() string { return strings.Join(c.tokens, "") }

// spacedVocabulary is vocabulary's words each after a space, as answer
// tokens are: a long answer (a million tokens) allocates no string per
// token.
var spacedVocabulary = func() (out [len(vocabulary)]string) {
	for i, w := range vocabulary {
		out[i] = " " + w
	}
	return out
}()

// vocabulary is the fixed set of words answers are made of.
var vocabulary = [...]string{
	"the", "a", "model", "token", "gateway", "request", "stream", "answer",
	"quick", "brown", "fox", "jumps", "over", "lazy", "dog", "and",
	"of", "to", "in", "is", "it", "that", "for", "on",
	"simulated", "inference", "server", "latency", "batch", "cache", "prompt", "reply",
	"blue", "green", "red", "river", "mountain", "cloud", "light", "stone",
	"runs", "sees", "makes", "takes", "gives", "finds", "keeps", "holds",
	"always", "never", "often", "slowly", "quickly", "here", "there", "now",
	"one", "two", "three", "many", "few", "every", "some", "all",
}

// countWords is the simulator's tokenizer: the number of whitespace
// separated words in text.
func countWords(text string) int { return len(strings.Fields(text)) }

// rngFor returns a PRNG determined by seed and text.
func rngFor(seed int64, text string) *rand.Rand {
	h := fnv.New64a()
	h.Write([]byte(text))
	return rand.New(rand.NewPCG(uint64(seed), h.Sum64()))
}

// complete generates the answer to req: defaultTokens words, each with a
// leading space, drawn from vocabulary by a PRNG seeded with (seed, the
// prompt), cut to req.maxTokens (max_tokens, max_completion_tokens,
// options.num_predict; finish reason "length") when that is lower. Other
// sampling parameters are accepted and ignored.
func complete(seed int64, defaultTokens int, req request) completion {
	return completeFrom(rngFor(seed, req.prompt), defaultTokens, req)
}

// completeFrom is complete with the words drawn from rng. A request for
// JSON (req.format) is answered with a JSON document of its schema
// (structuredAnswer), of whatever length it has, cut only by the
// request's own token limit.
func completeFrom(rng *rand.Rand, defaultTokens int, req request) completion {
	if req.format != nil {
		tokens, reason := structuredAnswer(rng, req.format), finishStop
		if req.maxTokens != noLimit && req.maxTokens < len(tokens) {
			tokens, reason = tokens[:req.maxTokens], finishLength
		}
		return applyStop(completion{tokens: tokens, promptTokens: countWords(req.prompt), finishReason: reason}, req.stop)
	}
	n, reason := defaultTokens, finishStop
	if req.maxTokens != noLimit && req.maxTokens < n {
		n, reason = req.maxTokens, finishLength
	}
	tokens := make([]string, n)
	for i := range tokens {
		tokens[i] = spacedVocabulary[rng.IntN(len(spacedVocabulary))]
	}
	return applyStop(completion{tokens: tokens, promptTokens: countWords(req.prompt), finishReason: reason}, req.stop)
}

// applyStop ends c at the first of stops its text contains, the one
// that ends first as generation goes (of two that end at one byte, the
// longer), as Ollama v0.17.4 and vLLM stop at the first completed: the
// text before it stays, the stop sequence and everything after it go,
// the finish reason is "stop" and c.stopSequence names it. Empty stop
// sequences match nothing.
func applyStop(c completion, stops []string) completion {
	if len(stops) == 0 {
		return c
	}
	text := c.text()
	at, end, matched := -1, -1, ""
	for _, s := range stops {
		i := strings.Index(text, s)
		if s == "" || i < 0 {
			continue
		}
		if e := i + len(s); end < 0 || e < end || e == end && i < at {
			at, end, matched = i, e, s
		}
	}
	if at < 0 {
		return c
	}
	kept, pos := []string{}, 0
	for _, t := range c.tokens {
		if pos+len(t) > at {
			if pos < at {
				kept = append(kept, t[:at-pos])
			}
			break
		}
		kept = append(kept, t)
		pos += len(t)
	}
	c.tokens, c.finishReason, c.stopSequence = kept, finishStop, matched
	return c
}

// embedDims is the default length of an embedding vector.
const embedDims = 8

// maxEmbedDims bounds the requested embedding length.
const maxEmbedDims = 4096

// embed returns a deterministic L2-normalized vector of dims components
// derived from seed and text.
func embed(seed int64, text string, dims int) []float32 {
	rng := rngFor(seed, text)
	v := make([]float64, dims)
	var norm float64
	for i := range v {
		v[i] = rng.NormFloat64()
		norm += v[i] * v[i]
	}
	norm = math.Sqrt(norm)
	out := make([]float32, dims)
	for i := range v {
		if norm > 0 {
			out[i] = float32(v[i] / norm)
		}
	}
	return out
}

// embedAll embeds every input of req and counts their tokens.
func embedAll(seed int64, req request) (vectors [][]float32, promptTokens int) {
	dims := req.dimensions
	if dims == 0 {
		dims = embedDims
	}
	vectors = make([][]float32, len(req.inputs))
	for i, in := range req.inputs {
		vectors[i] = embed(seed, in, dims)
		promptTokens += countWords(in)
	}
	return vectors, promptTokens
}

// pace delivers c's tokens to send as a model server would: it waits
// Config.TTFT before the first token and the token interval before each
// later one. If the request's context ends (the client went away or the
// server is stopping) or send fails, it closes the connection with
// abortConnection, so no partial answer ever looks complete. With
// Faults.DropAfter set it does the same after that many tokens.
func (s *Server) pace(ctx context.Context, c completion, send func(token string) error) {
	s.paceSteps(ctx, 0, len(c.tokens), func(i int) error { return send(c.tokens[i]) })
}

// paceSteps is pace for an answer of steps pieces of output (tokens of
// several choices, pieces of a tool call), delivered by send(0),
// send(1), ... in order. The first waits Config.TTFT plus prefill (the
// request's uncached prompt tokens, Server.prefill).
func (s *Server) paceSteps(ctx context.Context, prefill time.Duration, steps int, send func(step int) error) {
	drop := s.cfg.Faults.DropAfter
	if s.wait(ctx, s.cfg.TTFT+prefill) != nil {
		s.cancelled()
		abortConnection()
	}
	for i := range steps {
		if drop > 0 && i == drop {
			abortConnection()
		}
		if i > 0 && s.wait(ctx, s.cfg.tokenInterval()) != nil {
			s.cancelled()
			abortConnection()
		}
		if send(i) != nil {
			s.cancelled()
			abortConnection()
		}
		s.countToken()
	}
	if drop > 0 {
		abortConnection()
	}
}

// completeChoice is complete for choice i of a request answering several
// (OpenAI "n"): choice 0 is complete's answer, later ones are drawn from a
// PRNG seeded with the prompt and the index, so each choice differs and all
// are deterministic. Streamed, the choices are interleaved token by token.
func completeChoice(seed int64, defaultTokens int, req request, i int) completion {
	key := req.prompt
	if i > 0 {
		key = fmt.Sprintf("%s\x00choice %d", req.prompt, i)
	}
	return completeFrom(rngFor(seed, key), defaultTokens, req)
}

// abortConnection ends the current handler and makes net/http close the
// connection without completing the response (for HTTP/1.1, no final
// chunk), by panicking with http.ErrAbortHandler. Deferred calls, such as
// the release of the in-flight slot, still run.
func abortConnection() {
	panic(http.ErrAbortHandler)
}

// wait blocks for d on the clock, or until ctx is done.
func (s *Server) wait(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	elapsed := make(chan struct{})
	t := s.clock.AfterFunc(d, func() { close(elapsed) })
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-elapsed:
		return nil
	}
}

// textInput is a prompt or embedding input as the OpenAI and Ollama APIs
// accept it: a string, an array of strings, an array of token ids or an
// array of token-id arrays. Token ids are kept as space-separated decimal
// words, so each id counts as one token.
type textInput []string

// UnmarshalJSON accepts the four shapes above; null leaves the input empty.
func (t *textInput) UnmarshalJSON(b []byte) error {
	var (
		one    string
		many   []string
		ids    []int64
		idRows [][]int64
	)
	switch {
	case string(b) == "null":
		*t = nil
	case json.Unmarshal(b, &one) == nil:
		*t = textInput{one}
	case json.Unmarshal(b, &many) == nil:
		*t = many
	case json.Unmarshal(b, &ids) == nil:
		*t = textInput{joinIDs(ids)}
	case json.Unmarshal(b, &idRows) == nil:
		*t = make(textInput, len(idRows))
		for i, row := range idRows {
			(*t)[i] = joinIDs(row)
		}
	default:
		return fmt.Errorf("want a string, an array of strings or an array of token ids, got %.40s", b)
	}
	return nil
}

func joinIDs(ids []int64) string {
	words := make([]string, len(ids))
	for i, id := range ids {
		words[i] = strconv.FormatInt(id, 10)
	}
	return strings.Join(words, " ")
}

// decodeJSON unmarshals a request body into v, wrapping failures in
// errInvalidRequest.
func decodeJSON(body []byte, v any) error {
	if err := json.Unmarshal(body, v); err != nil {
		return fmt.Errorf("%w: %w", errInvalidRequest, err)
	}
	return nil
}

// checkDimensions validates a requested embedding length (0 = default).
func checkDimensions(d int) error {
	if d < 0 || d > maxEmbedDims {
		return fmt.Errorf("%w: dimensions %d: must be in 1-%d", errInvalidRequest, d, maxEmbedDims)
	}
	return nil
}
