package e2e

// End-to-end tests of tool calls, embeddings, completions and stream
// framing: a real edge, a real node agent over gRPC and `iop sim` backends
// of both protocols, driven with the official OpenAI Go client and with raw
// HTTP where the bytes themselves are under test.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"io"
	"log/slog"
	"math"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/shared"

	"iop/internal/clock"
	"iop/internal/e2e/harness"
	"iop/internal/node"
	"iop/internal/process"
	"iop/internal/sim"
	"iop/internal/sse"
)

// Model names of the endpoint tests: one served name per execution path,
// both simulators sharing a seed so they answer alike.
const (
	normalizedModel = "llama3:8b"
	tunnelModel     = "meta-llama/Llama-3-8B"
	plainModel      = "plain-model" // a provider without capabilities
)

type endpointEnv struct {
	e          *process.Process
	client     openai.Client
	ollamaSim  *sim.Server
	ollamaURL  string
	openaiSim  *sim.Server
	openaiURL  string
	logs       *logRecorder
	byPath     []endpointPath
	httpClient *http.Client
}

type endpointPath struct {
	name, model string
	tunnel      bool
}

// startEndpointEnv starts the sims, an edge (logging into a recorder) and
// one node with a provider per path (tools and embeddings) and one plain
// provider.
func startEndpointEnv(t *testing.T) *endpointEnv {
	t.Helper()
	env := &endpointEnv{logs: &logRecorder{}}
	env.ollamaSim, env.ollamaURL = harness.Sim(t, sim.Config{Protocol: sim.ProtocolOllama, Models: []string{normalizedModel}, Seed: 11})
	env.openaiSim, env.openaiURL = harness.Sim(t, sim.Config{Protocol: sim.ProtocolOpenAI, Models: []string{tunnelModel}, Seed: 11})
	_, plainURL := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOllama, Models: []string{plainModel}})
	ctx, cancel := context.WithCancel(context.Background())
	cfg := process.DefaultEdgeFile()
	cfg.Listen, cfg.NodeListen = "127.0.0.1:0", "127.0.0.1:0"
	e, err := process.Start(ctx, process.Config{Mode: process.ModeEdge, Edge: cfg}, process.Deps{Logger: slog.New(env.logs)})
	if err != nil {
		t.Fatal(err)
	}
	env.e = e
	harness.StopAtCleanup(t, cancel, e)
	caps := []string{"tools", "embeddings"}
	harness.Node(t, ctx, node.Config{
		NodeID: "gpu-1",
		Edge:   e.NodeAddr,
		Providers: []node.ProviderConfig{
			{ID: "ollama", Type: node.TypeOllama, BaseURL: env.ollamaURL, Models: []string{normalizedModel}, Capacity: 4, Capabilities: caps},
			{ID: "vllm", Type: "vllm", BaseURL: env.openaiURL + "/v1", Models: []string{tunnelModel}, Capacity: 4, Capabilities: caps},
			{ID: "plain", Type: node.TypeOllama, BaseURL: plainURL, Models: []string{plainModel}, Capacity: 1},
		},
	})
	env.client = newClient(e)
	env.byPath = []endpointPath{{"normalized", normalizedModel, false}, {"tunnel", tunnelModel, true}}
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	env.httpClient = &http.Client{Transport: tr}
	t.Cleanup(func() { waitIdle(t, e) })
	return env
}

// logRecorder is a slog.Handler that keeps every record's message and
// attributes, for tests of what the edge logs.
type logRecorder struct {
	mu      sync.Mutex
	records []map[string]string
	attrs   []slog.Attr
}

func (l *logRecorder) Enabled(context.Context, slog.Level) bool { return true }

func (l *logRecorder) Handle(_ context.Context, r slog.Record) error {
	rec := map[string]string{"msg": r.Message, "level": r.Level.String()}
	for _, a := range l.attrs {
		rec[a.Key] = a.Value.String()
	}
	r.Attrs(func(a slog.Attr) bool {
		rec[a.Key] = a.Value.String()
		return true
	})
	l.mu.Lock()
	defer l.mu.Unlock()
	l.records = append(l.records, rec)
	return nil
}

