package edge

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"

	"iop/internal/edge/contract"
	"iop/internal/edge/lifecycle"
	"iop/internal/scheduler"
)

// One dispatch loop. Service.Dispatch runs attempts (Service.attempt: one
// admission, one dispatch, and with read-ahead the run's first messages)
// until the pure function next decides the request is finished. The rules
// next encodes (DESIGN.md, docs/scheduling.md, "When a provider fails before any
// byte ..."):
//
//   - A dispatch that never reached a provider (stale generation, dispatch
//     timeout, a refusal, its node lost or draining before the run opened)
//     is admitted again once, without that candidate (exactly that
//     generation); it is no retry: max_retries does not count it.
//   - A provider that failed before the first byte in a way another may not
//     (unreachable, 502, 503, 429, its node lost before the run's first
//     message) gives the request to a provider not tried yet, at most
//     max_retries times; after that the failed attempt is the answer. For
//     a node lost, only that node connection (generation) is left out.
//   - A request whose attempt failed because its node connection was lost
//     (connLost), with no other candidate, waits for the node to come back
//     within reconnect_grace, as a queued request does (the resolver says
//     its providers are away), even before the edge fenced the connection.
//   - A provider that left rotation between admission and dispatch is no
//     attempt: the request is admitted again under the same run id; after
//     maxOutOfRotation such races that provider is left out.
//   - When admitting again finds no other candidate, the client gets the
//     failed attempt as it came (its run, or for a node that went away or
//     drains ErrProviderUnavailable), never a rejection.
//   - A node's refusal of a deposed scheduler leader's epoch (several
//     edges) is no attempt either: the request is admitted again at the
//     current leader, the candidate kept, at most maxStaleEpoch times.
//   - A client that leaves ends it: no further attempt.

// resultKind is what one attempt came to.
type resultKind uint8

const (
	// resNotAdmitted: admission failed (the scheduler's errors), or the
	// dispatch did otherwise (the caller's context ended); err says why.
	resNotAdmitted resultKind = iota
	// resOutOfRotation: admitted to a provider whose circuit opened (or
	// whose half-open trial was taken) before the dispatch.
	resOutOfRotation
	// resNoConnection: a follower was granted a node it has no
	// connection to; connected says whether the node has one now
	// (clusterMode.awaitNode waited for it while it could still come).
	resNoConnection
	// resNotDispatched: the dispatch never reached a provider
	// (dispatchRetryable: stale generation, dispatch timeout, refused, node
	// gone or draining before the run opened); err says why.
	resNotDispatched
	// resAnswered: dispatched; the run is the answer (the provider
	// answered, failed in a way no other candidate would change, or there
	// was no read-ahead).
	resAnswered
	// resFailedFirst: dispatched; the provider failed before the first
	// byte in a way another candidate may not (reason). run holds its
	// answer, ended; err is set for a node lost before the first message.
	resFailedFirst
	// resClientGone: dispatched; the caller's context ended meanwhile.
	resClientGone
)

// attemptResult is what one attempt returns to the dispatch loop.
type attemptResult struct {
	kind   resultKind
	run    *Run                // the run, once dispatched
	cand   scheduler.Candidate // the candidate admitted (zero for resNotAdmitted)
	reason string              // resFailedFirst: the retry reason ("status 503", "node gone")
	err    error               // why the attempt failed
	// ctxErr is the caller's context's error when the attempt returned
	// (nil while the caller waits).
	ctxErr error
	// connected: resNoConnection, the node is connected to this edge now.
	connected bool
}

// dispatchState is what the dispatch loop remembers between attempts.
type dispatchState struct {
	model      string // the request's model, for errors
	maxRetries int    // Config.Retries()
	retries    int    // admissions again after a provider failed before the first byte
	readmitted bool   // a dispatch that never reached a provider was admitted again
	outOfRot   int    // admissions whose provider left rotation before dispatch
	noConn     int    // follower grants of a node with no connection to this edge
	// staleEpochs counts dispatches a node refused for a deposed leader's
	// epoch (admitted again at the current leader, the candidate kept).
	staleEpochs int
	// failedRun (ended) or failedErr is the last failed attempt, the answer
	// when no other candidate serves the request.
	failedRun *Run
	failedErr error
}

// actionKind is what the dispatch loop does next.
type actionKind uint8

