package adapter

// Tests of the CLI adapter with real programs: /bin/cat, sh, and small
// scripts written to a temporary directory. Streaming and cancellation are
// proven by synchronizing on FIFOs the scripts block on, never by timing.

import (
	"context"
	"encoding/json"
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
	"unicode/utf8"

	"iop/internal/wire/nodev1"
)

// writeScript writes a /bin/sh script with body to a temporary directory
// and returns its path.
func writeScript(t *testing.T, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "script.sh")
	if err := os.WriteFile(path, []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return path
}

// mkfifo makes a FIFO in a temporary directory and returns its path.
func mkfifo(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "fifo")
	if err := syscall.Mkfifo(path, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// release writes a line to fifo, unblocking the script that reads it; the
// open blocks until the script opens it for reading.
func release(t *testing.T, fifo string) {
	t.Helper()
	f, err := os.OpenFile(fifo, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString("go\n"); err != nil {
		t.Fatal(err)
	}
}

func newTestCLI(t *testing.T, cfg CLIConfig) *CLI {
	t.Helper()
	c, err := NewCLI(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func completionReq(prompt string) Request {
	body, _ := json.Marshal(map[string]any{"model": "alias", "prompt": prompt})
	return Request{Op: nodev1.Operation_OPERATION_COMPLETION, ServedModel: "served-model", Body: body}
}

func cliChatReq(body string) Request {
	return Request{Op: nodev1.Operation_OPERATION_CHAT, ServedModel: "served-model", Body: []byte(body)}
}

// deltaTap is an EventSink that records events and passes each DELTA's
// text to deltas.
func deltaTap() (*eventRec, chan string) {
	deltas := make(chan string, 64)
	rec := &eventRec{onSend: func(events []*nodev1.RunEvent) error {
		for _, e := range events {
			if e.Type == nodev1.RunEvent_TYPE_DELTA {
				deltas <- e.Text
			}
		}
		return nil
	}}
	return rec, deltas
}

// receive waits, bounded, for the next value of ch.
func receive[T any](t *testing.T, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatal("nothing arrived within 10s")
		panic("unreachable")
	}
}

// goNormalize runs c.Normalize in a goroutine; the result arrives on the
// channel.
func goNormalize(ctx context.Context, c *CLI, req Request, sink EventSink) <-chan error {
	done := make(chan error, 1)
	go func() { done <- c.Normalize(ctx, req, sink) }()
	return done
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

// waitGone polls, bounded, until every pid is gone.
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

// zombieChildren lists the zombie children of this test process.
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

func TestCLIPromptViaStdin(t *testing.T) {
	c := newTestCLI(t, CLIConfig{Command: []string{"cat"}})
	rec := &eventRec{}
	const prompt = "héllo, wörld — 12345"
	if err := c.Normalize(context.Background(), completionReq(prompt), rec); err != nil {
		t.Fatal(err)
	}
	if got := rec.text(); got != prompt {
		t.Fatalf("text %q, want the prompt %q", got, prompt)
	}
	types := rec.types()
	if types[0] != nodev1.RunEvent_TYPE_STARTED || types[len(types)-2] != nodev1.RunEvent_TYPE_USAGE || types[len(types)-1] != nodev1.RunEvent_TYPE_COMPLETE {
		t.Fatalf("event types %v", types)
	}
	if f := rec.last(nodev1.RunEvent_TYPE_COMPLETE).FinishReason; f != "stop" {
		t.Fatalf("finish reason %q", f)
	}
	// 20 characters each way: ceil(20/4) = 5 estimated tokens.
	if u := rec.last(nodev1.RunEvent_TYPE_USAGE); u.PromptTokens != 5 || u.CompletionTokens != 5 {
		t.Fatalf("usage %d/%d, want the 5/5 estimate", u.PromptTokens, u.CompletionTokens)
	}
}

func TestCLIPromptViaArg(t *testing.T) {
	// $0 and $1 of sh -c are the next two arguments; stdin is /dev/null.
	c := newTestCLI(t, CLIConfig{
		Command:   []string{"sh", "-c", `printf '%s|%s|' "$0" "$1"; cat`, "--model={{model}}", "{{prompt}}"},
		PromptVia: PromptViaArg,
	})
	rec := &eventRec{}
	const prompt = `$(touch pwned); "quoted" 'single' *`
	if err := c.Normalize(context.Background(), completionReq(prompt), rec); err != nil {
		t.Fatal(err)
	}
	if got, want := rec.text(), "--model=served-model|"+prompt+"|"; got != want {
		t.Fatalf("text %q, want %q (the prompt as one argument, never expanded)", got, want)
	}
}

func TestCLIChatPromptRendering(t *testing.T) {
	c := newTestCLI(t, CLIConfig{Command: []string{"cat"}})
	for _, tc := range []struct{ name, body, want string }{
		{"one user message is its content", `{"messages":[{"role":"user","content":"just this"}]}`, "just this"},
		{"text parts", `{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}]}`, "a\nb"},
		{"a conversation", `{"messages":[{"role":"system","content":"Be terse."},{"role":"user","content":"Hi"},{"role":"assistant","content":"Hello"},{"role":"user","content":"Color?"}]}`,
			"system: Be terse.\n\nuser: Hi\n\nassistant: Hello\n\nuser: Color?"},
		{"one system message", `{"messages":[{"role":"system","content":"S"}]}`, "system: S"},
		{"sampling fields ignored", `{"messages":[{"role":"user","content":"x"}],"max_tokens":1,"temperature":0,"stop":["x"],"tools":[]}`, "x"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := &eventRec{}
			if err := c.Normalize(context.Background(), cliChatReq(tc.body), rec); err != nil {
				t.Fatal(err)
			}
			if got := rec.text(); got != tc.want {
				t.Fatalf("prompt %q, want %q", got, tc.want)
			}
		})
	}
}

func TestCLIRefusesWhatATextProgramCannotTake(t *testing.T) {
	marker := filepath.Join(t.TempDir(), "started")
	stdin := newTestCLI(t, CLIConfig{Command: []string{"sh", "-c", `touch "$0"; cat`, marker}})
	arg := newTestCLI(t, CLIConfig{Command: []string{"sh", "-c", `touch "$0"; echo "$1"`, marker, "{{prompt}}"}, PromptVia: PromptViaArg})
	for _, tc := range []struct {
		name string
		c    *CLI
		req  Request
		want string
	}{
		{"embeddings", stdin, Request{Op: nodev1.Operation_OPERATION_EMBEDDINGS, Body: []byte(`{"input":"x"}`)}, "embeddings are not supported"},
		{"tools", stdin, cliChatReq(`{"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f"}}]}`), "tools are not supported"},
		{"image", stdin, cliChatReq(`{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}}]}]}`), "part type \"image_url\""},
		{"tool calls", stdin, cliChatReq(`{"messages":[{"role":"assistant","tool_calls":[{"id":"1","function":{"name":"f","arguments":"{}"}}]}]}`), "tool calls are not supported"},
		{"no messages", stdin, cliChatReq(`{"messages":[]}`), "at least one message"},
		{"not json", stdin, cliChatReq(`{`), "not a valid chat"},
		{"two prompts", stdin, Request{Op: nodev1.Operation_OPERATION_COMPLETION, Body: []byte(`{"prompt":["a","b"]}`)}, "want one string"},
		{"NUL in an argument", arg, completionReq("a\x00b"), "NUL byte"},
		{"argument too long", arg, completionReq(strings.Repeat("x", maxArgBytes+1)), "prompt_via stdin"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := &eventRec{}
			err := tc.c.Normalize(context.Background(), tc.req, rec)
			var aerr *Error
			if !errors.As(err, &aerr) || aerr.Kind != ErrBadRequest || aerr.Status != http.StatusBadRequest || !strings.Contains(aerr.Message, tc.want) {
				t.Fatalf("err %v, want a 400 bad request mentioning %q", err, tc.want)
			}
			if len(rec.types()) != 0 {
				t.Fatalf("events %v sent for a refused request", rec.types())
			}
			if _, err := os.Stat(marker); err == nil {
				t.Fatal("the command was started for a refused request")
			}
		})
	}
}

func TestCLIEnvAndDirHonoured(t *testing.T) {
	t.Setenv("IOP_TEST_NODE_SECRET", "must-not-leak")
	t.Setenv("LC_TIME", "C")
	dir := t.TempDir()
	c := newTestCLI(t, CLIConfig{
		Command: []string{"sh", "-c", `echo "pwd=$(pwd)"; echo "greeting=$GREETING"; echo "secret=$IOP_TEST_NODE_SECRET"; echo "lc=$LC_TIME"; echo "path=$PATH"`},
		Env:     map[string]string{"GREETING": "hi there"},
		Dir:     dir,
	})
	rec := &eventRec{}
	if err := c.Normalize(context.Background(), completionReq(""), rec); err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("pwd=%s\ngreeting=hi there\nsecret=\nlc=C\npath=%s\n", dir, os.Getenv("PATH"))
	if got := rec.text(); got != want {
		t.Fatalf("output\n%s\nwant\n%s", got, want)
	}
}

func TestCLIRelativeExecutableIsRelativeToDir(t *testing.T) {
	script := writeScript(t, `echo ran`)
	c := newTestCLI(t, CLIConfig{Command: []string{"./" + filepath.Base(script)}, Dir: filepath.Dir(script)})
	rec := &eventRec{}
	if err := c.Normalize(context.Background(), completionReq(""), rec); err != nil || rec.text() != "ran\n" {
		t.Fatalf("err %v, text %q", err, rec.text())
	}
}

// TestCLIStreamsStdoutAsItIsWritten: the script prints a line, then blocks
// until the test writes to a FIFO, which it does only after receiving that
// line as a DELTA; an adapter that waited for more output or for the exit
// would never send it.
func TestCLIStreamsStdoutAsItIsWritten(t *testing.T) {
	fifo := mkfifo(t)
	c := newTestCLI(t, CLIConfig{Command: []string{writeScript(t, `printf 'first\n'; read x < "$1"; printf 'second\n'`), fifo}})
	rec, deltas := deltaTap()
	done := goNormalize(context.Background(), c, completionReq(""), rec)
	if got := receive(t, deltas); got != "first\n" {
		t.Fatalf("first delta %q", got)
	}
	release(t, fifo)
	if err := receive(t, done); err != nil {
		t.Fatal(err)
	}
	if got := rec.text(); got != "first\nsecond\n" {
		t.Fatalf("text %q", got)
	}
}

// TestCLIKeepsUTF8CharactersWhole: "é" (C3 A9) and "😀" (F0 9F 98 80) are
// written in parts, the script blocking between them; no DELTA holds part
// of a character.
func TestCLIKeepsUTF8CharactersWhole(t *testing.T) {
	fifo1, fifo2 := mkfifo(t), mkfifo(t)
	c := newTestCLI(t, CLIConfig{Command: []string{writeScript(t,
		`printf 'a\303'; read x < "$1"; printf '\251b\360\237'; read x < "$2"; printf '\230\200!'`), fifo1, fifo2}})
	rec, deltas := deltaTap()
	done := goNormalize(context.Background(), c, completionReq(""), rec)
	if got := receive(t, deltas); got != "a" {
		t.Fatalf("first delta %q, want %q (the half character held back)", got, "a")
	}
	release(t, fifo1)
	if got := receive(t, deltas); got != "éb" {
		t.Fatalf("second delta %q, want %q", got, "éb")
	}
	release(t, fifo2)
	if err := receive(t, done); err != nil {
		t.Fatal(err)
	}
	if got := rec.text(); got != "aéb😀!" {
		t.Fatalf("text %q", got)
	}
}

func TestCLIInvalidUTF8BecomesReplacementCharacter(t *testing.T) {
	c := newTestCLI(t, CLIConfig{Command: []string{"sh", "-c", `printf 'x\377y\342\202'`}})
	rec := &eventRec{}
	if err := c.Normalize(context.Background(), completionReq(""), rec); err != nil {
		t.Fatal(err)
	}
	if got := rec.text(); got != "x\uFFFDy\uFFFD" {
		t.Fatalf("text %q", got)
	}
}

func TestUTF8StreamNeverSplitsACharacter(t *testing.T) {
	const s = "aé€😀z"
	for i := 0; i <= len(s); i++ {
		for j := i; j <= len(s); j++ {
			var u utf8Stream
			parts := []string{u.next([]byte(s[:i])), u.next([]byte(s[i:j])), u.next([]byte(s[j:])), u.flush()}
			if got := strings.Join(parts, ""); got != s {
				t.Fatalf("splits %d,%d: %q, want %q", i, j, got, s)
			}
			for _, p := range parts {
				if !utf8.ValidString(p) {
					t.Fatalf("splits %d,%d: part %q is not valid UTF-8", i, j, p)
				}
			}
		}
	}
}

// FuzzUTF8Stream: whatever the bytes and however they are split, every
// piece is valid UTF-8, and valid input comes back unchanged.
func FuzzUTF8Stream(f *testing.F) {
	f.Add([]byte("aé€😀z"), uint(2), uint(5))
	f.Add([]byte("x\xffy\xe2\x82"), uint(1), uint(4))
	f.Fuzz(func(t *testing.T, data []byte, i, j uint) {
		i, j = i%uint(len(data)+1), j%uint(len(data)+1)
		if i > j {
			i, j = j, i
		}
		var u utf8Stream
		parts := []string{u.next(data[:i]), u.next(data[i:j]), u.next(data[j:]), u.flush()}
		for _, p := range parts {
			if !utf8.ValidString(p) {
				t.Fatalf("piece %q is not valid UTF-8", p)
			}
		}
		if utf8.Valid(data) && strings.Join(parts, "") != string(data) {
			t.Fatalf("valid input %q came back as %q", data, strings.Join(parts, ""))
		}
	})
}

func TestCLINonZeroExitFailsWithStderrTail(t *testing.T) {
	const secret = "sk-cli-secret-0042"
	c := newTestCLI(t, CLIConfig{
		Command: []string{"sh", "-c", `echo partial; echo "token $API_TOKEN rejected" >&2; printf 'bell\007 and \033[31mcolor\n' >&2; exit 3`},
		Env:     map[string]string{"API_TOKEN": secret},
	})
	rec := &eventRec{}
	err := c.Normalize(context.Background(), completionReq(""), rec)
	var aerr *Error
	if !errors.As(err, &aerr) || aerr.Kind != ErrProviderStatus || aerr.Status != http.StatusBadGateway {
		t.Fatalf("err %v, want a 502 provider status error", err)
	}
	const want = "command exited with status 3: token [redacted] rejected\nbell and [31mcolor"
	if aerr.Message != want {
		t.Fatalf("message %q, want %q", aerr.Message, want)
	}
	if rec.text() != "partial\n" || rec.last(nodev1.RunEvent_TYPE_COMPLETE) != nil {
		t.Fatalf("events %v, text %q: want the output so far and no COMPLETE", rec.types(), rec.text())
	}
}

func TestCLIStderrTailIsBounded(t *testing.T) {
	// 40 KiB of "é" on stderr, then a last line: the message holds the
	// end, cut at a character boundary.
	c := newTestCLI(t, CLIConfig{Command: []string{"sh", "-c", `i=0; while [ $i -lt 20480 ]; do printf 'é' >&2; i=$((i+1)); done; echo ' the end' >&2; exit 1`}})
	err := c.Normalize(context.Background(), completionReq(""), &eventRec{})
	var aerr *Error
	if !errors.As(err, &aerr) {
		t.Fatalf("err %v", err)
	}
	tail := strings.TrimPrefix(aerr.Message, "command exited with status 1: …")
	if tail == aerr.Message || !strings.HasSuffix(tail, "éé the end") || len(tail) > stderrTailBytes || !utf8.ValidString(tail) {
		t.Fatalf("message (%d bytes) %q...: want a cut tail of at most %d bytes", len(aerr.Message), aerr.Message[:min(80, len(aerr.Message))], stderrTailBytes)
	}
}

// TestRegression_StderrTailCutInsideACharacter: stderr of 2048 "é" (2
// bytes each) and "a", 4097 bytes, made a message that began with U+FFFD
// and lacked its "…", whatever the reads' sizes: the reader kept the last
// 2048 bytes, which start inside an "é", and the message, seeing no more
// than 2048 bytes, thought nothing was cut. TestCLIStderrTailIsBounded
// failed the same way when its reads happened to end there.
func TestRegression_StderrTailCutInsideACharacter(t *testing.T) {
	c := newTestCLI(t, CLIConfig{Command: []string{"sh", "-c", `i=0; s=''; while [ $i -lt 2048 ]; do s="${s}é"; i=$((i+1)); done; printf '%sa' "$s" >&2; exit 1`}})
	err := c.Normalize(context.Background(), completionReq(""), &eventRec{})
	var aerr *Error
	if !errors.As(err, &aerr) {
		t.Fatalf("err %v", err)
	}
	if want := "command exited with status 1: …" + strings.Repeat("é", 1023) + "a"; aerr.Message != want {
		got := []rune(aerr.Message)
		t.Fatalf("message (%d bytes) %q...%q, want %q...", len(aerr.Message), string(got[:min(36, len(got))]),
			string(got[max(0, len(got)-4):]), string([]rune(want)[:36]))
	}
}

// TestTailBuffer: whatever the sizes of the writes, the tail is the last
// at most limit bytes that start a character, and "cut" says whether any
// byte before it was dropped.
func TestTailBuffer(t *testing.T) {
	const limit = 16
	identity := func(s string) string { return s }
	for _, c := range []struct {
		name   string
		writes []string
		want   string
		cut    bool
	}{
		{"short", []string{"abc"}, "abc", false},
		{"exactly the limit", []string{strings.Repeat("a", 16)}, strings.Repeat("a", 16), false},
		{"over the limit, cut when read", []string{strings.Repeat("a", 17)}, strings.Repeat("a", 16), true},
		{"trimmed by a write to exactly the limit", []string{strings.Repeat("x", 32), "y"}, strings.Repeat("x", 15) + "y", true},
		// 16 "é" and "a" (33 bytes): the last 16 bytes start inside an "é".
		{"trimmed inside a character", []string{strings.Repeat("é", 16) + "a"}, strings.Repeat("é", 7) + "a", true},
		{"trimmed, then cut when read", []string{strings.Repeat("é", 16), "é", "a"}, strings.Repeat("é", 7) + "a", true},
		{"cut inside a character when read", []string{strings.Repeat("é", 8), "a"}, strings.Repeat("é", 7) + "a", true},
		{"4-byte characters", []string{strings.Repeat("😀", 9)}, strings.Repeat("😀", 4), true},
		// No character starts in the last bytes: at most 3 are dropped,
		// the rest stays to be shown as U+FFFD.
		{"invalid bytes", []string{strings.Repeat("\x80", 20)}, strings.Repeat("\x80", 13), true},
	} {
		t.Run(c.name, func(t *testing.T) {
			tb := &tailBuffer{limit: limit, redact: identity}
			for _, w := range c.writes {
				tb.write([]byte(w))
			}
			got, cut := tb.tail()
			if got != c.want || cut != c.cut {
				t.Fatalf("tail %q cut %v, want %q cut %v", got, cut, c.want, c.cut)
			}
			if len(got) > limit {
				t.Fatalf("tail of %d bytes, limit %d", len(got), limit)
			}
		})
	}
}

// TestRegression_StderrSecretAtTheCutIsRedacted: a secret that straddled
// the point where the stderr tail was cut (5000 bytes in one write, the
// secret at 2940) reached the message half redacted-proof: its last 19
// characters were shown.
func TestRegression_StderrSecretAtTheCutIsRedacted(t *testing.T) {
	const secret = "sk-SUPERSECRET-0123456789abcdef"
	for _, at := range []int{2940, 2950, 2960, 3000, 4000} {
		script := fmt.Sprintf(`head -c %d /dev/zero | tr '\0' A >&2; printf '%%s' "$MY_SECRET" >&2; head -c %d /dev/zero | tr '\0' B >&2; exit 1`, at, 5000-at-len(secret))
		c := newTestCLI(t, CLIConfig{Command: []string{"sh", "-c", script}, Env: map[string]string{"MY_SECRET": secret}})
		err := c.Normalize(context.Background(), completionReq(""), &eventRec{})
		var aerr *Error
		if !errors.As(err, &aerr) {
			t.Fatalf("err %v", err)
		}
		for i := 0; i+6 <= len(secret); i++ {
			if strings.Contains(aerr.Message, secret[i:i+6]) {
				t.Fatalf("secret at %d: part %q of it is in the message %q", at, secret[i:i+6], aerr.Message)
			}
		}
	}
}

func TestCLIKilledBySignal(t *testing.T) {
	c := newTestCLI(t, CLIConfig{Command: []string{"sh", "-c", `echo dying >&2; kill -9 $$`}})
	err := c.Normalize(context.Background(), completionReq(""), &eventRec{})
	var aerr *Error
	if !errors.As(err, &aerr) || aerr.Message != "command killed by signal 9 (SIGKILL): dying" {
		t.Fatalf("err %v", err)
	}
}

func TestCLIStartFailure(t *testing.T) {
	script := writeScript(t, "echo hi")
	c := newTestCLI(t, CLIConfig{Command: []string{script}})
	if err := os.Remove(script); err != nil {
		t.Fatal(err)
	}
	err := c.Normalize(context.Background(), completionReq(""), &eventRec{})
	var aerr *Error
	if !errors.As(err, &aerr) || aerr.Kind != ErrProviderUnreachable || aerr.Status != http.StatusBadGateway ||
		aerr.Message != "cannot start the command: no such file or directory" {
		t.Fatalf("err %v", err)
	}
}

// cancelScript runs a grandchild, writes its own pid and the grandchild's
// to $1, prints a line and waits: it only ends when killed.
const cancelScript = `sleep 1000 & echo "$$ $!" > "$1"; printf 'working\n'; wait`

// checkGroupGone checks that the command (reaped by the adapter, so at once)
// and its grandchild (killed, so within a bounded wait) are gone, and no
// zombie child is left to the test process.
func checkGroupGone(t *testing.T, pidFile string) {
	t.Helper()
	pids := readPIDs(t, pidFile)
	if len(pids) != 2 {
		t.Fatalf("pids %v", pids)
	}
	if err := syscall.Kill(pids[0], 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("the command %d is still there after Normalize returned (kill: %v)", pids[0], err)
	}
	waitGone(t, pids[1])
	if z := zombieChildren(t); len(z) > 0 {
		t.Errorf("zombie children left: %v", z)
	}
}

func TestCLICancelKillsTheProcessGroup(t *testing.T) {
	for _, tc := range []struct {
		name   string
		script string
	}{
		{"command ends on SIGTERM", cancelScript},
		// Both ignore SIGTERM (an ignored signal stays ignored in
		// children): SIGKILL after the kill grace ends them.
		{"command ignores SIGTERM", `trap '' TERM; ` + cancelScript},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pidFile := filepath.Join(t.TempDir(), "pids")
			c := newTestCLI(t, CLIConfig{Command: []string{writeScript(t, tc.script), pidFile}, KillGrace: 100 * time.Millisecond})
			ctx, cancel := context.WithCancelCause(context.Background())
			rec, deltas := deltaTap()
			done := goNormalize(ctx, c, completionReq(""), rec)
			receive(t, deltas)
			cause := errors.New("client went away")
			cancel(cause)
			err := receive(t, done)
			if !errors.Is(err, ErrCancelled) || !errors.Is(err, cause) {
				t.Fatalf("err %v, want ErrCancelled wrapping the cause", err)
			}
			checkGroupGone(t, pidFile)
		})
	}
}

