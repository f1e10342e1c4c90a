package edge

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"iop/internal/edge/contract"
	"iop/internal/edge/lifecycle"
	"iop/internal/scheduler"
	"iop/internal/tracing"
	"iop/internal/wire/nodev1"
)

// maxBodyChunk is the largest Body message sent down a Run stream, in
// bytes: an agent's request of a few hundred KiB goes in one message, which
// the node takes as it is, without joining chunks; a larger body is split
// so that no message nears gRPC's default limit of 4 MiB.
const maxBodyChunk = 1 << 20

// maxInlineBody is the largest request body carried in the Dispatch message
// itself (Dispatch.body_inline), in bytes. A body this small costs the
// control stream little, and the node calls the provider without waiting
// for the edge to send it down the run stream: one edge-to-node trip less
// before the provider sees the request. Larger bodies go down the run
// stream in Body chunks, under that stream's own flow control.
const maxInlineBody = 64 << 10

// validateRequest refuses a request without a model or with an unknown
// operation (ErrInvalidRequest).
func validateRequest(r contract.Request) error {
	if r.Model == "" {
		return fmt.Errorf("%w: empty model", ErrInvalidRequest)
	}
	if _, ok := wireOperation(r.Operation); !ok {
		return fmt.Errorf("%w: unknown operation %v", ErrInvalidRequest, r.Operation)
	}
	return nil
}

// wireOperation is op as the node protocol says it.
func wireOperation(op contract.Operation) (nodev1.Operation, bool) {
	switch op {
	case contract.OperationChat:
		return nodev1.Operation_OPERATION_CHAT, true
	case contract.OperationCompletion:
		return nodev1.Operation_OPERATION_COMPLETION, true
	case contract.OperationEmbeddings:
		return nodev1.Operation_OPERATION_EMBEDDINGS, true
	case contract.OperationRerank:
		return nodev1.Operation_OPERATION_RERANK, true
	case contract.OperationTranscription:
		return nodev1.Operation_OPERATION_TRANSCRIPTION, true
	case contract.OperationSpeech:
		return nodev1.Operation_OPERATION_SPEECH, true
	case contract.OperationImages:
		return nodev1.Operation_OPERATION_IMAGES, true
	case contract.OperationInfill:
		return nodev1.Operation_OPERATION_INFILL, true
	case contract.OperationLlamaCompletion:
		return nodev1.Operation_OPERATION_LLAMA_COMPLETION, true
	default:
		return nodev1.Operation_OPERATION_UNSPECIFIED, false
	}
}

// contractPath is the execution path p as the contract says it.
func contractPath(p nodev1.ExecutionPath) contract.Path {
	switch p {
	case nodev1.ExecutionPath_EXECUTION_PATH_TUNNEL:
		return contract.PathTunnel
	case nodev1.ExecutionPath_EXECUTION_PATH_NORMALIZED:
		return contract.PathNormalized
	default:
		return contract.PathUnknown
	}
}

// Service is the edge's dispatch surface for the HTTP API: it admits
// requests through the scheduler, sends them to nodes and hands back their
// runs. Create it with NewServer.
type Service struct {
	cfg      Config
	log      *slog.Logger
	clock    scheduler.Clock
	sched    *scheduler.Scheduler
	reg      *registry
	cat      *catalog
	trust    *trust
	shutdown chan struct{} // closed when the gRPC side stops
	stopOnce sync.Once
	// stopping ends (with cause ErrShuttingDown) at Shutdown: queued and
	// dispatching requests see it through their context.
	stopping     context.Context
	stopRequests context.CancelCauseFunc
	observer     lifecycle.Observer // nil: none
	reload       reloadState
	// afterAdmit, when set (tests only, before use), runs between admission
	// and dispatch.
	afterAdmit func(scheduler.Candidate)
	breakers   *breakers
	// prefix is the prefix index of prefix-cache-aware routing (nil: none,
	// every model routes least-loaded); routing the routing of each model
	// group, swapped by Reload (nil: least-loaded).
	prefix  *prefixIndex
	routing atomic.Pointer[routingPolicy]
	// adm admits requests: localAdmission, or cl for several edges.
	adm admission
	// cl is the cluster side (several edges, Config.Cluster); nil for a
	// single edge, whose admissions never look at it.
	cl *clusterMode
	// quotaDeps are Deps.Quota, for the cluster side.
	quotaDeps QuotaDeps
	// keep is keep_loaded's and the admin loads' state (residency_keep.go).
	keep keepState

	mu   sync.Mutex      // guards the fields below
	runs map[string]*Run // pending and open runs, by run id

	statsMu      sync.Mutex // guards the fields below; a leaf lock
	retries      map[string]uint64
	circuitOpens uint64
	// requested holds every known model name (an alias or a served name)
	// a request asked for, so that its queue is listed from the first
	// request (Snapshot). Only names the catalog knows enter it, so a
	// client cannot grow it.
	requested map[string]bool
}

