package loadgen

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"iop/internal/sse"
)

// maxLine bounds one NDJSON line of an answer, in bytes (an SSE line is
// bounded by package sse).
const maxLine = 1 << 20

// requester sends one request of a run and classifies its answer. Its
// fields are read-only after newRequester, so every goroutine shares it.
type requester struct {
	cfg  Config
	url  string
	body []byte
	// keepText: samples carry the answer's text (the sessions workload
	// appends it to the conversation).
	keepText bool
}

func newRequester(cfg Config) *requester {
	path := "/v1/chat/completions"
	if cfg.API == APIOllama {
		path = "/api/chat"
	}
	return &requester{cfg: cfg, url: strings.TrimRight(cfg.URL, "/") + path, body: requestBody(cfg), keepText: cfg.Workload == WorkloadSessions}
}

// prompt returns an ASCII prompt of exactly n bytes.
func prompt(n int) string {
	const words = "the quick brown fox jumps over the lazy dog "
	return strings.Repeat(words, n/len(words)+1)[:n]
}

// requestBody is the JSON body every request of cfg sends: one user message
// of PromptChars bytes, the stream flag, the API's max tokens field, and for
// an OpenAI stream stream_options.include_usage.
func requestBody(cfg Config) []byte {
	type message struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	body := map[string]any{
		"model":    cfg.Model,
		"messages": []message{{Role: "user", Content: prompt(cfg.PromptChars)}},
		"stream":   cfg.Stream, // explicit: Ollama streams by default
	}
	addOptions(body, cfg)
	b, err := json.Marshal(body)
	if err != nil {
		panic(err) // only strings, bools and ints: cannot fail
	}
	return b
}

// addOptions sets body's stream options and token limit from cfg: for an
// OpenAI stream stream_options.include_usage, and the API's max tokens
// field.
func addOptions(body map[string]any, cfg Config) {
	if cfg.Stream && cfg.API == APIOpenAI {
		// The usage chunk gives CompletionTokens, as vLLM's benchmarks ask.
		body["stream_options"] = map[string]any{"include_usage": true}
	}
	if cfg.MaxTokens > 0 {
		if cfg.API == APIOllama {
			body["options"] = map[string]any{"num_predict": cfg.MaxTokens}
		} else {
			body["max_tokens"] = cfg.MaxTokens
		}
	}
}

// do sends one request that was due at start and returns its sample. A
// request that fails because ctx ended is OutcomeCancelled; one cut by
// Config.Timeout is OutcomeTransport (no status yet) or OutcomeTruncated.
func (q *requester) do(ctx context.Context, start time.Time) sample {
	return q.doBody(ctx, start, q.body)
}

// doBody is do with a body of its own.
func (q *requester) doBody(ctx context.Context, start time.Time, body []byte) sample {
	rctx, cancel := context.WithTimeout(ctx, q.cfg.Timeout)
	defer cancel()
	s := q.send(rctx, start, body)
	if s.outcome != OutcomeOK && ctx.Err() != nil {
		s.outcome = OutcomeCancelled
	}
	return s
}

func (q *requester) send(ctx context.Context, start time.Time, body []byte) sample {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, q.url, bytes.NewReader(body))
	if err != nil {
		return sample{outcome: OutcomeTransport, err: err}
	}
	req.Header.Set("Content-Type", "application/json")
	for k, vs := range q.cfg.Header {
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	resp, err := q.cfg.Client.Do(req)
	if err != nil {
		return sample{outcome: OutcomeTransport, err: err}
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return sample{outcome: strconv.Itoa(resp.StatusCode), err: fmt.Errorf("%s", bytes.TrimSpace(msg))}
	}
	var s sample
	switch {
	case !q.cfg.Stream:
		s = q.readWhole(resp.Body)
	case q.cfg.API == APIOllama:
		s = readNDJSON(resp.Body, start, q.keepText)
	default:
		s = readSSE(resp.Body, start, q.keepText)
	}
	s.latency = time.Since(start)
	return s
}

// readWhole reads a non-streamed answer and checks it is one complete
// answer object with its text.
func (q *requester) readWhole(body io.Reader) sample {
	data, err := io.ReadAll(body)
	if err != nil {
		return sample{outcome: OutcomeTruncated, err: err}
	}
	if q.cfg.API == APIOllama {
		var a ollamaAnswer
		if err := json.Unmarshal(data, &a); err != nil || !a.Done {
			return sample{outcome: OutcomeBadBody, err: fmt.Errorf("not a finished Ollama chat answer: %.200s", data)}
		}
		if a.Error != nil {
			return sample{outcome: OutcomeStreamError, err: fmt.Errorf("%s", a.Error)}
		}
		s := sample{outcome: OutcomeOK, completionTokens: a.EvalCount}
		if q.keepText && a.Message != nil {
			s.text = a.Message.Content
		}
		return s
	}
	var a openaiAnswer
	if err := json.Unmarshal(data, &a); err != nil || len(a.Choices) == 0 || a.Choices[0].Message == nil {
		return sample{outcome: OutcomeBadBody, err: fmt.Errorf("not a chat.completion: %.200s", data)}
	}
	s := sample{outcome: OutcomeOK, completionTokens: a.Usage.CompletionTokens}
	if q.keepText {
		s.text = a.Choices[0].Message.Content
	}
	return s
}

