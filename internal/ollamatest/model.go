package ollamatest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/ollama/ollama/fs/ggml"
)

// Variant is a kind of test model: the same random llama weights with a
// template (and, for Embedding, a pooling type) that gives it a set of
// capabilities in /api/show.
type Variant string

// The variants and the capabilities Ollama v0.17.4 reports for each (checked
// by TestCreateModel_Capabilities).
const (
	// Plain: ["completion"]; a chat template with no tools and no
	// thinking. Ollama still answers /api/embed for it (its llama.cpp
	// runner embeds with any llama model), though /api/show does not list
	// "embedding".
	Plain Variant = "plain"
	// Tools: ["completion", "tools"]; the template renders .Tools and
	// .ToolCalls (as <tool_call>{json}</tool_call>).
	Tools Variant = "tools"
	// Thinking: ["completion", "thinking"]; the template renders
	// .Thinking between <think> and </think> and, when the request sets
	// think, ends the prompt with <think>, so Ollama reads what the model
	// writes (it never writes </think>) as thinking.
	Thinking Variant = "thinking"
	// ToolsThinking: ["completion", "tools", "thinking"]; both of the above.
	ToolsThinking Variant = "tools-thinking"
	// Embedding: ["embedding"]; the GGUF has llama.pooling_type 1 (mean),
	// so Ollama serves /api/embed and /v1/embeddings with it (vectors of
	// EmbeddingLength, normalized) and refuses chat and generate.
	Embedding Variant = "embedding"
)

// Capabilities returns what /api/show lists for a model of this variant.
func (v Variant) Capabilities() []string {
	switch v {
	case Plain:
		return []string{"completion"}
	case Tools:
		return []string{"completion", "tools"}
	case Thinking:
		return []string{"completion", "thinking"}
	case ToolsThinking:
		return []string{"completion", "tools", "thinking"}
	case Embedding:
		return []string{"embedding"}
	}
	return nil
}

// Variants lists every Variant.
var Variants = []Variant{Plain, Tools, Thinking, ToolsThinking, Embedding}

// The model's shape. EmbeddingLength is also the length of its embedding
// vectors; DefaultNumPredict the answer length, in tokens, of a request that
// sets no limit (the model's num_predict parameter).
const (
	EmbeddingLength   = 32
	DefaultNumPredict = 16

	layers     = 2
	heads      = 4
	headDim    = EmbeddingLength / heads
	ffnLength  = 64
	contextLen = 4096
	weightSeed = 20261125
)

// Templates (Go text/template, Ollama's template language). The role tags
// are not tokens of the vocabulary: they are tokenized as bytes, like any
// prompt text.
const (
	plainTemplate = `{{- if .System }}<|system|>{{ .System }}
{{ end }}
{{- range .Messages }}<|{{ .Role }}|>{{ .Content }}
{{ end }}<|assistant|>`

	toolsTemplate = `{{- if .System }}<|system|>{{ .System }}
{{ end }}
{{- if .Tools }}<|tools|>{{ range .Tools }}{{ json . }}
{{ end }}{{ end }}
{{- range .Messages }}<|{{ .Role }}|>{{ .Content }}
{{- range .ToolCalls }}<tool_call>{"name": "{{ .Function.Name }}", "arguments": {{ json .Function.Arguments }}}</tool_call>{{ end }}
{{ end }}<|assistant|>`

	thinkingTemplate = `{{- if .System }}<|system|>{{ .System }}
{{ end }}
{{- range .Messages }}<|{{ .Role }}|>{{ if .Thinking }}<think>{{ .Thinking }}</think>{{ end }}{{ .Content }}
{{ end }}<|assistant|>{{ if and .IsThinkSet .Think }}<think>{{ end }}`

	toolsThinkingTemplate = `{{- if .System }}<|system|>{{ .System }}
{{ end }}
{{- if .Tools }}<|tools|>{{ range .Tools }}{{ json . }}
{{ end }}{{ end }}
{{- range .Messages }}<|{{ .Role }}|>{{ if .Thinking }}<think>{{ .Thinking }}</think>{{ end }}{{ .Content }}
{{- range .ToolCalls }}<tool_call>{"name": "{{ .Function.Name }}", "arguments": {{ json .Function.Arguments }}}</tool_call>{{ end }}
{{ end }}<|assistant|>{{ if and .IsThinkSet .Think }}<think>{{ end }}`
)

