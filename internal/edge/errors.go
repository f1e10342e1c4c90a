package edge

import (
	"context"
	"errors"
	"slices"
	"strings"

	"iop/internal/edge/contract"
	"iop/internal/scheduler"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Outcomes of Service.Dispatch and Run.Recv: the contract's errors
// (package contract), which the scheduler's admission errors are wrapped
// with at the edge's boundary (boundaryError), and the edge's own.
var (
	// ErrInvalidConfig: Config.Validate, LoadConfig or NewServer got a
	// configuration that cannot be served.
	ErrInvalidConfig = errors.New("invalid edge config")
	// ErrInvalidRequest: a dispatch request without a model or with an
	// unknown operation.
	ErrInvalidRequest = errors.New("invalid dispatch request")
	// ErrNodeGone: the node connection a run was dispatched on ended (or the
	// node dropped the run's stream) before the run ended.
	ErrNodeGone = contract.ErrNodeGone
	// ErrStaleGeneration: the node reconnected between admission and
	// dispatch, twice in a row.
	ErrStaleGeneration = contract.ErrStaleGeneration
	// ErrDispatchTimeout: the node did not open the run's stream within
	// dispatch_timeout.
	ErrDispatchTimeout = contract.ErrDispatchTimeout
	// ErrDispatchRefused: the node answered the dispatch with DispatchRefused.
	ErrDispatchRefused = contract.ErrDispatchRefused
	// ErrProviderBusy, beside ErrDispatchRefused: the node refused because
	// its provider already runs its capacity there (DispatchRefused.busy).
	ErrProviderBusy = contract.ErrProviderBusy
	// errStaleEpoch, beside ErrDispatchRefused: the node refused a
	// Dispatch admitted by a deposed scheduler leader (several edges;
	// DispatchRefused.stale_epoch). No failure of the provider: the request
	// is admitted again at the current leader.
	errStaleEpoch = errors.New("stale epoch")
	// ErrShuttingDown: the edge is stopping (Service.Shutdown): the request
	// was refused or dequeued, or its run ended, before it finished.
	ErrShuttingDown = contract.ErrShuttingDown
	// ErrNoLeader: several edges, and no scheduler leader answered in time.
	ErrNoLeader = contract.ErrNoLeader
)

// boundaryError wraps an error Service.Dispatch returns with the
// contract's error for its outcome, the first that matches in this order
// (a lost provider is unavailable even if a rejection is in the chain):
// the one place where the scheduler's errors become the contract's. The
// edge's own outcomes (ErrNodeGone, ...) already are the contract's;
// errors without one (context errors, ErrInvalidRequest) pass through.
func boundaryError(err error) error {
	if err == nil {
		return nil
	}
	switch {
	case errors.Is(err, scheduler.ErrDisplaced):
		return &contractError{is: []error{contract.ErrShed, contract.ErrDisplaced}, err: err}
	case errors.Is(err, scheduler.ErrExpectedWait):
		return &contractError{is: []error{contract.ErrShed, contract.ErrExpectedWait}, err: err}
	}
	for _, m := range []struct{ from, to error }{
		{scheduler.ErrUnknownModel, contract.ErrUnknownModel},
		{scheduler.ErrProviderUnavailable, contract.ErrProviderUnavailable},
		{scheduler.ErrCandidatesRejected, contract.ErrCandidatesRejected},
		{scheduler.ErrQueueFull, contract.ErrQueueFull},
		{scheduler.ErrQueueTimeout, contract.ErrQueueTimeout},
		{scheduler.ErrNoProvider, contract.ErrNoProvider},
	} {
		if errors.Is(err, m.from) {
			return &contractError{is: []error{m.to}, err: err}
		}
	}
	return err
}

// contractError is a scheduler error err that is also the contract's
// errors is (errors.Is finds both). Its text is the contract's words,
// then err's, but only the words err does not say already: most of the
// scheduler's sentinels say what the contract's do, and a prefix would
// say it twice ("queue full: model "m": queue full").
type contractError struct {
	is  []error
	err error
}

func (e *contractError) Error() string {
	text := e.err.Error()
	var prefix []string
	for _, is := range e.is {
		if !strings.Contains(text, is.Error()) {
			prefix = append(prefix, is.Error())
		}
	}
	if len(prefix) == 0 {
		return text
	}
	return strings.Join(prefix, ": ") + ": " + text
}

func (e *contractError) Unwrap() []error { return append(slices.Clip(e.is), e.err) }

// Outcomes the gRPC handlers find themselves; grpcError maps them to codes.
var (
	errHelloInvalid    = errors.New("invalid hello")
	errBadToken        = errors.New("node token not accepted")
	errTokenNode       = errors.New("node token not accepted for this node id")
	errNodeBound       = errors.New("node id is bound to another token")
	errHelloTimeout    = errors.New("no hello in time")
	errHeartbeatMissed = errors.New("heartbeats missed")
	errSuperseded      = errors.New("connection superseded by a newer one of the same node")
	errNodeInUse       = errors.New("node id in use")
	errOutboxFull      = errors.New("control stream backlog full")
	errActivate        = errors.New("activating providers failed")
	errShutdown        = errors.New("edge shutting down")
	errConnClosed      = errors.New("the node closed its connection")
	errConnLost        = errors.New("node connection lost")
	errRunOpenMissing  = errors.New("first run stream message is not RunOpen")
	errRunNotPending   = errors.New("run is not pending")
	errRunStale        = errors.New("run was dispatched on another node connection")
	errRunAborted      = errors.New("run stream ended by the node")
	// errBodyRead: a streamed request body (Request.BodyFrom) failed to
	// read, its client's failure (gone, or over its size limit).
	errBodyRead = errors.New("reading the request body failed")
	// errNodeDraining: the node said Drain; it refuses dispatches and
	// closes its connection when its runs are done.
	errNodeDraining = errors.New("node is draining")
	// errNoConnection: the leader granted a follower a node that has no
	// connection to the follower (yet).
	errNoConnection = errors.New("this edge has no connection to the node")
)

// grpcError maps an outcome of a gRPC handler to the status the node sees.
// This is the one mapping from internal outcomes to gRPC codes.
func grpcError(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	var code codes.Code
	switch {
	case errors.Is(err, errHelloInvalid), errors.Is(err, errRunOpenMissing):
		code = codes.InvalidArgument
	case errors.Is(err, errBadToken), errors.Is(err, errTokenNode), errors.Is(err, errNodeBound):
		code = codes.PermissionDenied
	case errors.Is(err, errHelloTimeout), errors.Is(err, errHeartbeatMissed):
		code = codes.DeadlineExceeded
	case errors.Is(err, errSuperseded), errors.Is(err, errRunStale), errors.Is(err, errNodeDraining):
		code = codes.FailedPrecondition
	case errors.Is(err, errNodeInUse):
		code = codes.AlreadyExists
	case errors.Is(err, errRunNotPending):
		code = codes.NotFound
	case errors.Is(err, errOutboxFull):
		code = codes.ResourceExhausted
	case errors.Is(err, errShutdown):
		code = codes.Unavailable
	case errors.Is(err, context.Canceled):
		code = codes.Canceled
	case errors.Is(err, context.DeadlineExceeded):
		code = codes.DeadlineExceeded
	default:
		code = codes.Internal
	}
	return status.Error(code, err.Error())
}