// Dispatch admits req through its model's queue, sends it to the selected
// provider's node and waits for the node to open the run's stream (none
// to wait for when the Dispatch went down one of the node's idle warm
// streams: the run is open once it is sent; see warm.go). A body
// of at most 64 KiB (maxInlineBody) goes in the Dispatch message itself, so
// the node calls the provider without waiting for anything more; a larger
// one goes down the run stream once it is open, in Body chunks of at most
// 64 KiB, the last marked last, and Dispatch also waits until it was sent.
// It blocks while the request is queued. The model name is first resolved as
// Ollama clients expect: a name without a tag and the same name with
// ":latest" are one model (catalog.name), with one queue.
//
// Retry before the first byte: with max_retries > 0 (Config.MaxRetries,
// default 1), Dispatch also waits for the run's first message that says how
// the provider did (a head, a started, delta, complete or error event) and
// keeps the messages it read for Recv. When the provider failed in a way
// another candidate may not (unreachable or answered 502, 503 or 429; see
// verdict), or the node was lost before the run's first message, the
// request is admitted again, at most max_retries times, each time to a
// provider not tried yet for it (run id RunID + "-retry", then "-retry2",
// ...), and the failed run ends. When no other candidate takes it, the last
// failed run is returned as it came (its Recv gives the provider's answer)
// or, for a lost node, its error. Each retry is logged and counted (Stats).
// The decisions are next's (dispatch.go), one per attempt.
//
// Providers out of rotation (their circuit breaker open, see breakers) are
// no candidates; a model whose every provider is out of rotation fails with
// scheduler.ErrNoProvider.
//
// Errors: ErrInvalidRequest; the scheduler's admission errors
// (scheduler.ErrUnknownModel, ErrNoProvider, ErrCandidatesRejected naming
// the missing capability when no live or configured provider has it,
// ErrQueueFull, ErrQueueTimeout, ErrProviderUnavailable: the providers that
// could meet the request are gone or unavailable now, see resolver);
// ErrDispatchTimeout when the node does not open
// the run within dispatch_timeout twice in a row (once, the request is
// admitted again); ErrDispatchRefused; ErrStaleGeneration
// when the node reconnected between admission and dispatch twice in a row
// (once, the request is admitted again); ErrNodeGone; ctx's error when ctx
// ends first (the run is cancelled on the node). On every error the lease,
// if one was taken, is released.
func (s *Service) Dispatch(ctx context.Context, req contract.Request) (out *Run, outErr error) {
	defer func() { outErr = boundaryError(outErr) }() // last: after every other defer
	if err := validateRequest(req); err != nil {
		return nil, err
	}
	if s.stopping.Err() != nil {
		return nil, fmt.Errorf("%w: no new requests", ErrShuttingDown)
	}
	ctx = s.adm.bound(ctx)
	// A Shutdown while the request waits or is dispatched ends it with
	// ErrShuttingDown, not as a client that went away.
	callerCtx := ctx
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stopWait := context.AfterFunc(s.stopping, func() { cancel(ErrShuttingDown) })
	defer stopWait()
	defer func() {
		if outErr != nil && callerCtx.Err() == nil && errors.Is(context.Cause(ctx), ErrShuttingDown) {
			out, outErr = nil, fmt.Errorf("%w: the request was not served (%v)", ErrShuttingDown, outErr)
		}
	}()
	// Every attempt but the run handed to the caller is settled here (its
	// RunEnded published without an outcome): the caller settles its own
	// with Close.
	var attempts []*Run
	defer func() {
		for _, a := range attempts {
			if a != out || outErr != nil {
				a.drop(EndNotHandedOver)
			}
		}
	}()
	// "x" and "x:latest" are one model with one queue.
	req.Model = s.cat.name(req.Model)
	if s.cat.known(req.Model) {
		s.statsMu.Lock()
		s.requested[req.Model] = true
		s.statsMu.Unlock()
	}
	if req.RunID == "" {
		req.RunID = newRunID()
	}
	return s.dispatchLoop(ctx, req, &attempts)
}