func (l *logRecorder) WithAttrs(attrs []slog.Attr) slog.Handler {
	l.mu.Lock()
	defer l.mu.Unlock()
	return &logView{root: l, attrs: append(append([]slog.Attr(nil), l.attrs...), attrs...)}
}

func (l *logRecorder) WithGroup(string) slog.Handler { return l }

// find returns the records whose attributes include every key=value of want.
func (l *logRecorder) find(want map[string]string) []map[string]string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]string
	for _, rec := range l.records {
		ok := true
		for k, v := range want {
			if rec[k] != v {
				ok = false
			}
		}
		if ok {
			out = append(out, rec)
		}
	}
	return out
}

// logView is a logRecorder with attributes added by With.
type logView struct {
	root  *logRecorder
	attrs []slog.Attr
}

func (v *logView) Enabled(context.Context, slog.Level) bool { return true }
func (v *logView) Handle(ctx context.Context, r slog.Record) error {
	r2 := slog.NewRecord(r.Time, r.Level, r.Message, r.PC)
	r2.AddAttrs(v.attrs...)
	r.Attrs(func(a slog.Attr) bool { r2.AddAttrs(a); return true })
	return v.root.Handle(ctx, r2)
}
func (v *logView) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &logView{root: v.root, attrs: append(append([]slog.Attr(nil), v.attrs...), attrs...)}
}
func (v *logView) WithGroup(string) slog.Handler { return v }

// weatherTool is a function tool the simulators call when the last user
// message names it (their documented rule).
var weatherTool = openai.ChatCompletionFunctionTool(openai.FunctionDefinitionParam{
	Name: "get_weather",
	Parameters: shared.FunctionParameters{
		"type": "object",
		"properties": map[string]any{
			"city": map[string]any{"type": "string"},
			"days": map[string]any{"type": "integer"},
		},
	},
})

func checkWeatherArguments(t *testing.T, args string) {
	t.Helper()
	var got struct {
		City string `json:"city"`
		Days int    `json:"days"`
	}
	if err := json.Unmarshal([]byte(args), &got); err != nil || got.City == "" || got.Days != 42 {
		t.Fatalf("arguments %q (%v), want a city and days 42", args, err)
	}
}

