package contract

import (
	"io"
	"time"
)

// Operation is the kind of a dispatched request.
type Operation uint8

// Operations. The zero value is no operation: the edge refuses it.
const (
	OperationUnspecified Operation = iota
	// OperationChat is a chat completion (OpenAI /v1/chat/completions,
	// Ollama /api/chat).
	OperationChat
	// OperationCompletion is a text completion (OpenAI /v1/completions,
	// Ollama /api/generate).
	OperationCompletion
	// OperationEmbeddings is an embeddings request (OpenAI /v1/embeddings,
	// Ollama /api/embed and /api/embeddings).
	OperationEmbeddings
	// The media operations (package edge/api/media): the client's body
	// goes to the provider's endpoint of the same name as it came, on the
	// tunnel path only. OperationRerank: /v1/rerank and /rerank;
	// OperationTranscription: /v1/audio/transcriptions (multipart);
	// OperationSpeech: /v1/audio/speech; OperationImages:
	// /v1/images/generations; OperationInfill and OperationLlamaCompletion:
	// llama.cpp's /infill and /completion.
	OperationRerank
	OperationTranscription
	OperationSpeech
	OperationImages
	OperationInfill
	OperationLlamaCompletion
)

// String names the operation for logs and errors: "chat", "completion",
// "embeddings", or "unspecified" for any other value.
func (o Operation) String() string {
	switch o {
	case OperationChat:
		return "chat"
	case OperationCompletion:
		return "completion"
	case OperationEmbeddings:
		return "embeddings"
	case OperationRerank:
		return "rerank"
	case OperationTranscription:
		return "transcription"
	case OperationSpeech:
		return "speech"
	case OperationImages:
		return "images"
	case OperationInfill:
		return "infill"
	case OperationLlamaCompletion:
		return "llama_completion"
	default:
		return "unspecified"
	}
}

// Path is how a run's answer comes back from its node (DESIGN.md
// "Execution paths").
type Path uint8

// Execution paths. The zero value is an unknown path.
const (
	PathUnknown Path = iota
	// PathTunnel: the provider's own HTTP answer, relayed byte for byte
	// (head, data chunks, end).
	PathTunnel
	// PathNormalized: the node translated the provider's answer into
	// events (started, deltas, usage, complete).
	PathNormalized
)

// String is the path's name in logs, metrics, the usage ledger and the
// runs API: "tunnel", "normalized", or "" for PathUnknown.
func (p Path) String() string {
	switch p {
	case PathTunnel:
		return "tunnel"
	case PathNormalized:
		return "normalized"
	default:
		return ""
	}
}

// Request is one client request as the edge dispatches it.
type Request struct {
	// Model is the model name the client asked for: an alias or a served
	// name. It is also the request's model group (queue).
	Model string
	// Operation is the kind of request: chat, completion or embeddings.
	Operation Operation
	// Stream is the client's "stream" flag.
	Stream bool
	// Body is the client's JSON body, byte for byte; the node rewrites its
	// model to the served target.
	Body []byte
	// BodyFrom, when set, is the body as a stream, for a body too large to
	// hold (a multipart upload): Body is then nil, and the edge calls
	// BodyFrom once, with the served model the run went to, when it sends
	// the body down the run's stream, in chunks as they are read. It must
	// return a reader of the body with its model set to that name. A read
	// error fails the run (the node's provider call is cut). Such a request
	// is admitted once: no retry, as its body cannot be read again.
	BodyFrom func(servedModel string) io.Reader
	// OllamaFields is the JSON object of Ollama request fields OpenAI's API
	// has no name for (translate.OllamaFields), for Ollama providers
	// (node.proto Dispatch.ollama_fields); nil when there are none. Body
	// never carries them.
	OllamaFields []byte
	// Needs are the capabilities every candidate provider must have:
	// "tools" (the request defines tools), "vision" (a message carries an
	// image), "embeddings", and needs only tunnel-path providers meet:
	// "choices" (n above 1), "tool_choice", "remote_images",
	// "prompt_batch" (several completions prompts), "token_input" (token
	// ids as a prompt or input) and "logprobs".
	Needs []string
	// EstimatedInputTokens is a rough size of the prompt, in tokens: the
	// characters of its messages, tool calls and tool definitions / 4,
	// rounded up. The edge marks a request at or above its
	// long_context_tokens long, admitted against long_capacity.
	EstimatedInputTokens int
	// Headers are selected client headers a provider may need (canonical
	// names, e.g. "Accept"); never the client's credentials.
	Headers map[string]string
	// RunID, when set, is the run's id (else a new "run_<hex>" one); a
	// second admission after a failed dispatch uses RunID + "-retry".
	RunID string
	// PreferNodeID and PreferProviderID name a provider to choose over the
	// least loaded one when it is a candidate with a free slot (session
	// affinity); empty means no preference.
	PreferNodeID, PreferProviderID string
	// Flow names the request's flow in its model's queue (its key's name,
	// or the header or user value fairness.flow names); "" is the flow of
	// requests with none. Weight is the flow's weight (0 = 1).
	Flow   string
	Weight int
	// Priority is the request's band: PriorityCritical, PriorityStandard
	// (the zero value) or PrioritySheddable; PriorityBatch is set only by
	// the batch runner (no HTTP header or key maps to it).
	Priority int
}

