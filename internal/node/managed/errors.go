package managed

import "errors"

// Why a model server could not serve a run. Tunnel reports them inside an
// *adapter.Error (status 502, 504 for ErrStartTimeout) whose message names
// the model; errors.Is finds neither through it, the message says which.
var (
	// ErrUnknownModel: the model has no server in Config.Servers.
	ErrUnknownModel = errors.New("no model server configured for the model")
	// ErrStartFailed: the command could not be started (no such
	// executable, no free port).
	ErrStartFailed = errors.New("model server did not start")
	// ErrStartTimeout: the server did not answer its health URL with 200
	// within its start_timeout; it was stopped.
	ErrStartTimeout = errors.New("model server not healthy in time")
	// ErrExited: the server's process exited on its own (while starting,
	// or while runs were in flight).
	ErrExited = errors.New("model server exited")
	// ErrBusy: Unload of a model whose server has runs in flight.
	ErrBusy = errors.New("model server has runs in flight")
	// ErrNoRoom: Load of a model while MaxLoaded servers run (or are
	// starting): a preload never stops another model's server.
	ErrNoRoom = errors.New("no room for another model server (max_loaded_models): a preload stops none")
	// ErrStopped: the server was stopped while starting (Close, or another
	// model needed its place).
	ErrStopped = errors.New("model server stopped")
)