func TestEndToEndToolCalls(t *testing.T) {
	harness.Parallel(t)
	env := startEndpointEnv(t)
	params := func(model string) openai.ChatCompletionNewParams {
		return openai.ChatCompletionNewParams{
			Model:    model,
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("what is the weather in Paris? use get_weather")},
			Tools:    []openai.ChatCompletionToolUnionParam{weatherTool},
		}
	}
	for _, p := range env.byPath {
		t.Run(p.name+"/non-streaming", func(t *testing.T) {
			resp, err := env.client.Chat.Completions.New(context.Background(), params(p.model))
			if err != nil {
				t.Fatal(err)
			}
			ch := resp.Choices[0]
			if ch.FinishReason != "tool_calls" || len(ch.Message.ToolCalls) != 1 {
				t.Fatalf("answer %s", resp.RawJSON())
			}
			tc := ch.Message.ToolCalls[0]
			if !strings.HasPrefix(tc.ID, "call_") || tc.Type != "function" || tc.Function.Name != "get_weather" {
				t.Fatalf("tool call %s", tc.RawJSON())
			}
			checkWeatherArguments(t, tc.Function.Arguments)
			if resp.Usage.CompletionTokens == 0 {
				t.Errorf("usage %+v", resp.Usage)
			}
		})
		t.Run(p.name+"/streaming", func(t *testing.T) {
			stream := env.client.Chat.Completions.NewStreaming(context.Background(), params(p.model))
			var (
				acc                openai.ChatCompletionAccumulator
				parts, firstIDs    int
				finish             string
				argumentsSeenAfter bool
			)
			for stream.Next() {
				chunk := stream.Current()
				acc.AddChunk(chunk)
				for _, ch := range chunk.Choices {
					if ch.FinishReason != "" {
						finish = ch.FinishReason
					}
					for _, tc := range ch.Delta.ToolCalls {
						if tc.Index != 0 {
							t.Fatalf("tool call delta index %d, want 0", tc.Index)
						}
						if tc.ID != "" {
							firstIDs++
							if parts != 0 || tc.Function.Name != "get_weather" {
								t.Fatalf("id on a later part or without the name: %s", tc.RawJSON())
							}
						} else if tc.Function.Arguments != "" {
							argumentsSeenAfter = true
						}
						parts++
					}
				}
			}
			if err := stream.Err(); err != nil {
				t.Fatal(err)
			}
			if finish != "tool_calls" || firstIDs != 1 {
				t.Fatalf("finish %q, %d parts with an id", finish, firstIDs)
			}
			// Ollama sends a call whole: one part. The OpenAI-compatible
			// simulator streams its arguments in pieces, which the tunnel
			// relays as they are.
			if p.tunnel && (parts < 3 || !argumentsSeenAfter) {
				t.Fatalf("tunnel: %d parts, arguments in later parts %v; want them split over chunks", parts, argumentsSeenAfter)
			}
			calls := acc.Choices[0].Message.ToolCalls
			if len(calls) != 1 || !strings.HasPrefix(calls[0].ID, "call_") {
				t.Fatalf("accumulated %+v", calls)
			}
			checkWeatherArguments(t, calls[0].Function.Arguments)
		})
	}
	t.Run("without a tool named, text", func(t *testing.T) {
		p := params(normalizedModel)
		p.Messages = []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hello")}
		resp, err := env.client.Chat.Completions.New(context.Background(), p)
		if err != nil {
			t.Fatal(err)
		}
		if resp.Choices[0].FinishReason != "stop" || len(resp.Choices[0].Message.ToolCalls) != 0 || resp.Choices[0].Message.Content == "" {
			t.Fatalf("answer %s", resp.RawJSON())
		}
	})
}