func (v Variant) template() string {
	switch v {
	case Tools:
		return toolsTemplate
	case Thinking:
		return thinkingTemplate
	case ToolsThinking:
		return toolsThinkingTemplate
	}
	return plainTemplate
}

// CreateModel creates the model name (for example "tiny" or "tiny:latest")
// of variant v on the server: it writes the GGUF, uploads it (POST
// /api/blobs/sha256:…, unless the server has it) and calls POST /api/create
// with its template and, but for Embedding, num_predict DefaultNumPredict.
// It fails the test on any error.
func (s *Server) CreateModel(t testing.TB, name string, v Variant) {
	t.Helper()
	if v.Capabilities() == nil {
		t.Fatalf("unknown variant %q", v)
	}
	gguf, err := WriteGGUF(filepath.Join(t.TempDir(), "model.gguf"), name, v)
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(gguf)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(data)
	digest := "sha256:" + hex.EncodeToString(sum[:])

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if status, _ := s.request(ctx, http.MethodHead, "/api/blobs/"+digest, nil); status != http.StatusOK {
		if status, body := s.request(ctx, http.MethodPost, "/api/blobs/"+digest, data); status != http.StatusCreated && status != http.StatusOK {
			t.Fatalf("uploading the blob of %s: %d %s", name, status, trimJSON(body))
		}
	}
	create := map[string]any{
		"model":    name,
		"files":    map[string]string{"model.gguf": digest},
		"template": v.template(),
		"stream":   false,
	}
	// One thread: the model is so small that a second one only waits for
	// the first, and on a loaded machine ggml's thread sync made a token
	// take 80 ms instead of 0.15.
	params := map[string]any{"num_thread": 1}
	if v != Embedding {
		params["num_predict"] = DefaultNumPredict
	}
	create["parameters"] = params
	body, _ := json.Marshal(create)
	status, answer := s.request(ctx, http.MethodPost, "/api/create", body)
	if status != http.StatusOK || !bytes.Contains(answer, []byte(`"success"`)) {
		t.Fatalf("POST /api/create %s: %d %s", name, status, trimJSON(answer))
	}
}

// DeleteModel removes the model name from the server (DELETE /api/delete).
func (s *Server) DeleteModel(t testing.TB, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	body, _ := json.Marshal(map[string]string{"model": name})
	if status, answer := s.request(ctx, http.MethodDelete, "/api/delete", body); status != http.StatusOK {
		t.Fatalf("DELETE /api/delete %s: %d %s", name, status, trimJSON(answer))
	}
}

// Capabilities returns the capabilities POST /api/show lists for name.
func (s *Server) Capabilities(t testing.TB, name string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	body, _ := json.Marshal(map[string]string{"model": name})
	status, answer := s.request(ctx, http.MethodPost, "/api/show", body)
	if status != http.StatusOK {
		t.Fatalf("POST /api/show %s: %d %s", name, status, trimJSON(answer))
	}
	var show struct {
		Capabilities []string `json:"capabilities"`
	}
	if err := json.Unmarshal(answer, &show); err != nil {
		t.Fatalf("POST /api/show %s: %v: %s", name, err, trimJSON(answer))
	}
	return show.Capabilities
}

// Running returns the names of the models loaded now (GET /api/ps).
func (s *Server) Running(t testing.TB) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	status, answer := s.request(ctx, http.MethodGet, "/api/ps", nil)
	if status != http.StatusOK {
		t.Fatalf("GET /api/ps: %d %s", status, trimJSON(answer))
	}
	var ps struct {
		Models []struct {
			Name string `json:"name"`
		} `json:"models"`
	}
	if err := json.Unmarshal(answer, &ps); err != nil {
		t.Fatalf("GET /api/ps: %v: %s", err, trimJSON(answer))
	}
	var names []string
	for _, m := range ps.Models {
		names = append(names, m.Name)
	}
	return names
}