// retryRunID is the run id of a request's attempt-th admission again:
// id + "-retry", then id + "-retry2", ...
func retryRunID(id string, attempt int) string {
	if attempt == 1 {
		return id + "-retry"
	}
	return fmt.Sprintf("%s-retry%d", id, attempt)
}

// triedCandidate is a candidate an attempt of a request went to; exact excludes only
// its generation (the node replaced it: the new one is a fine candidate),
// else the provider is excluded whatever its node's generation. lost
// (exact too) says the attempt failed because that generation's
// connection was lost (connLost): while it is the only candidate left,
// the request waits for the node to come back (the resolver answers
// scheduler.ErrProviderAway) instead of failing.
type triedCandidate struct {
	scheduler.Candidate
	exact bool
	lost  bool
}

func tried1(c scheduler.Candidate, exact bool) triedCandidate {
	return triedCandidate{Candidate: c, exact: exact}
}

// triedLost is c, tried by an attempt whose node connection was lost.
func triedLost(c scheduler.Candidate) triedCandidate {
	return triedCandidate{Candidate: c, exact: true, lost: true}
}

// connLost reports whether an attempt failed because its node connection
// (that generation) ended, not because of its provider: the node is gone,
// or its generation was gone or replaced before the dispatch.
func connLost(err error) bool {
	return errors.Is(err, ErrNodeGone) || errors.Is(err, ErrStaleGeneration)
}

func (t triedCandidate) excludes(c scheduler.Candidate) bool {
	return c.NodeID == t.NodeID && c.ProviderID == t.ProviderID && (!t.exact || c.Generation == t.Generation)
}

// dispatchRetryable reports whether a dispatch failed before any provider
// saw the request, so admitting it again is safe.
func dispatchRetryable(err error) bool {
	return errors.Is(err, ErrStaleGeneration) || errors.Is(err, ErrDispatchTimeout) ||
		errors.Is(err, ErrDispatchRefused) || errors.Is(err, ErrNodeGone)
}

// maxOutOfRotation is how many times one request may be admitted to a
// provider that left rotation before its dispatch (errOutOfRotation)
// before Dispatch stops considering that provider for it.
const maxOutOfRotation = 3

// errOutOfRotation: the admitted candidate's circuit opened, or its
// half-open trial was taken, between the resolver and the dispatch.
var errOutOfRotation = errors.New("provider out of rotation")

// queueTime is the time a request waited for a slot, summed over its
// admissions (a request admitted again after a failed dispatch waits
// again), and whether any of them queued.
type queueTime struct {
	wait   time.Duration
	queued bool
}

// add counts one admission's wait.
func (q *queueTime) add(li scheduler.DispatchInfo) {
	q.wait += li.Wait
	q.queued = q.queued || li.QueueReason == scheduler.ReasonQueued
}

// reason is the admission reason of the request's run: queued when any
// of its admissions queued.
func (q *queueTime) reason() contract.Admission {
	if q.queued {
		return contract.AdmissionQueued
	}
	return contract.AdmissionImmediate
}

