package edge

// EndReason is why a run ended, decided once by Run.finish: the RunEnded
// event's reason, the run's log line, the label of
// iop_runs_ended_total{reason} and the lease's release reason. It says
// which end came first; how the request it served ended is its Outcome
// (contract.Outcome), a separate field of RunEnded.
type EndReason string

// End reasons. The strings are part of iop's interface (metrics labels,
// the events stream); docs/observability.md lists them.
const (
	// EndComplete: the node's complete event (normalized).
	EndComplete EndReason = "complete"
	// EndError: the node's error event (normalized).
	EndError EndReason = "error"
	// EndCancelled: the node's cancelled event (normalized).
	EndCancelled EndReason = "cancelled"
	// EndTunnelEnd: the tunnel's clean end (a TunnelEnd, or a head with
	// the whole answer).
	EndTunnelEnd EndReason = "tunnel_end"
	// EndTunnelProviderError: a TunnelEnd saying the provider's answer
	// ended with an error.
	EndTunnelProviderError EndReason = "tunnel_provider_error"
	// EndTunnelError: the node's TunnelError (the provider failed).
	EndTunnelError EndReason = "tunnel_error"
	// EndClosed: the HTTP API closed or cancelled the run (Run.Close,
	// Run.Cancel, Run.Fail): its answer was done, or it stopped reading.
	EndClosed EndReason = "closed"
	// EndClientGone: the client left while the run was dispatched.
	EndClientGone EndReason = "client_gone"
	// EndSuperseded: another provider took the request (a failed first
	// attempt was admitted again).
	EndSuperseded EndReason = "superseded"
	// EndNotHandedOver: Dispatch ended the run before its caller got it.
	EndNotHandedOver EndReason = "not_handed_over"
	// EndDispatchTimeout: the node did not open the run in time.
	EndDispatchTimeout EndReason = "dispatch_timeout"
	// EndDispatchRefused: the node refused the dispatch.
	EndDispatchRefused EndReason = "dispatch_refused"
	// EndDispatchSendFailed: the Dispatch could not be sent on a warm run
	// stream.
	EndDispatchSendFailed EndReason = "dispatch_send_failed"
	// EndStaleGeneration: the node connection the run was admitted for
	// was replaced before its dispatch.
	EndStaleGeneration EndReason = "stale_generation"
	// EndCircuitOpen: the provider's circuit opened before its dispatch.
	EndCircuitOpen EndReason = "circuit_open"
	// EndNodeGone: the node's connection ended.
	EndNodeGone EndReason = "node_gone"
	// EndRunStreamFailed: the run's stream failed while being read.
	EndRunStreamFailed EndReason = "run_stream_failed"
	// EndRunStreamClosed: the node closed the run's stream.
	EndRunStreamClosed EndReason = "run_stream_closed"
	// EndBodySendFailed: the request body could not be sent down the
	// run's stream.
	EndBodySendFailed EndReason = "body_send_failed"
	// EndEdgeShuttingDown: the edge stopped.
	EndEdgeShuttingDown EndReason = "edge_shutting_down"
)

// EndReasons lists every EndReason, for metrics and docs.
func EndReasons() []EndReason {
	return []EndReason{
		EndComplete, EndError, EndCancelled, EndTunnelEnd, EndTunnelProviderError, EndTunnelError,
		EndClosed, EndClientGone, EndSuperseded, EndNotHandedOver,
		EndDispatchTimeout, EndDispatchRefused, EndDispatchSendFailed, EndStaleGeneration, EndCircuitOpen,
		EndNodeGone, EndRunStreamFailed, EndRunStreamClosed, EndBodySendFailed, EndEdgeShuttingDown,
	}
}