// request sends one request to the server and returns its status and body
// (status 0 and the error's text if it could not be sent).
func (s *Server) request(ctx context.Context, method, path string, body []byte) (int, []byte) {
	req, err := http.NewRequestWithContext(ctx, method, s.URL+path, bytes.NewReader(body))
	if err != nil {
		return 0, []byte(err.Error())
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := s.Client.Do(req)
	if err != nil {
		return 0, []byte(err.Error())
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// WriteGGUF writes the GGUF file of a test model named name (its
// general.name) of variant v at path and returns path. The weights come from
// a fixed seed, so the file is the same on every call with the same name and
// variant; models of different names are different files, so Ollama loads
// a runner of its own for each (it shares one between models of one file).
//
// Shapes are in ggml's order, innermost (contiguous) dimension first: a
// weight W that maps n inputs to m outputs is [n, m], stored as m rows of n
// floats, row j giving output j. Dimension 0 of the residual stream is a
// constant lane: every token embedding has 2 there and no layer writes it
// (row 0 of attn_output and ffn_down is zero), so after the final RMSNorm it
// is positive, and column 0 of the output projection acts as a per-token
// bias: -50 for <unk>, <s>, </s> and the byte tokens, 0 for the word pieces.
// So an answer never ends by itself and is made of word pieces only (a
// stream of random bytes would stall: Ollama holds back output until it is
// valid UTF-8). The other weights of the output projection are small
// (standard deviation 0.1), so sampling at Ollama's default temperature is
// close to uniform over the word pieces, and Ollama's repeat limit (it cuts
// an answer that repeats one token 30 times in a row) is practically never
// hit; a greedy answer (temperature 0) does loop after a few dozen tokens.
func WriteGGUF(path, name string, v Variant) (string, error) {
	tokens, types := vocabulary()
	n := len(tokens)
	rng := rand.New(rand.NewPCG(weightSeed, 1))
	normal := func(count int, std float64) []float32 {
		w := make([]float32, count)
		for i := range w {
			w[i] = float32(rng.NormFloat64() * std)
		}
		return w
	}
	ones := func(count int) []float32 {
		w := make([]float32, count)
		for i := range w {
			w[i] = 1
		}
		return w
	}

	embd := normal(EmbeddingLength*n, 1)
	out := normal(EmbeddingLength*n, 0.1)
	for tok := range n {
		embd[tok*EmbeddingLength] = float32(2)
		bias := float32(0.5)
		switch types[tok] {
		case tokenUnknown, tokenControl:
			bias = -50
		case tokenByte:
			bias = -50
		}
		out[tok*EmbeddingLength] = bias
	}
	tensors := []*ggml.Tensor{
		f32("token_embd.weight", embd, EmbeddingLength, uint64(n)),
		f32("output_norm.weight", ones(EmbeddingLength), EmbeddingLength),
		f32("output.weight", out, EmbeddingLength, uint64(n)),
	}
	in := 1 / math.Sqrt(EmbeddingLength)
	for l := range layers {
		blk := fmt.Sprintf("blk.%d.", l)
		attnOut := normal(EmbeddingLength*EmbeddingLength, 0.5)
		clear(attnOut[:EmbeddingLength]) // row 0: the constant lane
		down := normal(ffnLength*EmbeddingLength, 0.5)
		clear(down[:ffnLength])
		tensors = append(tensors,
			f32(blk+"attn_norm.weight", ones(EmbeddingLength), EmbeddingLength),
			f32(blk+"attn_q.weight", normal(EmbeddingLength*EmbeddingLength, in), EmbeddingLength, EmbeddingLength),
			f32(blk+"attn_k.weight", normal(EmbeddingLength*EmbeddingLength, in), EmbeddingLength, EmbeddingLength),
			f32(blk+"attn_v.weight", normal(EmbeddingLength*EmbeddingLength, in), EmbeddingLength, EmbeddingLength),
			f32(blk+"attn_output.weight", attnOut, EmbeddingLength, EmbeddingLength),
			f32(blk+"ffn_norm.weight", ones(EmbeddingLength), EmbeddingLength),
			f32(blk+"ffn_gate.weight", normal(EmbeddingLength*ffnLength, in), EmbeddingLength, ffnLength),
			f32(blk+"ffn_up.weight", normal(EmbeddingLength*ffnLength, in), EmbeddingLength, ffnLength),
			f32(blk+"ffn_down.weight", down, ffnLength, EmbeddingLength),
		)
	}

	scores := make([]float32, n)
	for i := range scores {
		scores[i] = -float32(i)
	}
	kv := ggml.KV{
		"general.architecture":                   "llama",
		"general.name":                           name,
		"general.file_type":                      uint32(0), // all F32
		"llama.block_count":                      uint32(layers),
		"llama.context_length":                   uint32(contextLen),
		"llama.embedding_length":                 uint32(EmbeddingLength),
		"llama.feed_forward_length":              uint32(ffnLength),
		"llama.attention.head_count":             uint32(heads),
		"llama.attention.head_count_kv":          uint32(heads),
		"llama.attention.layer_norm_rms_epsilon": float32(1e-5),
		"llama.rope.dimension_count":             uint32(headDim),
		"llama.rope.freq_base":                   float32(10000),
		"llama.vocab_size":                       uint32(n),
		"tokenizer.ggml.model":                   "llama",
		"tokenizer.ggml.tokens":                  tokens,
		"tokenizer.ggml.scores":                  scores,
		"tokenizer.ggml.token_type":              types,
		"tokenizer.ggml.unknown_token_id":        uint32(0),
		"tokenizer.ggml.bos_token_id":            uint32(1),
		"tokenizer.ggml.eos_token_id":            uint32(2),
		"tokenizer.ggml.add_bos_token":           true,
		"tokenizer.ggml.add_eos_token":           false,
	}
	if v == Embedding {
		kv["llama.pooling_type"] = uint32(1) // mean
	}
	f, err := os.Create(path)
	if err != nil {
		return "", err
	}
	if err := ggml.WriteGGUF(f, kv, tensors); err != nil {
		f.Close()
		return "", fmt.Errorf("writing %s: %w", path, err)
	}
	return path, f.Close()
}

// SentencePiece token types (llama.cpp's llama_token_type).
const (
	tokenNormal  int32 = 1
	tokenUnknown int32 = 2
	tokenControl int32 = 3
	tokenByte    int32 = 6
)

// words are the vocabulary's word pieces, each also with SentencePiece's
// word-start mark "▁".
var words = []string{
	"the", "a", "an", "of", "to", "and", "in", "is", "it", "that", "sky", "blue",
	"sun", "light", "red", "green", "why", "how", "what", "time", "once", "upon",
	"there", "was", "we", "you", "they", "not", "very", "more", "less", "air",
	"water", "cloud", "rain", "day", "night", "model", "token", "text", "word",
	"i", "s", "e", "t", "o", "n", "r", "l", "d", "m", "er", "ing", "ed", "ly",
	".", ",", "!", "?", ":", "-",
}

// vocabulary returns the tokens and their types: <unk>, <s>, </s>, the 256
// byte tokens <0x00>…<0xFF> (SentencePiece's byte fallback: any text can be
// tokenized, and any byte sequence, valid UTF-8 or not, generated), "▁",
// then each word with and without "▁".
func vocabulary() ([]string, []int32) {
	tokens := []string{"<unk>", "<s>", "</s>"}
	types := []int32{tokenUnknown, tokenControl, tokenControl}
	for b := range 256 {
		tokens = append(tokens, fmt.Sprintf("<0x%02X>", b))
		types = append(types, tokenByte)
	}
	tokens = append(tokens, "▁")
	types = append(types, tokenNormal)
	for _, w := range words {
		for _, piece := range []string{"▁" + w, w} {
			if !slices.Contains(tokens, piece) {
				tokens = append(tokens, piece)
				types = append(types, tokenNormal)
			}
		}
	}
	return tokens, types
}

// f32 is an F32 tensor of the given ggml shape holding data.
func f32(name string, data []float32, shape ...uint64) *ggml.Tensor {
	return &ggml.Tensor{Name: name, Kind: uint32(ggml.TensorTypeF32), Shape: shape, WriterTo: floats(data)}
}

// floats writes float32s little-endian.
type floats []float32

func (f floats) WriteTo(w io.Writer) (int64, error) {
	b := make([]byte, 4*len(f))
	for i, x := range f {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	n, err := w.Write(b)
	return int64(n), err
}