// dispatchOnce admits req (never to a candidate tried excludes) and
// dispatches it; it returns the run, or the candidate it tried and why it
// failed. The admission's wait is added to waited, and the run's
// DispatchInfo reports waited whole. From the run's creation, the attempt's client-gone watcher ends
// it when ctx ends; with the run, dispatchOnce returns that watcher's stop,
// which the caller calls when it is done with the attempt.
func (s *Service) dispatchOnce(ctx context.Context, req contract.Request, tried []triedCandidate, waited *queueTime) (*Run, scheduler.Candidate, func(), error) {
	route := s.routeOf(req) // before Admit: it takes the prefix index's lock
	// The request's span, if it is traced (api.Config.Tracer): it gets the
	// queued, admitted and dispatched events, and its context goes to the
	// node in the Dispatch. A no-op span otherwise.
	span := trace.SpanFromContext(ctx)
	onQueued := func() {
		s.emitQueued(req.Model)
		if span.IsRecording() {
			span.AddEvent(tracing.EventQueued)
		}
	}
	g, err := s.adm.admit(ctx, req, tried, route, onQueued)
	if err != nil {
		return nil, scheduler.Candidate{}, nil, err
	}
	cand := g.candidate()
	li := g.info()
	waited.add(li)
	if route.blocks != nil {
		// The chosen provider receives the prompt: the next turn of its
		// conversation will find its blocks there.
		s.prefix.record(cand.Target, scheduler.ProviderRef{NodeID: cand.NodeID, ProviderID: cand.ProviderID}, route.blocks)
	}
	tk, ok := s.breakers.acquire(providerKey{cand.NodeID, cand.ProviderID})
	if !ok {
		g.release(EndCircuitOpen)
		return nil, cand, nil, errOutOfRotation
	}
	runID := req.RunID
	g.track(runID)
	if s.afterAdmit != nil {
		s.afterAdmit(cand)
	}
	c, p := s.reg.lookup(cand.NodeID, cand.Generation, cand.ProviderID)
	if c == nil {
		g.release(EndStaleGeneration)
		tk.done(outcomeNeutral)
		if !g.local() && cand.Generation == 0 {
			s.adm.awaitNode(ctx, cand.NodeID)
			return nil, cand, nil, fmt.Errorf("%w: %w: node %q", ErrStaleGeneration, errNoConnection, cand.NodeID)
		}
		return nil, cand, nil, fmt.Errorf("%w: %s", ErrStaleGeneration, s.staleReason(cand))
	}
	if span.IsRecording() {
		span.AddEvent(tracing.EventAdmitted, trace.WithAttributes(tracing.QueueReason.String(string(li.QueueReason)),
			tracing.QueueWait.Float64(li.Wait.Seconds())))
	}
	inline := len(req.Body) <= maxInlineBody && req.BodyFrom == nil
	epoch, leaseID := g.stamp()
	r := &Run{
		s:       s,
		conn:    c,
		grant:   g,
		epoch:   epoch,
		leaseID: leaseID,
		long:    li.Long,
		model:   req.Model,

		load:       li.Load,
		dispatched: s.clock.Now(),
		info: contract.DispatchInfo{
			RunID:                 runID,
			NodeID:                cand.NodeID,
			ProviderID:            cand.ProviderID,
			ProviderType:          p.typ,
			CostWeight:            p.costWeight,
			ServedModel:           cand.Target,
			Generation:            cand.Generation,
			Path:                  contractPath(p.path),
			QueueReason:           waited.reason(),
			QueueWait:             waited.wait,
			PrefixPromptTokens:    len(route.blocks) * prefixBlockTokens,
			PrefixPredictedTokens: route.predicted(cand),
		},
		inline:   inline,
		opened:   make(chan struct{}),
		bodySent: make(chan struct{}),
		ended:    make(chan struct{}),
		ticket:   tk,
	}
	var inlineBody []byte
	if inline {
		inlineBody = req.Body
		close(r.bodySent) // it goes with the Dispatch
	} else {
		r.body, r.bodyFrom = req.Body, req.BodyFrom
	}
	s.mu.Lock()
	s.runs[runID] = r
	s.mu.Unlock()
	s.emitRun(lifecycle.RunAdmitted, r, "")

	op, _ := wireOperation(req.Operation) // validateRequest refused any other
	d := &nodev1.Dispatch{
		RunId:         runID,
		ProviderId:    cand.ProviderID,
		ServedModel:   cand.Target,
		ExecutionPath: p.path,
		Operation:     op,
		Stream:        req.Stream,
		Headers:       req.Headers,
		Body:          inlineBody,
		BodyInline:    inline,
		OllamaFields:  req.OllamaFields,
	}
	if span.SpanContext().IsValid() {
		d.TraceContext = make(map[string]string, 2)
		tracing.Propagator.Inject(ctx, propagation.MapCarrier(d.TraceContext))
	}
	if r.epoch != 0 {
		d.Epoch, d.LeaseId, d.Long = r.epoch, r.leaseID, li.Long
		d.Key = requestKey(ctx)
	}
	if w := c.takeIdle(); w != nil {
		// A warm stream of the selected generation: the Dispatch goes down
		// it, and the run is open once it is sent.
		r.warm, r.awaitAck = true, true
		s.dispatchWarm(w, r, d)
	} else {
		// Arm the timeout before the node can see the dispatch.
		timer := s.clock.AfterFunc(s.cfg.DispatchTimeout, func() {
			r.finishIf(func(st runState) bool { return st == runPending }, EndDispatchTimeout, "",
				fmt.Errorf("%w: node %q did not open run %q within %s", ErrDispatchTimeout, cand.NodeID, runID, s.cfg.DispatchTimeout), true)
		})
		defer timer.Stop()
		if !c.enqueue(&nodev1.EdgeMessage{Msg: &nodev1.EdgeMessage_Dispatch{Dispatch: d}}) {
			r.finish(EndStaleGeneration, nil, false)
			r.settle("")
			return nil, cand, nil, fmt.Errorf("%w: node %q generation %d closed before dispatch", ErrStaleGeneration, cand.NodeID, cand.Generation)
		}
	}

	// The attempt's one client-gone watcher: the caller leaving ends the
	// run, which ends the waits below (r.ended) and a read-ahead.
	stopWatch := watchClient(ctx, r)
	for _, step := range []chan struct{}{r.opened, r.bodySent} {
		select {
		case <-step:
		case <-r.ended:
		}
		select {
		case <-step:
			// The step happened; a run that ended since (its node lost
			// before the first message) is the caller's to read, as one
			// that ends after we return. select picks at random among
			// ready cases, so without this look the same loss counted
			// now as "before the run opened", now as a retry
			// (TestRetryWhenNodeLostBeforeFirstByte failed 1 in 30).
			continue
		default:
		}
		if ended, err := r.outcome(); ended {
			stopWatch()
			r.settle("")
			if err == nil {
				err = fmt.Errorf("%w: run %q ended before it started", ErrNodeGone, runID)
			}
			return nil, cand, nil, err
		}
	}
	if span.IsRecording() {
		span.AddEvent(tracing.EventDispatched, trace.WithAttributes(tracing.RunID.String(runID),
			tracing.NodeID.String(cand.NodeID), tracing.ProviderID.String(cand.ProviderID)))
	}
	return r, cand, stopWatch, nil
}

