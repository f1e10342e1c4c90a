package node

import "errors"

// Configuration and lifecycle errors.
var (
	// ErrInvalidConfig wraps every problem Config.Validate finds.
	ErrInvalidConfig = errors.New("invalid node config")
	// ErrAlreadyRunning is returned by Run while another Run of the same
	// Agent is active.
	ErrAlreadyRunning = errors.New("node agent already running")
)

// Why a connection to the edge ended (logged, then the agent backs off and
// reconnects).
var (
	// ErrHelloRefused: the edge answered Hello with HelloRefused.
	ErrHelloRefused = errors.New("edge refused hello")
	// ErrWelcomeTimeout: the edge did not answer Hello in time.
	ErrWelcomeTimeout = errors.New("edge did not answer hello")
	// ErrHeartbeatTimeout: nothing arrived from the edge for three heartbeat
	// intervals.
	ErrHeartbeatTimeout = errors.New("edge missed heartbeats")
	// ErrConnectionLost: the Connect stream failed or the edge ended it.
	ErrConnectionLost = errors.New("connection to edge lost")
	// ErrProtocol: the edge sent something the protocol does not allow at
	// that point (e.g. no Welcome or HelloRefused first).
	ErrProtocol = errors.New("edge broke the protocol")
	// ErrDrained: the agent drained (Agent.Drain) and every run in flight
	// finished; the agent closes the connection and does not reconnect.
	ErrDrained = errors.New("node drained")
	// ErrDrainTimeout: the drain's grace period (Config.DrainTimeout) ended
	// with runs still in flight; they are aborted.
	ErrDrainTimeout = errors.New("drain grace period over")
)

// Why a dispatch was refused (sent to the edge as DispatchRefused.reason).
var (
	ErrUnknownProvider      = errors.New("unknown provider")
	ErrPathMismatch         = errors.New("provider does not answer on that execution path")
	ErrUnsupportedOperation = errors.New("unsupported operation")
	ErrDuplicateRun         = errors.New("run id already in flight")
	ErrMissingRunID         = errors.New("dispatch without a run id")
	ErrRunStreamFailed      = errors.New("cannot open run stream")
	// ErrDraining: the node is draining (it told the edge so) and takes no
	// new run.
	ErrDraining = errors.New("node is draining")
)

// Why a run ended early; causes of its context's cancellation.
var (
	// ErrCancelledByEdge: a Cancel for the run arrived (control stream or
	// run stream).
	ErrCancelledByEdge = errors.New("cancelled by edge")
	// ErrRunStreamEnded: the run's stream ended or broke before the run did.
	ErrRunStreamEnded = errors.New("run stream ended")
	// errBodyUnread: the adapter returned before it read a streamed body
	// to its end; the rest is dropped.
	errBodyUnread = errors.New("the provider call ended before the body was read")
	// ErrRunEnded: the run is over; its work context ends with it (on a
	// warm stream, which outlives the run).
	ErrRunEnded = errors.New("run ended")
	// ErrBodyTooLarge: the request body exceeded MaxBodyBytes.
	ErrBodyTooLarge = errors.New("request body too large")
	// ErrNoAdapter: the provider's adapter answers on neither execution
	// path (a provider kind without a working adapter constructor).
	ErrNoAdapter = errors.New("node has no adapter for the provider")
)
