package sim

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strings"
)

// openaiRoutes registers the OpenAI-compatible API (OpenAI API reference),
// each route with and without the /v1 prefix.
func (s *Server) openaiRoutes(mux *http.ServeMux) {
	for _, prefix := range []string{"/v1", ""} {
		mux.HandleFunc("POST "+prefix+"/chat/completions", s.openaiGenerate(true))
		mux.HandleFunc("POST "+prefix+"/completions", s.openaiGenerate(false))
		mux.HandleFunc("POST "+prefix+"/embeddings", s.openaiEmbeddings)
		mux.Handle("GET "+prefix+"/models", s.guard(writeOpenAIError, s.openaiModels))
		mux.Handle("GET "+prefix+"/models/{model...}", s.guard(writeOpenAIError, s.openaiModel))
	}
	s.mediaRoutes(mux)
	mux.Handle("GET /stats", s.guard(writeOpenAIError, s.serveStats))
	// GET /health answers 200 with an empty body, as vLLM's server does
	// (llama.cpp's answers {"status":"ok"}): a managed provider's default
	// health URL.
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	mux.Handle("/", s.guard(writeOpenAIError, func(w http.ResponseWriter, r *http.Request) {
		s.fail(w, r, writeOpenAIError, fmt.Errorf("%w: %s %s", errNotFound, r.Method, r.URL.Path))
	}))
}

// openaiError is the body of every OpenAI error response:
// {"error":{"message","type","param","code"}}.
type openaiError struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

// writeOpenAIError writes err in the OpenAI error shape, with the type and
// code the OpenAI API uses for the status.
func writeOpenAIError(w http.ResponseWriter, _ *http.Request, status int, err error) {
	e := openaiError{Message: err.Error(), Type: "invalid_request_error"}
	str := func(s string) *string { return &s }
	switch status {
	case http.StatusUnauthorized:
		e.Code = str("invalid_api_key")
	case http.StatusNotFound:
		if errors.Is(err, errUnknownModel) {
			e.Param, e.Code = str("model"), str("model_not_found")
		}
	case http.StatusTooManyRequests:
		e.Type, e.Code = "requests", str("rate_limit_exceeded")
	}
	if status >= 500 {
		e.Type = "server_error"
	}
	writeJSON(w, status, map[string]openaiError{"error": e})
}

// openaiContent is a chat message's content: a string, an array of content
// parts (whose "text" parts are kept, joined by newlines) or null.
type openaiContent string

// UnmarshalJSON accepts the three shapes above.
func (c *openaiContent) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		*c = ""
		return nil
	}
	var text string
	if json.Unmarshal(b, &text) == nil {
		*c = openaiContent(text)
		return nil
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(b, &parts); err != nil {
		return fmt.Errorf("content: want a string or an array of content parts, got %.40s", b)
	}
	var texts []string
	for _, p := range parts {
		if p.Type == "text" {
			texts = append(texts, p.Text)
		}
	}
	*c = openaiContent(strings.Join(texts, "\n"))
	return nil
}

// openaiStreamOptions is "stream_options".
type openaiStreamOptions struct {
	// IncludeUsage asks for a last chunk with empty choices and usage.
	IncludeUsage bool `json:"include_usage"`
}

// openaiGenerateRequest is the body of POST /v1/chat/completions
// (Messages) and POST /v1/completions (Prompt). Other fields (temperature,
// seed, ...) are accepted and ignored.
type openaiGenerateRequest struct {
	Model    string `json:"model"`
	Messages []struct {
		Role    string        `json:"role"`
		Content openaiContent `json:"content"`
	} `json:"messages"`
	Prompt              *textInput            `json:"prompt"`
	Stream              bool                  `json:"stream"`
	StreamOptions       *openaiStreamOptions  `json:"stream_options"`
	MaxTokens           *int                  `json:"max_tokens"`
	MaxCompletionTokens *int                  `json:"max_completion_tokens"`
	N                   *int                  `json:"n"`
	Tools               []simTool             `json:"tools"`
	ToolChoice          toolChoice            `json:"tool_choice"`
	ResponseFormat      *openaiResponseFormat `json:"response_format"`
	ReasoningEffort     *string               `json:"reasoning_effort"`
	// Stop is "stop": a string or an array of strings (applyStop).
	Stop      json.RawMessage `json:"stop"`
	Reasoning *struct {
		Effort  *string `json:"effort"`
		Enabled *bool   `json:"enabled"`
	} `json:"reasoning"`
}

// parseOpenAIChat parses a POST /v1/chat/completions body.
func parseOpenAIChat(body []byte) (request, error) {
	var in openaiGenerateRequest
	if err := decodeJSON(body, &in); err != nil {
		return request{}, err
	}
	texts := make([]string, len(in.Messages))
	for i, m := range in.Messages {
		texts[i] = string(m.Content)
	}
	req, err := in.toRequest(strings.Join(texts, "\n"))
	if err == nil && len(in.Messages) == 0 {
		err = fmt.Errorf("%w: messages must not be empty", errInvalidRequest)
	}
	req.tools, req.toolChoice = in.Tools, in.ToolChoice
	if n := len(in.Messages); n > 0 && in.Messages[n-1].Role == "user" {
		req.lastUser = string(in.Messages[n-1].Content)
	}
	return req, err
}

// parseOpenAICompletion parses a POST /v1/completions body. The prompt is
// a string, strings, token ids or token-id arrays; more than one prompt is
// a batch (request.prompts), answered as OpenAI and vLLM do.
func parseOpenAICompletion(body []byte) (request, error) {
	var in openaiGenerateRequest
	if err := decodeJSON(body, &in); err != nil {
		return request{}, err
	}
	var prompt string
	if in.Prompt != nil && len(*in.Prompt) > 0 {
		prompt = (*in.Prompt)[0]
	}
	req, err := in.toRequest(prompt)
	switch {
	case err != nil:
	case in.Prompt == nil || len(*in.Prompt) == 0:
		err = fmt.Errorf("%w: prompt is required", errInvalidRequest)
	case len(*in.Prompt) > 1:
		req.prompts = *in.Prompt
	}
	return req, err
}

func (in openaiGenerateRequest) toRequest(prompt string) (request, error) {
	req := request{
		model:        in.Model,
		prompt:       prompt,
		maxTokens:    noLimit,
		stream:       in.Stream,
		includeUsage: in.StreamOptions != nil && in.StreamOptions.IncludeUsage,
		format:       openaiFormat(in.ResponseFormat),
	}
	if in.Model == "" {
		return req, fmt.Errorf("%w: model is required", errInvalidRequest)
	}
	if len(in.Stop) > 0 && string(in.Stop) != "null" {
		var one string
		if json.Unmarshal(in.Stop, &one) == nil {
			req.stop = []string{one}
		} else if json.Unmarshal(in.Stop, &req.stop) != nil {
			return req, fmt.Errorf("%w: stop must be a string or an array of strings", errInvalidRequest)
		}
	}
	req.effort = in.ReasoningEffort
	if rs := in.Reasoning; rs != nil {
		switch {
		case rs.Effort != nil:
			req.effort = rs.Effort // as Ollama's OpenAI API reads it: before reasoning_effort
		case rs.Enabled != nil:
			on, off := "medium", "none"
			req.effort = &on
			if !*rs.Enabled {
				req.effort = &off
			}
		}
	}
	if in.N != nil {
		if *in.N < 1 || *in.N > maxChoices {
			return req, fmt.Errorf("%w: n must be in 1-%d, got %d", errInvalidRequest, maxChoices, *in.N)
		}
		req.n = *in.N
	}
	for _, limit := range []struct {
		name  string
		value *int
	}{{"max_tokens", in.MaxTokens}, {"max_completion_tokens", in.MaxCompletionTokens}} {
		if limit.value == nil {
			continue
		}
		if *limit.value < 1 {
			return req, fmt.Errorf("%w: %s must be at least 1, got %d", errInvalidRequest, limit.name, *limit.value)
		}
		req.maxTokens = *limit.value // max_completion_tokens, checked last, wins
	}
	return req, nil
}