// staleReason says why cand's generation has no connection to dispatch
// on: its node's connection ended (the node is gone), another generation
// replaced it, or that generation no longer has the provider.
func (s *Service) staleReason(cand scheduler.Candidate) string {
	cur := s.reg.current(cand.NodeID)
	switch {
	case cur == nil:
		return fmt.Sprintf("the connection of node %q generation %d ended before dispatch", cand.NodeID, cand.Generation)
	case cur.gen != cand.Generation:
		return fmt.Sprintf("node %q generation %d was replaced by generation %d before dispatch", cand.NodeID, cand.Generation, cur.gen)
	default:
		return fmt.Sprintf("provider %q left node %q generation %d before dispatch", cand.ProviderID, cand.NodeID, cand.Generation)
	}
}

// needsOf returns the capabilities req needs of the served model: its
// Needs, and NeedCompletion for a chat or completion request.
func needsOf(req contract.Request) []string {
	switch req.Operation {
	case contract.OperationChat, contract.OperationCompletion:
		if !slices.Contains(req.Needs, NeedCompletion) {
			return append(slices.Clip(req.Needs), NeedCompletion)
		}
	}
	return req.Needs
}

// resolver returns the request-local resolver the scheduler calls under its
// lock, which takes no lock of its own (it reads the registry's and the
// circuit breakers' published state): the catalog's candidates for model whose target has every
// capability in needs, that no earlier attempt of the request went to
// (tried) and whose provider is in rotation (its circuit breaker closed, or
// half-open with no trial in flight). When candidates exist but none has
// the needs, the answer is scheduler.ErrProviderUnavailable if a provider
// the edge knows could meet them (catalog.couldMeet: unhealthy, out of
// rotation, tried, or of a node gone less than ForgetAfter ago), else
// scheduler.ErrCandidatesRejected: only a request no live or configured
// provider can meet is a bad request.
func (s *Service) resolver(model string, needs []string, tried []triedCandidate) func() ([]scheduler.Candidate, error) {
	return func() ([]scheduler.Candidate, error) {
		cands, missing, err := s.cat.resolve(model, needs)
		if err != nil {
			return nil, err
		}
		out := make([]scheduler.Candidate, 0, len(cands))
		excluded, lost, open := false, false, false
		for _, c := range cands {
			if i := slices.IndexFunc(tried, func(t triedCandidate) bool { return t.excludes(c.Candidate) }); i >= 0 {
				excluded = true
				lost = lost || tried[i].lost
				continue
			}
			if !s.breakers.inRotation(providerKey{c.NodeID, c.ProviderID}) {
				open = true
				continue
			}
			out = append(out, c.Candidate)
		}
		switch {
		case len(out) > 0:
			return out, nil
		case lost && s.cat.awayFor.Load() > 0:
			// Its node's connection was lost under an earlier attempt,
			// and the edge may not have fenced it yet: the provider is
			// away, as after the fence, and comes back with the node.
			return nil, fmt.Errorf("%w %q: %w", scheduler.ErrNoProvider, model, scheduler.ErrProviderAway)
		case open:
			return nil, fmt.Errorf("%w %q: every provider that could serve it is out of rotation (circuit open)", scheduler.ErrNoProvider, model)
		case missing == "" && excluded:
			return nil, fmt.Errorf("%w %q but the ones that failed", scheduler.ErrNoProvider, model)
		case s.cat.couldMeet(model, needs):
			return nil, fmt.Errorf("%w: no provider for model %q with capability %q is available now (unhealthy, out of rotation or its node gone)",
				scheduler.ErrProviderUnavailable, model, missing)
		case missing == NeedChoices:
			return nil, fmt.Errorf("%w: no provider for model %q answers several choices (n above 1): only OpenAI-compatible providers do",
				scheduler.ErrCandidatesRejected, model)
		case missing == NeedToolChoice:
			return nil, fmt.Errorf("%w: no provider for model %q honours parallel_tool_calls false: only OpenAI-compatible providers do (Ollama cannot keep a model to one tool call unless tool_choice forces one)",
				scheduler.ErrCandidatesRejected, model)
		case missing == NeedPromptBatch:
			return nil, fmt.Errorf("%w: no provider for model %q answers a batch of prompts (a prompt array): only OpenAI-compatible providers do (Ollama takes one prompt per request); send one request per prompt",
				scheduler.ErrCandidatesRejected, model)
		case missing == NeedTokenInput:
			return nil, fmt.Errorf("%w: no provider for model %q takes token ids as input: only OpenAI-compatible providers do (Ollama takes text); send the text instead",
				scheduler.ErrCandidatesRejected, model)
		case missing == NeedThinking:
			// Ollama's own words for it, which Ollama clients show.
			return nil, fmt.Errorf("%w: %q does not support thinking (no provider of it has capability \"thinking\")",
				scheduler.ErrCandidatesRejected, model)
		case missing == NeedOllamaLogprobs:
			return nil, fmt.Errorf("%w: no provider for model %q returns logprobs: only Ollama providers do (an OpenAI-compatible or command provider has none in Ollama's shape)",
				scheduler.ErrCandidatesRejected, model)
		case missing == NeedLogprobs:
			return nil, fmt.Errorf("%w: no provider for model %q returns logprobs: only OpenAI-compatible providers do (the translation to Ollama's API has none)",
				scheduler.ErrCandidatesRejected, model)
		case missing == NeedRemoteImages:
			return nil, fmt.Errorf("%w: no provider for model %q takes an image by URL: only OpenAI-compatible providers fetch one; send the image inline as a base64 data URL (\"data:image/png;base64,...\")",
				scheduler.ErrCandidatesRejected, model)
		default:
			return nil, fmt.Errorf("%w: no provider for model %q has capability %q", scheduler.ErrCandidatesRejected, model, missing)
		}
	}
}

