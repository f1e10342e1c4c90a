package nodev1

// RefusedProviderBusy begins DispatchRefused.reason when a node refuses a
// Dispatch because its provider already runs its capacity on that node
// (the runs of all its edges together; package node, ErrProviderBusy): the
// edge reads it as load, not as a failure of the provider (its circuit
// breaker does not count it) and answers the client 503 with Retry-After.
const RefusedProviderBusy = "provider at capacity on this node"