// openaiAnswer is the part of a chat.completion (or chunk) loadgen reads.
type openaiAnswer struct {
	Choices []struct {
		Message *struct {
			Content string `json:"content"`
		} `json:"message"`
		Delta *struct {
			Content string `json:"content"`
			// Reasoning text, under its two names (vLLM and DeepSeek;
			// Ollama's /v1 and OpenRouter). Strings only: another type
			// makes the chunk malformed.
			ReasoningContent string `json:"reasoning_content"`
			Reasoning        string `json:"reasoning"`
		} `json:"delta"`
	} `json:"choices"`
	Usage struct {
		CompletionTokens int `json:"completion_tokens"`
	} `json:"usage"`
	Error json.RawMessage `json:"error"`
}

// ollamaAnswer is the part of an Ollama chat answer (or stream line)
// loadgen reads.
type ollamaAnswer struct {
	Message *struct {
		Content  string `json:"content"`
		Thinking string `json:"thinking"`
	} `json:"message"`
	Done      bool            `json:"done"`
	EvalCount int             `json:"eval_count"`
	Error     json.RawMessage `json:"error"`
}

// chunkClock records content chunk arrival times of one stream.
type chunkClock struct {
	start, last time.Time
	s           sample
}

func (c *chunkClock) chunk() {
	now := time.Now()
	if c.s.chunks == 0 {
		c.s.ttft = now.Sub(c.start)
	} else {
		c.s.itl = append(c.s.itl, now.Sub(c.last))
	}
	c.last = now
	c.s.chunks++
}

// errStreamEnd stops reading an SSE stream once its outcome is known.
var errStreamEnd = errors.New("stream outcome known")

// readSSE reads an OpenAI chat completion stream: `data: <chunk>` events
// (package sse, the WHATWG rules) until `data: [DONE]`. A chunk with
// non-empty choices[].delta.content or reasoning text is a content chunk
// (a reasoning model's first token is its reasoning); a chunk with "error"
// ends the stream as OutcomeStreamError.
func readSSE(body io.Reader, start time.Time, keepText bool) sample {
	c := chunkClock{start: start}
	var text strings.Builder
	err := sse.ReadAll(body, func(e sse.Event) error {
		data := bytes.TrimSpace(e.Data)
		if string(data) == "[DONE]" {
			c.s.outcome = OutcomeOK
			return errStreamEnd
		}
		var a openaiAnswer
		if err := json.Unmarshal(data, &a); err != nil {
			c.s.outcome, c.s.err = OutcomeBadBody, fmt.Errorf("chunk is not JSON: %.200s", data)
			return errStreamEnd
		}
		if len(a.Error) > 0 && string(a.Error) != "null" {
			c.s.outcome, c.s.err = OutcomeStreamError, fmt.Errorf("%s", a.Error)
			return errStreamEnd
		}
		for _, ch := range a.Choices {
			if d := ch.Delta; d != nil && (d.Content != "" || d.ReasoningContent != "" || d.Reasoning != "") {
				c.chunk()
				if keepText {
					text.WriteString(d.Content)
				}
				break
			}
		}
		c.s.completionTokens = max(c.s.completionTokens, a.Usage.CompletionTokens)
		return nil
	})
	switch {
	case errors.Is(err, errStreamEnd):
	case err == nil:
		c.s.outcome, c.s.err = OutcomeTruncated, fmt.Errorf("stream ended before [DONE]: %w", io.EOF)
	default:
		c.s.outcome, c.s.err = OutcomeTruncated, fmt.Errorf("stream ended before [DONE]: %w", err)
	}
	c.s.text = text.String()
	return c.s
}

// readNDJSON reads an Ollama chat stream: one JSON object per line until
// one with done true. A line with non-empty message.content or
// message.thinking is a content chunk; a line with "error" ends the stream
// as OutcomeStreamError.
func readNDJSON(body io.Reader, start time.Time, keepText bool) sample {
	c := chunkClock{start: start}
	var text strings.Builder
	br := bufio.NewReaderSize(body, 16<<10)
	for {
		line, err := readLine(br)
		if err != nil {
			c.s.outcome, c.s.err = OutcomeTruncated, fmt.Errorf("stream ended before done: %w", err)
			return c.s
		}
		line = bytes.TrimSpace(line)
		if len(line) == 0 {
			continue
		}
		var a ollamaAnswer
		if err := json.Unmarshal(line, &a); err != nil {
			c.s.outcome, c.s.err = OutcomeBadBody, fmt.Errorf("line is not JSON: %.200s", line)
			return c.s
		}
		if len(a.Error) > 0 && string(a.Error) != "null" {
			c.s.outcome, c.s.err = OutcomeStreamError, fmt.Errorf("%s", a.Error)
			return c.s
		}
		if a.Message != nil && (a.Message.Content != "" || a.Message.Thinking != "") {
			c.chunk()
			if keepText {
				text.WriteString(a.Message.Content)
			}
		}
		if a.Done {
			c.s.outcome, c.s.completionTokens = OutcomeOK, a.EvalCount
			c.s.text = text.String()
			return c.s
		}
	}
}

// errLineTooLong is returned by readLine for a line over maxLine bytes.
var errLineTooLong = errors.New("line too long")

// readLine returns the next line (without its end) of br. The result is
// valid until the next read.
func readLine(br *bufio.Reader) ([]byte, error) {
	line, err := br.ReadSlice('\n')
	if err == nil {
		return line, nil
	}
	if !errors.Is(err, bufio.ErrBufferFull) {
		if err == io.EOF && len(line) > 0 {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	long := append([]byte(nil), line...)
	for errors.Is(err, bufio.ErrBufferFull) {
		if len(long) > maxLine {
			return nil, errLineTooLong
		}
		line, err = br.ReadSlice('\n')
		long = append(long, line...)
	}
	if err != nil {
		return nil, err
	}
	return long, nil
}
