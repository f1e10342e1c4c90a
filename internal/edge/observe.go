package edge

import (
	"errors"

	"iop/internal/edge/lifecycle"
)

// emit passes e to the observer, if any. It must be called with no edge
// lock held (Run.mu, registry.mu, Service.mu).
func (s *Service) emit(e lifecycle.Event) {
	if s.observer == nil {
		return
	}
	if e.Time.IsZero() {
		e.Time = s.clock.Now()
	}
	s.observer.Observe(e)
}

// emitRun emits a run event for r with the provider's and the model
// queue's counters as they stand now.
func (s *Service) emitRun(typ lifecycle.Type, r *Run, reason string) {
	if s.observer != nil {
		s.emit(s.runEvent(typ, r, reason))
	}
}

// emitRunEnded emits RunEnded for r, which ended for reason, with the
// outcome its caller reported ("" for an attempt Dispatch dropped).
func (s *Service) emitRunEnded(r *Run, reason, outcome string) {
	if s.observer != nil {
		e := s.runEvent(lifecycle.RunEnded, r, reason)
		e.Outcome = outcome
		s.emit(e)
	}
}

func (s *Service) runEvent(typ lifecycle.Type, r *Run, reason string) lifecycle.Event {
	e := lifecycle.Event{
		Type: typ, RunID: r.info.RunID, Model: r.model, NodeID: r.info.NodeID, Generation: r.info.Generation,
		ProviderID: r.info.ProviderID, ServedModel: r.info.ServedModel, Reason: reason,
	}
	if typ == lifecycle.RunAdmitted {
		e.QueueReason, e.QueueWait = r.info.QueueReason.String(), r.info.QueueWait
		e.PrefixPromptTokens, e.PrefixPredictedTokens = r.info.PrefixPromptTokens, r.info.PrefixPredictedTokens
	}
	// A provider the scheduler forgot (its node gone and its last lease
	// released) has nothing in flight and no capacity.
	p, queued, _ := s.sched.Load(r.info.NodeID, r.info.ProviderID, r.model)
	e.Load = &lifecycle.Load{InFlight: p.InFlight, Capacity: p.Capacity, Queued: p.Queued, ModelQueued: queued}
	return e
}

// emitQueued emits RunQueued for a request of model that starts waiting.
func (s *Service) emitQueued(model string) {
	if s.observer == nil {
		return
	}
	_, queued, _ := s.sched.Load("", "", model)
	s.emit(lifecycle.Event{Type: lifecycle.RunQueued, Model: model, Load: &lifecycle.Load{ModelQueued: queued}})
}

// emitNode emits a node event for connection c; cause (NodeFenced only)
// becomes the reason.
func (s *Service) emitNode(typ lifecycle.Type, c *conn, cause error) {
	if s.observer == nil {
		return
	}
	e := lifecycle.Event{Type: typ, NodeID: c.nodeID, Generation: c.gen, Label: c.label}
	for _, p := range c.hello {
		e.Providers = append(e.Providers, p.id)
	}
	if cause != nil {
		e.Reason = fenceReason(cause)
	}
	s.emit(e)
}

// fenceReason names why a connection ended in a few stable words (the
// cause's text may carry addresses).
func fenceReason(cause error) string {
	switch {
	case errors.Is(cause, errNodeDraining):
		return "node drained"
	case errors.Is(cause, errSuperseded):
		return "replaced by a newer connection"
	case errors.Is(cause, errHeartbeatMissed):
		return "heartbeats missed"
	case errors.Is(cause, errShutdown):
		return "edge shutting down"
	case errors.Is(cause, errOutboxFull):
		return "control stream backlog"
	default:
		return "connection ended"
	}
}

// dispatchFailure names a retryable dispatch failure in a few stable words.
func dispatchFailure(err error) string {
	for _, e := range []error{ErrStaleGeneration, ErrDispatchTimeout, ErrDispatchRefused, ErrNodeGone} {
		if errors.Is(err, e) {
			return e.Error()
		}
	}
	return "dispatch failed"
}
