package edge

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"sync"
	"time"

	"iop/internal/scheduler"
	"iop/internal/wire/nodev1"
)

// maxBodyChunk is the largest Body message sent down a Run stream, in bytes.
const maxBodyChunk = 64 << 10

// Request is one client request to dispatch.
type Request struct {
	// Model is the requested model name: an alias or a served name. It is
	// also the request's model group (queue).
	Model string
	// Operation is the kind of request: chat, completion or embeddings.
	Operation nodev1.Operation
	// Stream is the client's "stream" flag.
	Stream bool
	// Body is the client's OpenAI JSON body, unchanged; the node rewrites
	// its model to the served target.
	Body []byte
	// Needs are capabilities every candidate provider must have ("tools",
	// "vision", "embeddings", NeedChoices): the request-local predicate.
	Needs []string
	// Long marks a long-context request, admitted against long_capacity.
	Long bool
	// EstimatedInputTokens is the caller's estimate of the prompt size, in
	// tokens, for observability.
	EstimatedInputTokens int
	// Headers are selected client headers the provider may need.
	Headers map[string]string // RunID, when set, is the run's id (else a new "run_<hex>" one); a
	// second admission after a failed dispatch uses RunID + "-retry".
	RunID string
	// PreferNodeID and PreferProviderID name a provider to choose over the
	// least loaded one when it is a candidate with a free slot (session
	// affinity); empty means no preference.
	PreferNodeID, PreferProviderID string
}

