package e2e

// End-to-end tests of a cli provider: a real edge and node agent (as in
// e2e_test.go), the node running a small shell script per run, driven with
// the official OpenAI Go client. The script's behaviour is chosen by the
// prompt, which it gets as its first argument:
//
//	hold:<file>  writes its pid and a grandchild's to <file>, prints "tick ",
//	             then waits for ever (only a cancel ends it)
//	fifo:<fifo>  prints "part one, ", blocks until the test writes to
//	             <fifo>, prints "part two"
//	fail         prints to stderr and exits 2
//	anything     prints "echo: " and the prompt

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"

	"iop/internal/e2e/harness"
	"iop/internal/edge"
	"iop/internal/edge/contract"
	"iop/internal/node"
	"iop/internal/process"
	"iop/internal/testenv"
)

const cliScript = `#!/bin/sh
case "$1" in
hold:*) sleep 1000 & echo "$$ $!" > "${1#hold:}"; printf 'tick '; wait ;;
fifo:*) printf 'part one, '; read x < "${1#fifo:}"; printf 'part two' ;;
fail) echo 'model weights not found' >&2; exit 2 ;;
*) printf 'echo: %s' "$1" ;;
esac
`

// startCLINode starts an edge and a node with two cli providers running
// cliScript: "cli-2" (model alias "cli2", capacity 2) and "cli-1" ("cli1",
// capacity 1).
func startCLINode(t *testing.T) *process.Process {
	t.Helper()
	script := filepath.Join(t.TempDir(), "model.sh")
	if err := os.WriteFile(script, []byte(cliScript), 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	e := harness.Edge(t, ctx, harness.EdgeConfig(map[string]edge.ModelConfig{
		"cli2": {Targets: []string{"cli-model-2"}},
		"cli1": {Targets: []string{"cli-model-1"}},
	}))
	t.Cleanup(cancel)
	command := []string{script, "{{prompt}}"}
	harness.Node(t, ctx, node.Config{
		NodeID: "laptop",
		Edge:   e.NodeAddr,
		Providers: []node.ProviderConfig{
			{ID: "cli-2", Type: node.TypeCLI, Command: command, PromptVia: node.PromptViaArg, Models: []string{"cli-model-2"}, Capacity: 2},
			{ID: "cli-1", Type: node.TypeCLI, Command: command, PromptVia: node.PromptViaArg, Models: []string{"cli-model-1"}, Capacity: 1},
		},
	})
	return e
}

func chatParams(model, prompt string) openai.ChatCompletionNewParams {
	return openai.ChatCompletionNewParams{Model: model, Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(prompt)}}
}

func TestEndToEndCLIProvider(t *testing.T) {
	harness.Parallel(t)
	e := startCLINode(t)
	client := newClient(e)

	t.Run("non-streaming", func(t *testing.T) {
		resp, err := client.Chat.Completions.New(context.Background(), chatParams("cli2", "hello there"))
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Choices) != 1 || resp.Choices[0].Message.Content != "echo: hello there" || resp.Choices[0].FinishReason != "stop" {
			t.Fatalf("answer %+v", resp.Choices)
		}
	})
	t.Run("streaming", func(t *testing.T) {
		stream := client.Chat.Completions.NewStreaming(context.Background(), chatParams("cli2", "streamed"))
		var text strings.Builder
		finish := ""
		for stream.Next() {
			for _, c := range stream.Current().Choices {
				text.WriteString(c.Delta.Content)
				if c.FinishReason != "" {
					finish = c.FinishReason
				}
			}
		}
		if err := stream.Err(); err != nil {
			t.Fatal(err)
		}
		if text.String() != "echo: streamed" || finish != "stop" {
			t.Fatalf("text %q, finish %q", text.String(), finish)
		}
	})
	t.Run("non-zero exit", func(t *testing.T) {
		_, err := client.Chat.Completions.New(context.Background(), chatParams("cli2", "fail"))
		var apiErr *openai.Error
		if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusBadGateway ||
			!strings.Contains(apiErr.Message, "command exited with status 2: model weights not found") {
			t.Fatalf("err %v, want a 502 with the stderr tail", err)
		}
	})
	t.Run("non-zero exit while streaming", func(t *testing.T) {
		stream := client.Chat.Completions.NewStreaming(context.Background(), chatParams("cli2", "fail"))
		for stream.Next() {
		}
		// No delta came before the failure: the edge still answers 502.
		var apiErr *openai.Error
		if err := stream.Err(); !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusBadGateway ||
			!strings.Contains(apiErr.Message, "model weights not found") {
			t.Fatalf("stream err %v, want a 502 with the stderr tail", err)
		}
	})
	waitIdle(t, e)
}

