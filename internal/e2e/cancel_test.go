package e2e

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"

	"iop/internal/e2e/harness"
	"iop/internal/node"
	"iop/internal/process"
	"iop/internal/sim"
	"iop/internal/testenv"
)

// cancelPath is one execution path under test: the served model a node
// provider answers through it and the simulator behind that provider.
type cancelPath struct {
	name, model string
	backend     *sim.Server
}

// startCancelStack starts an edge (cfg's listen addresses are replaced),
// one node with an Ollama provider (normalized path) and an
// OpenAI-compatible one (tunnel path), each of the given capacity, over two
// simulators at simCfg's pace.
func startCancelStack(t *testing.T, cfg process.EdgeFile, capacity int, simCfg sim.Config) (*process.Process, []cancelPath) {
	t.Helper()
	// Answers as long as max_tokens asks (the simulator's default is 16).
	simCfg.DefaultMaxTokens = 100_000_000
	ollamaCfg, openaiCfg := simCfg, simCfg
	ollamaCfg.Protocol, ollamaCfg.Models = sim.ProtocolOllama, []string{"slow-ollama"}
	openaiCfg.Protocol, openaiCfg.Models = sim.ProtocolOpenAI, []string{"slow-openai"}
	ollamaSim, ollamaURL := harness.Sim(t, ollamaCfg)
	openaiSim, openaiURL := harness.Sim(t, openaiCfg)

	ctx, cancel := context.WithCancel(context.Background())
	cfg.Listen, cfg.NodeListen = "127.0.0.1:0", "127.0.0.1:0"
	cfg.Database = ":memory:"
	e, err := process.Start(ctx, process.Config{Mode: process.ModeEdge, Edge: cfg}, process.Deps{Logger: harness.Logger(t, "edge")})
	if err != nil {
		t.Fatal(err)
	}
	harness.StopAtCleanup(t, cancel, e)
	harness.RememberEdge(t, e)
	harness.Node(t, ctx, node.Config{
		NodeID: "gpu-1",
		Edge:   e.NodeAddr,
		Providers: []node.ProviderConfig{
			{ID: "ollama-1", Type: node.TypeOllama, BaseURL: ollamaURL, Models: []string{"slow-ollama"}, Capacity: capacity},
			{ID: "vllm-1", Type: "vllm", BaseURL: openaiURL + "/v1", Models: []string{"slow-openai"}, Capacity: capacity},
		},
	})
	return e, []cancelPath{
		{"normalized", "slow-ollama", ollamaSim},
		{"tunnel", "slow-openai", openaiSim},
	}
}

// limitedChat is a one-message chat request for at most maxTokens tokens.
func limitedChat(model string, maxTokens int64) openai.ChatCompletionNewParams {
	return openai.ChatCompletionNewParams{
		Model:     model,
		Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage("count for me")},
		MaxTokens: openai.Int(maxTokens),
	}
}

// intactRun runs a streaming request of n tokens and reports whether it got
// all of them with finish reason "length".
func intactRun(client openai.Client, model string, n int64) <-chan error {
	done := make(chan error, 1)
	go func() {
		stream := client.Chat.Completions.NewStreaming(context.Background(), limitedChat(model, n))
		var acc openai.ChatCompletionAccumulator
		for stream.Next() {
			acc.AddChunk(stream.Current())
		}
		switch {
		case stream.Err() != nil:
			done <- stream.Err()
		case len(acc.Choices) != 1 || int64(len(strings.Fields(acc.Choices[0].Message.Content))) != n || acc.Choices[0].FinishReason != "length":
			done <- fmt.Errorf("concurrent run damaged: %+v", acc.Choices)
		default:
			done <- nil
		}
	}()
	return done
}