// Priority bands of Request.Priority (auth.PriorityRank's ranks).
const (
	PriorityBatch     = -2
	PrioritySheddable = -1
	PriorityStandard  = 0
	PriorityCritical  = 1
)

// DispatchInfo describes where a run went. It does not change.
type DispatchInfo struct {
	RunID, NodeID, ProviderID, ProviderType, ServedModel string
	// CostWeight is the provider's cost_weight: what one second of its
	// slot counts as in GPU-time; 0 means 1.
	CostWeight float64
	// Generation is the node connection the run was sent on.
	Generation uint64
	// Path says how the answer comes back: tunnel or normalized.
	Path Path
	// QueueReason is how the request was admitted: AdmissionImmediate or
	// AdmissionQueued (it waited for a slot).
	QueueReason Admission
	// QueueWait is how long the request waited for a slot.
	QueueWait time.Duration
	// PrefixPromptTokens is the prompt's full blocks, in tokens (16 a
	// block of 64 characters), when the run was routed by prefix (routing:
	// prefix), else 0; PrefixPredictedTokens the tokens of it the edge
	// expected the chosen provider to hold in its cache.
	PrefixPromptTokens, PrefixPredictedTokens int
}

// Snapshot is one view of the edge's nodes, providers and queues, for the
// admin routes and the metrics' gauges. Its slices are the caller's.
type Snapshot struct {
	Nodes     []NodeSnapshot
	Providers []ProviderSnapshot
	Queues    []QueueSnapshot
	// Waiters counts queued requests; Leases unreleased leases.
	Waiters, Leases int
	// Cluster is the edge's view of its cluster (several edges); nil for
	// a single edge.
	Cluster *ClusterSnapshot
}

// ClusterSnapshot is an edge's view of its cluster (several edges, one
// elected scheduler leader).
type ClusterSnapshot struct {
	// Name is this edge's cluster name; LeaderAddr the leader's advertise
	// address; Epoch the leader's epoch (0: no leader known).
	Name, LeaderAddr string
	Epoch            int64
	// Leader: this edge leads; Ready: and has rebuilt its leases from the
	// nodes' reports (it admits).
	Leader, Ready bool
	// HeldLeases: leases the leader's scheduler holds for other edges'
	// runs and adopted runs of older epochs (0 on a follower).
	HeldLeases int
	// Runs: runs this edge relays now (dispatched, not ended).
	Runs int
	// NameInUseBy is the advertise address of another edge with this
	// edge's cluster name ("": none).
	NameInUseBy string
}

// NodeSnapshot is one connected node.
type NodeSnapshot struct {
	NodeID, Label, Version string
	Generation             uint64
	ConnectedAt, LastSeen  time.Time
	// Providers are the node's provider ids, sorted.
	Providers []string
	// Draining: the node said Drain; its providers take no new requests
	// while its runs in flight finish.
	Draining bool
	// IdleRunStreams counts the node's warm Run streams (opened ahead of
	// need, RunOpen.idle) waiting for a run on this connection.
	IdleRunStreams int
}

// ProviderSnapshot is one provider: the scheduler's counters for its
// (node, provider) resource and what its node said of it. A provider whose
// node is gone is Status "orphan", without node details; one whose node
// drains (NodeSnapshot.Draining) is "draining".
type ProviderSnapshot struct {
	NodeID, ProviderID, Type string
	Generation               uint64
	Models, Capabilities     []string
	Path                     Path
	Healthy                  bool
	Capacity, LongCapacity   int
	InFlight, LongInFlight   int
	// BatchInFlight counts its requests in flight of the batch priority
	// (of InFlight).
	BatchInFlight int
	// Queued counts waiters that list this provider.
	Queued int
	// Load is InFlight / Capacity.
	Load float64
	// Status is "available", "draining" (its node drains: no new
	// requests) or "orphan" (its node is gone).
	Status string
	// Circuit is the provider's circuit breaker state: "closed" (in
	// rotation), "open" (out of rotation for a cool-down) or "half_open"
	// (one trial request may go).
	Circuit string
	// ModelCapabilities are the capabilities of the served models whose
	// server said their own (Ollama's /api/show), by model; a model not in
	// it has Capabilities.
	ModelCapabilities map[string][]string
	// Loaded are the served models its server holds loaded, as its node
	// last read them (an Ollama's /api/ps), by name; nil when its node
	// reads none (a server that holds its models always).
	Loaded []ResidentModel
}