const (
	// actFinish: return run or err to the caller.
	actFinish actionKind = iota
	// actRetry: a provider failed before the first byte; admit the request
	// again (a new run id) without that provider; log and count it.
	actRetry
	// actReadmit: the dispatch never reached a provider; admit the
	// request again (a new run id) without that candidate's generation.
	actReadmit
	// actAgain: the provider left rotation before dispatch; admit the
	// request again under the same run id, without that provider when
	// exclude is set.
	actAgain
	// actResubmit: a node refused the dispatch for a deposed leader's
	// epoch; admit the request again (a new run id) at the current leader,
	// the candidate kept.
	actResubmit
	// actRejoin: a follower was granted a node it had no connection to;
	// admit the request again (a new run id), without that provider when
	// exclude is set. Not an attempt.
	actRejoin
)

// maxStaleEpoch is how many times one request is admitted again after a
// node refused a deposed leader's epoch (each failover deposes one).
const maxStaleEpoch = 3

// action is next's decision.
type action struct {
	kind    actionKind
	exclude bool  // actAgain, actRejoin: leave the provider out from now on
	run     *Run  // actFinish: the run handed to the caller
	err     error // actFinish: or the error returned
	// drop, when set, is ended and settled as "client gone" before
	// finishing.
	drop *Run
}

// next decides, from what an attempt came to and what earlier attempts
// left, whether the request is admitted again or finished, and how. It is
// pure: the caller does the logging, counting, dropping and admitting.
func next(res attemptResult, st dispatchState) (action, dispatchState) {
	switch res.kind {
	case resOutOfRotation:
		// Its circuit opened, or another request took its half-open
		// trial, after the resolver ran: not an attempt. The resolver
		// leaves it out while it is out of rotation, so the request may
		// still go to it once it is back (the trial succeeded); only after
		// maxOutOfRotation such races is it left out for good, so the loop
		// ends.
		st.outOfRot++
		return action{kind: actAgain, exclude: st.outOfRot >= maxOutOfRotation}, st
	case resNoConnection:
		// The node was (re)connecting to this edge: once it is here, the
		// leader may grant it again; one that did not come in its grace
		// (or after maxOutOfRotation such grants) is left out.
		st.noConn++
		return action{kind: actRejoin, exclude: !res.connected || st.noConn >= maxOutOfRotation}, st
	case resNotDispatched:
		if errors.Is(res.err, errStaleEpoch) && st.staleEpochs < maxStaleEpoch {
			// Admitted by a deposed leader: no attempt, the candidate is
			// as good as before; the current leader admits it again.
			st.staleEpochs++
			return action{kind: actResubmit}, st
		}
		if !st.readmitted {
			st.readmitted = true
			if st.failedRun == nil {
				st.failedErr = res.err
			}
			return action{kind: actReadmit}, st
		}
		return notServed(res, st), st
	case resNotAdmitted:
		return notServed(res, st), st
	}
	// Dispatched: an earlier failed attempt is no longer the answer.
	st.failedRun, st.failedErr = nil, nil
	switch res.kind {
	case resClientGone:
		return action{kind: actFinish, err: res.ctxErr, drop: res.run}, st
	case resFailedFirst:
		if st.retries >= st.maxRetries {
			if res.err != nil {
				return action{kind: actFinish, err: res.err}, st
			}
			return action{kind: actFinish, run: res.run}, st
		}
		st.retries++
		if res.err != nil {
			st.failedErr = res.err
		} else {
			st.failedRun = res.run
		}
		return action{kind: actRetry}, st
	default: // resAnswered
		return action{kind: actFinish, run: res.run}, st
	}
}

