package batch

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"
	"unicode/utf8"
)

// Defaults of Config's zero fields.
const (
	DefaultMaxFileBytes     int64 = 200 << 20 // 200 MiB, OpenAI's batch input limit
	DefaultConcurrency            = 64
	DefaultCompletionWindow       = 24 * time.Hour
	DefaultMaxAttempts            = 8
	DefaultStartGrace             = 15 * time.Second
	DefaultLeaseTTL               = 10 * time.Second
	// MaxLines bounds the requests of one batch (OpenAI's limit).
	MaxLines = 50_000
)

// Executor runs one request of a batch as an API request of the edge:
// a POST of body to path, as the key named owner ("" for an open API), at
// the batch priority. A non-nil error means it did not run to an answer
// (ctx ended): the line stays pending.
type Executor interface {
	Execute(ctx context.Context, owner, path string, body []byte) (Response, error)
}

// Response is one request's answer: its status, request id and body.
type Response struct {
	Status    int
	RequestID string
	Body      []byte
	// RetryAfter is the answer's Retry-After (RFC 9110 10.2.3, seconds), 0
	// without one: a refusal that says when it will fit is tried again
	// then, without counting against MaxAttempts.
	RetryAfter time.Duration
}

// Config configures a Service. Zero fields take the documented defaults.
type Config struct {
	// Store keeps files, batches and lines; required.
	Store Store
	// Contents keeps the files' bytes; nil means a directory, Dir.
	Contents Contents
	// Dir holds the files' bytes, one file per id, when Contents is nil.
	Dir string
	// Runner names this service among those sharing Store (the edge's
	// name); a random suffix makes each process's own, so a restarted
	// edge never takes a lease its previous process may still use.
	Runner string
	// LeaseTTL is how long a batch's lease lasts unrenewed
	// (DefaultLeaseTTL): the runner renews it every third of it, and a
	// batch whose runner died runs again on another service that long
	// after. Every third of it, too, a service claims the active batches
	// nobody holds.
	LeaseTTL time.Duration
	// MaxFileBytes bounds an uploaded file, in bytes (DefaultMaxFileBytes).
	MaxFileBytes int64
	// Concurrency is the lines of one batch in flight at once
	// (DefaultConcurrency).
	Concurrency int
	// CompletionWindow is how long the window "24h" gives a batch; tests
	// shorten it (DefaultCompletionWindow).
	CompletionWindow time.Duration
	// MaxAttempts bounds the tries of a line refused with 429 or 503, or
	// lost with its node (502 upstream_unavailable) (DefaultMaxAttempts);
	// the last refusal is its result. A refusal with a Retry-After, or
	// while Ready says the edge cannot serve, is not counted: the line
	// waits, within its batch's completion window.
	MaxAttempts int
	// RetryDelay is the first wait before a retry, doubled each time up
	// to 16 times it (1 s).
	RetryDelay time.Duration
	// Ready, if set, reports whether the edge can serve now (a node is
	// connected); a batch's lines wait for it, checked every RetryDelay.
	Ready func() bool
	// StartGrace is how long after Start an unknown model (404) is taken
	// for a node not yet reconnected and retried as a 503 is
	// (DefaultStartGrace).
	StartGrace time.Duration
	// Now stamps records; nil means time.Now.
	Now    func() time.Time
	Logger *slog.Logger
	// Progress, if set, is told of each finished line (metrics).
	Progress func(kind, state string)
}

// Service keeps files and batches and runs the batches.
type Service struct {
	cfg      Config
	store    Store
	contents Contents
	logger   *slog.Logger

	mu      sync.Mutex // guards the fields below
	exec    Executor
	started time.Time       // when Start ran
	ctx     context.Context // ends at Close
	jobs    map[string]*job // running batches by id
	closed  bool
	wg      sync.WaitGroup
	stop    context.CancelFunc
}

