package adapter

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"iop/internal/wire/nodev1"
)

// How a CLI passes the prompt to its command (CLIConfig.PromptVia).
const (
	// PromptViaStdin writes the prompt to the command's standard input,
	// then closes it.
	PromptViaStdin = "stdin"
	// PromptViaArg substitutes the prompt for "{{prompt}}" in the
	// command's arguments; standard input is /dev/null.
	PromptViaArg = "arg"
)

// DefaultKillGrace is CLIConfig.KillGrace when it is zero.
const DefaultKillGrace = 5 * time.Second

// Placeholders of a CLI argument template.
const (
	placeholderModel  = "{{model}}"
	placeholderPrompt = "{{prompt}}"
)

const (
	// cliReadChunk is the most stdout bytes one DELTA carries: each Read
	// of the command's stdout (up to this size) becomes one DELTA at once.
	cliReadChunk = 32 << 10
	// stderrTailBytes bounds the stderr tail an ERROR message carries.
	stderrTailBytes = 2 << 10
	// maxArgBytes is the longest single argument Linux passes to execve
	// (MAX_ARG_STRLEN, 32 pages of 4 KiB, including the terminating NUL).
	maxArgBytes = 32*4096 - 1
	// minRedactBytes is the shortest env value redacted from stderr: a
	// shorter one is not a secret and would garble the message.
	minRedactBytes = 8
)

// inheritedEnv are the variables a command gets from the node's own
// environment (besides every LC_* variable); CLIConfig.Env adds to them.
// Nothing else passes, so the node's secrets (API keys of other providers,
// its edge token) never reach a command unless Env names them.
var inheritedEnv = []string{"PATH", "HOME", "USER", "LOGNAME", "SHELL", "TMPDIR", "TZ", "LANG"}

// CLIConfig describes a provider that is a local command-line program.
type CLIConfig struct {
	// Command is the executable and its argument template. Command[0] is a
	// name looked up in the command's PATH (Env's PATH if set, else the
	// node's) or a path (relative to Dir when relative); it must exist and
	// be executable when NewCLI is called. In the arguments, "{{model}}" is
	// replaced by the served model and "{{prompt}}" by the prompt (with
	// PromptVia "arg"), also inside a longer argument ("--model={{model}}").
	// No shell is involved: a prompt is never parsed or expanded. Required.
	Command []string
	// PromptVia is PromptViaStdin (the default when empty) or PromptViaArg,
	// which needs "{{prompt}}" in Command.
	PromptVia string
	// Env is added to the inherited environment (see inheritedEnv: PATH,
	// HOME, USER, LOGNAME, SHELL, TMPDIR, TZ, LANG and LC_* of the node),
	// replacing a variable of the same name. Values of 8 bytes or more are
	// redacted from the stderr tail an error shows.
	Env map[string]string
	// Dir is the command's working directory; empty means the node's.
	Dir string
	// Timeout bounds a whole run, from waiting for a process slot to the
	// command's exit; 0 means DefaultTimeout.
	Timeout time.Duration
	// KillGrace is the time between SIGTERM and SIGKILL to the process
	// group of a cancelled or timed-out run; 0 means DefaultKillGrace.
	KillGrace time.Duration
	// MaxProcs is the most commands running at once (the provider's
	// capacity); a run beyond it waits for a slot. 0 means 1.
	MaxProcs int
}

// CLI answers on the normalized path by running a local command per run.
// The prompt is a plain-text rendering of the request (see [cliPrompt]);
// stdout streams back as DELTAs as it is written; exit status 0 completes
// the run, anything else fails it with the tail of stderr.
//
// Concurrency: CLI is safe for concurrent use. Each Normalize call starts
// up to four goroutines of its own (stdout reader, stderr reader, stdin
// writer, exit watcher) and ends them, the command's whole process group
// and its zombie before it returns. A buffered channel of MaxProcs tokens
// (slots) bounds the commands running at once; a token is held from before
// the start to after the reap.
type CLI struct {
	argv0     string   // Command[0] as configured, the command's argv[0]
	path      string   // the resolved executable
	args      []string // argument template, Command[1:]
	promptArg bool
	env       []string // KEY=VALUE, built once by NewCLI
	dir       string
	timeout   time.Duration
	killGrace time.Duration
	slots     chan struct{}
	redactor  *strings.Replacer // hides Env values of minRedactBytes or more
	onWait    func()            // if set, called when a run finds every slot taken (tests)
}