// notServed is next's answer when an attempt ends without a run and the
// request is not admitted again: its error, or, after an earlier attempt
// failed (st.failedRun or failedErr), that attempt's outcome as it would
// have been without admitting it again, unless the client left.
func notServed(res attemptResult, st dispatchState) action {
	err := res.err
	if st.failedRun == nil && st.failedErr == nil {
		if st.outOfRot > 0 && (errors.Is(err, scheduler.ErrNoProvider) || errors.Is(err, scheduler.ErrCandidatesRejected)) {
			// Admitted once, its provider left rotation before dispatch
			// and none is left: its providers went away while it waited.
			return action{kind: actFinish, err: fmt.Errorf("model %q: %w: %v", st.model, scheduler.ErrProviderUnavailable, err)}
		}
		return action{kind: actFinish, err: err}
	}
	if res.ctxErr != nil {
		return action{kind: actFinish, err: res.ctxErr, drop: st.failedRun}
	}
	if st.failedRun != nil {
		return action{kind: actFinish, run: st.failedRun}
	}
	// No other candidate: none left (ErrNoProvider); none left with the
	// request's needs (a rejection now means the providers that met them
	// went away, since the first admission found one: never a 400 for a
	// request that was admitted once); or the re-admission waited and lost
	// its providers (ErrProviderUnavailable).
	if !errors.Is(err, scheduler.ErrNoProvider) && !errors.Is(err, scheduler.ErrCandidatesRejected) &&
		!errors.Is(err, scheduler.ErrProviderUnavailable) {
		return action{kind: actFinish, err: err}
	}
	// A node that went away or drains leaves the model without a provider
	// (503); other failures are reported as they were.
	if errors.Is(st.failedErr, ErrNodeGone) || errors.Is(st.failedErr, ErrStaleGeneration) || errors.Is(st.failedErr, errNodeDraining) {
		return action{kind: actFinish, err: fmt.Errorf("%w: %w", scheduler.ErrProviderUnavailable, st.failedErr)}
	}
	return action{kind: actFinish, err: st.failedErr}
}

// attempt admits req (never to a candidate tried excludes), dispatches it
// and, with readAhead, reads the run's first messages until one says how
// the provider did (Run.readFirst). superseded, an earlier failed attempt,
// is dropped once this one is dispatched. One client-gone watcher covers
// the attempt from the run's creation to its return: the caller's context
// ending ends the run ("client gone").
func (s *Service) attempt(ctx context.Context, req contract.Request, tried []triedCandidate, waited *queueTime, readAhead bool, superseded *Run) attemptResult {
	run, cand, stopWatch, err := s.dispatchOnce(ctx, req, tried, waited)
	switch {
	case errors.Is(err, errOutOfRotation):
		return attemptResult{kind: resOutOfRotation, cand: cand, err: err, ctxErr: ctx.Err()}
	case errors.Is(err, errNoConnection):
		return attemptResult{kind: resNoConnection, cand: cand, err: err, ctxErr: ctx.Err(), connected: s.reg.current(cand.NodeID) != nil}
	case err != nil && dispatchRetryable(err):
		return attemptResult{kind: resNotDispatched, cand: cand, err: err, ctxErr: ctx.Err()}
	case err != nil:
		return attemptResult{kind: resNotAdmitted, cand: cand, err: err, ctxErr: ctx.Err()}
	}
	// A run on a warm stream may still be refused: its node says so on the
	// stream, so the earlier failed attempt stays the answer until the
	// read-ahead said it was not.
	if superseded != nil && !run.warm {
		superseded.drop(EndSuperseded)
		superseded = nil
	}
	res := attemptResult{kind: resAnswered, run: run, cand: cand}
	if readAhead {
		res.reason, res.err = run.readFirst()
		if res.reason != "" {
			res.kind = resFailedFirst
		}
	}
	stopWatch()
	if res.ctxErr = ctx.Err(); res.ctxErr != nil && readAhead {
		res.kind, res.run, res.err = resClientGone, run, res.ctxErr
	}
	if ended, err := run.outcome(); readAhead && res.ctxErr == nil && ended && errors.Is(err, ErrDispatchRefused) {
		// Refused on its warm stream: it never reached a provider, as a
		// control-stream refusal before the run opened.
		return attemptResult{kind: resNotDispatched, run: run, cand: cand, err: err}
	}
	if superseded != nil {
		superseded.drop(EndSuperseded)
	}
	return res
}

