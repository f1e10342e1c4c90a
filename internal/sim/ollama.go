package sim

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"
)

// OllamaVersion is what GET /api/version reports.
const OllamaVersion = "0.17.4"

// modelsModifiedAt is the modification time listed for every configured
// model (Config.Models); one added later has the time it was added.
var modelsModifiedAt = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

// ollamaRoutes registers the Ollama API (Ollama API doc, docs.ollama.com/api).
func (s *Server) ollamaRoutes(mux *http.ServeMux) {
	mux.HandleFunc("POST /api/chat", s.ollamaGenerate(true))
	mux.HandleFunc("POST /api/generate", s.ollamaGenerate(false))
	mux.HandleFunc("POST /api/embed", s.ollamaEmbed(false))
	mux.HandleFunc("POST /api/embeddings", s.ollamaEmbed(true))
	mux.Handle("GET /api/tags", s.guard(writeOllamaError, s.ollamaTags))
	mux.Handle("GET /api/ps", s.guard(writeOllamaError, s.ollamaPS))
	mux.Handle("POST /api/show", s.guard(writeOllamaError, s.ollamaShow))
	mux.Handle("GET /api/version", s.guard(writeOllamaError, func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"version": OllamaVersion})
	}))
	mux.Handle("GET /{$}", s.guard(writeOllamaError, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		io.WriteString(w, "Ollama is running")
	}))
	mux.Handle("GET /stats", s.guard(writeOllamaError, s.serveStats))
	mux.Handle("/", s.guard(writeOllamaError, func(w http.ResponseWriter, r *http.Request) {
		s.fail(w, r, writeOllamaError, fmt.Errorf("%w: %s %s", errNotFound, r.Method, r.URL.Path))
	}))
}

// writeOllamaError writes Ollama's error shape: {"error": "<message>"}.
func writeOllamaError(w http.ResponseWriter, _ *http.Request, status int, err error) {
	writeJSON(w, status, map[string]string{"error": err.Error()})
}

// ollamaMessage is a chat message (Ollama API doc, /api/chat "messages").
// Fields the simulator does not use (images) are accepted and dropped;
// ToolCalls are read from requests and written in answers; Thinking is
// written in answers of a thinking model (and read, unused, from an
// earlier answer in the request).
type ollamaMessage struct {
	Role      string           `json:"role"`
	Content   string           `json:"content"`
	Thinking  string           `json:"thinking,omitempty"`
	ToolCalls []ollamaToolCall `json:"tool_calls,omitempty"`
}

// ollamaToolCall is one entry of a message's "tool_calls": Ollama sends a
// whole call at once, its arguments as a JSON object (not a string) and
// without an id.
type ollamaToolCall struct {
	Function struct {
		Name      string          `json:"name"`
		Arguments json.RawMessage `json:"arguments"`
	} `json:"function"`
}

// ollamaOptions are the model options the simulator honours.
type ollamaOptions struct {
	// NumPredict limits the tokens generated; < 0 means no limit.
	NumPredict *int `json:"num_predict"`
	// Stop are the stop sequences (applyStop).
	Stop []string `json:"stop"`
}

// ollamaGenerateRequest is the body of POST /api/chat (Messages) and
// POST /api/generate (Prompt, System). Stream defaults to true.
type ollamaGenerateRequest struct {
	Model    string          `json:"model"`
	Messages []ollamaMessage `json:"messages"`
	Prompt   string          `json:"prompt"`
	System   string          `json:"system"`
	Stream   *bool           `json:"stream"`
	Options  ollamaOptions   `json:"options"`
	Tools    []simTool       `json:"tools"`
	Think    json.RawMessage `json:"think"`
	Raw      bool            `json:"raw"`
	// Format asks for JSON: "json" or a JSON schema (structured output).
	Format json.RawMessage `json:"format"`
	// Logprobs and TopLogprobs ask for the tokens' log probabilities.
	Logprobs    bool `json:"logprobs"`
	TopLogprobs int  `json:"top_logprobs"`
	// KeepAlive 0 ("0", "0s") with no prompt unloads the model.
	KeepAlive json.RawMessage `json:"keep_alive"`
}

// keepAliveZero reports whether keep_alive says 0: 0, "0", or a duration
// of 0 ("0s", "0m").
func keepAliveZero(v json.RawMessage) bool {
	var n float64
	if json.Unmarshal(v, &n) == nil {
		return n == 0 && len(v) > 0
	}
	var str string
	if json.Unmarshal(v, &str) != nil {
		return false
	}
	if str == "0" {
		return true
	}
	d, err := time.ParseDuration(str)
	return err == nil && d == 0
}

// keepAliveOf reads keep_alive as Ollama does (api.Duration): a number
// of seconds or a duration string; negative keeps the model loaded for
// ever. nil when absent or unreadable.
func keepAliveOf(v json.RawMessage) *time.Duration {
	var d time.Duration
	var n float64
	var str string
	switch {
	case len(v) == 0:
		return nil
	case json.Unmarshal(v, &n) == nil:
		d = time.Duration(n * float64(time.Second))
	case json.Unmarshal(v, &str) == nil:
		var err error
		if d, err = time.ParseDuration(str); err != nil {
			return nil
		}
	default:
		return nil
	}
	if d < 0 {
		d = -1
	}
	return &d
}

// parseOllamaChat parses a POST /api/chat body.
func parseOllamaChat(body []byte) (request, error) {
	var in ollamaGenerateRequest
	if err := decodeJSON(body, &in); err != nil {
		return request{}, err
	}
	texts := make([]string, len(in.Messages))
	for i, m := range in.Messages {
		texts[i] = m.Content
	}
	req, err := in.toRequest(strings.Join(texts, "\n"), len(in.Messages) == 0)
	req.tools = in.Tools
	if n := len(in.Messages); n > 0 && in.Messages[n-1].Role == "user" {
		req.lastUser = in.Messages[n-1].Content
	}
	return req, err
}

// parseOllamaGenerate parses a POST /api/generate body.
func parseOllamaGenerate(body []byte) (request, error) {
	var in ollamaGenerateRequest
	if err := decodeJSON(body, &in); err != nil {
		return request{}, err
	}
	prompt := in.Prompt
	if in.System != "" {
		prompt = in.System + "\n" + prompt
	}
	return in.toRequest(prompt, in.Prompt == "")
}

func (in ollamaGenerateRequest) toRequest(prompt string, loadOnly bool) (request, error) {
	req := request{
		model:     in.Model,
		prompt:    prompt,
		maxTokens: noLimit,
		stream:    in.Stream == nil || *in.Stream,
		loadOnly:  loadOnly,
		unload:    loadOnly && keepAliveZero(in.KeepAlive),
		keepAlive: keepAliveOf(in.KeepAlive),
		think:     in.Think,
		raw:       in.Raw,
		format:    ollamaFormat(in.Format),
		// Ollama returns logprobs for top_logprobs above 0 even without
		// logprobs.
		logprobs:    in.Logprobs || in.TopLogprobs > 0,
		topLogprobs: in.TopLogprobs,
	}
	if in.Model == "" {
		return req, fmt.Errorf("%w: model is required", errInvalidRequest)
	}
	if in.TopLogprobs < 0 || in.TopLogprobs > 20 {
		// Ollama's own text and status (GenerateHandler, ChatHandler).
		return req, fmt.Errorf("%w: top_logprobs must be between 0 and 20", errInvalidRequest)
	}
	if n := in.Options.NumPredict; n != nil && *n >= 0 {
		req.maxTokens = *n
	}
	req.stop = in.Options.Stop
	return req, nil
}

// ollamaResponse is one line of an /api/chat or /api/generate stream, or
// the whole non-streamed answer (Ollama API doc). Chat answers carry
// Message, generate answers Response. Durations are in nanoseconds; they
// are set on the final (Done) object only.
type ollamaResponse struct {
	Model              string         `json:"model"`
	CreatedAt          string         `json:"created_at"` // RFC 3339, UTC
	Message            *ollamaMessage `json:"message,omitempty"`
	Response           *string        `json:"response,omitempty"`
	Thinking           string         `json:"thinking,omitempty"` // generate; chat's is in Message
	Done               bool           `json:"done"`
	DoneReason         string         `json:"done_reason,omitempty"` // "stop", "length" or "load"
	TotalDuration      int64          `json:"total_duration,omitempty"`
	LoadDuration       int64          `json:"load_duration,omitempty"`
	PromptEvalCount    int            `json:"prompt_eval_count,omitempty"`
	PromptEvalDuration int64          `json:"prompt_eval_duration,omitempty"`
	EvalCount          int            `json:"eval_count,omitempty"`
	EvalDuration       int64          `json:"eval_duration,omitempty"`
	Logprobs           []simLogprob   `json:"logprobs,omitempty"`
}

// simLogprob is one token's log probability in Ollama's shape (api.Logprob;
// an alternative, api.TokenLogprob, has no top_logprobs).
type simLogprob struct {
	Token       string       `json:"token"`
	Logprob     float64      `json:"logprob"`
	Bytes       []int        `json:"bytes,omitempty"`
	TopLogprobs []simLogprob `json:"top_logprobs,omitempty"`
}

// simLogprobs returns the log probability of each of tokens, as Ollama
// answers logprobs: a value ≤ 0 derived from the token and its position,
// the token's bytes, and, for top > 0, top alternatives most likely first,
// the token itself the first of them.
func simLogprobs(tokens []string, top int) []simLogprob {
	out := make([]simLogprob, len(tokens))
	for i, tok := range tokens {
		h := fnv.New32a()
		fmt.Fprintf(h, "%d:%s", i, tok)
		lp := -float64(h.Sum32()%1000) / 1000
		out[i] = simLogprob{Token: tok, Logprob: lp, Bytes: tokenBytes(tok)}
		for j := range top {
			alt := simLogprob{Token: tok, Logprob: lp, Bytes: tokenBytes(tok)}
			if j > 0 {
				alt.Token = fmt.Sprintf(" alt%d", j)
				alt.Logprob, alt.Bytes = lp-float64(j), tokenBytes(alt.Token)
			}
			out[i].TopLogprobs = append(out[i].TopLogprobs, alt)
		}
	}
	return out
}

// tokenBytes is tok's bytes as Ollama writes them: integers.
func tokenBytes(tok string) []int {
	if tok == "" {
		return nil
	}
	b := make([]int, len(tok))
	for i := range len(tok) {
		b[i] = int(tok[i])
	}
	return b
}

// ollamaGenerate returns the handler of POST /api/chat (chat) or
// POST /api/generate. A stream is NDJSON (application/x-ndjson), one
// object per token, flushed per line, then a final object with done:true,
// done_reason and counts. A thinking model's answer starts with its
// reasoning, a token per object with empty content and the token in
// message.thinking (chat) or thinking (generate), as Ollama streams it;
// a non-streamed answer has it whole there; eval_count counts it too
// (ollamaThinking says when a model thinks). A request with no messages
// (chat) or no prompt (generate) only "loads the model" and gets
// done_reason "load".
func (s *Server) ollamaGenerate(chat bool) http.HandlerFunc {
	parse := parseOllamaGenerate
	if chat {
		parse = parseOllamaChat
	}
	return func(w http.ResponseWriter, r *http.Request) {
		req, release, err := s.accept(w, r, parse)
		if err != nil {
			s.fail(w, r, writeOllamaError, err)
			return
		}
		defer release()

		thinks, err := s.ollamaThinking(req, chat)
		if err != nil {
			s.fail(w, r, writeOllamaError, err)
			return
		}
		frame := func(content string) ollamaResponse {
			resp := ollamaResponse{Model: req.model, CreatedAt: s.clock.Now().UTC().Format(time.RFC3339Nano)}
			if chat {
				resp.Message = &ollamaMessage{Role: "assistant", Content: content}
			} else {
				resp.Response = &content
			}
			return resp
		}
		thinkingFrame := func(thinking string) ollamaResponse {
			resp := frame("")
			if chat {
				resp.Message.Thinking = thinking
			} else {
				resp.Thinking = thinking
			}
			return resp
		}
		if req.loadOnly {
			resp := frame("")
			resp.Done, resp.DoneReason = true, "load"
			if req.unload {
				resp.DoneReason = "unload"
			}
			writeJSON(w, http.StatusOK, resp)
			return
		}

		c := complete(s.cfg.Seed, s.cfg.DefaultMaxTokens, req)
		var call *toolCall
		if tool := chooseTool(req.tools, req.lastUser); chat && tool != nil {
			tc := makeToolCall(s.cfg.Seed, tool, req.prompt)
			call = &tc
			// The whole call is one step of output; usage counts its pieces.
			c = completion{tokens: []string{""}, promptTokens: c.promptTokens, finishReason: finishStop}
		}
		thoughts := thinkingTokens(s.cfg.Seed, req.prompt, "", thinks)
		start := s.clock.Now()
		var firstToken time.Time
		final := func(content string) ollamaResponse {
			end := s.clock.Now()
			if firstToken.IsZero() {
				firstToken = end
			}
			resp := frame(content)
			resp.Done, resp.DoneReason = true, c.finishReason
			// Durations are floored at 1ns so clients computing tokens per
			// second from them never divide by zero.
			resp.TotalDuration = max(int64(end.Sub(start)+req.load), 1)
			resp.LoadDuration = max(int64(req.load), 1)
			resp.PromptEvalCount, resp.PromptEvalDuration = c.promptTokens, max(int64(firstToken.Sub(start)), 1)
			resp.EvalCount, resp.EvalDuration = len(c.tokens)+len(thoughts), max(int64(end.Sub(firstToken)), 1)
			if call != nil {
				resp.EvalCount = len(call.pieces) + len(thoughts)
			}
			return resp
		}
		// withCall adds the tool call to a chat frame.
		withCall := func(resp ollamaResponse) ollamaResponse {
			if call != nil {
				var tc ollamaToolCall
				tc.Function.Name, tc.Function.Arguments = call.name, json.RawMessage(call.arguments)
				resp.Message.ToolCalls = []ollamaToolCall{tc}
			}
			return resp
		}
		markFirst := func() {
			if firstToken.IsZero() {
				firstToken = s.clock.Now()
			}
		}

		// The output, a token per step: the thinking, then the answer.
		steps := c.tokens
		if len(thoughts) > 0 {
			steps = append(thoughts[:len(thoughts):len(thoughts)], c.tokens...)
		}
		var logprobs []simLogprob
		if req.logprobs {
			logprobs = simLogprobs(steps, req.topLogprobs)
		}
		if !req.stream {
			s.paceSteps(r.Context(), req.prefill, len(steps), func(int) error { markFirst(); return nil })
			resp := withCall(final(c.text()))
			resp.Logprobs = logprobs
			if chat {
				resp.Message.Thinking = joinTokens(thoughts)
			} else {
				resp.Thinking = joinTokens(thoughts)
			}
			writeJSON(w, http.StatusOK, resp)
			return
		}
		w.Header().Set("Content-Type", "application/x-ndjson")
		w.WriteHeader(http.StatusOK)
		enc := json.NewEncoder(w) // Encode ends each object with "\n"
		if after := s.cfg.Faults.StreamErrorAfter; after > 0 && after < len(steps) {
			steps = steps[:after]
		}
		s.paceSteps(r.Context(), req.prefill, len(steps), func(i int) error {
			markFirst()
			var resp ollamaResponse
			if i < len(thoughts) {
				resp = thinkingFrame(steps[i])
			} else {
				resp = withCall(frame(steps[i]))
			}
			if logprobs != nil {
				resp.Logprobs = logprobs[i : i+1]
			}
			if err := enc.Encode(resp); err != nil {
				return err
			}
			return flush(w)
		})
		if s.cfg.Faults.StreamErrorAfter > 0 {
			enc.Encode(map[string]string{"error": errStreamFault.Error()})
			return
		}
		enc.Encode(final(""))
	}
}

// ollamaEmbedRequest is the body of POST /api/embed (Input) and of the
// legacy POST /api/embeddings (Prompt).
type ollamaEmbedRequest struct {
	Model      string          `json:"model"`
	Input      json.RawMessage `json:"input"`
	Prompt     string          `json:"prompt"`
	Dimensions int             `json:"dimensions"`
}

// parseOllamaEmbed parses a POST /api/embed body; input is a string or an
// array of strings, each embedded separately. Token ids are refused, as
// Ollama's EmbedHandler refuses any other input: "invalid input type".
func parseOllamaEmbed(body []byte) (request, error) {
	var in ollamaEmbedRequest
	if err := decodeJSON(body, &in); err != nil {
		return request{}, err
	}
	var (
		one    string
		inputs []string
	)
	switch {
	case len(in.Input) == 0 || string(in.Input) == "null":
	case json.Unmarshal(in.Input, &one) == nil:
		inputs = []string{one}
	case json.Unmarshal(in.Input, &inputs) == nil:
	default:
		return request{}, fmt.Errorf("%w: invalid input type", errInvalidRequest)
	}
	return in.toRequest(inputs)
}

// parseOllamaEmbeddings parses a legacy POST /api/embeddings body, whose
// single input is "prompt".
func parseOllamaEmbeddings(body []byte) (request, error) {
	var in ollamaEmbedRequest
	if err := decodeJSON(body, &in); err != nil {
		return request{}, err
	}
	return in.toRequest([]string{in.Prompt})
}

func (in ollamaEmbedRequest) toRequest(inputs []string) (request, error) {
	req := request{model: in.Model, inputs: inputs, dimensions: in.Dimensions}
	if in.Model == "" {
		return req, fmt.Errorf("%w: model is required", errInvalidRequest)
	}
	return req, checkDimensions(in.Dimensions)
}

// ollamaEmbed returns the handler of POST /api/embed, answering
// {"model","embeddings":[[float,...],...],"total_duration","load_duration",
// "prompt_eval_count"}, or with legacy set, of POST /api/embeddings,
// answering {"embedding":[float,...]}. Vectors of /api/embed are
// L2-normalized, 8 components unless the request sets "dimensions"; the
// legacy answer is the model's raw vector, as Ollama's /api/embeddings
// does not normalize it: the same direction, of norm rawEmbeddingNorm.
func (s *Server) ollamaEmbed(legacy bool) http.HandlerFunc {
	parse := parseOllamaEmbed
	if legacy {
		parse = parseOllamaEmbeddings
	}
	return func(w http.ResponseWriter, r *http.Request) {
		req, release, err := s.accept(w, r, parse)
		if err != nil {
			s.fail(w, r, writeOllamaError, err)
			return
		}
		defer release()
		start := s.clock.Now()
		if s.wait(r.Context(), s.cfg.TTFT) != nil {
			abortConnection()
		}
		vectors, promptTokens := embedAll(s.cfg.Seed, req)
		if legacy {
			// float64, as Ollama writes /api/embeddings vectors.
			raw := make([]float64, len(vectors[0]))
			for i, v := range vectors[0] {
				raw[i] = float64(v * rawEmbeddingNorm)
			}
			writeJSON(w, http.StatusOK, map[string]any{"embedding": raw})
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{
			"model":             req.model,
			"embeddings":        vectors,
			"total_duration":    max(int64(s.clock.Now().Sub(start)+req.load), 1),
			"load_duration":     max(int64(req.load), 1),
			"prompt_eval_count": promptTokens,
		})
	}
}

// rawEmbeddingNorm is the L2 norm of the simulator's raw (not normalized)
// embedding vectors, which /api/embeddings answers.
const rawEmbeddingNorm = 7.25

// ollamaModelDetails is the "details" object of a listed model (as in
// Ollama's /api/tags, /api/ps and /api/show).
type ollamaModelDetails struct {
	ParentModel       string   `json:"parent_model"`
	Format            string   `json:"format"`
	Family            string   `json:"family"`
	Families          []string `json:"families"`
	ParameterSize     string   `json:"parameter_size"`
	QuantizationLevel string   `json:"quantization_level"`
}

// ollamaModel is one entry of GET /api/tags and GET /api/ps.
type ollamaModel struct {
	Name       string             `json:"name"`
	Model      string             `json:"model"`
	ModifiedAt string             `json:"modified_at,omitempty"`
	Size       int64              `json:"size"` // bytes
	Digest     string             `json:"digest"`
	Details    ollamaModelDetails `json:"details"`
	ExpiresAt  string             `json:"expires_at,omitempty"` // /api/ps only
	SizeVRAM   int64              `json:"size_vram,omitempty"`  // /api/ps only, bytes
	// ContextLength is /api/ps only: the context the model is loaded with,
	// in tokens.
	ContextLength int `json:"context_length,omitempty"`
}