// openaiUsage is "usage": token counts of a request.
type openaiUsage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

// openaiMessage is an answer's "message" (non-streamed chat) or "delta"
// (streamed chat; role only on the first chunk, content absent on the
// last). A thinking model's reasoning is under ReasoningContent or
// Reasoning (Config.ReasoningField).
type openaiMessage struct {
	Role             string           `json:"role,omitempty"`
	Content          *string          `json:"content,omitempty"`
	ReasoningContent *string          `json:"reasoning_content,omitempty"`
	Reasoning        *string          `json:"reasoning,omitempty"`
	ToolCalls        []openaiToolCall `json:"tool_calls,omitempty"`
}

// openaiFullMessage is a non-streamed answer's "message": content null
// when the message only calls tools, and refusal null, as OpenAI answers
// (its OpenAPI document requires both).
type openaiFullMessage struct {
	openaiMessage
	Content *string `json:"content"`
	Refusal *string `json:"refusal"`
}

// openaiToolCall is one entry of a message's or delta's "tool_calls". A
// streamed call's first delta carries Index, ID, Type and the name with
// empty arguments; later deltas carry Index and the next piece of
// Function.Arguments only.
type openaiToolCall struct {
	Index    *int   `json:"index,omitempty"` // deltas only
	ID       string `json:"id,omitempty"`
	Type     string `json:"type,omitempty"` // "function"
	Function struct {
		Name      string `json:"name,omitempty"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

// openaiChoice is one entry of "choices". Chat answers carry Message or
// Delta, text completions Text.
type openaiChoice struct {
	Index        int                `json:"index"`
	Message      *openaiFullMessage `json:"message,omitempty"`
	Delta        *openaiMessage     `json:"delta,omitempty"`
	Text         *string            `json:"text,omitempty"`
	Logprobs     *struct{}          `json:"logprobs"`      // always null
	FinishReason *string            `json:"finish_reason"` // null until the last chunk
	// StopReason is vLLM's stop_reason: the stop sequence that ended the
	// choice, on its last chunk (left out when none did).
	StopReason *string `json:"stop_reason,omitempty"`
}

// openaiCompletion is a chat.completion, chat.completion.chunk or
// text_completion object (OpenAI API reference). Created is in Unix seconds.
type openaiCompletion struct {
	ID                string         `json:"id"`
	Object            string         `json:"object"`
	Created           int64          `json:"created"`
	Model             string         `json:"model"`
	SystemFingerprint string         `json:"system_fingerprint"`
	Choices           []openaiChoice `json:"choices"`
	Usage             *openaiUsage   `json:"usage,omitempty"`
}

// openaiAnswer is one choice of an answer: reasoning tokens (a thinking
// model's), then text tokens or a tool call.
type openaiAnswer struct {
	completion
	thoughts []string
	call     *toolCall
	id       string // the tool call's id
}

// stopReason is the choice's vLLM stop_reason: its stop sequence, or nil
// when none ended it (a tool call ends no stop sequence).
func (a openaiAnswer) stopReason() *string {
	if a.stopSequence == "" || a.call != nil {
		return nil
	}
	s := a.stopSequence
	return &s
}

// steps is the number of streamed chunks of output the choice has: one per
// reasoning token, then one per token, or for a tool call its first chunk
// (id and name) and one per piece of its arguments.
func (a openaiAnswer) steps() int {
	if a.call != nil {
		return len(a.thoughts) + 1 + len(a.call.pieces)
	}
	return len(a.thoughts) + len(a.tokens)
}

// completionTokens is the choice's share of usage.completion_tokens
// (reasoning included, as OpenAI counts it).
func (a openaiAnswer) completionTokens() int {
	if a.call != nil {
		return len(a.thoughts) + len(a.call.pieces)
	}
	return len(a.thoughts) + len(a.tokens)
}

// openaiGenerate returns the handler of POST /v1/chat/completions (chat)
// or POST /v1/completions. It answers "n" choices (default 1), each its own
// deterministic text; a chat request that meets chooseTool's rule, as its
// tool_choice allows (toolChoice.pick), is answered, in every choice, with
// a tool call (finish_reason "tool_calls").
//
// Non-streamed, it answers one chat.completion / text_completion object
// with usage. Streamed, it answers Server-Sent Events (text/event-stream),
// each "data: <chunk>\n\n" and flushed: for chat first a chunk with
// delta.role "assistant" per choice, then the output in rounds, each round
// one chunk per unfinished choice in index order (so choices interleave):
// a token, or a tool call's first delta (index, id, type, name, arguments
// "") and then its arguments in pieces of 4 characters; then one chunk
// with finish_reason per choice, then, if stream_options.include_usage, a
// chunk with empty choices and usage, then "data: [DONE]". A thinking
// model's chat answer starts each choice with its reasoning, a token per
// delta under Config.ReasoningField, and has it whole in the message of a
// non-streamed answer (openaiThinking says how long).
func (s *Server) openaiGenerate(chat bool) http.HandlerFunc {
	parse, object, chunkObject, idPrefix := parseOpenAICompletion, "text_completion", "text_completion", "cmpl"
	if chat {
		parse, object, chunkObject, idPrefix = parseOpenAIChat, "chat.completion", "chat.completion.chunk", "chatcmpl"
	}
	return func(w http.ResponseWriter, r *http.Request) {
		req, release, err := s.accept(w, r, parse)
		if err != nil {
			s.fail(w, r, writeOpenAIError, err)
			return
		}
		defer release()

		thinks := 0
		if chat {
			if thinks, err = s.openaiThinking(req); err != nil {
				s.fail(w, r, writeOpenAIError, err)
				return
			}
		}
		// A batch of prompts is answered as OpenAI and vLLM do: n choices
		// per prompt, choice index = prompt index * n + choice.
		prompts := []string{req.prompt}
		if !chat && len(req.prompts) > 1 {
			prompts = req.prompts
		}
		perPrompt := req.choices()
		answers := make([]openaiAnswer, len(prompts)*perPrompt)
		var tool *simTool
		if chat {
			if tool, err = req.toolChoice.pick(req.tools, req.lastUser); err != nil {
				s.fail(w, r, writeOpenAIError, err)
				return
			}
		}
		usage := &openaiUsage{}
		for i := range answers {
			one := req
			one.prompt = prompts[i/perPrompt]
			answers[i].completion = completeChoice(s.cfg.Seed, s.cfg.DefaultMaxTokens, one, i%perPrompt)
			answers[i].thoughts = thinkingTokens(s.cfg.Seed, req.prompt, fmt.Sprint(i), thinks)
			if chat && tool != nil {
				call := makeToolCall(s.cfg.Seed, tool, req.prompt)
				answers[i].call, answers[i].id = &call, toolCallID(req.seq, i)
				answers[i].finishReason, answers[i].tokens = finishToolCalls, nil
			}
			usage.CompletionTokens += answers[i].completionTokens()
		}
		for p := range prompts {
			usage.PromptTokens += answers[p*perPrompt].promptTokens
		}
		usage.TotalTokens = usage.PromptTokens + usage.CompletionTokens
		base := openaiCompletion{
			ID:                fmt.Sprintf("%s-sim-%d", idPrefix, req.seq),
			Object:            chunkObject,
			Created:           s.clock.Now().Unix(),
			Model:             req.model,
			SystemFingerprint: "fp_sim",
		}

		if !req.stream {
			steps := 0
			for _, a := range answers {
				steps = max(steps, a.steps())
			}
			s.paceSteps(r.Context(), req.prefill, steps, func(int) error { return nil })
			resp := base
			resp.Object, resp.Usage = object, usage
			for i, a := range answers {
				text := a.text()
				choice := openaiChoice{Index: i, FinishReason: &answers[i].finishReason, StopReason: answers[i].stopReason()}
				switch {
				case !chat:
					choice.Text = &text
				case a.call != nil:
					tc := openaiToolCall{ID: a.id, Type: "function"}
					tc.Function.Name, tc.Function.Arguments = a.call.name, a.call.arguments
					choice.Message = &openaiFullMessage{openaiMessage: openaiMessage{Role: "assistant", ToolCalls: []openaiToolCall{tc}}}
				default:
					choice.Message = &openaiFullMessage{openaiMessage: openaiMessage{Role: "assistant"}, Content: &text}
				}
				if chat && len(a.thoughts) > 0 {
					s.reasoningMessage(&choice.Message.openaiMessage, joinTokens(a.thoughts))
				}
				resp.Choices = append(resp.Choices, choice)
			}
			writeJSON(w, http.StatusOK, resp)
			return
		}

		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("Cache-Control", "no-cache")
		w.WriteHeader(http.StatusOK)
		send := func(v any) error {
			data, err := json.Marshal(v)
			if err != nil {
				return err
			}
			if _, err := fmt.Fprintf(w, "data: %s\n\n", data); err != nil {
				return err
			}
			return flush(w)
		}
		chunk := func(choice openaiChoice) openaiCompletion {
			out := base
			out.Choices = []openaiChoice{choice}
			return out
		}
		// The output in rounds: round k holds step k of every choice that
		// has one, in index order.
		type step struct{ choice, k int }
		var steps []step
		for k := 0; ; k++ {
			n := len(steps)
			for i, a := range answers {
				if k < a.steps() {
					steps = append(steps, step{i, k})
				}
			}
			if len(steps) == n {
				break
			}
		}
		failAfter := s.cfg.Faults.StreamErrorAfter
		if failAfter > 0 && failAfter < len(steps) {
			steps = steps[:failAfter]
		}
		empty, roleSent := "", !chat
		sendRoles := func() error {
			if roleSent {
				return nil
			}
			roleSent = true
			for i := range answers {
				if err := send(chunk(openaiChoice{Index: i, Delta: &openaiMessage{Role: "assistant", Content: &empty}})); err != nil {
					return err
				}
			}
			return nil
		}
		s.paceSteps(r.Context(), req.prefill, len(steps), func(j int) error {
			if err := sendRoles(); err != nil {
				return err
			}
			st := steps[j]
			a := answers[st.choice]
			choice := openaiChoice{Index: st.choice}
			k := st.k - len(a.thoughts) // the step within the text or call
			switch {
			case k < 0:
				choice.Delta = &openaiMessage{}
				s.reasoningMessage(choice.Delta, a.thoughts[st.k])
			case !chat:
				choice.Text = &a.tokens[k]
			case a.call != nil:
				index := 0
				tc := openaiToolCall{Index: &index}
				if k == 0 {
					tc.ID, tc.Type, tc.Function.Name = a.id, "function", a.call.name
				} else {
					tc.Function.Arguments = a.call.pieces[k-1]
				}
				choice.Delta = &openaiMessage{ToolCalls: []openaiToolCall{tc}}
			default:
				choice.Delta = &openaiMessage{Content: &a.tokens[k]}
			}
			return send(chunk(choice))
		})
		if sendRoles() != nil {
			return
		}
		if failAfter > 0 {
			e := openaiError{Message: errStreamFault.Error(), Type: "server_error"}
			if send(map[string]openaiError{"error": e}) != nil {
				return
			}
			fmt.Fprint(w, "data: [DONE]\n\n")
			flush(w)
			return
		}
		for i := range answers {
			last := openaiChoice{Index: i, FinishReason: &answers[i].finishReason, StopReason: answers[i].stopReason()}
			if chat {
				last.Delta = &openaiMessage{}
			} else {
				last.Text = &empty
			}
			if send(chunk(last)) != nil {
				return
			}
		}
		if req.includeUsage {
			u := base
			u.Choices, u.Usage = []openaiChoice{}, usage
			if send(u) != nil {
				return
			}
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
		flush(w)
	}
}

// openaiEmbeddingsRequest is the body of POST /v1/embeddings.
type openaiEmbeddingsRequest struct {
	Model          string    `json:"model"`
	Input          textInput `json:"input"`
	EncodingFormat string    `json:"encoding_format"` // "float" (default) or "base64"
	Dimensions     int       `json:"dimensions"`
}

// parseOpenAIEmbeddings parses a POST /v1/embeddings body.
func parseOpenAIEmbeddings(body []byte) (request, error) {
	var in openaiEmbeddingsRequest
	if err := decodeJSON(body, &in); err != nil {
		return request{}, err
	}
	req := request{model: in.Model, inputs: in.Input, dimensions: in.Dimensions, base64: in.EncodingFormat == "base64"}
	switch {
	case in.Model == "":
		return req, fmt.Errorf("%w: model is required", errInvalidRequest)
	case len(in.Input) == 0:
		return req, fmt.Errorf("%w: input must not be empty", errInvalidRequest)
	case in.EncodingFormat != "" && in.EncodingFormat != "float" && in.EncodingFormat != "base64":
		return req, fmt.Errorf("%w: encoding_format %q: want \"float\" or \"base64\"", errInvalidRequest, in.EncodingFormat)
	}
	return req, checkDimensions(in.Dimensions)
}

// openaiEmbedding is one entry of an embeddings response's "data".
// Embedding is []float32, or with encoding_format "base64" the base64 of
// the little-endian float32 components.
type openaiEmbedding struct {
	Object    string `json:"object"` // "embedding"
	Index     int    `json:"index"`
	Embedding any    `json:"embedding"`
}

// openaiEmbeddings answers POST /v1/embeddings with {"object":"list",
// "data":[{"object":"embedding","index","embedding"}],"model","usage"}.
// Vectors are L2-normalized, 8 components unless "dimensions" is set.
func (s *Server) openaiEmbeddings(w http.ResponseWriter, r *http.Request) {
	req, release, err := s.accept(w, r, parseOpenAIEmbeddings)
	if err != nil {
		s.fail(w, r, writeOpenAIError, err)
		return
	}
	defer release()
	if s.wait(r.Context(), s.cfg.TTFT) != nil {
		abortConnection()
	}
	vectors, promptTokens := embedAll(s.cfg.Seed, req)
	data := make([]openaiEmbedding, len(vectors))
	for i, v := range vectors {
		data[i] = openaiEmbedding{Object: "embedding", Index: i, Embedding: v}
		if req.base64 {
			data[i].Embedding = encodeFloat32s(v)
		}
	}
	writeJSON(w, http.StatusOK, struct {
		Object string            `json:"object"` // "list"
		Data   []openaiEmbedding `json:"data"`
		Model  string            `json:"model"`
		Usage  map[string]int    `json:"usage"` // prompt_tokens, total_tokens
	}{"list", data, req.model, map[string]int{"prompt_tokens": promptTokens, "total_tokens": promptTokens}})
}

// encodeFloat32s is the base64 of v's little-endian float32 components.
func encodeFloat32s(v []float32) string {
	buf := make([]byte, 0, 4*len(v))
	for _, f := range v {
		buf = binary.LittleEndian.AppendUint32(buf, math.Float32bits(f))
	}
	return base64.StdEncoding.EncodeToString(buf)
}

// openaiModelObject is a model object (OpenAI API reference, "The model
// object"). Created is in Unix seconds.
type openaiModelObject struct {
	ID      string `json:"id"`
	Object  string `json:"object"` // "model"
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
}

func openaiModelFor(name string) openaiModelObject {
	return openaiModelObject{ID: name, Object: "model", Created: modelsModifiedAt.Unix(), OwnedBy: "iop-sim"}
}

// openaiModels answers GET /v1/models: {"object":"list","data":[model...]}.
func (s *Server) openaiModels(w http.ResponseWriter, _ *http.Request) {
	served := s.servedModels()
	data := make([]openaiModelObject, len(served))
	for i, m := range served {
		data[i] = openaiModelFor(m.name)
	}
	writeJSON(w, http.StatusOK, struct {
		Object string              `json:"object"` // "list"
		Data   []openaiModelObject `json:"data"`
	}{"list", data})
}

// openaiModel answers GET /v1/models/{model} with one model object, or 404.
func (s *Server) openaiModel(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("model")
	if !s.serves(name) {
		s.fail(w, r, writeOpenAIError, fmt.Errorf("%w: %q", errUnknownModel, name))
		return
	}
	writeJSON(w, http.StatusOK, openaiModelFor(name))
}