// dispatchLoop runs attempts of req until next finishes it (see the rules
// above) and returns what it decided. Every attempt is appended to
// *attempts, so that Dispatch settles those it does not hand out.
func (s *Service) dispatchLoop(ctx context.Context, req contract.Request, attempts *[]*Run) (*Run, error) {
	baseID := req.RunID
	st := dispatchState{model: req.Model, maxRetries: s.cfg.Retries()}
	if req.BodyFrom != nil {
		// A streamed body is read once: no retry, and an admission
		// again after it began to go down gets an error to read.
		st.maxRetries = 0
		req.BodyFrom = onceBody(req.BodyFrom)
	}
	var tried []triedCandidate
	var waited queueTime
	for n := 0; ; {
		res := s.attempt(ctx, req, tried, &waited, st.maxRetries > 0, st.failedRun)
		if res.run != nil {
			*attempts = append(*attempts, res.run)
		}
		var act action
		act, st = next(res, st)
		cand := res.cand
		switch act.kind {
		case actFinish:
			if act.drop != nil {
				act.drop.drop(EndClientGone)
			}
			return act.run, act.err
		case actAgain:
			if act.exclude {
				tried = append(tried, tried1(cand, false))
			}
			continue // not an attempt: the same run id
		case actReadmit:
			msg, t := "dispatch failed before the run opened; admitting the request again without that node connection", tried1(cand, true)
			if connLost(res.err) || errors.Is(res.err, errNodeDraining) {
				// The node went away, or is going (a refusal of a draining
				// node may come before its Drain): as for a lost connection.
				msg, t = "node connection lost or draining before the run opened; admitting the request again (it waits for the node within reconnect_grace if no other provider serves it)", triedLost(cand)
			}
			s.log.Info(msg, "run", req.RunID, "model", req.Model, "node", cand.NodeID, "generation", cand.Generation, "provider", cand.ProviderID, "err", res.err)
			s.emit(lifecycle.Event{Type: lifecycle.DispatchRetried, Model: req.Model, NodeID: cand.NodeID, Generation: cand.Generation, ProviderID: cand.ProviderID, Reason: dispatchFailure(res.err)})
			tried = append(tried, t)
		case actRejoin:
			s.log.Info("the leader chose a node not connected to this edge; admitting the request again", "run", req.RunID, "model", req.Model, "node", cand.NodeID, "provider", cand.ProviderID, "exclude", act.exclude)
			if act.exclude {
				tried = append(tried, tried1(cand, false))
			}
		case actResubmit:
			s.log.Info("a node refused a deposed leader's epoch; admitting the request again at the current leader", "run", req.RunID, "model", req.Model, "node", cand.NodeID, "provider", cand.ProviderID, "err", res.err)
		case actRetry:
			s.countRetry(res.reason)
			s.emit(lifecycle.Event{Type: lifecycle.DispatchRetried, Model: req.Model, NodeID: cand.NodeID, Generation: cand.Generation, ProviderID: cand.ProviderID, Reason: res.reason})
			msg, t := "provider failed before the first byte; admitting the request again without it", tried1(cand, false)
			if connLost(res.err) {
				// The node, not its provider, went away: the provider may
				// serve it again on the node's next connection.
				msg, t = "node connection lost before the first byte; admitting the request again (it waits for the node within reconnect_grace if no other provider serves it)", triedLost(cand)
			}
			s.log.Warn(msg, "run", req.RunID, "model", req.Model, "node", cand.NodeID, "generation", cand.Generation,
				"provider", cand.ProviderID, "reason", res.reason, "retry", st.retries, "max_retries", st.maxRetries)
			tried = append(tried, t)
		}
		n++
		req.RunID = retryRunID(baseID, n)
	}
}

// watchClient is an attempt's one client-gone watcher: when ctx ends it
// ends r ("client gone", with ctx's error, cancelling it on the node). The
// returned stop ends the watch; when the watcher already fired it waits
// until r has ended, so that whoever stopped it sees the run's end whole.
// stop may be called more than once.
func watchClient(ctx context.Context, r *Run) (stop func()) {
	fired := make(chan struct{})
	stopAfter := context.AfterFunc(ctx, func() {
		defer close(fired)
		r.finish(EndClientGone, ctx.Err(), true)
	})
	var once sync.Once
	return func() {
		once.Do(func() {
			if !stopAfter() {
				<-fired
			}
		})
	}
}

// onceBody is from, callable once: a second call's reader fails with
// errBodyRead (the body already went to another attempt).
func onceBody(from func(string) io.Reader) func(string) io.Reader {
	var used atomic.Bool
	return func(served string) io.Reader {
		if used.Swap(true) {
			return errReader{fmt.Errorf("%w: the body already went to another attempt", errBodyRead)}
		}
		return from(served)
	}
}

// errReader is a reader whose every Read fails with err.
type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }
