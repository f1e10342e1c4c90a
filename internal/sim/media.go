package sim

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"image"
	"image/color"
	"image/png"
	"io"
	"math"
	"mime"
	"mime/multipart"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"
)

// The media routes of the OpenAI protocol, as the servers iop relays to
// answer them:
//
//	POST /v1/rerank, /rerank                  vLLM's rerank API (Jina/Cohere shape)
//	POST /v1/audio/transcriptions             OpenAI's, multipart/form-data, read as a stream
//	POST /v1/audio/speech                     OpenAI's: audio bytes, streamed in chunks
//	POST /v1/images/generations               OpenAI's: PNG images as b64_json (or data: URLs)
//	POST /infill, /completion                 llama.cpp server's native API (SSE with "stream":true)
//
// Each records the body's length and SHA-256 as received
// (SeenRequest.BodyBytes, BodySHA256), so tests check a relay byte for
// byte, and takes an in-flight slot as every inference request does.

// maxMediaBodyBytes bounds an uploaded transcription body; it is read as
// it comes, never held.
const maxMediaBodyBytes = 8 << 30

func (s *Server) mediaRoutes(mux *http.ServeMux) {
	for _, prefix := range []string{"/v1", ""} {
		mux.HandleFunc("POST "+prefix+"/rerank", s.answered(s.rerank))
		mux.HandleFunc("POST "+prefix+"/audio/transcriptions", s.answered(s.transcription))
		mux.HandleFunc("POST "+prefix+"/audio/speech", s.answered(s.speech))
		mux.HandleFunc("POST "+prefix+"/images/generations", s.answered(s.images))
	}
	mux.HandleFunc("POST /infill", s.answered(s.llamaCompletion(true)))
	mux.HandleFunc("POST /completion", s.answered(s.llamaCompletion(false)))
}

// MediaAnswer is what a media route answered: its path, status, and
// its body's length and SHA-256 (hex), as written.
type MediaAnswer struct {
	Path       string
	Status     int
	BodyBytes  int64
	BodySHA256 string
}

// MediaAnswers lists the media routes' answers, oldest first (at most
// the last maxSeen).
func (s *Server) MediaAnswers() []MediaAnswer {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]MediaAnswer(nil), s.mediaAnswers...)
}

// answered records h's answer (MediaAnswers) once it returns.
func (s *Server) answered(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		hw := &hashWriter{ResponseWriter: w, sum: countingHash{h: sha256.New()}}
		defer func() {
			a := MediaAnswer{Path: r.URL.Path, Status: cmp.Or(hw.status, http.StatusOK), BodyBytes: hw.sum.n,
				BodySHA256: hex.EncodeToString(hw.sum.h.Sum(nil))}
			s.mu.Lock()
			if len(s.mediaAnswers) == maxSeen {
				s.mediaAnswers = s.mediaAnswers[1:]
			}
			s.mediaAnswers = append(s.mediaAnswers, a)
			s.mu.Unlock()
		}()
		h(hw, r)
	}
}

// hashWriter is a ResponseWriter that hashes the body written.
type hashWriter struct {
	http.ResponseWriter
	status int
	sum    countingHash
}

func (h *hashWriter) WriteHeader(status int) {
	if h.status == 0 {
		h.status = status
	}
	h.ResponseWriter.WriteHeader(status)
}

func (h *hashWriter) Write(p []byte) (int, error) {
	if h.status == 0 {
		h.status = http.StatusOK
	}
	n, err := h.ResponseWriter.Write(p)
	_, _ = h.sum.Write(p[:n])
	return n, err
}

func (h *hashWriter) Flush() {
	if f, ok := h.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (h *hashWriter) Unwrap() http.ResponseWriter { return h.ResponseWriter }

// acceptJSON is accept for a media route's JSON body: it records the
// body's length and hash, and parses it into v, whose "model" it returns.
func (s *Server) acceptJSON(w http.ResponseWriter, r *http.Request, v any, model func() string) (request, func(), error) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	if err != nil {
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			err = errBodyTooLarge
		} else {
			err = fmt.Errorf("%w: reading body: %w", errInvalidRequest, err)
		}
	} else {
		err = decodeJSON(body, v)
	}
	sum := sha256.Sum256(body)
	req := request{maxTokens: noLimit}
	if err == nil {
		req.model = model()
		req.prompt = string(body)
	}
	s.recordSeen(SeenRequest{Method: r.Method, Path: r.URL.Path, Model: req.model, Authorization: r.Header.Get("Authorization"),
		BodyBytes: int64(len(body)), BodySHA256: hex.EncodeToString(sum[:])})
	return s.admit(r, req, err)
}