func (r Request) validate() error {
	if r.Model == "" {
		return fmt.Errorf("%w: empty model", ErrInvalidRequest)
	}
	switch r.Operation {
	case nodev1.Operation_OPERATION_CHAT, nodev1.Operation_OPERATION_COMPLETION, nodev1.Operation_OPERATION_EMBEDDINGS:
		return nil
	default:
		return fmt.Errorf("%w: unknown operation %v", ErrInvalidRequest, r.Operation)
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
	shutdown chan struct{} // closed when the gRPC side stops
	stopOnce sync.Once
	// afterAdmit, when set (tests only, before use), runs between admission
	// and dispatch.
	afterAdmit func(scheduler.Candidate)

	mu   sync.Mutex      // guards the fields below
	runs map[string]*Run // pending and open runs, by run id
}

// Dispatch admits req through its model's queue, sends it to the selected
// provider's node, waits for the node to open the run's stream and sends it
// the body (in Body chunks of at most 64 KiB, the last marked last). It
// blocks while the request is queued. The model name is first resolved as
// Ollama clients expect: a name without a tag and the same name with
// ":latest" are one model (catalog.name), with one queue.
//
// Errors: ErrInvalidRequest; the scheduler's admission errors
// (scheduler.ErrUnknownModel, ErrNoProvider, ErrCandidatesRejected naming
// the missing capability, ErrQueueFull, ErrQueueTimeout,
// ErrProviderUnavailable); ErrDispatchTimeout when the node does not open
// the run within dispatch_timeout twice in a row (once, the request is
// admitted again); ErrDispatchRefused; ErrStaleGeneration
// when the node reconnected between admission and dispatch twice in a row
// (once, the request is admitted again); ErrNodeGone; ctx's error when ctx
// ends first (the run is cancelled on the node). On every error the lease,
// if one was taken, is released.
func (s *Service) Dispatch(ctx context.Context, req Request) (*Run, error) {
	if err := req.validate(); err != nil {
		return nil, err
	}
	// "x" and "x:latest" are one model with one queue.
	req.Model = s.cat.name(req.Model)
	if s.cfg.LongContextTokens > 0 && req.EstimatedInputTokens >= s.cfg.LongContextTokens {
		req.Long = true
	}
	if req.RunID == "" {
		req.RunID = newRunID()
	}
	run, failed, err := s.dispatchOnce(ctx, req, nil)
	if !retryable(err) {
		return run, err
	}
	// DESIGN.md: a dispatch that never reached a provider (sent on a
	// replaced generation, not opened in time, refused, or lost with its
	// node before the run opened) is released and admitted again, once,
	// without the candidate that failed.
	s.log.Info("dispatch failed before the run opened; trying another provider", "model", req.Model, "node", failed.NodeID, "provider", failed.ProviderID, "err", err)
	req.RunID += "-retry"
	run, _, err2 := s.dispatchOnce(ctx, req, &failed)
	if errors.Is(err2, scheduler.ErrNoProvider) {
		// No other candidate. A node that went away leaves the model
		// without a provider (503); other failures are reported as they were.
		if errors.Is(err, ErrNodeGone) || errors.Is(err, ErrStaleGeneration) {
			return nil, fmt.Errorf("%w: %w", scheduler.ErrProviderUnavailable, err)
		}
		return nil, err
	}
	return run, err2
}

// retryable reports whether a dispatch failed before any provider saw the
// request, so admitting it again is safe.
func retryable(err error) bool {
	return errors.Is(err, ErrStaleGeneration) || errors.Is(err, ErrDispatchTimeout) ||
		errors.Is(err, ErrDispatchRefused) || errors.Is(err, ErrNodeGone)
}

// dispatchOnce admits req (never to the candidate exclude, if set) and
// dispatches it; it returns the run, or the candidate it tried and why it
// failed.
func (s *Service) dispatchOnce(ctx context.Context, req Request, exclude *scheduler.Candidate) (*Run, scheduler.Candidate, error) {
	lease, err := s.sched.Admit(ctx, scheduler.Request{
		Group:                req.Model,
		Long:                 req.Long,
		EstimatedInputTokens: req.EstimatedInputTokens,
		Resolve:              s.resolver(req.Model, req.Needs, exclude),
		Prefer:               scheduler.ProviderRef{NodeID: req.PreferNodeID, ProviderID: req.PreferProviderID},
	})
	if err != nil {
		return nil, scheduler.Candidate{}, err
	}
	runID := req.RunID
	lease.Track(runID)
	cand := lease.Candidate()
	if s.afterAdmit != nil {
		s.afterAdmit(cand)
	}
	c, p := s.reg.lookup(cand.NodeID, cand.Generation, cand.ProviderID)
	if c == nil {
		lease.Release("stale generation")
		return nil, cand, fmt.Errorf("%w: node %q generation %d was replaced before dispatch", ErrStaleGeneration, cand.NodeID, cand.Generation)
	}
	li := lease.Info()
	r := &Run{
		s:     s,
		conn:  c,
		lease: lease,
		info: DispatchInfo{
			RunID:        runID,
			NodeID:       cand.NodeID,
			ProviderID:   cand.ProviderID,
			ProviderType: p.typ,
			ServedModel:  cand.Target,
			Generation:   cand.Generation,
			Path:         p.path,
			QueueReason:  string(li.QueueReason),
			QueueWait:    li.Wait,
		},
		body:     req.Body,
		opened:   make(chan struct{}),
		bodySent: make(chan struct{}),
		ended:    make(chan struct{}),
	}
	s.mu.Lock()
	s.runs[runID] = r
	s.mu.Unlock()

	// Arm the timeout before the node can see the dispatch.
	timer := s.clock.AfterFunc(s.cfg.DispatchTimeout, func() {
		r.finishIf(func(st runState) bool { return st == runPending }, "dispatch timeout",
			fmt.Errorf("%w: node %q did not open run %q within %s", ErrDispatchTimeout, cand.NodeID, runID, s.cfg.DispatchTimeout), true)
	})
	defer timer.Stop()
	msg := &nodev1.EdgeMessage{Msg: &nodev1.EdgeMessage_Dispatch{Dispatch: &nodev1.Dispatch{
		RunId:         runID,
		ProviderId:    cand.ProviderID,
		ServedModel:   cand.Target,
		ExecutionPath: p.path,
		Operation:     req.Operation,
		Stream:        req.Stream,
		Headers:       req.Headers,
	}}}
	if !c.enqueue(msg) {
		r.finish("stale generation", nil, false)
		return nil, cand, fmt.Errorf("%w: node %q generation %d closed before dispatch", ErrStaleGeneration, cand.NodeID, cand.Generation)
	}

	for _, step := range []chan struct{}{r.opened, r.bodySent} {
		select {
		case <-step:
		case <-r.ended:
		case <-ctx.Done():
			r.finish("client gone", ctx.Err(), true)
		}
		if ended, err := r.outcome(); ended {
			if err == nil {
				err = fmt.Errorf("%w: run %q ended before it started", ErrNodeGone, runID)
			}
			return nil, cand, err
		}
	}
	return r, cand, nil
}

// resolver returns the request-local resolver the scheduler calls under its
// lock: the catalog's candidates for model that have every capability in
// needs.
func (s *Service) resolver(model string, needs []string, exclude *scheduler.Candidate) func() ([]scheduler.Candidate, error) {
	return func() ([]scheduler.Candidate, error) {
		cands, err := s.cat.resolve(model)
		if err != nil {
			return nil, err
		}
		out := make([]scheduler.Candidate, 0, len(cands))
		missing, excluded := "", false
		for _, c := range cands {
			if exclude != nil && c.NodeID == exclude.NodeID && c.ProviderID == exclude.ProviderID && c.Generation == exclude.Generation {
				excluded = true
				continue
			}
			if m := c.prov.lacks(needs); m != "" {
				if missing == "" {
					missing = m
				}
				continue
			}
			out = append(out, c.Candidate)
		}
		if len(out) == 0 && missing == "" && excluded {
			return nil, fmt.Errorf("%w %q but the one that failed", scheduler.ErrNoProvider, model)
		}
		if len(out) == 0 && missing == NeedChoices {
			return nil, fmt.Errorf("%w: no provider for model %q answers several choices (n above 1): only OpenAI-compatible providers do",
				scheduler.ErrCandidatesRejected, model)
		}
		if len(out) == 0 {
			return nil, fmt.Errorf("%w: no provider for model %q has capability %q", scheduler.ErrCandidatesRejected, model, missing)
		}
		return out, nil
	}
}

// Models lists the model names clients may request: every configured
// alias and every name served by a connected node, sorted.
func (s *Service) Models() []string { return s.cat.models() }

// ModelInfo is what the edge knows of one model.
type ModelInfo struct {
	// Name is the catalog's name for the requested one (see Dispatch).
	Name string
	// Alias is set when Name is a configured alias; Targets are then its
	// served model names, else Targets is [Name].
	Alias   bool
	Targets []string
	// Providers are the available providers serving a target, sorted by
	// node then provider.
	Providers []ModelProvider
}

// ModelProvider is one provider of a model, with its scheduler counters.
type ModelProvider struct {
	NodeID, ProviderID, Type string
	Capabilities             []string
	Healthy                  bool
	Capacity, InFlight       int
}

// ModelInfo describes the model a client calls name, resolved as Dispatch
// resolves it ("x" and "x:latest" are one model). ok is false when name is
// neither an alias nor a model a connected node serves. It takes a Snapshot.
func (s *Service) ModelInfo(name string) (ModelInfo, bool) {
	name = s.cat.name(name)
	info := ModelInfo{Name: name, Targets: []string{name}}
	if targets, ok := s.cat.aliases[name]; ok {
		info.Alias, info.Targets = true, slices.Clone(targets)
	} else if !slices.Contains(s.cat.models(), name) {
		return ModelInfo{}, false
	}
	for _, p := range s.Snapshot().Providers {
		if p.Status != "available" || !slices.ContainsFunc(info.Targets, func(t string) bool { return slices.Contains(p.Models, t) }) {
			continue
		}
		info.Providers = append(info.Providers, ModelProvider{NodeID: p.NodeID, ProviderID: p.ProviderID, Type: p.Type,
			Capabilities: p.Capabilities, Healthy: p.Healthy, Capacity: p.Capacity, InFlight: p.InFlight})
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

// Snapshot is a view of nodes, providers and queues, for admin endpoints.
type Snapshot struct {
	Nodes     []NodeSnapshot
	Providers []ProviderSnapshot
	Queues    []QueueSnapshot
	// Waiters counts queued requests; Leases unreleased leases.
	Waiters, Leases int
}

// NodeSnapshot is one connected node.
type NodeSnapshot struct {
	NodeID, Label, Version string
	Generation             uint64
	ConnectedAt, LastSeen  time.Time
	// Providers are the node's provider ids, sorted.
	Providers []string
}

// ProviderSnapshot is one provider: the scheduler's counters for its
// (node, provider) resource and what its node said of it. A provider whose
// node is gone while runs drain is Status "orphan", without node details.
type ProviderSnapshot struct {
	NodeID, ProviderID, Type string
	Generation               uint64
	Models, Capabilities     []string
	Path                     nodev1.ExecutionPath
	Healthy                  bool
	Capacity, LongCapacity   int
	InFlight, LongInFlight   int
	// Queued counts waiters that list this provider.
	Queued int
	// Load is InFlight / Capacity.
	Load float64
	// Status is "available" or "orphan".
	Status string
}

// QueueSnapshot is one model group's queue.
type QueueSnapshot struct {
	Model        string
	MaxQueue     int
	QueueTimeout time.Duration
	Queued       int
}

// Snapshot returns the current nodes, providers and queues, sorted by node
// then provider, and by model.
func (s *Service) Snapshot() Snapshot {
	ss := s.sched.Snapshot()
	snap := Snapshot{Waiters: ss.Waiters, Leases: ss.Leases}
	s.reg.mu.RLock()
	for _, c := range s.reg.nodes {
		ns := NodeSnapshot{NodeID: c.nodeID, Label: c.label, Version: c.version, Generation: c.gen, ConnectedAt: c.connectedAt, LastSeen: c.seen()}
		for _, p := range c.providers {
			ns.Providers = append(ns.Providers, p.id)
		}
		snap.Nodes = append(snap.Nodes, ns)
	}
	for _, sp := range ss.Providers {
		ps := ProviderSnapshot{
			NodeID: sp.NodeID, ProviderID: sp.ProviderID, Generation: sp.Generation,
			Capacity: sp.Capacity, LongCapacity: sp.LongCapacity, InFlight: sp.InFlight, LongInFlight: sp.LongInFlight,
			Queued: sp.Queued, Load: sp.Load, Status: sp.Status,
		}
		if c := s.reg.nodes[sp.NodeID]; c != nil && c.gen == sp.Generation {
			if p := c.byID[sp.ProviderID]; p != nil {
				ps.Type, ps.Path, ps.Healthy = p.typ, p.path, p.healthy
				ps.Models, ps.Capabilities = slices.Clone(p.models), slices.Clone(p.caps)
			}
		}
		snap.Providers = append(snap.Providers, ps)
	}
	s.reg.mu.RUnlock()
	sort.Slice(snap.Nodes, func(i, j int) bool { return snap.Nodes[i].NodeID < snap.Nodes[j].NodeID })
	for _, g := range ss.Groups {
		snap.Queues = append(snap.Queues, QueueSnapshot{Model: g.Name, MaxQueue: g.Policy.MaxQueue, QueueTimeout: g.Policy.QueueTimeout, Queued: g.Queued})
	}
	return snap
}
