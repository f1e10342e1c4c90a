package adapter

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"iop/internal/translate"
	"iop/internal/wire/nodev1"
)

// MaxAnswerBytes is the most of a provider's answer a normalized-path
// adapter holds at once, in bytes: one Ollama stream line (a final line
// carries every token id of a long conversation in "context"), one whole
// embeddings answer. A larger one fails the run (502). The edge's
// max_answer_bytes has the same default.
const MaxAnswerBytes = 256 << 20 // 256 MiB

// maxEmbedBytes caps an Ollama /api/embed answer.
const maxEmbedBytes = MaxAnswerBytes

// maxFloatsPerDelta bounds one embeddings DELTA (4 bytes per value on the
// wire), so a large batch travels as several messages of about 1 MiB.
const maxFloatsPerDelta = 256 << 10

// Ollama answers on the normalized path by driving an Ollama server's native
// API. It is safe for concurrent use.
type Ollama struct {
	p           *httpProvider
	deltaFloats int // most embedding values in one DELTA; maxFloatsPerDelta
	maxLine     int // most bytes of one stream line; maxLineBytes

	mu sync.Mutex // guards the fields below
	// boolThink holds the served models that refused a think level (see
	// thinkFor); they get think true for a reasoning effort.
	boolThink map[string]bool
}

var _ Normalizer = (*Ollama)(nil)

// NewOllama returns the adapter for the Ollama server at cfg.BaseURL (e.g.
// "http://127.0.0.1:11434"). Errors wrap ErrInvalidConfig.
func NewOllama(cfg Config) (*Ollama, error) {
	p, err := newHTTPProvider(cfg)
	if err != nil {
		return nil, err
	}
	return &Ollama{p: p, deltaFloats: maxFloatsPerDelta, maxLine: maxLineBytes}, nil
}

// Path is EXECUTION_PATH_NORMALIZED.
func (o *Ollama) Path() nodev1.ExecutionPath { return nodev1.ExecutionPath_EXECUTION_PATH_NORMALIZED }

// Close drops idle connections to the server.
func (o *Ollama) Close() { o.p.Close() }