// Shutdown ends the edge's client work, for the end of its drain: every
// queued or dispatching request fails with ErrShuttingDown (HTTP 503, so
// clients retry, maybe through another edge), every run in flight ends
// with ErrShuttingDown (its Recv returns it: a stream ends with an error
// event, never cut; the node is told to cancel it), and later Dispatch
// calls fail with it at once. Node connections stay up, so the cancels
// reach the nodes. It is idempotent.
func (s *Service) Shutdown() {
	s.stopRequests(ErrShuttingDown)
	s.mu.Lock()
	open := make([]*Run, 0, len(s.runs))
	for _, r := range s.runs {
		open = append(open, r)
	}
	s.mu.Unlock()
	for _, r := range open {
		r.finish(EndEdgeShuttingDown, fmt.Errorf("%w: run %q ended before it finished", ErrShuttingDown, r.info.RunID), true)
	}
}

// Stats are counters of the edge's fault handling since it started.
type Stats struct {
	// Retries counts admissions again after a provider failed before the
	// first byte, by reason: "status 429", "status 502", "status 503",
	// "node gone".
	Retries map[string]uint64
	// CircuitOpened counts the times a provider was taken out of rotation
	// (a circuit opened, or re-opened after a failed trial).
	CircuitOpened uint64
}

// Stats returns the fault-handling counters; the map is the caller's.
func (s *Service) Stats() Stats {
	s.statsMu.Lock()
	defer s.statsMu.Unlock()
	return Stats{Retries: maps.Clone(s.retries), CircuitOpened: s.circuitOpens}
}

func (s *Service) countRetry(reason string) {
	s.statsMu.Lock()
	s.retries[reason]++
	s.statsMu.Unlock()
}