func TestCLITimeoutKillsTheProcessGroup(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "pids")
	c := newTestCLI(t, CLIConfig{Command: []string{writeScript(t, cancelScript), pidFile}, Timeout: 300 * time.Millisecond})
	err := c.Normalize(context.Background(), completionReq(""), &eventRec{})
	var aerr *Error
	if !errors.As(err, &aerr) || aerr.Kind != ErrProviderTimeout || aerr.Status != http.StatusGatewayTimeout {
		t.Fatalf("err %v, want a 504 timeout", err)
	}
	checkGroupGone(t, pidFile)
}

func TestCLISinkFailureKillsTheProcessGroup(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "pids")
	c := newTestCLI(t, CLIConfig{Command: []string{writeScript(t, cancelScript), pidFile}})
	gone := errors.New("run stream gone")
	rec := &eventRec{onSend: func(events []*nodev1.RunEvent) error {
		if events[0].Type == nodev1.RunEvent_TYPE_DELTA {
			return gone
		}
		return nil
	}}
	if err := c.Normalize(context.Background(), completionReq(""), rec); !errors.Is(err, ErrSink) || !errors.Is(err, gone) {
		t.Fatalf("err %v, want ErrSink", err)
	}
	checkGroupGone(t, pidFile)
}

// TestCLICompletesWhenABackgroundChildHoldsStdout: the command exits 0 but
// leaves a process holding its stdout open; the run completes at the exit
// and the leftover process is killed.
func TestCLICompletesWhenABackgroundChildHoldsStdout(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "pids")
	c := newTestCLI(t, CLIConfig{Command: []string{"sh", "-c", `sleep 1000 & echo "$$ $!" > "$0"; echo done`, pidFile}})
	rec := &eventRec{}
	if err := c.Normalize(context.Background(), completionReq(""), rec); err != nil {
		t.Fatal(err)
	}
	if rec.text() != "done\n" {
		t.Fatalf("text %q", rec.text())
	}
	checkGroupGone(t, pidFile)
}