func TestEndToEndEmbeddings(t *testing.T) {
	harness.Parallel(t)
	env := startEndpointEnv(t)
	inputs := []string{"the first text", "a second one", "third"}
	var vectors [][][]float64
	for _, p := range env.byPath {
		t.Run(p.name, func(t *testing.T) {
			resp, err := env.client.Embeddings.New(context.Background(), openai.EmbeddingNewParams{
				Model:          p.model,
				Input:          openai.EmbeddingNewParamsInputUnion{OfArrayOfStrings: inputs},
				EncodingFormat: openai.EmbeddingNewParamsEncodingFormatFloat,
			})
			if err != nil {
				t.Fatal(err)
			}
			if resp.Object != "list" || len(resp.Data) != len(inputs) {
				t.Fatalf("answer %s", resp.RawJSON())
			}
			var got [][]float64
			for i, d := range resp.Data {
				if d.Index != int64(i) || d.Object != "embedding" || len(d.Embedding) != 8 {
					t.Fatalf("data[%d] %s", i, d.RawJSON())
				}
				norm := 0.0
				for _, x := range d.Embedding {
					norm += x * x
				}
				if math.Abs(norm-1) > 1e-5 {
					t.Fatalf("data[%d] has norm %v, want unit vectors", i, norm)
				}
				got = append(got, d.Embedding)
			}
			if resp.Usage.PromptTokens != 7 || resp.Usage.TotalTokens != 7 {
				t.Errorf("usage %+v, want 7 prompt tokens (the words of the inputs)", resp.Usage)
			}
			vectors = append(vectors, got)
		})
	}
	t.Run("same vectors on both paths", func(t *testing.T) {
		if len(vectors) != 2 {
			t.Fatalf("got vectors from %d paths, want 2", len(vectors))
		}
		for i := range inputs {
			for j := range vectors[0][i] {
				if float32(vectors[0][i][j]) != float32(vectors[1][i][j]) {
					t.Fatalf("input %d differs: normalized %v, tunnel %v", i, vectors[0][i], vectors[1][i])
				}
			}
		}
	})
	for _, p := range env.byPath {
		t.Run(p.name+"/base64", func(t *testing.T) {
			status, body := env.post(t, "/v1/embeddings", `{"model":"`+p.model+`","input":"third","encoding_format":"base64"}`)
			var got struct {
				Data []struct {
					Embedding string `json:"embedding"`
				} `json:"data"`
			}
			if status != http.StatusOK || json.Unmarshal(body, &got) != nil || len(got.Data) != 1 {
				t.Fatalf("%d %s", status, body)
			}
			raw, err := base64.StdEncoding.DecodeString(got.Data[0].Embedding)
			if err != nil || len(raw) != 32 {
				t.Fatalf("embedding %q: %v", got.Data[0].Embedding, err)
			}
			for j := range 8 {
				f := math.Float32frombits(binary.LittleEndian.Uint32(raw[4*j:]))
				if len(vectors) == 2 && f != float32(vectors[0][2][j]) {
					t.Fatalf("component %d is %v, want %v", j, f, vectors[0][2][j])
				}
			}
		})
	}
	t.Run("a provider without the capability is never asked", func(t *testing.T) {
		_, err := env.client.Embeddings.New(context.Background(), openai.EmbeddingNewParams{
			Model: plainModel,
			Input: openai.EmbeddingNewParamsInputUnion{OfString: openai.String("x")},
		})
		var apiErr *openai.Error
		if !errorsAs(err, &apiErr) || apiErr.StatusCode != http.StatusBadRequest || !strings.Contains(apiErr.Message, "embeddings") {
			t.Fatalf("err %v, want a 400 naming embeddings", err)
		}
	})
	t.Run("bad input is a 400 naming it", func(t *testing.T) {
		for body, param := range map[string]string{
			`{"model":"` + normalizedModel + `","input":""}`:                             "input",
			`{"model":"` + normalizedModel + `","input":[]}`:                             "input",
			`{"model":"` + normalizedModel + `","input":["a",2]}`:                        "input[1]",
			`{"model":"` + normalizedModel + `","input":[[1,-2]]}`:                       "input[0][1]",
			`{"model":"` + normalizedModel + `","input":"a","encoding_format":"binary"}`: "encoding_format",
			`{"model":"` + normalizedModel + `","input":"a","dimensions":0}`:             "dimensions",
			`{"input":"a"}`: "model",
		} {
			status, resp := env.post(t, "/v1/embeddings", body)
			var e struct {
				Error struct {
					Param string `json:"param"`
				} `json:"error"`
			}
			if status != http.StatusBadRequest || json.Unmarshal(resp, &e) != nil || e.Error.Param != param {
				t.Errorf("%s: %d %s, want a 400 with param %s", body, status, resp, param)
			}
		}
	})
	t.Run("token input reaches a tunnel provider; Ollama refuses it naming input", func(t *testing.T) {
		status, body := env.post(t, "/v1/embeddings", `{"model":"`+tunnelModel+`","input":[[1,2,3],[4]]}`)
		if status != http.StatusOK || !bytes.Contains(body, []byte(`"index":1`)) {
			t.Fatalf("tunnel: %d %s", status, body)
		}
		status, body = env.post(t, "/v1/embeddings", `{"model":"`+normalizedModel+`","input":[[1,2,3]]}`)
		if status != http.StatusBadRequest || !bytes.Contains(body, []byte("input:")) {
			t.Fatalf("normalized: %d %s", status, body)
		}
	})
}

