package sim

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"sync"
	"time"

	"iop/internal/clock"
)

// maxBodyBytes bounds a request body; larger ones are answered 413.
const maxBodyBytes = 16 << 20

// maxSeen is how many requests Seen remembers.
const maxSeen = 1000

// shutdownGrace bounds how long Serve waits for requests to finish after
// its context is done before closing their connections.
const shutdownGrace = 5 * time.Second

// Stats are a Server's counters since New.
type Stats struct {
	// Requests counts every HTTP request received, on any route but GET
	// /api/ps (PSReadings); Server.Seen lists the same requests.
	Requests int64 `json:"requests"`
	// PSReadings counts GET /api/ps requests: what a node reads to report
	// the models loaded (residency), apart from the requests it relays.
	PSReadings int64 `json:"ps_readings"`
	// InFlight is the number of inference requests admitted and not yet
	// finished.
	InFlight int `json:"in_flight"`
	// MaxInFlight is the highest InFlight ever observed.
	MaxInFlight int `json:"max_in_flight"`
	// Admitted counts inference requests admitted (given an in-flight slot).
	Admitted int64 `json:"admitted"`
	// Repeated counts admitted requests whose prompt an earlier admitted
	// request had; only with Config.CountRepeats, else 0.
	Repeated int64 `json:"repeated"`
	// Rejected counts requests answered 429 because MaxConcurrent was reached.
	Rejected int64 `json:"rejected"`
	// InjectedErrors counts requests answered with Faults.ErrorStatus.
	InjectedErrors int64 `json:"injected_errors"`
	// Cancelled counts inference requests whose client went away (closed
	// the connection or cancelled the request) before the answer was
	// complete: the server saw the abort and stopped generating.
	Cancelled int64 `json:"cancelled"`
	// PrefixHitBlocks and PrefixMissBlocks count the full prompt blocks
	// found in and missing from the prefix cache (Config.PrefixCacheTokens),
	// PrefixHitTokens and PrefixMissTokens the prompt tokens served from it
	// and prefilled, over every generation request admitted; PrefixCachedBlocks
	// is the blocks cached now. All 0 without a cache, but the miss tokens
	// when a prefill rate is set.
	PrefixHitBlocks    int64 `json:"prefix_hit_blocks"`
	PrefixMissBlocks   int64 `json:"prefix_miss_blocks"`
	PrefixHitTokens    int64 `json:"prefix_hit_tokens"`
	PrefixMissTokens   int64 `json:"prefix_miss_tokens"`
	PrefixCachedBlocks int   `json:"prefix_cached_blocks"`
	// Loads and Evictions count the models loaded and evicted
	// (Config.MaxLoadedModels, LoadTime), Unloads those unloaded on
	// request (keep_alive 0); 0 without residency.
	Loads     int64 `json:"loads"`
	Evictions int64 `json:"evictions"`
	Unloads   int64 `json:"unloads"`
	// OutputTokens counts the answer tokens delivered (pieces of output:
	// tokens, or pieces of a tool call), over every inference request.
	OutputTokens int64 `json:"output_tokens"`
	// MaxTokensPerMinute is the most OutputTokens delivered in any 60
	// whole seconds of the server's clock.
	MaxTokensPerMinute int64 `json:"max_tokens_per_minute"`
	// LastModel is the model named by the latest request ("" if none).
	LastModel string `json:"last_model"`
	// LastAuthorization is the Authorization header of the latest request.
	LastAuthorization string `json:"-"`
}

// SeenRequest is what a Server recorded of one request it received.
type SeenRequest struct {
	Method string
	Path   string
	// Model is the model named in the request body, "" if none or unparsable.
	Model string
	// Authorization is the request's Authorization header, verbatim.
	Authorization string
	// BodyBytes and BodySHA256 (hex) are the length and hash of the body
	// as received, on the media routes (media.go); else 0 and "".
	BodyBytes  int64
	BodySHA256 string
}