// TestEndToEndCLICancellation: a client that goes away (after the first
// chunk, during a non-streaming request, while queued) stops its command's
// whole process group, gives the slot back, and leaves a concurrent run on
// the same provider intact.
func TestEndToEndCLICancellation(t *testing.T) {
	// In a process of its own: it checks that the test process has no
	// zombie child, and the children of parallel tests come and go.
	if testenv.RunInOwnProcess(t) {
		return
	}
	e := startCLINode(t)
	client := newClient(e)

	for _, tc := range []struct {
		name  string
		leave func(t *testing.T, pidFile string)
	}{
		{"client closes after the first chunk", func(t *testing.T, pidFile string) {
			stream := client.Chat.Completions.NewStreaming(context.Background(), chatParams("cli2", "hold:"+pidFile))
			for stream.Next() {
				if c := stream.Current().Choices; len(c) > 0 && c[0].Delta.Content != "" {
					break
				}
			}
			if err := stream.Err(); err != nil {
				t.Fatalf("stream failed before its first chunk: %v", err)
			}
			stream.Close()
		}},
		{"client closes during a non-streaming request", func(t *testing.T, pidFile string) {
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() {
				_, err := client.Chat.Completions.New(ctx, chatParams("cli2", "hold:"+pidFile))
				done <- err
			}()
			waitFile(t, pidFile) // the command runs
			cancel()
			if err := <-done; !errors.Is(err, context.Canceled) {
				t.Fatalf("err %v, want context.Canceled", err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			concurrent := startFIFORun(t, client, "cli2")
			pidFile := filepath.Join(t.TempDir(), "pids")
			tc.leave(t, pidFile)
			waitFile(t, pidFile)
			waitGone(t, readPIDs(t, pidFile)...)
			// The cancelled run's slot is back; the concurrent one holds its own.
			waitSnapshot(t, e, func(s contract.Snapshot) bool { return s.Leases == 1 && inFlight(s, "cli-2") == 1 })
			concurrent.finish(t)
			waitIdle(t, e)
			checkAdminInFlightZero(t, e)
			if z := zombieChildren(t); len(z) > 0 {
				t.Errorf("zombie children left: %v", z)
			}
		})
	}

	t.Run("client closes while queued", func(t *testing.T) {
		holder := startFIFORun(t, client, "cli1") // takes the only slot
		pidFile := filepath.Join(t.TempDir(), "pids")
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() {
			_, err := client.Chat.Completions.New(ctx, chatParams("cli1", "hold:"+pidFile))
			done <- err
		}()
		waitSnapshot(t, e, func(s contract.Snapshot) bool { return s.Waiters == 1 })
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Fatalf("err %v, want context.Canceled", err)
		}
		waitSnapshot(t, e, func(s contract.Snapshot) bool { return s.Waiters == 0 })
		holder.finish(t)
		// A request after it is served after anything still queued: if the
		// cancelled one had been kept and dispatched, its command would
		// have written its pid file by now.
		resp, err := client.Chat.Completions.New(context.Background(), chatParams("cli1", "after"))
		if err != nil || resp.Choices[0].Message.Content != "echo: after" {
			t.Fatalf("request after: %v %+v", err, resp)
		}
		if _, err := os.Stat(pidFile); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("the queued request started its command (pid file: %v)", err)
		}
		waitIdle(t, e)
		checkAdminInFlightZero(t, e)
	})
}

// fifoRun is a streaming request whose command blocks on a FIFO.
type fifoRun struct {
	fifo string
	done chan string // the whole text, or "error: ..."
}

