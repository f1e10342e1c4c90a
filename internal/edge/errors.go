package edge

import (
	"context"
	"errors"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Outcomes of Service.Dispatch and Run.Recv besides the scheduler's
// admission errors (scheduler.ErrUnknownModel, ErrNoProvider,
// ErrCandidatesRejected, ErrQueueFull, ErrQueueTimeout,
// ErrProviderUnavailable), which Dispatch returns wrapped as they are.
var (
	// ErrInvalidConfig: Config.Validate, LoadConfig or NewServer got a
	// configuration that cannot be served.
	ErrInvalidConfig = errors.New("invalid edge config")
	// ErrInvalidRequest: a dispatch request without a model or with an
	// unknown operation.
	ErrInvalidRequest = errors.New("invalid dispatch request")
	// ErrNodeGone: the node connection a run was dispatched on ended (or the
	// node dropped the run's stream) before the run ended.
	ErrNodeGone = errors.New("node gone")
	// ErrStaleGeneration: the node reconnected between admission and
	// dispatch, twice in a row.
	ErrStaleGeneration = errors.New("stale node generation")
	// ErrDispatchTimeout: the node did not open the run's stream within
	// dispatch_timeout.
	ErrDispatchTimeout = errors.New("dispatch timed out")
	// ErrDispatchRefused: the node answered the dispatch with DispatchRefused.
	ErrDispatchRefused = errors.New("dispatch refused by node")
	// ErrShuttingDown: the edge is stopping (Service.Shutdown): the request
	// was refused or dequeued, or its run ended, before it finished.
	ErrShuttingDown = errors.New("edge shutting down")
)

// Outcomes the gRPC handlers find themselves; grpcError maps them to codes.
var (
	errHelloInvalid    = errors.New("invalid hello")
	errBadToken        = errors.New("node token not accepted")
	errTokenNode       = errors.New("node token not accepted for this node id")
	errNodeBound       = errors.New("node id is bound to another token")
	errHelloTimeout    = errors.New("no hello in time")
	errHeartbeatMissed = errors.New("heartbeats missed")
	errSuperseded      = errors.New("connection superseded by a newer one of the same node")
	errOutboxFull      = errors.New("control stream backlog full")
	errActivate        = errors.New("activating providers failed")
	errShutdown        = errors.New("edge shutting down")
	errRunOpenMissing  = errors.New("first run stream message is not RunOpen")
	errRunNotPending   = errors.New("run is not pending")
	errRunStale        = errors.New("run was dispatched on another node connection")
	errRunAborted      = errors.New("run stream ended by the node")
	// errNodeDraining: the node said Drain; it refuses dispatches and
	// closes its connection when its runs are done.
	errNodeDraining = errors.New("node is draining")
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
	case errors.Is(err, errSuperseded), errors.Is(err, errRunStale):
		code = codes.FailedPrecondition
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