// TestClientGoneCancelsRun proves, for both execution paths, that a client
// going away ends its run everywhere: after the first streamed chunk, during
// a non-streaming request, and while queued. The backend sees the abort,
// the slot comes back, a queued request never reaches the backend, and a
// concurrent run on the same provider finishes intact.
func TestClientGoneCancelsRun(t *testing.T) {
	harness.Parallel(t)
	// 100 tokens/s: a 100,000-token answer outlives the test; a 20-token
	// one ends in 0.2 s.
	e, paths := startCancelStack(t, process.DefaultEdgeFile(), 2, sim.Config{TokensPerSecond: 100})
	client := newClient(e)
	const long = 100_000

	for _, p := range paths {
		t.Run(p.name+"/after first chunk", func(t *testing.T) {
			before := p.backend.Stats().Cancelled
			intact := intactRun(client, p.model, 20)
			ctx, cancel := context.WithCancel(context.Background())
			stream := client.Chat.Completions.NewStreaming(ctx, limitedChat(p.model, long))
			if !stream.Next() {
				t.Fatalf("no first chunk: %v", stream.Err())
			}
			start := time.Now()
			cancel()
			stream.Close()
			testenv.Eventually(t, "the backend sees the abort", func() bool { return p.backend.Stats().Cancelled == before+1 })
			t.Logf("the backend saw the abort %s after the client left", time.Since(start))
			if err := <-intact; err != nil {
				t.Fatal(err)
			}
			waitIdle(t, e)
		})

		t.Run(p.name+"/during a non-streaming request", func(t *testing.T) {
			stats := p.backend.Stats()
			before := stats.Cancelled
			intact := intactRun(client, p.model, 20)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			errc := make(chan error, 1)
			go func() {
				_, err := client.Chat.Completions.New(ctx, limitedChat(p.model, long))
				errc <- err
			}()
			// Counted by arrival, not by being in flight together: on a
			// loaded machine the 0.2 s intact run can end before the long
			// one arrives (the test then waited for InFlight 2 in vain).
			testenv.Eventually(t, "both runs reach the backend", func() bool { return p.backend.Stats().Requests == stats.Requests+2 })
			cancel()
			if err := <-errc; !errors.Is(err, context.Canceled) {
				t.Fatalf("client error %v, want context.Canceled", err)
			}
			testenv.Eventually(t, "the backend sees the abort", func() bool { return p.backend.Stats().Cancelled == before+1 })
			if err := <-intact; err != nil {
				t.Fatal(err)
			}
			waitIdle(t, e)
		})

		t.Run(p.name+"/while queued", func(t *testing.T) {
			before := p.backend.Stats()
			// Two long runs hold both slots.
			var holders []context.CancelFunc
			for range 2 {
				ctx, cancel := context.WithCancel(context.Background())
				holders = append(holders, cancel)
				stream := client.Chat.Completions.NewStreaming(ctx, limitedChat(p.model, long))
				if !stream.Next() {
					t.Fatalf("holder got no chunk: %v", stream.Err())
				}
				defer stream.Close()
			}
			ctx, cancel := context.WithCancel(context.Background())
			errc := make(chan error, 1)
			go func() {
				_, err := client.Chat.Completions.New(ctx, limitedChat(p.model, 3))
				errc <- err
			}()
			testenv.Eventually(t, "the request is queued", func() bool { return e.Service.Snapshot().Waiters == 1 })
			cancel()
			if err := <-errc; !errors.Is(err, context.Canceled) {
				t.Fatalf("client error %v, want context.Canceled", err)
			}
			testenv.Eventually(t, "the queue is empty", func() bool { return e.Service.Snapshot().Waiters == 0 })
			for _, stop := range holders {
				stop()
			}
			testenv.Eventually(t, "the backend sees both holders leave", func() bool { return p.backend.Stats().Cancelled == before.Cancelled+2 })
			waitIdle(t, e)
			if got := p.backend.Stats().Requests - before.Requests; got != 2 {
				t.Fatalf("the backend received %d requests, want only the 2 holders", got)
			}
			// The provider still serves.
			if err := <-intactRun(client, p.model, 5); err != nil {
				t.Fatal(err)
			}
			waitIdle(t, e)
		})
	}
}

// TestSlowReaderLosesItsSlot proves the write deadline: with capacity 1, a
// client that reads the response headers and then stops reading has its run
// cancelled after write_timeout, and the next request is admitted.
func TestSlowReaderLosesItsSlot(t *testing.T) {
	harness.ParallelLong(t)
	cfg := process.DefaultEdgeFile()
	cfg.WriteTimeout = 300 * time.Millisecond
	// The next request waits for the stalled run's slot: on two cores
	// shared with other test binaries, freeing it took longer than the
	// default 30s queue timeout.
	cfg.Queue.QueueTimeout = testenv.WaitDeadline
	// Unlimited token rate: the answer fills every buffer on the way.
	e, paths := startCancelStack(t, cfg, 1, sim.Config{})
	client := newClient(e)
	for _, p := range paths {
		t.Run(p.name, func(t *testing.T) {
			before := p.backend.Stats().Cancelled
			conn := stalledReader(t, e, p.model)
			defer conn.Close()
			resp, err := client.Chat.Completions.New(context.Background(), limitedChat(p.model, 3))
			if err != nil {
				t.Fatalf("the request after the stalled reader: %v", err)
			}
			if got := len(strings.Fields(resp.Choices[0].Message.Content)); got != 3 {
				t.Fatalf("answer %q", resp.Choices[0].Message.Content)
			}
			testenv.Eventually(t, "the backend sees the abort", func() bool { return p.backend.Stats().Cancelled == before+1 })
			waitIdle(t, e)
		})
	}
}

// stalledReader sends a streaming request for a huge answer on a raw
// connection with a small receive buffer, reads the response head and then
// reads nothing more. It returns once the run holds its slot. The answer,
// 2,000,000 tokens of at least 90 bytes on the wire each, is over four
// times what every buffer on its way holds (loopback sockets autotune to
// at most 32 MiB received and 4 MiB sent, the edge's stream window is
// 256 KiB), so it never ends while the test runs; the simulator builds it
// whole before the first byte, so a larger one only costs time.
func stalledReader(t *testing.T, e *process.Process, model string) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", e.HTTPAddr)
	if err != nil {
		t.Fatal(err)
	}
	if err := conn.(*net.TCPConn).SetReadBuffer(4096); err != nil {
		t.Fatal(err)
	}
	body := fmt.Sprintf(`{"model":%q,"stream":true,"max_tokens":2000000,"messages":[{"role":"user","content":"go on"}]}`, model)
	fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", e.HTTPAddr, len(body), body)
	resp, err := http.ReadResponse(bufio.NewReaderSize(conn, 4096), nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("stalled reader got status %d", resp.StatusCode)
	}
	return conn
}

// TestWriteDeadlineDoesNotCutReadingClients checks that the write deadline
// bounds each write, not the response: a stream whose tokens come further
// apart than the write timeout, and which lasts many of them, is delivered
// whole to a client that keeps reading.
func TestWriteDeadlineDoesNotCutReadingClients(t *testing.T) {
	harness.Parallel(t)
	cfg := process.DefaultEdgeFile()
	cfg.WriteTimeout = 100 * time.Millisecond
	// 10 tokens at 5/s: 200 ms between writes, 2 s in all.
	e, paths := startCancelStack(t, cfg, 1, sim.Config{TokensPerSecond: 5})
	client := newClient(e)
	var wg sync.WaitGroup
	for _, p := range paths {
		wg.Go(func() {
			if err := <-intactRun(client, p.model, 10); err != nil {
				t.Errorf("%s: %v", p.name, err)
			}
		})
	}
	wg.Wait()
	waitIdle(t, e)
}