func ollamaModelEntry(m model) ollamaModel {
	return ollamaModel{
		Name:       m.name,
		Model:      m.name,
		ModifiedAt: m.modifiedAt.Format(time.RFC3339Nano),
		Size:       1 << 30,
		Digest:     m.digest,
		Details: ollamaModelDetails{
			Format: "gguf", Family: "sim", Families: []string{"sim"},
			ParameterSize: "1B", QuantizationLevel: "Q4_K_M",
		},
	}
}

// ollamaTags answers GET /api/tags: {"models":[{name, model, modified_at,
// size, digest, details}]}, one entry per served model, the most recently
// modified first (as Ollama's ListHandler sorts them).
func (s *Server) ollamaTags(w http.ResponseWriter, _ *http.Request) {
	served := s.servedModels()
	models := make([]ollamaModel, len(served))
	for i, m := range served {
		models[i] = ollamaModelEntry(m)
	}
	writeJSON(w, http.StatusOK, map[string]any{"models": models})
}

// ollamaPS answers GET /api/ps: the models loaded in VRAM (every served
// model without residency, Config.MaxLoadedModels), each expiring 5
// minutes after its last use, the latest expiry first.
func (s *Server) ollamaPS(w http.ResponseWriter, _ *http.Request) {
	loaded := s.loadedModels()
	models := make([]ollamaModel, len(loaded))
	for i, m := range loaded {
		models[i] = ollamaModelEntry(m.model)
		models[i].ModifiedAt = ""
		models[i].SizeVRAM = models[i].Size
		models[i].ExpiresAt = m.expires.UTC().Format(time.RFC3339Nano)
		models[i].ContextLength = simContextLength
	}
	writeJSON(w, http.StatusOK, map[string]any{"models": models})
}

// simContextLength is the context length, in tokens, the simulator reports
// for every model.
const simContextLength = 4096

// ollamaShow answers POST /api/show {"model"} (or legacy {"name"}) with the
// model's details, its architecture and context length in model_info (as
// "general.architecture" and "<architecture>.context_length"), one
// made-up tensor and its capabilities (Config.Capabilities, AddModel);
// Ollama's 400 "model is required" and 404 "model 'x' not found".
func (s *Server) ollamaShow(w http.ResponseWriter, r *http.Request) {
	var in struct {
		Model string `json:"model"`
		Name  string `json:"name"`
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	if err == nil {
		err = decodeJSON(body, &in)
	} else {
		err = fmt.Errorf("%w: reading body: %w", errInvalidRequest, err)
	}
	if err != nil {
		s.fail(w, r, writeOllamaError, err)
		return
	}
	name := cmp.Or(in.Model, in.Name)
	if name == "" {
		writeOllamaError(w, r, http.StatusBadRequest, errors.New("model is required")) // Ollama's text
		return
	}
	m, ok := s.lookup(name)
	if !ok {
		writeOllamaError(w, r, http.StatusNotFound, fmt.Errorf("model '%s' not found", name)) // Ollama's text
		return
	}
	entry := ollamaModelEntry(m)
	writeJSON(w, http.StatusOK, map[string]any{
		"modelfile":    "",
		"parameters":   "",
		"template":     "{{ .Prompt }}",
		"details":      entry.Details,
		"model_info":   map[string]any{"general.architecture": "sim", "sim.context_length": simContextLength},
		"tensors":      []map[string]any{{"name": "token_embd.weight", "type": "Q4_K", "shape": []int{2048, 32000}}},
		"capabilities": s.showCapabilities(m.capabilities),
		"modified_at":  entry.ModifiedAt,
	})
}

// showCapabilities are what /api/show lists of a model with caps: caps,
// and "thinking" for a thinking model (Config.Thinking), as Ollama lists
// it for a model that thinks.
func (s *Server) showCapabilities(caps []string) []string {
	if s.cfg.Thinking && !slices.Contains(caps, "thinking") {
		return append(slices.Clip(caps), "thinking")
	}
	return caps
}

// writeJSON writes v as a JSON response with the given status.
func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}