var _ Normalizer = (*CLI)(nil)

// NewCLI checks cfg, resolves the executable and builds the command's
// environment from the node's (read once, here). Errors wrap
// ErrInvalidConfig: no command, an unknown prompt_via or placeholder, a
// prompt placeholder that does not match PromptVia, an executable that is
// not found or not executable, a Dir that is not a directory, a negative
// duration or MaxProcs.
func NewCLI(cfg CLIConfig) (*CLI, error) {
	invalid := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...)
	}
	if len(cfg.Command) == 0 || cfg.Command[0] == "" {
		return nil, invalid("command is required")
	}
	if cfg.Timeout < 0 || cfg.KillGrace < 0 || cfg.MaxProcs < 0 {
		return nil, invalid("timeout %v, kill grace %v, max procs %d: must not be negative", cfg.Timeout, cfg.KillGrace, cfg.MaxProcs)
	}
	prompts := 0
	for _, a := range cfg.Command[1:] {
		prompts += strings.Count(a, placeholderPrompt)
		rest := strings.ReplaceAll(strings.ReplaceAll(a, placeholderPrompt, ""), placeholderModel, "")
		if i := strings.Index(rest, "{{"); i >= 0 && strings.Contains(rest[i:], "}}") {
			return nil, invalid("argument %q: unknown placeholder: want {{model}} or {{prompt}}", a)
		}
	}
	c := &CLI{
		argv0:     cfg.Command[0],
		args:      slices.Clone(cfg.Command[1:]),
		dir:       cfg.Dir,
		timeout:   orDefault(cfg.Timeout, DefaultTimeout),
		killGrace: orDefault(cfg.KillGrace, DefaultKillGrace),
		slots:     make(chan struct{}, max(cfg.MaxProcs, 1)),
	}
	switch cfg.PromptVia {
	case "", PromptViaStdin:
		if prompts > 0 {
			return nil, invalid("{{prompt}} in the command needs prompt via %q", PromptViaArg)
		}
	case PromptViaArg:
		if prompts == 0 {
			return nil, invalid("prompt via %q needs {{prompt}} in the command", PromptViaArg)
		}
		c.promptArg = true
	default:
		return nil, invalid("prompt via %q: want %q or %q", cfg.PromptVia, PromptViaStdin, PromptViaArg)
	}
	if c.dir != "" {
		if fi, err := os.Stat(c.dir); err != nil || !fi.IsDir() {
			return nil, invalid("dir %q is not a directory", c.dir)
		}
	}
	env := make(map[string]string)
	for _, kv := range os.Environ() {
		k, v, _ := strings.Cut(kv, "=")
		if slices.Contains(inheritedEnv, k) || strings.HasPrefix(k, "LC_") {
			env[k] = v
		}
	}
	var secrets []string
	for k, v := range cfg.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.IndexByte(v, 0) >= 0 {
			return nil, invalid("env %q: a name must be non-empty without '=' or NUL, a value without NUL", k)
		}
		env[k] = v
		if len(v) >= minRedactBytes {
			secrets = append(secrets, v)
		}
	}
	for _, k := range slices.Sorted(maps.Keys(env)) {
		c.env = append(c.env, k+"="+env[k])
	}
	// Longest first, so a secret that contains another is hidden whole.
	slices.SortFunc(secrets, func(a, b string) int { return len(b) - len(a) })
	pairs := make([]string, 0, 2*len(secrets))
	for _, s := range secrets {
		pairs = append(pairs, s, "[redacted]")
	}
	c.redactor = strings.NewReplacer(pairs...)
	path, err := resolveExecutable(cfg.Command[0], env["PATH"], c.dir)
	if err != nil {
		return nil, invalid("%w", err)
	}
	c.path = path
	return c, nil
}

// orDefault is d, or def when d is zero.
func orDefault(d, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return d
}

// resolveExecutable returns the absolute path of name: looked up in the
// directories of pathList when it has no slash (relative entries are
// skipped, like exec.LookPath refuses them), else taken relative to dir.
func resolveExecutable(name, pathList, dir string) (string, error) {
	if !strings.Contains(name, "/") {
		for _, d := range filepath.SplitList(pathList) {
			if !filepath.IsAbs(d) {
				continue
			}
			if p := filepath.Join(d, name); isExecutable(p) {
				return p, nil
			}
		}
		return "", fmt.Errorf("executable %q not found in PATH %q", name, pathList)
	}
	p := name
	if !filepath.IsAbs(p) {
		p = filepath.Join(dir, p)
	}
	p, err := filepath.Abs(p)
	if err != nil || !isExecutable(p) {
		return "", fmt.Errorf("executable %q is not an executable file", name)
	}
	return p, nil
}