// ResidentModel is one served model a provider holds loaded.
type ResidentModel struct {
	Model string
	// Since is when its node first saw it loaded (RFC 3339; "" unknown).
	Since string
	// Kept: an alias with keep_loaded names it.
	Kept bool
}

// QueueSnapshot is one model group's queue: one for every configured
// alias and every model that has had a request (a name the catalog
// knows), with its policy, and Queued 0 while none waits.
type QueueSnapshot struct {
	Model        string
	MaxQueue     int
	QueueTimeout time.Duration
	Queued       int
	// Batch counts the queued batch lines, of Queued: the batch band,
	// bounded by queue.batch's max_queue, not MaxQueue.
	Batch int
	// Fairness is "on" or "off" (the queue's order).
	Fairness string
	// Flows counts the queued requests by flow and priority ("critical",
	// "standard", "sheddable"), sorted by flow then priority, highest
	// first; only pairs with a queued request.
	Flows []FlowQueue
	// Targets, for a configured alias, are its targets in config order;
	// nil for a served model name's queue.
	Targets []string
	// UnmatchedTargets, for a configured alias, are its targets that no
	// node serves or served lately (a misspelt name, a model no node has),
	// in config order; nil when every target matches, or before any node
	// connected. When it holds every target, a request for the alias is
	// answered 404 (UnmatchedAliasError).
	UnmatchedTargets []string
}

// FlowQueue is the queue of one flow in one priority band of a model.
type FlowQueue struct {
	Flow     string
	Priority string
	Queued   int
}

// ModelInfo is what the edge knows of one model.
type ModelInfo struct {
	// Name is the catalog's name for the requested one ("x" and
	// "x:latest" are one model, package modelname).
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
	// Capabilities are iop's capability words for Target on this provider
	// ("completion", "tools", "vision", "embeddings", "thinking", ...,
	// and lifecycle ones such as "stream"): the model's own when its node
	// described it (e.g. from Ollama's /api/show), else the provider's
	// with "completion" added (such a model is taken to generate text).
	// Sorted.
	Capabilities       []string
	Healthy            bool
	Capacity, InFlight int
	// Target is the served model name the provider serves the model as:
	// the first target, in alias order, it serves.
	Target string
	// Details are what the provider's model server says of Target, nil
	// when its node said nothing. Not to be modified.
	Details *ModelDetails
	// OllamaAPI: the provider's server speaks Ollama's API (an ollama
	// provider, or the simulator in its Ollama mode), so its node can ask
	// it for /api/show (Service.Show).
	OllamaAPI bool
}

// ModelDetails is what a model server says of one model, as Ollama's
// /api/tags and /api/show do (docs/api.md of github.com/ollama/ollama).
type ModelDetails struct {
	Size              int64  // bytes on disk
	Digest            string // e.g. the sha256 hex of the manifest
	ModifiedAt        string // RFC 3339, as the server said it
	Format            string // e.g. "gguf"
	Family            string // e.g. "llama"
	Families          []string
	ParameterSize     string // e.g. "8.0B"
	QuantizationLevel string // e.g. "Q4_K_M"
	ParentModel       string
	ContextLength     int64 // tokens; 0 = not said
}

// LoadedModel is one model one provider holds loaded (its residency), for
// Ollama's GET /api/ps and the scheduler's later use.
type LoadedModel struct {
	NodeID, ProviderID, Type string
	// Served is the provider's served model name the loaded model is (the
	// name clients request it by).
	Served string
	// Name and Model are the model server's names for it ("tiny:latest").
	Name, Model    string
	Size, SizeVRAM int64 // bytes of memory it takes, of which in GPU memory
	Digest         string
	Details        ModelDetails
	// ExpiresAt is when the server unloads it if idle (RFC 3339, as the
	// server said it); "" when Always.
	ExpiresAt     string
	ContextLength int64 // tokens it was loaded with; 0 = not said
	// LoadedSince is when the node first saw it loaded (RFC 3339); "" when
	// not Reported.
	LoadedSince string
	// Source says where the entry comes from: "reported" (the server's own
	// listing, Ollama's /api/ps, read by the node), "always" (an
	// OpenAI-compatible server serves its models always: every served
	// model), or "in_flight" (a run of it is in flight on a provider whose
	// node has not reported it loaded yet: it is loading or loaded).
	Source string
	// InFlight counts the runs of Served in flight on the provider.
	InFlight int
	// Kept: an alias with keep_loaded names Served.
	Kept bool
}

// Sources of a LoadedModel.
const (
	LoadedReported = "reported"
	LoadedAlways   = "always"
	LoadedInFlight = "in_flight"
)