// Normalize translates req to Ollama's API (translate.ToOllamaChat,
// ToOllamaGenerate, ToOllamaEmbed; their errors are 400s), streams the answer from Ollama
// and sends it to sink as run events:
//
//	chat, completion: STARTED, DELTA{text, thinking, tool_calls} per line
//	                  with text, thinking (message.thinking, or a generate
//	                  answer's thinking) or tool calls, each as it comes,
//	                  then USAGE{prompt_tokens, completion_tokens}
//	                  + COMPLETE{finish_reason}
//	embeddings:       STARTED, DELTA{embeddings} (one or more, vectors in input
//	                  order), then USAGE{prompt_tokens} + COMPLETE{"stop"}
//
// A chat's forced tool call (tool_choice "required", a named function)
// reaches Ollama as a format and comes back as that call (readStream;
// translate.ToOllamaChatRequest). A think level the translation made of a
// reasoning effort goes as the model takes it: a level, or true for a
// model that refused a level before (thinkFor).
//
// The fields of req.OllamaFields (translate.ParseOllamaFields; not an
// object: 400 naming translate.ExtensionKey) are set on the Ollama request
// with their JSON values unchanged, where the translation does not set the
// same field; req.Body is decoded once, whatever it carries.
//
// finish_reason is "length" when Ollama's done_reason is "length", else
// "tool_calls" when the answer called a tool, else "stop". Failures are reported as the package doc describes; a non-2xx
// answer's *Error carries Ollama's {"error": ...} text and status.
func (o *Ollama) Normalize(ctx context.Context, req Request, sink EventSink) error {
	var (
		path   string
		body   []byte
		inputs int
		forced *translate.ForcedCall // the answer's text is this tool call
		err    error
	)
	// Ollama-only fields the client sent (keep_alive, think, num_ctx, ...);
	// their error is reported after the body's own.
	fields, fieldsErr := translate.ParseOllamaFields(req.OllamaFields)
	switch req.Op {
	case nodev1.Operation_OPERATION_CHAT:
		path = "/api/chat"
		var chat translate.OllamaChat
		chat, err = translate.ToOllamaChatRequest(req.Body, req.ServedModel, fields)
		body, forced = chat.Body, chat.Forced
	case nodev1.Operation_OPERATION_COMPLETION:
		path = "/api/generate"
		body, err = translate.ToOllamaGenerate(req.Body, req.ServedModel, fields)
	case nodev1.Operation_OPERATION_EMBEDDINGS:
		if fields.TakeLegacyEmbeddings() {
			// The raw vector, as Ollama answers /api/embeddings.
			path, inputs = "/api/embeddings", 1
			body, err = translate.ToOllamaEmbeddings(req.Body, req.ServedModel, fields)
			break
		}
		path = "/api/embed"
		body, inputs, err = translate.ToOllamaEmbed(req.Body, req.ServedModel, fields)
	default:
		return badRequest("operation %v is not supported", req.Op)
	}
	if err != nil {
		return translateFailed(err) // a *translate.FieldError: Param its field
	}
	if fieldsErr != nil {
		return fieldBadRequest(translate.ExtensionKey, "%v", fieldsErr)
	}
	// The node matches the stop sequences itself (stopMatcher), so that
	// it knows which one ended an answer; a forced call's format keeps
	// Ollama's own.
	var stops []string
	if req.Op != nodev1.Operation_OPERATION_EMBEDDINGS && forced == nil {
		if body, stops, err = translate.TakeOllamaStop(body); err != nil {
			return translateFailed(err)
		}
	}
	// A think level the translation made of a reasoning effort (not one
	// the client set in Ollama's own terms) goes as Ollama's model takes
	// it (thinkFor).
	effortLevel := req.Op != nodev1.Operation_OPERATION_EMBEDDINGS && !fields.Has("think")
	if effortLevel && o.takesBoolThink(req.ServedModel) {
		body, _ = translate.ThinkAsBool(body)
	}
	c, err := o.p.post(ctx, path, body, http.Header{"Accept": {"application/x-ndjson, application/json"}})
	if err != nil {
		return err
	}
	if c.resp.StatusCode == http.StatusBadRequest && effortLevel {
		if c, err = o.thinkFor(ctx, c, path, body, req.ServedModel); err != nil {
			return err
		}
	}
	defer c.close()
	if c.resp.StatusCode < 200 || c.resp.StatusCode > 299 {
		return o.statusError(c)
	}
	// STARTED goes with the first part of the answer, not with the 2xx
	// head: a 2xx whose first line (or whole embed answer) is an error
	// object is a failure before the first byte (ErrProviderError), which
	// the edge may send to another provider.
	if req.Op == nodev1.Operation_OPERATION_EMBEDDINGS {
		return o.readEmbeddings(c, inputs, sink)
	}
	return o.readStream(c, sink, forced, newStopMatcher(stops))
}

// stopDrainLines and stopDrainTime bound what drainAfterStop reads after
// a stop sequence matched: about stopDrainLines tokens, generated but not
// sent, for at most stopDrainTime. A longer rest is cut off by closing the
// request.
const (
	stopDrainLines = 64
	stopDrainTime  = 2 * time.Second
)

// drainAfterStop reads and discards the rest of Ollama's stream after a
// stop sequence matched in last (the request's stop sequences were not
// sent to Ollama, so it goes on generating), within stopDrainLines lines
// and stopDrainTime. It returns the done line when it came within them,
// else last. A request cancelled mid-answer is what Ollama v0.17.4 may
// leave its next request unanswered after (seen once in 50 cancels on a
// loaded machine), so a short rest is read out rather than cut.
func (o *Ollama) drainAfterStop(c *call, br *bufio.Reader, last ollamaLine) ollamaLine {
	cut := time.AfterFunc(stopDrainTime, func() { c.resp.Body.Close() })
	defer cut.Stop()
	for range stopDrainLines {
		line, err := readNDJSONLine(br, o.maxLine)
		if err != nil && len(line) == 0 {
			return last
		}
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		l, perr := parseLine(line)
		if perr != nil || l.Err != "" {
			return last
		}
		if l.Done {
			return l
		}
	}
	return last
}

// thinkFor handles c, a 400 to body: when it is Ollama's refusal of a
// think level (translate.IsThinkLevelRefusal: the model takes booleans
// only, as every model but gpt-oss does in Ollama v0.17.4), the model is
// remembered and body is sent once more with think true
// (translate.ThinkAsBool), and that call is returned; any other 400 is
// returned as its error. Later requests for the model send true at once
// (takesBoolThink), so each model costs one refused request per adapter.
func (o *Ollama) thinkFor(ctx context.Context, c *call, path string, body []byte, model string) (*call, error) {
	err := o.statusError(c)
	c.close()
	var e *Error
	if !errors.As(err, &e) || !translate.IsThinkLevelRefusal(e.Message) {
		return nil, err
	}
	retry, ok := translate.ThinkAsBool(body)
	if !ok {
		return nil, err
	}
	o.mu.Lock()
	if o.boolThink == nil {
		o.boolThink = make(map[string]bool)
	}
	o.boolThink[model] = true
	o.mu.Unlock()
	return o.p.post(ctx, path, retry, http.Header{"Accept": {"application/x-ndjson, application/json"}})
}

// takesBoolThink reports whether model refused a think level before.
func (o *Ollama) takesBoolThink(model string) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.boolThink[model]
}

// startedEvent is the STARTED event that opens a normalized answer.
func startedEvent() *nodev1.RunEvent { return &nodev1.RunEvent{Type: nodev1.RunEvent_TYPE_STARTED} }

// newToolCallID returns a new OpenAI-style tool call id: "call_" and 24
// random characters.
func newToolCallID() string { return "call_" + strings.ToLower(rand.Text()[:24]) }

// statusError is the *Error for a non-2xx answer: Ollama's own error text
// (redacted), or the body's own text (a proxy's "Bad Gateway" page, see
// bodyText), or, with neither, the status text.
func (o *Ollama) statusError(c *call) error {
	status := c.resp.StatusCode
	data, err := io.ReadAll(io.LimitReader(c.resp.Body, errorBodyLimit))
	if err != nil && c.parent.Err() != nil {
		return c.failure(err, true)
	}
	var body struct {
		Error json.RawMessage `json:"error"`
	}
	msg := ""
	if json.Unmarshal(data, &body) == nil {
		msg = errorText(body.Error)
	}
	if msg == "" {
		msg = bodyText(data)
	}
	if msg == "" {
		msg = fmt.Sprintf("provider answered %d %s", status, http.StatusText(status))
	}
	// Redact before cutting, so no secret is cut in half.
	return &Error{Kind: ErrProviderStatus, Status: status, Message: truncate(o.p.redact(msg), maxFallbackMessage)}
}

// readStream relays an NDJSON chat or generate stream to sink. Lines that
// arrived together (a complete next line is already buffered) go up in one
// Send, so a fast provider costs one message per read rather than one per
// token; a line is never held back waiting for more (BENCHMARKS.md). Tool
// calls (Ollama sends each whole, without an id unless it is recent)
// become DELTA tool_calls numbered from 0 in order of arrival, with
// Ollama's id or a new "call_..." one, and make the finish reason
// "tool_calls" unless the answer was cut at its length limit (as Ollama's
// own OpenAI layer does). With forced set, the request forced a tool
// call (translate.ToOllamaChatRequest): the answer's text is gathered
// rather than sent, and becomes that call (forced.Call) at the end, as
// one DELTA tool call; text that is no call of the request's tools is a
// failure of kind ErrProviderStream, unless the answer was cut at its
// length limit (then it is sent as text, finish_reason "length"). A whole
// call (its arguments JSON) finishes "tool_calls" even at the length
// limit: the grammar lets a model pad the call with whitespace.
//
// Text passes through stop (the request's stop sequences, which Ollama
// was not sent): the first one found in the text ends the answer there,
// as Ollama would have ended it, with COMPLETE{"stop", stop_sequence}.
// The text up to the stop is sent at once; the rest Ollama generates is
// read and dropped (drainAfterStop), so the USAGE sent has Ollama's own
// counts (completion_tokens counts the dropped tokens too: they were
// generated). When the rest is longer than stopDrainLines the request is
// closed (Normalize closes it), and USAGE has the pieces of the answer
// streamed so far as completion_tokens (Ollama streams one token a line)
// and no prompt_tokens (Ollama counts the prompt in its last line only).
func (o *Ollama) readStream(c *call, sink EventSink, forced *translate.ForcedCall, stop *stopMatcher) error {
	br := lineReaders.Get().(*bufio.Reader)
	br.Reset(c.resp.Body)
	defer func() {
		br.Reset(nil)
		lineReaders.Put(br)
	}()
	var (
		events    []*nodev1.RunEvent
		calls     int32           // tool calls so far
		started   bool            // STARTED was sent
		callText  strings.Builder // a forced call's text so far
		wholeCall bool            // the forced call's text was a whole call
		pieces    int32           // lines with text or thinking so far
	)
	// send sends the events gathered so far, after STARTED the first
	// time; a failure that follows them still reaches the client after
	// their text.
	send := func() error {
		if len(events) == 0 {
			return nil
		}
		if !started {
			events = append([]*nodev1.RunEvent{startedEvent()}, events...)
			started = true
		}
		err := sink.Send(events...)
		events = nil
		if err != nil {
			return sinkFailed(err)
		}
		return nil
	}
	// streamErr ends the stream with a failure: after the answer began,
	// one of kind ErrProviderStream; before (nothing gathered or sent), of
	// kind before (ErrProviderError for an error object, else
	// ErrProviderStream), with nothing sent.
	streamErr := func(before error, msg string) error {
		if err := send(); err != nil {
			return err
		}
		kind := ErrProviderStream
		if !started {
			kind = before
		}
		return &Error{Kind: kind, Status: http.StatusBadGateway, Message: msg}
	}
	for {
		line, rerr := readNDJSONLine(br, o.maxLine)
		if rerr == errLineTooLong {
			return streamErr(ErrProviderStream, fmt.Sprintf("provider sent a stream line over %d bytes", o.maxLine))
		}
		if len(bytes.TrimSpace(line)) > 0 {
			l, err := parseLine(line)
			if err != nil {
				return streamErr(ErrProviderStream, "provider sent a malformed stream line")
			}
			if l.Err != "" {
				return streamErr(ErrProviderError, truncate(o.p.redact(l.Err), maxFallbackMessage))
			}
			if forced != nil && l.Text != "" {
				callText.WriteString(l.Text)
				l.Text = ""
			}
			if l.Text != "" || l.Thinking != "" {
				pieces++
			}
			var matched string
			l.Text, matched = stop.feed(l.Text)
			if l.Done && matched == "" {
				l.Text += stop.flush()
			}
			if matched != "" {
				if l.Text != "" || l.Thinking != "" || len(l.Logprobs) > 0 {
					events = append(events, &nodev1.RunEvent{Type: nodev1.RunEvent_TYPE_DELTA, Text: l.Text, Thinking: l.Thinking, Logprobs: l.Logprobs})
				}
				if !started && len(events) == 0 {
					events = append(events, startedEvent())
					started = true
				}
				usage := &nodev1.RunEvent{Type: nodev1.RunEvent_TYPE_USAGE, CompletionTokens: pieces}
				if !l.Done {
					// The text up to the stop goes out now; then Ollama
					// is read to its end (drainAfterStop), for its own
					// counts and because a request cancelled mid-answer
					// can leave Ollama unanswering the next one.
					if err := send(); err != nil {
						return err
					}
					l = o.drainAfterStop(c, br, l)
				}
				if l.Done { // Ollama's own counts
					usage.PromptTokens, usage.CompletionTokens = l.PromptTokens, l.CompletionTokens
				}
				events = append(events, usage,
					&nodev1.RunEvent{Type: nodev1.RunEvent_TYPE_COMPLETE, FinishReason: "stop", StopSequence: matched})
				return send()
			}
			if l.Text != "" || l.Thinking != "" || len(l.ToolCalls) > 0 || len(l.Logprobs) > 0 {
				delta := &nodev1.RunEvent{Type: nodev1.RunEvent_TYPE_DELTA, Text: l.Text, Thinking: l.Thinking, Logprobs: l.Logprobs}
				for _, tc := range l.ToolCalls {
					id := tc.ID
					if id == "" {
						id = newToolCallID()
					}
					delta.ToolCalls = append(delta.ToolCalls, &nodev1.ToolCallDelta{
						Index: calls, Id: id, Name: tc.Name, Arguments: tc.Arguments,
					})
					calls++
				}
				events = append(events, delta)
			}
			if l.Done {
				if forced != nil && calls == 0 {
					name, args, err := forced.Call(callText.String())
					whole := err == nil && json.Valid([]byte(args))
					switch {
					case whole || (err == nil && l.DoneReason != "length"):
						events = append(events, &nodev1.RunEvent{Type: nodev1.RunEvent_TYPE_DELTA, ToolCalls: []*nodev1.ToolCallDelta{
							{Index: 0, Id: newToolCallID(), Name: name, Arguments: args}}})
						calls++
						// A whole call is the answer even when the model
						// spent its last tokens on the whitespace the
						// format's grammar allows.
						wholeCall = whole
					case l.DoneReason == "length":
						// Cut by the token limit before the call was
						// whole (its function unnamed, or its arguments
						// not yet JSON): the text as it came, with
						// finish_reason "length".
						events = append(events, &nodev1.RunEvent{Type: nodev1.RunEvent_TYPE_DELTA, Text: callText.String()})
					default:
						return streamErr(ErrProviderStream, truncate(o.p.redact(err.Error()), maxFallbackMessage))
					}
				}
				if !started && len(events) == 0 {
					// An answer with no content still starts.
					events = append(events, startedEvent())
					started = true
				}
				finish := "stop"
				switch {
				case l.DoneReason == "length" && !wholeCall:
					finish = "length"
				case calls > 0:
					finish = "tool_calls"
				}
				events = append(events,
					&nodev1.RunEvent{Type: nodev1.RunEvent_TYPE_USAGE, PromptTokens: l.PromptTokens, CompletionTokens: l.CompletionTokens},
					&nodev1.RunEvent{Type: nodev1.RunEvent_TYPE_COMPLETE, FinishReason: finish})
				return send()
			}
		}
		if rerr != nil || !lineBuffered(br) {
			if err := send(); err != nil {
				return err
			}
		}
		if rerr == nil {
			continue
		}
		if rerr != io.EOF {
			return c.failure(rerr, true)
		}
		if c.parent.Err() != nil { // a cancel can surface as a clean EOF
			return c.failure(context.Canceled, true)
		}
		return streamErr(ErrProviderStream, "provider closed stream before done")
	}
}

// lineReaders holds the 64 KiB readers of Ollama streams between requests
// (a new one for each request was most of the normalized path's
// allocation). readStream returns its reader when it returns: nothing read
// from it outlives that, as parsing a line copies what it keeps.
var lineReaders = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, 64<<10) }}

// errLineTooLong is readNDJSONLine's error for a line over maxLineBytes.
var errLineTooLong = errors.New("ndjson line too long")

// readNDJSONLine returns the next line of br, its newline included, or the
// last bytes before the end of the stream with the read error (io.EOF at a
// clean end). A line over maxLine bytes is errLineTooLong.
func readNDJSONLine(br *bufio.Reader, maxLine int) ([]byte, error) {
	line, err := br.ReadSlice('\n')
	if err != bufio.ErrBufferFull {
		if len(line) > maxLine+1 { // +1: the newline
			return nil, errLineTooLong
		}
		return line, err
	}
	long := append([]byte(nil), line...)
	for err == bufio.ErrBufferFull {
		if len(long) > maxLine {
			return nil, errLineTooLong
		}
		line, err = br.ReadSlice('\n')
		long = append(long, line...)
	}
	if len(long) > maxLine+1 { // +1: the newline
		return nil, errLineTooLong
	}
	return long, err
}

// lineBuffered reports whether a complete line is already buffered in br,
// so reading it will not block.
func lineBuffered(br *bufio.Reader) bool {
	b, _ := br.Peek(br.Buffered())
	return bytes.IndexByte(b, '\n') >= 0
}