func TestEndToEndCompletions(t *testing.T) {
	harness.Parallel(t)
	env := startEndpointEnv(t)
	var texts []string
	for _, p := range env.byPath {
		t.Run(p.name+"/non-streaming", func(t *testing.T) {
			resp, err := env.client.Completions.New(context.Background(), openai.CompletionNewParams{
				Model:     openai.CompletionNewParamsModel(p.model),
				Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String("once upon a time")},
				MaxTokens: openai.Int(5),
			})
			if err != nil {
				t.Fatal(err)
			}
			if resp.Object != "text_completion" || len(resp.Choices) != 1 || resp.Choices[0].FinishReason != "length" {
				t.Fatalf("answer %s", resp.RawJSON())
			}
			if n := len(strings.Fields(resp.Choices[0].Text)); n != 5 {
				t.Fatalf("%d words in %q, want 5", n, resp.Choices[0].Text)
			}
			if resp.Usage.PromptTokens != 4 || resp.Usage.CompletionTokens != 5 || resp.Usage.TotalTokens != 9 {
				t.Errorf("usage %+v", resp.Usage)
			}
			texts = append(texts, resp.Choices[0].Text)
		})
		t.Run(p.name+"/streaming", func(t *testing.T) {
			stream := env.client.Completions.NewStreaming(context.Background(), openai.CompletionNewParams{
				Model:         openai.CompletionNewParamsModel(p.model),
				Prompt:        openai.CompletionNewParamsPromptUnion{OfString: openai.String("once upon a time")},
				MaxTokens:     openai.Int(5),
				StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
			})
			var text strings.Builder
			chunks, finish := 0, ""
			var usage openai.CompletionUsage
			for stream.Next() {
				c := stream.Current()
				if c.Object != "text_completion" {
					t.Fatalf("chunk %s", c.RawJSON())
				}
				for _, ch := range c.Choices {
					text.WriteString(ch.Text)
					if ch.FinishReason != "" {
						finish = string(ch.FinishReason)
					}
				}
				if c.Usage.TotalTokens != 0 {
					usage = c.Usage
				}
				chunks++
			}
			if err := stream.Err(); err != nil {
				t.Fatal(err)
			}
			if len(texts) > 0 && text.String() != texts[len(texts)-1] {
				t.Errorf("streamed %q, non-streamed %q", text.String(), texts[len(texts)-1])
			}
			if finish != "length" || chunks < 6 || usage.CompletionTokens != 5 || usage.PromptTokens != 4 {
				t.Errorf("finish %q, %d chunks, usage %+v", finish, chunks, usage)
			}
		})
	}
	t.Run("same text on both paths", func(t *testing.T) {
		if len(texts) != 2 || texts[0] != texts[1] {
			t.Fatalf("texts %q", texts)
		}
	})
	t.Run("fields Ollama cannot honour are a 400 naming them", func(t *testing.T) {
		for field, body := range map[string]string{
			"echo": `{"model":"` + normalizedModel + `","prompt":"x","echo":true}`,
		} {
			status, resp := env.post(t, "/v1/completions", body)
			if status != http.StatusBadRequest || !bytes.Contains(resp, []byte(`"message":"`+field+`:`)) {
				t.Errorf("%s: %d %s", field, status, resp)
			}
		}
		// Several choices are refused before the queue: no Ollama provider
		// can answer them (the "choices" need).
		status, resp := env.post(t, "/v1/completions", `{"model":"`+normalizedModel+`","prompt":"x","n":2}`)
		if status != http.StatusBadRequest || !bytes.Contains(resp, []byte(`(n above 1)`)) {
			t.Errorf("n: %d %s", status, resp)
		}
		// So are logprobs (the "logprobs" need): the translation has none.
		status, resp = env.post(t, "/v1/completions", `{"model":"`+normalizedModel+`","prompt":"x","logprobs":1}`)
		if status != http.StatusBadRequest || !bytes.Contains(resp, []byte(`returns logprobs`)) {
			t.Errorf("logprobs: %d %s", status, resp)
		}
	})
	t.Run("bad prompt is a 400 naming it", func(t *testing.T) {
		for body, param := range map[string]string{
			`{"model":"m"}`:                       "prompt",
			`{"model":"m","prompt":{}}`:           "prompt",
			`{"model":"m","prompt":"x","n":0}`:    "n",
			`{"model":"m","prompt":"x","echo":1}`: "echo",
		} {
			status, resp := env.post(t, "/v1/completions", body)
			if status != http.StatusBadRequest || !bytes.Contains(resp, []byte(`"param":"`+param+`"`)) {
				t.Errorf("%s: %d %s", body, status, resp)
			}
		}
	})
}