func TestCLICommandThatIgnoresStdin(t *testing.T) {
	// A 256 KiB prompt overflows the pipe (64 KiB); the command never reads it.
	c := newTestCLI(t, CLIConfig{Command: []string{"sh", "-c", "echo ignored"}})
	rec := &eventRec{}
	if err := c.Normalize(context.Background(), completionReq(strings.Repeat("p", 256<<10)), rec); err != nil || rec.text() != "ignored\n" {
		t.Fatalf("err %v, text %q", err, rec.text())
	}
}

// TestCLINeverRunsMoreThanMaxProcs: with one slot, a second run waits
// (onWait tells when it found the slot taken) without starting its
// command, and starts only after the first command is gone.
func TestCLINeverRunsMoreThanMaxProcs(t *testing.T) {
	fifo := mkfifo(t)
	pidFile := filepath.Join(t.TempDir(), "pid")
	script := writeScript(t, `
if [ "$1" = first ]; then echo $$ > "$2"; printf 'first\n'; read x < "$3"; exit 0; fi
if kill -0 "$(cat "$2")" 2>/dev/null; then echo overlap; else echo alone; fi`)
	c := newTestCLI(t, CLIConfig{Command: []string{script, "{{prompt}}", pidFile, fifo}, PromptVia: PromptViaArg, MaxProcs: 1})
	waiting := make(chan struct{}, 1)
	c.onWait = func() { waiting <- struct{}{} }

	rec1, deltas := deltaTap()
	done1 := goNormalize(context.Background(), c, completionReq("first"), rec1)
	receive(t, deltas)
	rec2 := &eventRec{}
	done2 := goNormalize(context.Background(), c, completionReq("second"), rec2)
	receive(t, waiting)
	if types := rec2.types(); len(types) != 0 {
		t.Fatalf("the waiting run sent %v", types)
	}
	release(t, fifo)
	if err := receive(t, done1); err != nil {
		t.Fatal(err)
	}
	if err := receive(t, done2); err != nil {
		t.Fatal(err)
	}
	if rec2.text() != "alone\n" {
		t.Fatalf("second run saw %q: it ran alongside the first", rec2.text())
	}

	// A run cancelled while it waits for the slot never starts.
	done1 = goNormalize(context.Background(), c, completionReq("first"), rec1)
	receive(t, deltas)
	ctx, cancel := context.WithCancel(context.Background())
	rec3 := &eventRec{}
	done3 := goNormalize(ctx, c, completionReq("third"), rec3)
	receive(t, waiting)
	cancel()
	if err := receive(t, done3); !errors.Is(err, ErrCancelled) {
		t.Fatalf("cancelled waiter: %v, want ErrCancelled", err)
	}
	if types := rec3.types(); len(types) != 0 {
		t.Fatalf("the cancelled waiter sent %v", types)
	}
	release(t, fifo)
	if err := receive(t, done1); err != nil {
		t.Fatal(err)
	}
}