// readEmbeddings reads an /api/embed answer and sends its vectors.
func (o *Ollama) readEmbeddings(c *call, inputs int, sink EventSink) error {
	data, err := io.ReadAll(io.LimitReader(c.resp.Body, maxEmbedBytes+1))
	if err != nil {
		return c.failure(err, true)
	}
	if len(data) > maxEmbedBytes {
		return &Error{Kind: ErrProviderStream, Status: http.StatusBadGateway, Message: "provider answer too large"}
	}
	var out struct {
		Embeddings      [][]float32     `json:"embeddings"`
		Embedding       []float32       `json:"embedding"` // /api/embeddings
		PromptEvalCount float64         `json:"prompt_eval_count"`
		Error           json.RawMessage `json:"error"`
	}
	if err := json.Unmarshal(data, &out); err != nil {
		return &Error{Kind: ErrProviderStream, Status: http.StatusBadGateway, Message: "provider sent a malformed embeddings answer"}
	}
	if out.Embeddings == nil && out.Embedding != nil {
		out.Embeddings = [][]float32{out.Embedding}
	}
	if msg := errorText(out.Error); msg != "" {
		return &Error{Kind: ErrProviderError, Status: http.StatusBadGateway, Message: truncate(o.p.redact(msg), maxFallbackMessage)}
	}
	if len(out.Embeddings) != inputs {
		return &Error{Kind: ErrProviderStream, Status: http.StatusBadGateway,
			Message: fmt.Sprintf("provider sent %d embeddings for %d inputs", len(out.Embeddings), inputs)}
	}
	// STARTED only now that the answer is known good (see Normalize).
	events := []*nodev1.RunEvent{startedEvent()}
	delta := &nodev1.RunEvent{Type: nodev1.RunEvent_TYPE_DELTA}
	floats := 0
	for _, vec := range out.Embeddings {
		if floats > 0 && floats+len(vec) > o.deltaFloats {
			if err := sink.Send(append(events, delta)...); err != nil {
				return sinkFailed(err)
			}
			events = nil
			delta, floats = &nodev1.RunEvent{Type: nodev1.RunEvent_TYPE_DELTA}, 0
		}
		delta.Embeddings = append(delta.Embeddings, &nodev1.Embedding{Values: vec})
		floats += len(vec)
	}
	if err := sink.Send(append(events, delta,
		&nodev1.RunEvent{Type: nodev1.RunEvent_TYPE_USAGE, PromptTokens: clampCount(out.PromptEvalCount)},
		&nodev1.RunEvent{Type: nodev1.RunEvent_TYPE_COMPLETE, FinishReason: "stop"},
	)...); err != nil {
		return sinkFailed(err)
	}
	return nil
}