// post sends a JSON body to the edge and returns the status and body.
func (env *endpointEnv) post(t *testing.T, path, body string) (int, []byte) {
	t.Helper()
	return postTo(t, env.httpClient, "http://"+env.e.HTTPAddr+path, body)
}

func postTo(t *testing.T, c *http.Client, url, body string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, out
}

// TestEndToEndStreamFraming compares what a client gets through iop with
// what it gets from the model server directly: on the tunnel path the very
// same bytes (two choices interleaved, tool-call arguments split over
// chunks, an error event inside a 200 stream), on the normalized path the
// same usage.
func TestEndToEndStreamFraming(t *testing.T) {
	harness.Parallel(t)
	// Twin simulators: same config and a frozen clock, so the same request
	// sequence gets byte-identical answers (ids count admitted requests).
	twin := func(model string, faults sim.Faults) (direct, behind string) {
		start := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
		cfg := func() sim.Config {
			return sim.Config{Protocol: sim.ProtocolOpenAI, Models: []string{model}, Seed: 5, DefaultMaxTokens: 6,
				Clock: clock.NewFake(start), Faults: faults}
		}
		_, direct = harness.Sim(t, cfg())
		_, behind = harness.Sim(t, cfg())
		return direct, behind
	}
	directURL, behindURL := twin("twin", sim.Faults{})
	faultyDirect, faultyBehind := twin("twin-faulty", sim.Faults{StreamErrorAfter: 3})

	logs := &logRecorder{}
	ctx, cancel := context.WithCancel(context.Background())
	cfg := process.DefaultEdgeFile()
	cfg.Listen, cfg.NodeListen = "127.0.0.1:0", "127.0.0.1:0"
	e, err := process.Start(ctx, process.Config{Mode: process.ModeEdge, Edge: cfg}, process.Deps{Logger: slog.New(logs)})
	if err != nil {
		t.Fatal(err)
	}
	harness.StopAtCleanup(t, cancel, e)
	ollamaSim, ollamaURL := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOllama, Models: []string{"ollama-twin"}, Seed: 5})
	harness.Node(t, ctx, node.Config{NodeID: "n1", Edge: e.NodeAddr, Providers: []node.ProviderConfig{
		{ID: "twin", Type: "openai", BaseURL: behindURL + "/v1", Models: []string{"twin"}, Capacity: 1, Capabilities: []string{"tools"}},
		{ID: "ollama", Type: node.TypeOllama, BaseURL: ollamaURL, Models: []string{"ollama-twin"}, Capacity: 1},
	}})
	harness.Node(t, ctx, node.Config{NodeID: "n2", Edge: e.NodeAddr, Providers: []node.ProviderConfig{
		{ID: "faulty", Type: "openai", BaseURL: faultyBehind + "/v1", Models: []string{"twin-faulty"}, Capacity: 1},
	}})
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	hc := &http.Client{Transport: tr}
	t.Cleanup(func() { waitIdle(t, e) })
	edgeURL := "http://" + e.HTTPAddr

	t.Run("tunnel passes streams through byte for byte", func(t *testing.T) {
		for _, tc := range []struct{ name, body string }{
			{"n=2 interleaved", `{"model":"twin","stream":true,"n":2,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"two answers"}]}`},
			{"tool-call arguments split", `{"model":"twin","stream":true,"tools":[{"type":"function","function":{"name":"lookup","parameters":{"type":"object","properties":{"q":{"type":"string"},"limit":{"type":"integer"}}}}}],"messages":[{"role":"user","content":"please lookup"}]}`},
			{"n=2 not streamed", `{"model":"twin","n":2,"messages":[{"role":"user","content":"two answers"}]}`},
		} {
			t.Run(tc.name, func(t *testing.T) {
				_, want := postTo(t, hc, directURL+"/v1/chat/completions", tc.body)
				status, got := postTo(t, hc, edgeURL+"/v1/chat/completions", tc.body)
				if status != http.StatusOK || !bytes.Equal(got, want) {
					t.Fatalf("through iop (%d):\n%s\ndirect:\n%s", status, got, want)
				}
				if strings.Contains(tc.name, "interleaved") && !bytes.Contains(got, []byte(`"index":1`)) {
					t.Fatalf("no second choice in %s", got)
				}
			})
		}
	})

	t.Run("an error event inside a 200 stream is relayed and the run fails", func(t *testing.T) {
		body := `{"model":"twin-faulty","stream":true,"messages":[{"role":"user","content":"fail please"}]}`
		_, want := postTo(t, hc, faultyDirect+"/v1/chat/completions", body)
		if !bytes.Contains(want, []byte(`data: {"error":`)) || !bytes.HasSuffix(want, []byte("data: [DONE]\n\n")) {
			t.Fatalf("the faulty simulator sent no error event then [DONE]: %s", want)
		}
		status, got := postTo(t, hc, edgeURL+"/v1/chat/completions", body)
		if status != http.StatusOK || !bytes.Equal(got, want) {
			t.Fatalf("through iop (%d):\n%s\ndirect:\n%s", status, got, want)
		}
		failed := waitLog(t, logs, map[string]string{"msg": "run ended", "provider_id": "faulty", "reason": "upstream error"})
		if failed["path"] != "EXECUTION_PATH_TUNNEL" {
			t.Errorf("run ended %v", failed)
		}
		if len(logs.find(map[string]string{"msg": "provider reported an error inside its answer"})) == 0 {
			t.Error("the provider's error was not logged")
		}
	})

	t.Run("normalized usage equals the provider's", func(t *testing.T) {
		body := `{"model":"ollama-twin","messages":[{"role":"user","content":"count my words please"}]}`
		_, direct := postTo(t, hc, ollamaURL+"/api/chat", body)
		var last struct {
			PromptEvalCount int `json:"prompt_eval_count"`
			EvalCount       int `json:"eval_count"`
		}
		sc := bufio.NewScanner(bytes.NewReader(direct))
		for sc.Scan() {
			if err := json.Unmarshal(sc.Bytes(), &last); err != nil {
				t.Fatal(err)
			}
		}
		_, got := postTo(t, hc, edgeURL+"/v1/chat/completions",
			`{"model":"ollama-twin","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"count my words please"}]}`)
		var u struct {
			Usage *struct {
				PromptTokens     int `json:"prompt_tokens"`
				CompletionTokens int `json:"completion_tokens"`
			} `json:"usage"`
		}
		_ = sse.ReadAll(bytes.NewReader(got), func(e sse.Event) error {
			if string(e.Data) != "[DONE]" && u.Usage == nil {
				_ = json.Unmarshal(e.Data, &u)
			}
			return nil
		})
		if u.Usage == nil || u.Usage.PromptTokens != last.PromptEvalCount || u.Usage.CompletionTokens != last.EvalCount || last.EvalCount == 0 {
			t.Fatalf("edge usage %+v, provider's prompt_eval_count %d eval_count %d", u.Usage, last.PromptEvalCount, last.EvalCount)
		}
		if n := len(ollamaSim.Seen()); n != 2 {
			t.Fatalf("the Ollama simulator saw %d requests, want 2", n)
		}
	})
}

// waitLog polls the recorder, bounded, for a record with every key=value
// of want.
func waitLog(t *testing.T, logs *logRecorder, want map[string]string) map[string]string {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		if got := logs.find(want); len(got) > 0 {
			return got[0]
		}
		if time.Now().After(deadline) {
			t.Fatalf("no log record with %v", want)
		}
		<-tick.C
	}
}