func TestNewCLIRejects(t *testing.T) {
	notExec := filepath.Join(t.TempDir(), "data.txt")
	if err := os.WriteFile(notExec, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		cfg  CLIConfig
		want string
	}{
		{"no command", CLIConfig{}, "command is required"},
		{"not in PATH", CLIConfig{Command: []string{"iop-no-such-program"}}, `"iop-no-such-program" not found in PATH`},
		{"PATH from env", CLIConfig{Command: []string{"cat"}, Env: map[string]string{"PATH": t.TempDir()}}, `"cat" not found in PATH`},
		{"not executable", CLIConfig{Command: []string{notExec}}, "not an executable file"},
		{"dir missing", CLIConfig{Command: []string{"cat"}, Dir: filepath.Join(t.TempDir(), "nope")}, "not a directory"},
		{"prompt placeholder with stdin", CLIConfig{Command: []string{"echo", "{{prompt}}"}}, `needs prompt via "arg"`},
		{"arg without placeholder", CLIConfig{Command: []string{"echo"}, PromptVia: PromptViaArg}, "needs {{prompt}}"},
		{"unknown placeholder", CLIConfig{Command: []string{"echo", "{{temperature}}"}}, "unknown placeholder"},
		{"unknown prompt via", CLIConfig{Command: []string{"cat"}, PromptVia: "file"}, `prompt via "file"`},
		{"bad env name", CLIConfig{Command: []string{"cat"}, Env: map[string]string{"A=B": "x"}}, `env "A=B"`},
		{"negative grace", CLIConfig{Command: []string{"cat"}, KillGrace: -time.Second}, "must not be negative"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewCLI(tc.cfg)
			if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want ErrInvalidConfig mentioning %q", err, tc.want)
			}
		})
	}
}