// Server is a simulated model server. Create it with New; serve it with
// Serve, ListenAndServe or Start, or mount Handler on a server of your own.
type Server struct {
	cfg     Config
	clock   clock.Clock
	logger  *slog.Logger
	handler http.Handler
	// trace, if set before serving, is called with "admitted" and "released"
	// as inference requests take and give back their in-flight slot; tests
	// use it to synchronise with handlers instead of sleeping.
	trace func(event string)

	mu        sync.Mutex // guards the fields below
	models    []model    // served now, in listing order
	created   int        // models added by AddModel so far
	stats     Stats
	tokenSecs map[int64]int64     // output tokens per Unix second, the last minute's
	admitted  uint64              // inference requests admitted so far; drives fault choice and ids
	seen      []SeenRequest       // ring of the last maxSeen requests
	seenStart int                 // index of the oldest entry once seen is full
	cache     *prefixCache        // nil unless Config.PrefixCacheTokens or PrefillTokensPerSecond
	prompts   map[string]struct{} // admitted prompts; nil unless Config.CountRepeats
	// resident are the models loaded or loading, with residency
	// (residency.go); residentChanged is closed and replaced when one
	// loads, is evicted or a request on one ends.
	resident        []*resident
	residentChanged chan struct{}

	// mediaAnswers are the media routes' answers, the last maxSeen.
	mediaAnswers []MediaAnswer
}

// New returns a Server for cfg, with defaults applied to its zero fields.
// It returns an error wrapping ErrInvalidConfig if cfg does not validate.
// A nil logger discards logs.
func New(cfg Config, logger *slog.Logger) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	s := &Server{
		cfg:    cfg,
		clock:  cfg.Clock,
		logger: logger.With("component", "sim", "protocol", string(cfg.Protocol)),

		residentChanged: make(chan struct{}),
	}
	if cfg.PrefixCacheTokens > 0 || cfg.PrefillTokensPerSecond > 0 {
		s.cache = newPrefixCache(cfg.PrefixCacheTokens)
	}
	if cfg.CountRepeats {
		s.prompts = make(map[string]struct{})
	}
	for _, name := range cfg.Models {
		caps, ok := cfg.Capabilities[name]
		if !ok {
			caps = DefaultCapabilities
		}
		s.models = append(s.models, newModel(name, caps, modelsModifiedAt, 0))
	}
	mux := http.NewServeMux()
	switch cfg.Protocol {
	case ProtocolOllama:
		s.ollamaRoutes(mux)
	case ProtocolOpenAI:
		s.openaiRoutes(mux)
	}
	s.handler = mux
	return s, nil
}

// Handler returns the http.Handler serving the configured protocol.
func (s *Server) Handler() http.Handler { return s.handler }

// Stats returns a copy of the server's counters.
func (s *Server) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stats
}

// Seen returns the last (up to 1000) requests received, oldest first.
func (s *Server) Seen() []SeenRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]SeenRequest, 0, len(s.seen))
	out = append(out, s.seen[s.seenStart:]...)
	return append(out, s.seen[:s.seenStart]...)
}

// Serve answers HTTP requests on ln until ctx is done, then shuts down:
// it stops accepting, cancels the context of every request still running
// (ending hung requests and streams) and waits up to 5 s for them. It
// closes ln. It returns nil after a shutdown caused by ctx, or the error
// that stopped serving.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	srv := &http.Server{
		Handler:           s.handler,
		BaseContext:       func(net.Listener) context.Context { return ctx },
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          slog.NewLogLogger(s.logger.Handler(), slog.LevelDebug),
	}
	s.logger.Info("serving", "addr", ln.Addr().String(), "models", s.Models())
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		srv.Close()
	}
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// ListenAndServe listens on the TCP address addr ("host:port") and calls
// Serve. It blocks until ctx is done or serving fails.
func (s *Server) ListenAndServe(ctx context.Context, addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	return s.Serve(ctx, ln)
}

// Start serves on the TCP address addr ("" means 127.0.0.1 on a free port)
// in the background, for tests and `iop dev`. It returns the base URL
// ("http://127.0.0.1:PORT", no trailing slash) and a stop function that
// shuts the server down and returns once it has stopped.
func (s *Server) Start(addr string) (url string, stop func(), err error) {
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := s.Serve(ctx, ln); err != nil {
			s.logger.Error("serve failed", "err", err)
		}
	}()
	stop = func() {
		cancel()
		<-done
	}
	return "http://" + ln.Addr().String(), stop, nil
}

// errorWriter writes err as a protocol's error response.
type errorWriter func(w http.ResponseWriter, r *http.Request, status int, err error)

// guard wraps the handler of a route that is not an inference request
// (listings, health, show): it records the request and checks the API key.
func (s *Server) guard(writeErr errorWriter, h http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/api/ps" {
			s.mu.Lock()
			s.stats.PSReadings++
			s.mu.Unlock()
		} else {
			s.record(r, "")
		}
		if err := s.authorize(r); err != nil {
			s.fail(w, r, writeErr, err)
			return
		}
		h(w, r)
	})
}

// accept runs the steps every inference request goes through before it is
// answered: read and parse the body, record it, check the API key, the
// request itself and the model, take an in-flight slot (or 429), and apply
// the ErrorRate and Hang faults (a hung request is aborted when its context
// ends). On success the caller must call release exactly once when done
// answering. On error nothing is held and the caller answers with the error
// (see fail).
func (s *Server) accept(w http.ResponseWriter, r *http.Request, parse func([]byte) (request, error)) (req request, release func(), err error) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	if err != nil {
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			err = errBodyTooLarge
		} else {
			err = fmt.Errorf("%w: reading body: %w", errInvalidRequest, err)
		}
	} else {
		req, err = parse(body)
	}
	s.record(r, req.model)
	return s.admit(r, req, err)
}

// admit is accept's steps after the body was read and parsed into req
// (parseErr its failure) and recorded.
func (s *Server) admit(r *http.Request, req request, parseErr error) (_ request, release func(), err error) {
	err = parseErr
	if authErr := s.authorize(r); authErr != nil {
		return request{}, nil, authErr
	}
	if err != nil {
		return request{}, nil, err
	}
	if !s.serves(req.model) {
		return request{}, nil, fmt.Errorf("%w: %q", errUnknownModel, req.model)
	}

	n, err := s.enter(req.prompt)
	if err != nil {
		return request{}, nil, err
	}
	req.seq = n
	var waited time.Duration
	var unuse func()
	if req.unload {
		waited, unuse, err = s.unload(r.Context(), req.model)
	} else {
		waited, unuse, err = s.load(r.Context(), req.model, req.keepAlive)
	}
	if err != nil {
		s.leave()
		return request{}, nil, err
	}
	req.load = waited
	release = func() { unuse(); s.leave() }
	req.prefill = s.prefill(req)
	if s.shouldFail(n) {
		release()
		return request{}, nil, errInjectedFault
	}
	if s.cfg.Faults.Hang {
		defer release()
		<-r.Context().Done()
		abortConnection()
	}
	return req, release, nil
}

// prefill looks req's prompt up in the prefix cache (if any), counts the
// outcome and returns the prefill time of its uncached tokens.
func (s *Server) prefill(req request) time.Duration {
	if s.cache == nil || req.prompt == "" || req.loadOnly {
		return 0
	}
	// The answer's blocks are cached after the prompt's, as an engine
	// keeps the KV of the tokens it generated: the next turn of a
	// conversation, which appends the answer, finds them. (Cached at
	// admission, before the answer is written: the conversation's next
	// turn cannot come sooner.)
	answer := complete(s.cfg.Seed, s.cfg.DefaultMaxTokens, req).text()
	s.mu.Lock()
	o := s.cache.admit(req.model, req.prompt)
	if s.cache.maxBlocks > 0 && answer != "" {
		s.cache.admit(req.model, req.prompt+" "+answer)
	}
	s.stats.PrefixHitBlocks += int64(o.HitBlocks)
	s.stats.PrefixMissBlocks += int64(o.MissBlocks)
	s.stats.PrefixHitTokens += int64(o.HitTokens)
	s.stats.PrefixMissTokens += int64(o.MissTokens)
	s.stats.PrefixCachedBlocks = s.cache.lru.Len()
	s.mu.Unlock()
	d := prefillTime(o.MissTokens, s.cfg.PrefillTokensPerSecond)
	s.logger.Debug("prefix cache", "model", req.model, "hit_blocks", o.HitBlocks, "miss_blocks", o.MissBlocks,
		"hit_tokens", o.HitTokens, "miss_tokens", o.MissTokens, "prefill", d)
	return d
}

// countToken counts one output token delivered now (Stats.OutputTokens,
// Stats.MaxTokensPerMinute).
func (s *Server) countToken() {
	sec := s.clock.Now().Unix()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.tokenSecs == nil {
		s.tokenSecs = make(map[int64]int64)
	}
	s.stats.OutputTokens++
	s.tokenSecs[sec]++
	var minute int64
	for at, n := range s.tokenSecs {
		switch {
		case at <= sec-60:
			delete(s.tokenSecs, at)
		case at <= sec:
			minute += n
		}
	}
	s.stats.MaxTokensPerMinute = max(s.stats.MaxTokensPerMinute, minute)
}

// serveStats answers GET /stats with Stats as JSON.
func (s *Server) serveStats(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(s.Stats())
}

// fail answers a request with err in the protocol's error shape.
func (s *Server) fail(w http.ResponseWriter, r *http.Request, writeErr errorWriter, err error) {
	status := statusOf(err, s.cfg.Faults.ErrorStatus)
	s.logger.Debug("request failed", "path", r.URL.Path, "status", status, "err", err)
	writeErr(w, r, status, err)
}

// record counts r and remembers its path, model and Authorization header.
func (s *Server) record(r *http.Request, model string) {
	s.recordSeen(SeenRequest{Method: r.Method, Path: r.URL.Path, Model: model, Authorization: r.Header.Get("Authorization")})
}

// recordSeen counts a request and remembers seen.
func (s *Server) recordSeen(seen SeenRequest) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stats.Requests++
	s.stats.LastModel = seen.Model
	s.stats.LastAuthorization = seen.Authorization
	if len(s.seen) < maxSeen {
		s.seen = append(s.seen, seen)
		return
	}
	s.seen[s.seenStart] = seen
	s.seenStart = (s.seenStart + 1) % maxSeen
}

// authorize checks the bearer token when Config.APIKey is set.
func (s *Server) authorize(r *http.Request) error {
	if s.cfg.APIKey == "" {
		return nil
	}
	want := "Bearer " + s.cfg.APIKey
	if subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), []byte(want)) != 1 {
		return errUnauthorized
	}
	return nil
}

// enter takes an in-flight slot, or fails with errOverCapacity. It returns
// the request's admission number (1 for the first admitted request).
func (s *Server) enter(prompt string) (uint64, error) {
	n, err := s.takeSlot(prompt)
	if err == nil && s.trace != nil {
		s.trace("admitted")
	}
	return n, err
}

func (s *Server) takeSlot(prompt string) (uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cfg.MaxConcurrent > 0 && s.stats.InFlight >= s.cfg.MaxConcurrent {
		s.stats.Rejected++
		return 0, errOverCapacity
	}
	if s.prompts != nil {
		if _, ok := s.prompts[prompt]; ok {
			s.stats.Repeated++
		}
		s.prompts[prompt] = struct{}{}
	}
	s.admitted++
	s.stats.Admitted++
	s.stats.InFlight++
	s.stats.MaxInFlight = max(s.stats.MaxInFlight, s.stats.InFlight)
	return s.admitted, nil
}

// cancelled counts a request whose client went away mid-answer.
func (s *Server) cancelled() {
	s.mu.Lock()
	s.stats.Cancelled++
	s.mu.Unlock()
}

// leave gives back the in-flight slot taken by enter.
func (s *Server) leave() {
	s.mu.Lock()
	s.stats.InFlight--
	s.mu.Unlock()
	if s.trace != nil {
		s.trace("released")
	}
}

// shouldFail decides, deterministically from Config.Seed and the admission
// number n, whether request n gets an injected error.
func (s *Server) shouldFail(n uint64) bool {
	rate := s.cfg.Faults.ErrorRate
	if rate == 0 {
		return false
	}
	u := rand.New(rand.NewPCG(uint64(s.cfg.Seed), n)).Float64() // in [0, 1)
	if u < rate {
		s.mu.Lock()
		s.stats.InjectedErrors++
		s.mu.Unlock()
		return true
	}
	return false
}

// flush sends buffered response bytes to the client now.
func flush(w http.ResponseWriter) error {
	return http.NewResponseController(w).Flush()
}