// circuitOpened takes k out of rotation in the scheduler too: queued
// requests re-resolve their candidates, and those left with none fail
// (scheduler.ErrProviderUnavailable) instead of waiting for it. When the
// cool-down ends, a timer on the edge's clock re-resolves them again, so
// the half-open provider's trial slot goes to the earliest waiter that can
// use it instead of staying idle beside it (work conservation).
func (s *Service) circuitOpened(k providerKey) {
	s.statsMu.Lock()
	s.circuitOpens++
	s.statsMu.Unlock()
	s.log.Warn("provider out of rotation: circuit open", "node", k.node, "provider", k.provider)
	s.rotationChanged(k)
	if d := s.breakers.coolDownLeft(k); d > 0 {
		s.clock.AfterFunc(d, func() { s.rotationChanged(k) })
	}
}

// rotationChanged re-activates the resources of k's node in the scheduler,
// so queued requests re-resolve their candidates against k's circuit as it
// is now: k left rotation (circuit opened) or came back (cool-down over,
// trial done). It takes no lock while calling the scheduler.
func (s *Service) rotationChanged(k providerKey) {
	if c := s.reg.current(k.node); c != nil {
		if err := s.sched.Activate(c.nodeID, c.gen, s.reg.specs(c), func() bool { return s.reg.isCurrent(c) }); err != nil {
			s.log.Warn("re-activation failed", "node", c.nodeID, "err", err)
		}
	}
	s.reg.notify()
}

// Models lists the model names clients may request: every configured
// alias and every name served by a connected node, sorted.
func (s *Service) Models() []string { return s.cat.models() }

// Known reports whether a client's model name is one Dispatch resolves
// rather than refuses as unknown: an alias, or a served name ever
// advertised (also while no node serves it now, until it is forgotten).
func (s *Service) Known(name string) bool { return s.cat.known(s.cat.name(name)) }

// ModelInfo describes the model a client calls name, resolved as Dispatch
// resolves it ("x" and "x:latest" are one model). ok is false when name is
// neither an alias nor a model a connected node serves. It takes a Snapshot.
func (s *Service) ModelInfo(name string) (contract.ModelInfo, bool) {
	name = s.cat.name(name)
	info := contract.ModelInfo{Name: name, Targets: []string{name}}
	if targets, ok := (*s.cat.aliases.Load())[name]; ok {
		info.Alias, info.Targets = true, slices.Clone(targets)
	} else if !slices.Contains(s.cat.models(), name) {
		return contract.ModelInfo{}, false
	}
	for _, p := range s.Snapshot().Providers {
		if p.Status != "available" {
			continue
		}
		mp, ok := s.reg.describe(p.NodeID, p.Generation, p.ProviderID, info.Targets)
		if !ok {
			continue
		}
		mp.NodeID, mp.ProviderID, mp.Type = p.NodeID, p.ProviderID, p.Type
		mp.Healthy, mp.Capacity, mp.InFlight = p.Healthy, p.Capacity, p.InFlight
		info.Providers = append(info.Providers, mp)
	}
	return info, true
}

// RunsInFlight counts the runs dispatched and not yet ended, by served
// model name.
func (s *Service) RunsInFlight() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]int)
	for _, r := range s.runs {
		out[r.info.ServedModel]++
	}
	return out
}

func (s *Service) forget(r *Run) {
	s.mu.Lock()
	if s.runs[r.info.RunID] == r {
		delete(s.runs, r.info.RunID)
	}
	s.mu.Unlock()
}

func (s *Service) run(id string) *Run {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.runs[id]
}

// runsOf returns the unfinished runs dispatched on c.
func (s *Service) runsOf(c *conn) []*Run {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*Run
	for _, r := range s.runs {
		if r.conn == c {
			out = append(out, r)
		}
	}
	return out
}

func newRunID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go ≥ 1.24)
	return "run_" + hex.EncodeToString(b[:])
}

// StatusDraining is the snapshot status of a provider whose node drains,
// beside the scheduler's scheduler.StatusAvailable and StatusOrphan.
const StatusDraining = "draining"