func isExecutable(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0
}

// Path is EXECUTION_PATH_NORMALIZED.
func (c *CLI) Path() nodev1.ExecutionPath { return nodev1.ExecutionPath_EXECUTION_PATH_NORMALIZED }

// Close does nothing: a CLI holds no idle resources between runs.
func (c *CLI) Close() {}

// Normalize runs the command for req and sends its answer to sink:
//
//	STARTED once the command has started,
//	DELTA{text} for each read of its stdout, as soon as it is written,
//	then USAGE + COMPLETE{"stop"} when it exits with status 0.
//
// The text is stdout's bytes as UTF-8: a character split across writes is
// held back until complete, invalid bytes become U+FFFD. USAGE is an
// estimate, not a count: prompt and output characters / 4, rounded up
// (OpenAI's rule of thumb for English text); the request's max_tokens,
// temperature, stop and other sampling fields are ignored. Failures:
//
//   - embeddings, tools, image content, or a body that does not parse:
//     *Error ErrBadRequest 400, no process started; so is a prompt that
//     cannot be an argument (a NUL byte, or over 128 KiB with PromptViaArg);
//   - the command cannot start: *Error ErrProviderUnreachable 502;
//   - a non-zero exit or a signal: *Error ErrProviderStatus 502 whose
//     message holds the status and the last 2 KiB of stderr (valid UTF-8,
//     control characters dropped, Env secrets redacted);
//   - Timeout passed: *Error ErrProviderTimeout 504;
//   - ctx ended: an error wrapping ErrCancelled and ctx's cause;
//   - sink failed: an error wrapping ErrSink.
//
// On the last three the command's process group (the command runs in a new
// group, Setpgid) gets SIGTERM, then SIGKILL once the command has exited
// or KillGrace has passed. On every outcome the group gets SIGKILL after
// the command exited, before it is reaped (so the group id cannot have
// been reused): a background process it left behind does not outlive the
// run. Normalize returns only once the command is reaped.
func (c *CLI) Normalize(ctx context.Context, req Request, sink EventSink) error {
	prompt, err := cliPrompt(req)
	if err != nil {
		return err
	}
	args, err := c.argv(req.ServedModel, prompt)
	if err != nil {
		return err
	}
	rctx, cancel := context.WithTimeoutCause(ctx, c.timeout, ErrProviderTimeout)
	defer cancel()
	select {
	case c.slots <- struct{}{}:
	default:
		if c.onWait != nil {
			c.onWait()
		}
		select {
		case c.slots <- struct{}{}:
		case <-rctx.Done():
			return c.ended(ctx)
		}
	}
	defer func() { <-c.slots }()
	p, err := c.start(args, prompt)
	if err != nil {
		return err
	}
	defer p.cleanup()
	return p.run(ctx, rctx, sink, utf8.RuneCountInString(prompt))
}

// ended is the outcome of a run whose context (ctx plus the timeout) ended.
func (c *CLI) ended(ctx context.Context) error {
	if ctx.Err() != nil {
		return fmt.Errorf("%w: %w", ErrCancelled, context.Cause(ctx))
	}
	return &Error{Kind: ErrProviderTimeout, Status: http.StatusGatewayTimeout,
		Message: fmt.Sprintf("command did not finish within the provider timeout (%v)", c.timeout)}
}

// argv is the command's arguments for model and prompt.
func (c *CLI) argv(model, prompt string) ([]string, error) {
	args := make([]string, len(c.args))
	for i, a := range c.args {
		a = strings.ReplaceAll(a, placeholderModel, model)
		if c.promptArg && strings.Contains(a, placeholderPrompt) {
			if strings.IndexByte(prompt, 0) >= 0 {
				return nil, badRequest("the prompt holds a NUL byte, which a command argument cannot")
			}
			a = strings.ReplaceAll(a, placeholderPrompt, prompt)
			if len(a) > maxArgBytes {
				return nil, badRequest("the prompt is too long for a command argument (%d bytes, at most %d): configure prompt_via stdin", len(a), maxArgBytes)
			}
		}
		args[i] = a
	}
	return args, nil
}

// process is one running command and the goroutines that serve it.
type process struct {
	c      *CLI
	cmd    *exec.Cmd
	stdout *os.File      // read end; its reader goroutine reads it
	stderr *os.File      // read end; its reader goroutine reads it
	stdin  *os.File      // write end, nil with PromptViaArg; its writer goroutine owns it
	chunks chan []byte   // stdout's reads, closed at EOF or a read error
	exited chan struct{} // closed once the command has exited (not yet reaped)
	errEOF chan struct{} // closed once stderr is read to its end
	stop   chan struct{} // closed by cleanup: readers stop sending
	wg     sync.WaitGroup

	tail *tailBuffer // the end of stderr, redacted

	reaped bool
	state  *os.ProcessState
}

// start starts the command with its pipes and the goroutines serving them.
func (c *CLI) start(args []string, prompt string) (*process, error) {
	startFailed := func(err error) error {
		if errors.Is(err, syscall.E2BIG) {
			return badRequest("the command's arguments are too long: configure prompt_via stdin")
		}
		msg := "cannot start the command"
		var errno syscall.Errno
		if errors.As(err, &errno) {
			msg += ": " + errno.Error()
		}
		return &Error{Kind: ErrProviderUnreachable, Status: http.StatusBadGateway, Message: msg}
	}
	var parentEnds, childEnds []*os.File
	closeAll := func(fs []*os.File) {
		for _, f := range fs {
			f.Close()
		}
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		return nil, startFailed(err)
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		closeAll([]*os.File{outR, outW})
		return nil, startFailed(err)
	}
	parentEnds, childEnds = []*os.File{outR, errR}, []*os.File{outW, errW}
	cmd := &exec.Cmd{
		Path:        c.path,
		Args:        append([]string{c.argv0}, args...),
		Env:         c.env,
		Dir:         c.dir,
		Stdout:      outW,
		Stderr:      errW,
		SysProcAttr: &syscall.SysProcAttr{Setpgid: true},
	}
	var inW *os.File
	if !c.promptArg {
		inR, w, err := os.Pipe()
		if err != nil {
			closeAll(parentEnds)
			closeAll(childEnds)
			return nil, startFailed(err)
		}
		inW, cmd.Stdin = w, inR
		parentEnds, childEnds = append(parentEnds, inW), append(childEnds, inR)
	}
	err = cmd.Start()
	closeAll(childEnds) // the command holds its own copies
	if err != nil {
		closeAll(parentEnds)
		return nil, startFailed(err)
	}
	p := &process{
		c: c, cmd: cmd, stdout: outR, stderr: errR, stdin: inW,
		chunks: make(chan []byte),
		exited: make(chan struct{}),
		errEOF: make(chan struct{}),
		stop:   make(chan struct{}),
		tail:   &tailBuffer{limit: stderrTailBytes, redact: c.redactor.Replace},
	}
	p.wg.Add(3)
	go p.readStdout()
	go p.readStderr()
	go p.watchExit()
	if inW != nil {
		p.wg.Add(1)
		go p.writeStdin(prompt)
	}
	return p, nil
}