// startFIFORun starts a streaming request on model and returns once its
// first chunk of content has arrived: the command runs and holds a slot.
func startFIFORun(t *testing.T, client openai.Client, model string) *fifoRun {
	t.Helper()
	r := &fifoRun{fifo: filepath.Join(t.TempDir(), "fifo"), done: make(chan string, 1)}
	if err := syscall.Mkfifo(r.fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	first := make(chan struct{})
	go func() {
		stream := client.Chat.Completions.NewStreaming(context.Background(), chatParams(model, "fifo:"+r.fifo))
		defer stream.Close()
		var text strings.Builder
		for stream.Next() {
			if c := stream.Current().Choices; len(c) > 0 {
				if text.Len() == 0 && c[0].Delta.Content != "" {
					close(first)
				}
				text.WriteString(c[0].Delta.Content)
			}
		}
		if err := stream.Err(); err != nil {
			r.done <- "error: " + err.Error()
			return
		}
		r.done <- text.String()
	}()
	select {
	case <-first:
	case s := <-r.done:
		t.Fatalf("the concurrent run ended before its first chunk: %s", s)
	case <-time.After(10 * time.Second):
		t.Fatal("the concurrent run sent nothing within 10s")
	}
	return r
}

// finish releases the command and checks the whole answer arrived.
func (r *fifoRun) finish(t *testing.T) {
	t.Helper()
	f, err := os.OpenFile(r.fifo, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.WriteString("go\n")
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	if got := <-r.done; got != "part one, part two" {
		t.Fatalf("the concurrent run got %q, want it intact", got)
	}
}

func inFlight(s contract.Snapshot, provider string) int {
	for _, p := range s.Providers {
		if p.ProviderID == provider {
			return p.InFlight
		}
	}
	return -1
}

// checkAdminInFlightZero checks /admin/v1/providers reports no run in flight.
func checkAdminInFlightZero(t *testing.T, e *process.Process) {
	t.Helper()
	var providers []struct {
		ProviderID string `json:"provider_id"`
		InFlight   int    `json:"in_flight"`
	}
	getJSON(t, e, "/admin/v1/providers", &providers)
	if len(providers) != 2 {
		t.Fatalf("admin providers %+v", providers)
	}
	for _, p := range providers {
		if p.InFlight != 0 {
			t.Errorf("admin: provider %s in_flight %d", p.ProviderID, p.InFlight)
		}
	}
}

// waitFile polls, bounded, until path exists and is not empty.
func waitFile(t *testing.T, path string) {
	t.Helper()
	testenv.Eventually(t, path+" appears", func() bool {
		fi, err := os.Stat(path)
		return err == nil && fi.Size() > 0
	})
}

// readPIDs reads the whitespace-separated pids a script wrote to path.
func readPIDs(t *testing.T, path string) []int {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, f := range strings.Fields(string(data)) {
		pid, err := strconv.Atoi(f)
		if err != nil {
			t.Fatalf("pid file %q: %v", data, err)
		}
		pids = append(pids, pid)
	}
	if len(pids) != 2 {
		t.Fatalf("pid file %q: want the command's pid and its child's", data)
	}
	return pids
}

// procStat returns the state letter and parent pid of pid from /proc.
func procStat(pid int) (state string, ppid int, ok bool) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return "", 0, false
	}
	// pid (comm) state ppid ...; comm may hold spaces and parentheses.
	fields := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+1:]))
	if len(fields) < 2 {
		return "", 0, false
	}
	ppid, _ = strconv.Atoi(fields[1])
	return fields[0], ppid, true
}

// processGone reports whether pid has stopped running: kill(pid, 0) fails
// with ESRCH, or it is a zombie whose parent is not this test process (an
// orphan killed after its parent died waits for PID 1, which in some
// containers never reaps it).
func processGone(pid int) bool {
	if errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) {
		return true
	}
	state, ppid, ok := procStat(pid)
	return !ok || (state == "Z" && ppid != os.Getpid())
}

// waitGone polls, bounded (5s), until every pid is gone.
func waitGone(t *testing.T, pids ...int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for _, pid := range pids {
		for !processGone(pid) {
			if time.Now().After(deadline) {
				state, ppid, _ := procStat(pid)
				t.Fatalf("process %d still there (state %s, parent %d)", pid, state, ppid)
			}
			<-tick.C
		}
	}
}

// zombieChildren lists the zombie children of this test process (the node
// runs in it, so its commands are its children).
func zombieChildren(t *testing.T) []int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var out []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if state, ppid, ok := procStat(pid); ok && state == "Z" && ppid == os.Getpid() {
			out = append(out, pid)
		}
	}
	return out
}