// New returns a Service over cfg.Store; Start starts its runner.
func New(cfg Config) (*Service, error) {
	if cfg.Store == nil || (cfg.Contents == nil && cfg.Dir == "") {
		return nil, fmt.Errorf("%w: batch service needs a store and a place for file bytes", ErrInvalid)
	}
	if cfg.Contents == nil {
		if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
			return nil, fmt.Errorf("batch files: %w", err)
		}
		cfg.Contents = Dir(cfg.Dir)
	}
	if cfg.LeaseTTL <= 0 {
		cfg.LeaseTTL = DefaultLeaseTTL
	}
	cfg.Runner += "/" + newID("")[:8]
	if cfg.MaxFileBytes <= 0 {
		cfg.MaxFileBytes = DefaultMaxFileBytes
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = DefaultConcurrency
	}
	if cfg.CompletionWindow <= 0 {
		cfg.CompletionWindow = DefaultCompletionWindow
	}
	if cfg.MaxAttempts <= 0 {
		cfg.MaxAttempts = DefaultMaxAttempts
	}
	if cfg.RetryDelay <= 0 {
		cfg.RetryDelay = time.Second
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.StartGrace <= 0 {
		cfg.StartGrace = DefaultStartGrace
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Service{cfg: cfg, store: cfg.Store, contents: cfg.Contents, logger: cfg.Logger.With("component", "batch", "runner", cfg.Runner),
		jobs: map[string]*job{}}, nil
}

// MaxFileBytes is the upload limit in force.
func (s *Service) MaxFileBytes() int64 { return s.cfg.MaxFileBytes }

// Start starts the runner with exec: it claims every active batch
// nobody holds (a previous process's, or one whose runner died) now and
// every third of LeaseTTL, and runs its lines without a result (again).
func (s *Service) Start(ctx context.Context, exec Executor) error {
	if _, err := s.store.ActiveBatches(ctx); err != nil {
		return fmt.Errorf("batch store: %w", err)
	}
	s.mu.Lock()
	s.exec = exec
	s.ctx, s.stop = context.WithCancel(context.Background())
	runCtx := s.ctx
	s.mu.Unlock()
	s.claimIdle(runCtx)
	s.wg.Go(func() {
		t := time.NewTicker(s.cfg.LeaseTTL / 3)
		defer t.Stop()
		for {
			select {
			case <-runCtx.Done():
				return
			case <-t.C:
				s.claimIdle(runCtx)
			}
		}
	})
	return nil
}

// claimIdle claims the active batches whose lease is not live and runs
// them here.
func (s *Service) claimIdle(ctx context.Context) {
	active, err := s.store.ActiveBatches(ctx)
	if err != nil {
		if ctx.Err() == nil {
			s.logger.Warn("batch store: active batches not read", "err", err)
		}
		return
	}
	for _, b := range active {
		s.mu.Lock()
		_, running := s.jobs[b.ID]
		s.mu.Unlock()
		if running || (b.Leased && b.Runner != s.cfg.Runner) {
			continue
		}
		s.claim(ctx, b.ID, true)
	}
}

// claim takes batch id's lease and runs it here; resumed says another
// process (or this one, earlier) ran it before.
func (s *Service) claim(ctx context.Context, id string, resumed bool) {
	b, ok, err := s.store.Claim(ctx, id, s.cfg.Runner, s.cfg.LeaseTTL)
	if err != nil {
		if ctx.Err() == nil {
			s.logger.Warn("batch not claimed", "batch", id, "err", err)
		}
		return
	}
	if !ok {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		_ = s.store.Release(context.WithoutCancel(ctx), id, b.Epoch)
		return
	}
	at := time.Time{}
	if resumed {
		at = s.cfg.Now()
		s.logger.Info("resuming batch", "batch", b.ID, "status", b.Status, "epoch", b.Epoch, "done", b.Completed+b.Failed, "total", b.Total)
	}
	if !s.startLocked(b, at) {
		_ = s.store.Release(context.WithoutCancel(ctx), id, b.Epoch)
	}
}

// Close stops every running batch without changing its status and
// releases its lease (a later Start, here or on another service,
// resumes it) and waits for the runner.
func (s *Service) Close() error {
	s.mu.Lock()
	s.closed = true
	stop := s.stop
	s.mu.Unlock()
	if stop != nil {
		stop()
	}
	s.wg.Wait()
	return nil
}

// newID is prefix and 24 random hex digits.
func newID(prefix string) string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// UploadFile streams r (at most MaxFileBytes) to a new file of owner
// with purpose and filename: Stage, then Commit.
func (s *Service) UploadFile(ctx context.Context, owner, purpose, filename string, r io.Reader) (File, error) {
	u, err := s.Stage(owner, filename, r)
	if err != nil {
		return File{}, err
	}
	return u.Commit(ctx, purpose)
}

// Upload is a file's bytes in storage, not yet a file: a multipart form
// may name the purpose after the file.
type Upload struct {
	s *Service
	f File
}

// Stage streams r (at most MaxFileBytes) to storage. Errors: ErrTooLarge;
// ErrBodyRead wrapping r's error (the client's upload broke); else the
// storage's (a server fault).
func (s *Service) Stage(owner, filename string, r io.Reader) (*Upload, error) {
	f := File{ID: newID("file-"), Owner: owner, Filename: filename, CreatedAt: s.cfg.Now()}
	src := &readFailure{r: io.LimitReader(r, s.cfg.MaxFileBytes+1)}
	n, err := s.contents.Put(context.Background(), f.ID, src)
	switch {
	case err != nil && src.err != nil:
		err = fmt.Errorf("%w: %w", ErrBodyRead, err)
	case err == nil && n > s.cfg.MaxFileBytes:
		err = fmt.Errorf("%w: over %d bytes", ErrTooLarge, s.cfg.MaxFileBytes)
	}
	if err != nil {
		s.removeContent(f.ID)
		return nil, err
	}
	f.Bytes = n
	return &Upload{s: s, f: f}, nil
}

// readFailure is r remembering its first read error other than io.EOF:
// what tells a client's broken upload from a store that failed.
type readFailure struct {
	r   io.Reader
	err error
}

func (f *readFailure) Read(p []byte) (int, error) {
	n, err := f.r.Read(p)
	if err != nil && err != io.EOF && f.err == nil {
		f.err = err
	}
	return n, err
}

// Commit records the upload as a file of purpose; only "batch" is kept
// (ErrInvalid otherwise, and the bytes are removed).
func (u *Upload) Commit(ctx context.Context, purpose string) (File, error) {
	if purpose != "batch" {
		u.Discard()
		return File{}, fmt.Errorf("%w: purpose: %q is not kept here; upload batch input files (purpose \"batch\")", ErrInvalid, purpose)
	}
	u.f.Purpose = purpose
	if err := u.s.store.CreateFile(ctx, u.f); err != nil {
		u.Discard()
		return File{}, err
	}
	return u.f, nil
}

// Discard removes the upload's bytes.
func (u *Upload) Discard() { u.s.removeContent(u.f.ID) }

// removeContent removes file id's bytes, logging a failure.
func (s *Service) removeContent(id string) {
	if err := s.contents.Remove(context.Background(), id); err != nil {
		s.logger.Warn("file bytes left behind", "file", id, "err", err)
	}
}

// Dir keeps file bytes in a directory, one file per id.
type Dir string

var _ Contents = Dir("")

func (d Dir) path(id string) string { return filepath.Join(string(d), filepath.Base(id)) }

// Put copies r to file id through a temporary name, synced, so a crash
// never leaves a partial file under an id.
func (d Dir) Put(_ context.Context, id string, r io.Reader) (int64, error) {
	tmp, err := os.CreateTemp(string(d), ".upload-*")
	if err != nil {
		return 0, err
	}
	n, err := io.Copy(tmp, r)
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), d.path(id))
	}
	if err != nil {
		os.Remove(tmp.Name())
	}
	return n, err
}

