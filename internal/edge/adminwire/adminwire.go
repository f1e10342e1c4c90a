// Package adminwire holds the JSON shapes of the edge's admin API
// (GET /admin/v1/nodes, /providers, /queues, /usage), shared by the edge that
// writes them (internal/edge/api) and the clients that read them
// (iop status, iop usage). Times are RFC 3339; slices are never null.
package adminwire

import "time"

// Node is one entry of GET /admin/v1/nodes.
type Node struct {
	ID             string    `json:"id"`
	Label          string    `json:"label"`
	Generation     uint64    `json:"generation"`
	ConnectedSince time.Time `json:"connected_since"`
	LastHeartbeat  time.Time `json:"last_heartbeat"`
	Version        string    `json:"version"`
	Providers      []string  `json:"providers"`
	// Draining: the node is shutting down (it said Drain): its providers
	// take no new requests while its runs in flight finish.
	Draining bool `json:"draining"`
}

// Provider is one entry of GET /admin/v1/providers: the scheduler's
// counters for it and what its node said of it.
type Provider struct {
	NodeID       string   `json:"node_id"`
	ProviderID   string   `json:"provider_id"`
	Type         string   `json:"type"`
	Capacity     int      `json:"capacity"`
	InFlight     int      `json:"in_flight"`
	LongCapacity int      `json:"long_capacity"`
	LongInFlight int      `json:"long_in_flight"`
	Queued       int      `json:"queued"`
	LoadRatio    float64  `json:"load_ratio"` // in_flight / capacity; capacity ≥ 1
	Health       string   `json:"health"`     // "healthy" or "unhealthy"
	Models       []string `json:"models"`
	Capabilities []string `json:"capabilities"`
	Status       string   `json:"status"`  // "available", "draining" (its node drains) or "orphan" (its node is gone)
	Circuit      string   `json:"circuit"` // "closed", "open" (out of rotation) or "half_open"
	// ModelCapabilities are the capabilities of each served model whose
	// server said its own (Ollama's /api/show: a discovered provider's
	// models), by model name; a model not listed has Capabilities.
	ModelCapabilities map[string][]string `json:"model_capabilities,omitempty"`
	// Loaded are the served models its server holds loaded, as its node
	// last read them (an Ollama's /api/ps); absent when its node reads
	// none (a server that holds its models always).
	Loaded []Loaded `json:"loaded,omitempty"`
	// ReadsLoaded says its node reads what its server holds loaded: then
	// an absent Loaded means none. Absent when false.
	ReadsLoaded bool `json:"reads_loaded,omitempty"`
	// BatchInFlight counts its requests of the batch priority in flight
	// (of in_flight); left out when 0.
	BatchInFlight int `json:"batch_in_flight,omitempty"`
}

// Loaded is one served model a provider holds loaded.
type Loaded struct {
	Model string `json:"model"`
	// Since is when its node first saw it loaded (RFC 3339), "" unknown.
	Since string `json:"since,omitempty"`
	// Kept: an alias with keep_loaded names it.
	Kept bool `json:"kept,omitempty"`
}

// Queue is one entry of GET /admin/v1/queues: a model group's policy and
// its queued requests, in all and by flow and priority.
type Queue struct {
	Model  string `json:"model"`
	Policy struct {
		MaxQueue       int   `json:"max_queue"`
		QueueTimeoutMS int64 `json:"queue_timeout_ms"` // milliseconds
		// Fairness is "on" (weighted fair order between flows) or "off"
		// (FIFO within each priority band).
		Fairness string `json:"fairness"`
	} `json:"policy"`
	Queued int `json:"queued"`
	// Batch counts the batch lines among Queued (the batch band, bounded
	// by queue.batch.max_queue, not max_queue).
	Batch int `json:"batch"`
	// Flows are the queued requests by flow and priority, sorted by flow
	// then priority (highest first); only pairs with a queued request,
	// never null.
	Flows []QueueFlow `json:"flows"`
	// Targets, for a configured alias, are the served model names it
	// resolves to, in config order; absent for a served name's queue.
	Targets []string `json:"targets,omitempty"`
	// UnmatchedTargets, for a configured alias, are its targets that no
	// node serves or served lately ("x" matches a served "x:latest"), in
	// config order; absent when every target matches or no node has
	// connected yet. When it lists every target, requests for the alias
	// are answered 404.
	UnmatchedTargets []string `json:"unmatched_targets,omitempty"`
}

// QueueFlow is the queue of one flow (a key's name, or the header or
// user value the edge's fairness.flow names; "" for requests with none) in
// one priority band ("critical", "standard" or "sheddable").
type QueueFlow struct {
	Flow     string `json:"flow"`
	Priority string `json:"priority"`
	Queued   int    `json:"queued"`
}