// readStdout sends each read of stdout, copied, until EOF, an error, or
// stop.
func (p *process) readStdout() {
	defer p.wg.Done()
	defer close(p.chunks)
	buf := make([]byte, cliReadChunk)
	for {
		n, err := p.stdout.Read(buf)
		if n > 0 {
			select {
			case p.chunks <- slices.Clone(buf[:n]):
			case <-p.stop:
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// readStderr keeps the tail of stderr until EOF or an error.
func (p *process) readStderr() {
	defer p.wg.Done()
	defer close(p.errEOF)
	buf := make([]byte, 4<<10)
	for {
		n, err := p.stderr.Read(buf)
		if n > 0 {
			p.tail.write(buf[:n])
		}
		if err != nil {
			return
		}
	}
}

// writeStdin writes the prompt to stdin and closes it. A command that
// exits without reading it all is not an error (its outcome decides).
func (p *process) writeStdin(prompt string) {
	defer p.wg.Done()
	defer p.stdin.Close()
	_, _ = io.WriteString(p.stdin, prompt)
}

// watchExit closes exited when the command has exited, without reaping it
// (waitid with WNOWAIT): until the reap its pid, which is also its process
// group's id, cannot be reused, so signalling the group stays safe.
func (p *process) watchExit() {
	defer p.wg.Done()
	defer close(p.exited)
	var info unix.Siginfo
	for {
		err := unix.Waitid(unix.P_PID, p.cmd.Process.Pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
		if err != unix.EINTR {
			return
		}
	}
}

// signalGroup sends sig to the command's process group. Called only before
// the reap.
func (p *process) signalGroup(sig syscall.Signal) {
	_ = syscall.Kill(-p.cmd.Process.Pid, sig)
}

// terminate stops the group: SIGTERM, then SIGKILL once the command has
// exited or the kill grace has passed.
func (p *process) terminate() {
	p.signalGroup(syscall.SIGTERM)
	t := time.NewTimer(p.c.killGrace)
	defer t.Stop()
	select {
	case <-p.exited:
	case <-t.C:
	}
	p.signalGroup(syscall.SIGKILL)
}

// reap waits for the command (which must have exited or been killed) and
// records its state.
func (p *process) reap() {
	if p.reaped {
		return
	}
	<-p.exited
	p.signalGroup(syscall.SIGKILL) // what it left behind, while its pgid is still ours
	p.reaped = true
	_ = p.cmd.Wait() // the state says how it ended
	p.state = p.cmd.ProcessState
}

// cleanup kills what is left of the group, unblocks and joins the
// goroutines, and reaps the command. It is called exactly once, on every
// path, after run.
func (p *process) cleanup() {
	if !p.reaped {
		select {
		case <-p.exited:
		default:
			p.signalGroup(syscall.SIGKILL)
		}
		p.reap()
	}
	close(p.stop)
	now := time.Now()
	_ = p.stdout.SetReadDeadline(now) // an escaped descendant may hold the pipes open
	_ = p.stderr.SetReadDeadline(now)
	if p.stdin != nil {
		_ = p.stdin.SetWriteDeadline(now)
	}
	p.wg.Wait()
	p.stdout.Close()
	p.stderr.Close()
}

// run relays the command's stdout to sink until the command has exited and
// stdout is drained, or ctx (the caller's) or rctx (plus the timeout) ends.
func (p *process) run(ctx, rctx context.Context, sink EventSink, promptChars int) error {
	fail := func(err error) error {
		p.terminate()
		return err
	}
	if err := sink.Send(&nodev1.RunEvent{Type: nodev1.RunEvent_TYPE_STARTED}); err != nil {
		return fail(sinkFailed(err))
	}
	var (
		text      utf8Stream
		outChars  int
		chunks    = p.chunks
		exited    = p.exited
		drain     *time.Timer
		drainDone <-chan time.Time
	)
	defer func() {
		if drain != nil {
			drain.Stop()
		}
	}()
	send := func(s string) error {
		if s == "" {
			return nil
		}
		outChars += utf8.RuneCountInString(s)
		if err := sink.Send(&nodev1.RunEvent{Type: nodev1.RunEvent_TYPE_DELTA, Text: s}); err != nil {
			return sinkFailed(err)
		}
		return nil
	}
	for chunks != nil || exited != nil {
		select {
		case <-rctx.Done():
			return fail(p.c.ended(ctx))
		case b, ok := <-chunks:
			if !ok {
				chunks = nil
				continue
			}
			if err := send(text.next(b)); err != nil {
				return fail(err)
			}
		case <-exited:
			// Kill what the command left behind (so the pipes it holds
			// close), then drain what is already written; a process that
			// left the group gets kill grace to close stdout.
			exited = nil
			p.signalGroup(syscall.SIGKILL)
			drain = time.NewTimer(p.c.killGrace)
			drainDone = drain.C
		case <-drainDone:
			chunks = nil
		}
	}
	if err := send(text.flush()); err != nil {
		return err
	}
	t := time.NewTimer(p.c.killGrace)
	select {
	case <-p.errEOF:
	case <-t.C:
	}
	t.Stop()
	p.reap()
	if p.state != nil && p.state.Success() {
		if err := sink.Send(
			&nodev1.RunEvent{Type: nodev1.RunEvent_TYPE_USAGE, PromptTokens: estimateTokens(promptChars), CompletionTokens: estimateTokens(outChars)},
			&nodev1.RunEvent{Type: nodev1.RunEvent_TYPE_COMPLETE, FinishReason: "stop"},
		); err != nil {
			return sinkFailed(err)
		}
		return nil
	}
	return p.exitError()
}

// exitError is the *Error for a command that did not exit with status 0.
func (p *process) exitError() error {
	msg := "command failed"
	if st := p.state; st != nil {
		if ws, ok := st.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			msg = fmt.Sprintf("command killed by signal %d (%s)", int(ws.Signal()), unix.SignalName(ws.Signal()))
		} else {
			msg = fmt.Sprintf("command exited with status %d", st.ExitCode())
		}
	}
	if tail := p.stderrTail(); tail != "" {
		msg += ": " + tail
	}
	return &Error{Kind: ErrProviderStatus, Status: http.StatusBadGateway, Message: msg}
}

// stderrTail is the last stderrTailBytes of stderr, safe to show: Env
// secrets redacted, valid UTF-8 without control characters other than
// newline and tab, trimmed; "…" marks a cut (tailBuffer.tail decides both
// where the tail starts and whether anything before it was dropped).
func (p *process) stderrTail() string {
	s, cut := p.tail.tail()
	s = strings.ToValidUTF8(s, "\uFFFD")
	s = strings.Map(func(r rune) rune {
		if r == '\n' || r == '\t' || !unicode.IsControl(r) {
			return r
		}
		return -1
	}, s)
	s = strings.TrimSpace(s)
	if cut && s != "" {
		s = "…" + s
	}
	return s
}

// tailBuffer keeps the end of a byte stream (a command's stderr), redacted:
// the one place that decides where the kept tail starts and whether bytes
// before it were dropped. Its cuts fall on UTF-8 character boundaries. It
// is safe for concurrent use.
type tailBuffer struct {
	limit  int                 // the tail is at most limit bytes
	redact func(string) string // hides secrets; applied before any cut

	mu  sync.Mutex // guards the fields below
	buf []byte     // redacted; at most 2*limit bytes after each write
	cut bool       // bytes before buf were dropped
}

// write appends p. The whole buffer is redacted before it is cut, so no
// cut splits a secret and leaves part of it (a secret split between two
// writes is whole once the second is appended).
func (t *tailBuffer) write(p []byte) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = []byte(t.redact(string(append(t.buf, p...))))
	if len(t.buf) > 2*t.limit {
		t.buf = slices.Clone(lastBytes(t.buf, t.limit))
		t.cut = true
	}
}

// tail returns the last at most limit bytes written, starting at a
// character boundary, and whether anything before them was dropped.
func (t *tailBuffer) tail() (string, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	b, cut := t.buf, t.cut
	if len(b) > t.limit {
		b, cut = lastBytes(b, t.limit), true
	}
	return string(b), cut
}

// lastBytes is the longest suffix of b of at most n bytes that does not
// start inside a UTF-8 sequence: the up to utf8.UTFMax-1 continuation
// bytes at the cut go with what precedes them. (More in a row are no
// character's; they stay, and become U+FFFD.)
func lastBytes(b []byte, n int) []byte {
	if len(b) <= n {
		return b
	}
	b = b[len(b)-n:]
	for i := 0; i < utf8.UTFMax-1 && len(b) > 0 && !utf8.RuneStart(b[0]); i++ {
		b = b[1:]
	}
	return b
}

// estimateTokens is chars / 4 rounded up, clamped to int32.
func estimateTokens(chars int) int32 {
	return int32(min((chars+3)/4, math.MaxInt32))
}

// utf8Stream turns a byte stream into valid UTF-8 strings without
// splitting a character across two of them.
type utf8Stream struct{ carry []byte }

// next returns the text of carry + b up to the last complete character
// and keeps the rest (at most 3 bytes of an incomplete one) for later.
// Invalid bytes become U+FFFD.
func (u *utf8Stream) next(b []byte) string {
	data := append(u.carry, b...)
	cut := completePrefix(data)
	u.carry = slices.Clone(data[cut:])
	return strings.ToValidUTF8(string(data[:cut]), "\uFFFD")
}

// flush returns what is held back (an incomplete character: U+FFFD).
func (u *utf8Stream) flush() string {
	s := strings.ToValidUTF8(string(u.carry), "\uFFFD")
	u.carry = nil
	return s
}

// completePrefix is the length of b without a trailing incomplete (but so
// far valid) UTF-8 sequence.
func completePrefix(b []byte) int {
	for i := len(b) - 1; i >= 0 && i > len(b)-utf8.UTFMax; i-- {
		if utf8.RuneStart(b[i]) {
			if utf8.FullRune(b[i:]) {
				return len(b)
			}
			return i
		}
	}
	return len(b)
}