// Open opens file id (ErrNotFound when it has none).
func (d Dir) Open(_ context.Context, id string) (io.ReadCloser, error) {
	f, err := os.Open(d.path(id))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%w: file %s has no content", ErrNotFound, id)
	}
	return f, err
}

// Remove removes file id.
func (d Dir) Remove(_ context.Context, id string) error {
	if err := os.Remove(d.path(id)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// File returns owner's file id (ErrNotFound).
func (s *Service) File(ctx context.Context, owner, id string) (File, error) {
	return s.store.GetFile(ctx, owner, id)
}

// Files lists owner's files, newest first (see Store.ListFiles).
func (s *Service) Files(ctx context.Context, owner, purpose, after string, limit int) ([]File, bool, error) {
	return s.store.ListFiles(ctx, owner, purpose, after, limit)
}

// Content opens the bytes of owner's file id.
func (s *Service) Content(ctx context.Context, owner, id string) (File, io.ReadCloser, error) {
	f, err := s.store.GetFile(ctx, owner, id)
	if err != nil {
		return File{}, nil, err
	}
	rc, err := s.contents.Open(ctx, id)
	if err != nil {
		return File{}, nil, err
	}
	return f, rc, nil
}

// DeleteFile deletes owner's file id and its bytes.
func (s *Service) DeleteFile(ctx context.Context, owner, id string) error {
	if err := s.store.DeleteFile(ctx, owner, id); err != nil {
		return err
	}
	s.removeContent(id)
	return nil
}

// Endpoints a batch may name (OpenAI's Batch API).
var Endpoints = map[string]bool{
	"/v1/chat/completions": true, "/v1/completions": true, "/v1/embeddings": true, "/v1/responses": true,
}

// Metadata bounds of OpenAI's API reference ("metadata": up to 16 pairs,
// keys of at most 64 characters, values of at most 512).
const (
	maxMetadataPairs    = 16
	maxMetadataKeyLen   = 64
	maxMetadataValueLen = 512
)

// checkMetadata returns ErrInvalid naming the first pair of m over the
// bounds (a key's pair as param metadata.<key>).
func checkMetadata(m map[string]string) error {
	if len(m) > maxMetadataPairs {
		return fmt.Errorf("%w: metadata: at most %d pairs, not %d", ErrInvalid, maxMetadataPairs, len(m))
	}
	keys := slices.Sorted(maps.Keys(m))
	for _, k := range keys {
		if n := utf8.RuneCountInString(k); n > maxMetadataKeyLen {
			return fmt.Errorf("%w: metadata: a key is %d characters long, over %d", ErrInvalid, n, maxMetadataKeyLen)
		}
		if n := utf8.RuneCountInString(m[k]); n > maxMetadataValueLen {
			return fmt.Errorf("%w: metadata.%s: the value is %d characters long, over %d", ErrInvalid, k, n, maxMetadataValueLen)
		}
	}
	return nil
}

// CreateRequest is POST /v1/batches's body.
type CreateRequest struct {
	InputFileID      string            `json:"input_file_id"`
	Endpoint         string            `json:"endpoint"`
	CompletionWindow string            `json:"completion_window"`
	Metadata         map[string]string `json:"metadata"`
}

// CreateBatch creates owner's batch of the file req names; it starts
// validating at once. Errors: ErrInvalid, ErrNotFound (the input file).
func (s *Service) CreateBatch(ctx context.Context, owner string, req CreateRequest) (Batch, error) {
	switch {
	case req.InputFileID == "":
		return Batch{}, &MissingError{Param: "input_file_id"}
	case req.Endpoint == "":
		return Batch{}, &MissingError{Param: "endpoint"}
	case req.CompletionWindow == "":
		return Batch{}, &MissingError{Param: "completion_window"}
	case !Endpoints[req.Endpoint]:
		return Batch{}, fmt.Errorf("%w: endpoint: must be one of /v1/chat/completions, /v1/completions, /v1/embeddings, /v1/responses", ErrInvalid)
	case req.CompletionWindow != "24h":
		return Batch{}, fmt.Errorf("%w: completion_window: must be 24h", ErrInvalid)
	}
	if err := checkMetadata(req.Metadata); err != nil {
		return Batch{}, err
	}
	f, err := s.store.GetFile(ctx, owner, req.InputFileID)
	if err != nil {
		return Batch{}, err
	}
	if f.Purpose != "batch" {
		return Batch{}, fmt.Errorf("%w: input_file_id: file %s has purpose %s, not batch", ErrInvalid, f.ID, f.Purpose)
	}
	now := s.cfg.Now()
	b := Batch{ID: newID("batch_"), Owner: owner, Kind: KindOpenAI, Endpoint: req.Endpoint, InputFileID: f.ID,
		CompletionWindow: req.CompletionWindow, Metadata: req.Metadata, Status: StatusValidating,
		CreatedAt: now, ExpiresAt: now.Add(s.cfg.CompletionWindow)}
	return b, s.create(ctx, b, nil)
}

// MessageRequest is one request of an Anthropic message batch.
type MessageRequest struct {
	CustomID string `json:"custom_id"`
	Params   []byte `json:"-"`
}

// CreateMessageBatch creates owner's Anthropic message batch of reqs
// (each run as POST /v1/messages with its params). Errors: ErrInvalid.
func (s *Service) CreateMessageBatch(ctx context.Context, owner string, reqs []MessageRequest) (Batch, error) {
	if len(reqs) == 0 || len(reqs) > MaxLines*2 {
		return Batch{}, fmt.Errorf("%w: requests: between 1 and %d requests", ErrInvalid, MaxLines*2)
	}
	lines := make([]Line, len(reqs))
	seen := make(map[string]bool, len(reqs))
	for i, r := range reqs {
		if !validCustomID(r.CustomID) {
			return Batch{}, fmt.Errorf("%w: requests.%d.custom_id: String should match pattern '^[a-zA-Z0-9_-]{1,64}$'", ErrInvalid, i)
		}
		if seen[r.CustomID] {
			return Batch{}, fmt.Errorf("%w: requests.%d.custom_id: %q is used twice", ErrInvalid, i, r.CustomID)
		}
		seen[r.CustomID] = true
		lines[i] = Line{No: i + 1, CustomID: r.CustomID, Body: r.Params}
	}
	now := s.cfg.Now()
	b := Batch{ID: newID("msgbatch_"), Owner: owner, Kind: KindAnthropic, Endpoint: "/v1/messages",
		CompletionWindow: "24h", Status: StatusInProgress, CreatedAt: now, InProgressAt: now,
		ExpiresAt: now.Add(s.cfg.CompletionWindow), Total: len(lines)}
	return b, s.create(ctx, b, lines)
}

// validCustomID reports whether id matches Anthropic's custom_id pattern,
// ^[a-zA-Z0-9_-]{1,64}$.
func validCustomID(id string) bool {
	if id == "" || len(id) > 64 {
		return false
	}
	for _, c := range []byte(id) {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '_', c == '-':
		default:
			return false
		}
	}
	return true
}

// create stores b (and lines, when given) and starts its job.
func (s *Service) create(ctx context.Context, b Batch, lines []Line) error {
	s.mu.Lock()
	closed := s.closed || s.ctx == nil
	s.mu.Unlock()
	if closed {
		return ErrClosed
	}
	if err := s.store.CreateBatch(ctx, b); err != nil {
		return err
	}
	if lines != nil {
		if err := s.store.AddLines(ctx, b.ID, lines); err != nil {
			return err
		}
	}
	s.claim(ctx, b.ID, false) // nobody holds it yet; else a service that claimed it first runs it
	return nil
}

// Batch returns owner's batch id of kind (ErrNotFound).
func (s *Service) Batch(ctx context.Context, owner, kind, id string) (Batch, error) {
	b, err := s.store.GetBatch(ctx, owner, id)
	if err == nil && b.Kind != kind {
		return Batch{}, fmt.Errorf("%w: no batch %s", ErrNotFound, id)
	}
	return b, err
}

// Batches lists owner's batches of kind, newest first.
func (s *Service) Batches(ctx context.Context, owner, kind, after string, limit int) ([]Batch, bool, error) {
	return s.store.ListBatches(ctx, owner, kind, after, limit)
}

// Cancel asks owner's batch id to stop: it goes to cancelling at once,
// and to cancelled once its lines in flight have ended, on whichever
// service runs it (this one at once, another at its next lease renewal).
// Cancelling a batch already cancelling is no change; one that ended is
// ErrState.
func (s *Service) Cancel(ctx context.Context, owner, kind, id string) (Batch, error) {
	if _, err := s.Batch(ctx, owner, kind, id); err != nil {
		return Batch{}, err
	}
	b, err := s.store.RequestCancel(ctx, owner, id, s.cfg.Now())
	if err != nil {
		return Batch{}, err
	}
	s.mu.Lock()
	j := s.jobs[id]
	s.mu.Unlock()
	if j != nil {
		j.cancelled(b)
	}
	return b, nil
}

// DeleteMessageBatch deletes owner's ended message batch id, its lines
// and its results (Anthropic's DELETE /v1/messages/batches/{id}).
// Errors: ErrNotFound; ErrState while the batch is in progress or
// canceling (Anthropic: cancel it first, then delete it once it ended).
func (s *Service) DeleteMessageBatch(ctx context.Context, owner, id string) error {
	b, err := s.Batch(ctx, owner, KindAnthropic, id)
	if err != nil {
		return err
	}
	if err := s.store.DeleteBatch(ctx, owner, id); err != nil {
		return err
	}
	if b.ResultsFileID != "" {
		if err := s.DeleteFile(ctx, owner, b.ResultsFileID); err != nil && !errors.Is(err, ErrNotFound) {
			s.logger.Warn("message batch results left behind", "batch", id, "file", b.ResultsFileID, "err", err)
		}
	}
	return nil
}

// startLocked starts b's job unless one runs (false then); resumed is
// when it was claimed from an earlier runner (zero for a new batch).
func (s *Service) startLocked(b Batch, resumed time.Time) bool {
	if _, ok := s.jobs[b.ID]; ok || s.ctx == nil {
		return false
	}
	j := newJob(s, b)
	j.resumed = resumed
	s.jobs[b.ID] = j
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		j.run(s.ctx)
		s.mu.Lock()
		delete(s.jobs, b.ID)
		s.mu.Unlock()
	}()
	return true
}

// Statuses are every status of a batch, in the order of its life.
var Statuses = []string{StatusValidating, StatusFailed, StatusInProgress, StatusFinalizing, StatusCompleted,
	StatusExpired, StatusCancelling, StatusCancelled}

// Counts counts the batches of every owner by status (every status of
// Statuses, 0 when none).
func (s *Service) Counts(ctx context.Context) (map[string]int, error) {
	counts, err := s.store.CountBatches(ctx)
	if err != nil {
		return nil, err
	}
	for _, st := range Statuses {
		counts[st] += 0
	}
	return counts, nil
}

// Active lists every batch still being worked on, of every owner, with
// its stored counts (for the admin API's progress view).
func (s *Service) Active(ctx context.Context) ([]Batch, error) {
	return s.store.ActiveBatches(ctx)
}