// Snapshot returns the current nodes, providers and queues, sorted by node
// then provider, and by model. It lists a queue for every model group the
// scheduler holds, every configured alias and every known model name a
// request asked for (Service.requested), each with its policy and queued
// count.
func (s *Service) Snapshot() contract.Snapshot {
	ss := s.sched.Snapshot()
	snap := contract.Snapshot{Waiters: ss.Waiters, Leases: ss.Leases}
	if cs, ok := s.Cluster(); ok {
		s.mu.Lock()
		n := len(s.runs)
		s.mu.Unlock()
		snap.Cluster = &contract.ClusterSnapshot{Name: cs.Name, LeaderAddr: cs.LeaderAddr, Epoch: cs.Epoch, Leader: cs.Leader, Ready: cs.Ready, HeldLeases: cs.Leases, Runs: n, NameInUseBy: cs.NameInUseBy}
	}
	st := s.reg.load()
	for _, cs := range st.nodes.all() {
		c := cs.c
		ns := contract.NodeSnapshot{NodeID: c.nodeID, Label: c.label, Version: c.version, Generation: c.gen, ConnectedAt: c.connectedAt, LastSeen: c.seen(), Draining: cs.draining, IdleRunStreams: c.idleCount()}
		for _, p := range cs.providers {
			ns.Providers = append(ns.Providers, p.id)
		}
		snap.Nodes = append(snap.Nodes, ns)
	}
	for _, sp := range ss.Providers {
		ps := contract.ProviderSnapshot{
			NodeID: sp.NodeID, ProviderID: sp.ProviderID, Generation: sp.Generation,
			Capacity: sp.Capacity, LongCapacity: sp.LongCapacity, InFlight: sp.InFlight, LongInFlight: sp.LongInFlight,
			BatchInFlight: sp.BatchInFlight, Queued: sp.Queued, Load: sp.Load, Status: sp.Status,
			Circuit: s.breakers.state(providerKey{sp.NodeID, sp.ProviderID}),
		}
		if cs := st.current(sp.NodeID); cs != nil && cs.c.gen == sp.Generation {
			if p := cs.byID[sp.ProviderID]; p != nil {
				ps.Type, ps.Path, ps.Healthy = p.typ, contractPath(p.path), p.healthy
				ps.Models, ps.Capabilities = slices.Clone(p.models), slices.Clone(p.caps)
				for m, sm := range p.model {
					if ps.ModelCapabilities == nil {
						ps.ModelCapabilities = make(map[string][]string, len(p.model))
					}
					ps.ModelCapabilities[m] = slices.Clone(sm.caps)
				}
				if cs.draining && ps.Status == scheduler.StatusAvailable {
					ps.Status = StatusDraining
				}
				ps.Loaded = s.residentOf(p)
			}
		}
		snap.Providers = append(snap.Providers, ps)
	}
	sort.Slice(snap.Nodes, func(i, j int) bool { return snap.Nodes[i].NodeID < snap.Nodes[j].NodeID })
	listed := make(map[string]bool, len(ss.Groups))
	for _, g := range ss.Groups {
		if g.Queued == 0 && !s.cat.known(g.Name) {
			// A removed alias, or a name forgotten since: listed while
			// requests still wait in it, gone when it is empty.
			continue
		}
		listed[g.Name] = true
		q := contract.QueueSnapshot{Model: g.Name, MaxQueue: g.Policy.MaxQueue, QueueTimeout: g.Policy.QueueTimeout, Queued: g.Queued,
			Batch: g.Batch, Fairness: fairnessName(g.Policy.Fairness)}
		for _, f := range g.Flows {
			q.Flows = append(q.Flows, contract.FlowQueue{Flow: f.Flow, Priority: f.Priority.String(), Queued: f.Queued})
		}
		snap.Queues = append(snap.Queues, q)
	}
	// Every configured alias and every model that had a request has a
	// queue, empty until a request waits in it.
	names := s.cat.aliasNames()
	s.statsMu.Lock()
	for m := range s.requested {
		names = append(names, m)
	}
	s.statsMu.Unlock()
	for _, name := range names {
		if listed[name] || !s.cat.known(name) { // a removed alias is no queue
			continue
		}
		listed[name] = true
		p := s.sched.Policy(name)
		snap.Queues = append(snap.Queues, contract.QueueSnapshot{Model: name, MaxQueue: p.MaxQueue, QueueTimeout: p.QueueTimeout, Fairness: fairnessName(p.Fairness)})
	}
	sort.Slice(snap.Queues, func(i, j int) bool { return snap.Queues[i].Model < snap.Queues[j].Model })
	aliases := *s.cat.aliases.Load()
	un := s.cat.unmatchedAliases()
	for i := range snap.Queues {
		q := &snap.Queues[i]
		if targets, ok := aliases[q.Model]; ok {
			q.Targets, q.UnmatchedTargets = slices.Clone(targets), un[q.Model]
		}
	}
	return snap
}

// fairnessName is a queue's fairness in snapshots: "on" or "off".
func fairnessName(f scheduler.Fairness) string {
	if f == scheduler.FairnessOn {
		return FairnessOn
	}
	return FairnessOff
}