// rerankRequest is vLLM's rerank request (and Jina's, Cohere's): the
// documents are strings or {"text"} objects.
type rerankRequest struct {
	Model           string            `json:"model"`
	Query           string            `json:"query"`
	Documents       []json.RawMessage `json:"documents"`
	TopN            *int              `json:"top_n"`
	ReturnDocuments *bool             `json:"return_documents"`
}

// rerank answers vLLM's {"id","model","usage":{"total_tokens"},
// "results":[{"index","document":{"text"},"relevance_score"}]}, the
// results by score, highest first, top_n of them. A document's score is
// the share of the query's words it holds, nudged by a hash of it.
func (s *Server) rerank(w http.ResponseWriter, r *http.Request) {
	var in rerankRequest
	req, release, err := s.acceptJSON(w, r, &in, func() string { return in.Model })
	if err == nil && (in.Query == "" || len(in.Documents) == 0) {
		release()
		err = fmt.Errorf("%w: query and documents are required", errInvalidRequest)
	}
	if err != nil {
		s.fail(w, r, writeOpenAIError, err)
		return
	}
	defer release()
	texts := make([]string, len(in.Documents))
	for i, d := range in.Documents {
		var obj struct {
			Text string `json:"text"`
		}
		if json.Unmarshal(d, &texts[i]) != nil && json.Unmarshal(d, &obj) == nil {
			texts[i] = obj.Text
		}
	}
	if s.wait(r.Context(), s.cfg.TTFT) != nil {
		abortConnection()
	}
	type result struct {
		Index    int                `json:"index"`
		Document *map[string]string `json:"document,omitempty"`
		Score    float64            `json:"relevance_score"`
	}
	query := strings.Fields(strings.ToLower(in.Query))
	results := make([]result, len(texts))
	tokens := len(query)
	for i, text := range texts {
		words := strings.Fields(strings.ToLower(text))
		tokens += len(words)
		hits := 0
		for _, q := range query {
			for _, d := range words {
				if d == q {
					hits++
					break
				}
			}
		}
		score := 0.9*float64(hits)/float64(max(len(query), 1)) + float64(rngFor(s.cfg.Seed, text).IntN(100))/1000
		results[i] = result{Index: i, Score: score}
		if in.ReturnDocuments == nil || *in.ReturnDocuments {
			results[i].Document = &map[string]string{"text": text}
		}
	}
	sort.SliceStable(results, func(a, b int) bool { return results[a].Score > results[b].Score })
	if in.TopN != nil && *in.TopN >= 0 && *in.TopN < len(results) {
		results = results[:*in.TopN]
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"id": fmt.Sprintf("rerank-%d", req.seq), "model": req.model,
		"usage": map[string]int{"total_tokens": tokens}, "results": results})
}

// countingHash is the length and SHA-256 of what went through it.
type countingHash struct {
	n int64
	h hash.Hash
}

func (c *countingHash) Write(p []byte) (int, error) {
	c.n += int64(len(p))
	return c.h.Write(p)
}

// transcription reads OpenAI's multipart transcription request as it
// comes (the file is hashed, never held) and answers by response_format:
// json (the default) {"text"}, text as text/plain, verbose_json
// {"task","language","duration","text","segments":[]}. The text names the
// audio's length and hash. The slot is taken once the body is in.
func (s *Server) transcription(w http.ResponseWriter, r *http.Request) {
	sum := &countingHash{h: sha256.New()}
	body := io.TeeReader(http.MaxBytesReader(w, r.Body, maxMediaBodyBytes), sum)
	fields, fileBytes, err := readTranscription(r.Header.Get("Content-Type"), body)
	_, _ = io.Copy(io.Discard, body) // the epilogue, if any
	s.recordSeen(SeenRequest{Method: r.Method, Path: r.URL.Path, Model: fields["model"], Authorization: r.Header.Get("Authorization"),
		BodyBytes: sum.n, BodySHA256: hex.EncodeToString(sum.h.Sum(nil))})
	_, release, err := s.admit(r, request{model: fields["model"], maxTokens: noLimit}, err)
	if err != nil {
		s.fail(w, r, writeOpenAIError, err)
		return
	}
	defer release()
	if s.wait(r.Context(), s.cfg.TTFT) != nil {
		abortConnection()
	}
	text := fmt.Sprintf("Transcribed %d bytes of %s with hash %x.", fileBytes, fields["filename"], sum.h.Sum(nil)[:8])
	switch fields["response_format"] {
	case "", "json":
		writeJSON(w, http.StatusOK, map[string]string{"text": text})
	case "text":
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = io.WriteString(w, text+"\n")
	case "verbose_json":
		writeJSON(w, http.StatusOK, map[string]any{"task": "transcribe", "language": cmp.Or(fields["language"], "english"),
			"duration": float64(fileBytes) / 32000, "text": text, "segments": []any{}})
	default:
		s.fail(w, r, writeOpenAIError, fmt.Errorf("%w: response_format %q: the simulator answers json, text or verbose_json",
			errInvalidRequest, fields["response_format"]))
	}
}

// readTranscription reads a multipart/form-data body: its text fields
// (model, language, prompt, response_format, ...; the file's name as
// "filename") and the length of its "file" part, which is read and
// dropped. "model" and "file" are required.
func readTranscription(contentType string, body io.Reader) (map[string]string, int64, error) {
	mt, params, err := mime.ParseMediaType(contentType)
	if err != nil || mt != "multipart/form-data" || params["boundary"] == "" {
		return nil, 0, fmt.Errorf("%w: Content-Type must be multipart/form-data with a boundary", errInvalidRequest)
	}
	fields := map[string]string{}
	var fileBytes int64
	file := false
	mr := multipart.NewReader(body, params["boundary"])
	for {
		part, err := mr.NextRawPart()
		if err == io.EOF {
			break
		}
		if err != nil {
			return fields, 0, fmt.Errorf("%w: multipart body: %w", errInvalidRequest, err)
		}
		name := part.FormName()
		if name == "file" {
			file = true
			fields["filename"] = part.FileName()
			if fileBytes, err = io.Copy(io.Discard, part); err != nil {
				return fields, 0, fmt.Errorf("%w: file: %w", errInvalidRequest, err)
			}
			continue
		}
		v, err := io.ReadAll(io.LimitReader(part, 1<<20))
		if err != nil {
			return fields, 0, fmt.Errorf("%w: %s: %w", errInvalidRequest, name, err)
		}
		fields[name] = string(v)
	}
	switch {
	case fields["model"] == "":
		return fields, 0, fmt.Errorf("%w: the field model is required", errInvalidRequest)
	case !file:
		return fields, 0, fmt.Errorf("%w: the field file is required", errInvalidRequest)
	}
	return fields, fileBytes, nil
}

// speechRequest is OpenAI's speech request.
type speechRequest struct {
	Model          string   `json:"model"`
	Input          string   `json:"input"`
	Voice          string   `json:"voice"`
	ResponseFormat string   `json:"response_format"`
	Speed          *float64 `json:"speed"`
}

// speechTypes are the Content-Types of OpenAI's speech formats.
var speechTypes = map[string]string{"mp3": "audio/mpeg", "opus": "audio/opus", "aac": "audio/aac",
	"flac": "audio/flac", "wav": "audio/wav", "pcm": "audio/pcm"}

// speechRate is the sample rate of the speech answers: 24 kHz, 16-bit
// mono, as OpenAI's pcm.
const speechRate = 24000

// speech answers OpenAI's speech request with audio bytes, streamed in
// chunks of 4800 samples (0.2 s) a token interval apart: 60 ms of a tone
// per input character. wav is a WAV file and pcm raw 16-bit samples;
// mp3, opus, aac and flac are the same samples under their Content-Type
// (the simulator encodes no codec).
func (s *Server) speech(w http.ResponseWriter, r *http.Request) {
	var in speechRequest
	_, release, err := s.acceptJSON(w, r, &in, func() string { return in.Model })
	format := cmp.Or(in.ResponseFormat, "mp3")
	if err == nil && (in.Input == "" || in.Voice == "" || speechTypes[format] == "") {
		release()
		err = fmt.Errorf("%w: input and voice are required, response_format one of mp3, opus, aac, flac, wav, pcm", errInvalidRequest)
	}
	if err != nil {
		s.fail(w, r, writeOpenAIError, err)
		return
	}
	defer release()
	samples := min(len([]rune(in.Input))*speechRate*6/100, 60*speechRate)
	audio := make([]byte, 0, 44+2*samples)
	if format == "wav" {
		audio = appendWAVHeader(audio, samples)
	}
	for i := range samples {
		v := int16(8000 * math.Sin(2*math.Pi*440*float64(i)/speechRate))
		audio = binary.LittleEndian.AppendUint16(audio, uint16(v))
	}
	w.Header().Set("Content-Type", speechTypes[format])
	const chunk = 2 * 4800
	steps := (len(audio) + chunk - 1) / chunk
	flusher, _ := w.(http.Flusher)
	s.paceSteps(r.Context(), 0, steps, func(i int) error {
		if _, err := w.Write(audio[i*chunk : min((i+1)*chunk, len(audio))]); err != nil {
			return err
		}
		if flusher != nil {
			flusher.Flush()
		}
		return nil
	})
}

// appendWAVHeader appends the 44-byte header of a WAV file of samples
// 16-bit mono samples at speechRate.
func appendWAVHeader(b []byte, samples int) []byte {
	data := uint32(2 * samples)
	b = append(b, "RIFF"...)
	b = binary.LittleEndian.AppendUint32(b, 36+data)
	b = append(b, "WAVEfmt "...)
	b = binary.LittleEndian.AppendUint32(b, 16)
	b = binary.LittleEndian.AppendUint16(b, 1) // PCM
	b = binary.LittleEndian.AppendUint16(b, 1) // mono
	b = binary.LittleEndian.AppendUint32(b, speechRate)
	b = binary.LittleEndian.AppendUint32(b, 2*speechRate)
	b = binary.LittleEndian.AppendUint16(b, 2)
	b = binary.LittleEndian.AppendUint16(b, 16)
	b = append(b, "data"...)
	return binary.LittleEndian.AppendUint32(b, data)
}

// imagesRequest is OpenAI's image generation request.
type imagesRequest struct {
	Model          string `json:"model"`
	Prompt         string `json:"prompt"`
	N              *int   `json:"n"`
	Size           string `json:"size"`
	ResponseFormat string `json:"response_format"`
}

// images answers OpenAI's {"created","data":[{"b64_json"}]} (or "url", a
// data: URL, for response_format url) with n PNG images of size (at most
// 1024x1024; default 256x256) in one colour drawn from the prompt.
func (s *Server) images(w http.ResponseWriter, r *http.Request) {
	var in imagesRequest
	_, release, err := s.acceptJSON(w, r, &in, func() string { return in.Model })
	n := 1
	if in.N != nil {
		n = *in.N
	}
	width, height, sizeErr := parseSize(cmp.Or(in.Size, "256x256"))
	switch {
	case err != nil:
	case in.Prompt == "" || n < 1 || n > 10 || sizeErr != nil:
		release()
		err = fmt.Errorf("%w: prompt is required, n from 1 to 10, size WxH up to 1024x1024", errInvalidRequest)
	case in.ResponseFormat != "" && in.ResponseFormat != "url" && in.ResponseFormat != "b64_json":
		release()
		err = fmt.Errorf("%w: response_format must be url or b64_json", errInvalidRequest)
	}
	if err != nil {
		s.fail(w, r, writeOpenAIError, err)
		return
	}
	defer release()
	if s.wait(r.Context(), s.cfg.TTFT) != nil {
		abortConnection()
	}
	data := make([]map[string]string, n)
	for i := range data {
		rng := rngFor(s.cfg.Seed, fmt.Sprintf("%s\x00%d", in.Prompt, i))
		img := image.NewNRGBA(image.Rect(0, 0, width, height))
		c := color.NRGBA{uint8(rng.IntN(256)), uint8(rng.IntN(256)), uint8(rng.IntN(256)), 255}
		for y := range height {
			for x := range width {
				img.SetNRGBA(x, y, c)
			}
		}
		var buf bytes.Buffer
		_ = png.Encode(&buf, img)
		b64 := base64.StdEncoding.EncodeToString(buf.Bytes())
		if in.ResponseFormat == "url" {
			data[i] = map[string]string{"url": "data:image/png;base64," + b64, "revised_prompt": in.Prompt}
		} else {
			data[i] = map[string]string{"b64_json": b64, "revised_prompt": in.Prompt}
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"created": s.clock.Now().Unix(), "data": data})
}

// parseSize reads "WxH" with each side from 1 to 1024.
func parseSize(size string) (int, int, error) {
	ws, hs, ok := strings.Cut(size, "x")
	wi, werr := strconv.Atoi(ws)
	hi, herr := strconv.Atoi(hs)
	if !ok || werr != nil || herr != nil || wi < 1 || hi < 1 || wi > 1024 || hi > 1024 {
		return 0, 0, fmt.Errorf("%w: size %q", errInvalidRequest, size)
	}
	return wi, hi, nil
}

// llamaRequest is llama.cpp's /completion and /infill request (the
// fields the simulator reads; "model" is iop's, for routing).
type llamaRequest struct {
	Model       string          `json:"model"`
	Prompt      json.RawMessage `json:"prompt"`
	InputPrefix *string         `json:"input_prefix"`
	InputSuffix *string         `json:"input_suffix"`
	NPredict    *int            `json:"n_predict"`
	Stream      bool            `json:"stream"`
}

// llamaCompletion answers llama.cpp server's /completion (infill false)
// or /infill: {"index","content","tokens","id_slot","stop":true,"model",
// "tokens_predicted","tokens_evaluated","stop_type","stopping_word",
// "tokens_cached","truncated","timings":{...}}; with "stream":true an
// event stream of {"index","content","tokens","stop":false,"id_slot",
// "tokens_predicted","tokens_evaluated"} per token, then that final
// object with "content":"" and "stop":true, and no [DONE] (llama.cpp's
// server README, "POST /completion"). /infill needs input_prefix and
// input_suffix.
func (s *Server) llamaCompletion(infill bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var in llamaRequest
		req, release, err := s.acceptJSON(w, r, &in, func() string { return in.Model })
		if err == nil && infill && (in.InputPrefix == nil || in.InputSuffix == nil) {
			release()
			err = fmt.Errorf("%w: input_prefix and input_suffix are required", errInvalidRequest)
		}
		if err == nil && !infill && len(in.Prompt) == 0 {
			release()
			err = fmt.Errorf("%w: prompt is required", errInvalidRequest)
		}
		if err != nil {
			s.fail(w, r, writeOpenAIError, err)
			return
		}
		defer release()
		if in.NPredict != nil && *in.NPredict >= 0 {
			req.maxTokens = *in.NPredict
		}
		c := complete(s.cfg.Seed, s.cfg.DefaultMaxTokens, req)
		evaluated := countWords(req.prompt)
		start := s.clock.Now()
		final := func(content string) map[string]any {
			ms := float64(s.clock.Now().Sub(start)) / float64(time.Millisecond)
			return map[string]any{"index": 0, "content": content, "tokens": []int{}, "id_slot": 0, "stop": true,
				"model": req.model, "tokens_predicted": len(c.tokens), "tokens_evaluated": evaluated,
				"stop_type": "limit", "stopping_word": "", "tokens_cached": 0, "truncated": false,
				"timings": map[string]any{"prompt_n": evaluated, "prompt_ms": 0.0, "predicted_n": len(c.tokens), "predicted_ms": ms}}
		}
		if !in.Stream {
			if s.wait(r.Context(), s.cfg.TTFT+time.Duration(len(c.tokens))*s.cfg.tokenInterval()) != nil {
				abortConnection()
			}
			for range c.tokens {
				s.countToken()
			}
			writeJSON(w, http.StatusOK, final(c.text()))
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		flusher, _ := w.(http.Flusher)
		event := func(v any) error {
			b, _ := json.Marshal(v)
			if _, err := fmt.Fprintf(w, "data: %s\n\n", b); err != nil {
				return err
			}
			if flusher != nil {
				flusher.Flush()
			}
			return nil
		}
		s.pace(r.Context(), c, func(token string) error {
			return event(map[string]any{"index": 0, "content": token, "tokens": []int{}, "stop": false, "id_slot": -1,
				"tokens_predicted": 1, "tokens_evaluated": evaluated})
		})
		_ = event(final(""))
	}
}
