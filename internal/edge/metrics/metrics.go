// Package metrics exports the edge's Prometheus metrics (prometheus.io
// naming conventions: the iop_ prefix, base units in the name, _total for
// counters). Counters and histograms are fed by two hooks: one
// observe.RequestRecord per finished API request (RequestDone), and the edge's
// lifecycle events (Observe). Gauges that mirror the scheduler and the node
// registry (in-flight, capacity, queue depth, nodes connected) are read from
// the edge's Snapshot at scrape time by a custom Collector, so they can
// never drift from what the scheduler holds.
//
// Every collector is registered on the prometheus.Registerer passed to New;
// nothing is registered globally.
//
// # Metrics
//
//	iop_requests_total{model,api,outcome,status}       counter: finished API requests
//	iop_admissions_total{model,reason}                 counter: admission outcomes (immediate, queued, queue_full, queue_timeout,
//	                                                   rejected, unavailable, unknown_model, dispatch_failed, cancelled)
//	iop_queue_wait_seconds{model}                      histogram: time admitted requests waited for a slot
//	iop_time_to_first_token_seconds{model,path}        histogram: from the request's arrival to its first generated text
//	iop_request_duration_seconds{model,api}            histogram: from arrival to the end of the response
//	iop_inter_token_latency_seconds{model,path}        histogram: mean time between output tokens of one request
//	iop_input_tokens_total{model}                      counter: prompt tokens of requests whose usage is known
//	iop_output_tokens_total{model}                     counter: completion tokens of requests whose usage is known
//	iop_runs_in_flight{model}                          gauge: runs admitted and not yet ended
//	iop_runs_ended_total{reason}                       counter: runs ended, by edge.EndReason (every reason from 0)
//	iop_node_connects_total{node}                      counter: node connections accepted
//	iop_node_fences_total{node,reason}                 counter: node connections fenced
//	iop_dispatch_retries_total{model,reason}           counter: dispatches admitted again after failing before the run started
//	iop_flow_admissions_total{model,flow,priority}     counter: requests admitted (immediate or queued), by flow and priority
//	iop_flow_sheds_total{model,flow,reason}            counter: sheddable requests shed (reason displaced or expected_wait)
//	iop_nodes_connected                                gauge (scrape time)
//	iop_provider_in_flight{node,provider}              gauge (scrape time)
//	iop_provider_capacity{node,provider}               gauge (scrape time); not for an orphan (its node is gone)
//	iop_provider_long_in_flight{node,provider}         gauge (scrape time)
//	iop_provider_long_capacity{node,provider}          gauge (scrape time); not for an orphan
//	iop_provider_queued{node,provider}                 gauge (scrape time): waiters that list the provider
//	iop_provider_healthy{node,provider}                gauge (scrape time): 1 healthy, 0 not (or orphan, or draining)
//	iop_queue_depth{model}                             gauge (scrape time): waiters of the model's queue
//	iop_queue_max{model}                               gauge (scrape time): the queue's max_queue
//
// A model label is the requested model name only once the edge knew it (an
// alias or a served name); a request refused before that (invalid, unknown
// model, or cancelled before admission) is counted with model="", so a
// client cannot grow the label set.
//
// A flow label is a key's name (the keys are configured: a bounded set),
// or, where the edge's fairness.flow takes flows from a client's header or
// body, one of the first MaxFlowLabels such values seen; later values are
// counted under flow="other", so clients cannot grow the label set.
//
// Node labels do not outlive their node: the label values of a node whose
// last connection was fenced edge.ForgetAfter ago (by the events' own times,
// the edge's clock) are deleted at the next node event, so nodes that come
// and go do not grow the label sets. The per-provider gauges are read from
// the snapshot and list only the providers the scheduler holds.
//
// # Concurrency
//
// A Metrics is safe for concurrent use: its hooks update client_golang's
// collectors, which are; Metrics.mu, a leaf lock, guards which nodes are
// gone, and is held by node events while they count and delete label values,
// so a node's counters are never deleted after its new connection counted.
// Metrics.flowMu, another leaf lock, guards the set of client-named flow
// label values.
// The snapshot collector calls the Snapshotter on the scrape's goroutine.
package metrics

import (
	"slices"
	"strconv"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"

	"iop/internal/edge"
	"iop/internal/edge/api/observe"
	"iop/internal/edge/contract"
	"iop/internal/edge/lifecycle"
)

// Snapshotter is where scrape-time gauges come from; *edge.Service is one.
type Snapshotter interface {
	Snapshot() contract.Snapshot
}

// Metrics holds the edge's collectors. Create it with New.
type Metrics struct {
	requests     *prometheus.CounterVec
	admissions   *prometheus.CounterVec
	queueWait    *prometheus.HistogramVec
	ttft         *prometheus.HistogramVec
	duration     *prometheus.HistogramVec
	interToken   *prometheus.HistogramVec
	inputTokens  *prometheus.CounterVec
	outputTokens *prometheus.CounterVec
	runsInFlight *prometheus.GaugeVec
	runsEnded    *prometheus.CounterVec
	connects     *prometheus.CounterVec
	fences       *prometheus.CounterVec
	retries      *prometheus.CounterVec
	flowAdmits   *prometheus.CounterVec
	flowSheds    *prometheus.CounterVec

	flowMu    sync.Mutex          // a leaf; guards flowNames
	flowNames map[string]struct{} // client-named flows with a label value
	// prefixPrompt and prefixPredicted: the prompt tokens of runs routed by
	// prefix, and those the router expected the chosen provider to hold
	// (their ratio is the predicted prefix hit ratio).
	prefixPrompt    *prometheus.CounterVec
	prefixPredicted *prometheus.CounterVec

	mu      sync.Mutex           // guards the fields below
	nodeGen map[string]uint64    // the latest generation seen, per node with label values
	reasons map[string][]string  // the fence reasons counted, per node
	gone    map[string]time.Time // nodes whose latest connection was fenced, since when
	expiry  []goneNode           // gone marks in time order
}

// goneNode is a node's fence at at; its label values go at at +
// edge.ForgetAfter unless it connected again since.
type goneNode struct {
	node string
	at   time.Time
}

var (
	_ observe.Observer   = (*Metrics)(nil)
	_ lifecycle.Observer = (*Metrics)(nil)
)

// Histogram buckets, in seconds.
var (
	// Queue waits run up to the queue timeout (default 30s).
	queueWaitBuckets = []float64{0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60}
	// Time to first token: from a cached prompt on a GPU to a long prompt
	// on a CPU.
	ttftBuckets = []float64{0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80}
	// Whole requests: a short answer to a long generation (the node's
	// default provider timeout is 10m).
	durationBuckets = []float64{0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320, 640}
	// Time per output token: 1000 tokens/s to 1 token/s.
	interTokenBuckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1}
)

// New creates the edge's collectors and registers them, with the
// scrape-time collector over snap, on reg. It returns the registration
// error (a collector already registered).
func New(reg prometheus.Registerer, snap Snapshotter) (*Metrics, error) {
	m := &Metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "iop_requests_total", Help: "Finished API requests, by requested model, API, outcome and HTTP status (0: aborted before a status).",
		}, []string{"model", "api", "outcome", "status"}),
		admissions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "iop_admissions_total", Help: "Admission outcomes of API requests, by requested model and reason.",
		}, []string{"model", "reason"}),
		queueWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "iop_queue_wait_seconds", Help: "Time admitted requests waited in their model's queue for a slot.", Buckets: queueWaitBuckets,
		}, []string{"model"}),
		ttft: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "iop_time_to_first_token_seconds", Help: "Time from a request's arrival to its first generated text reaching the edge.", Buckets: ttftBuckets,
		}, []string{"model", "path"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "iop_request_duration_seconds", Help: "Time from a request's arrival to the end of its response.", Buckets: durationBuckets,
		}, []string{"model", "api"}),
		interToken: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "iop_inter_token_latency_seconds", Help: "Mean time between output tokens of one request (first to last), observed once per request.", Buckets: interTokenBuckets,
		}, []string{"model", "path"}),
		inputTokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "iop_input_tokens_total", Help: "Prompt tokens of finished requests whose usage is known.",
		}, []string{"model"}),
		outputTokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "iop_output_tokens_total", Help: "Completion tokens of finished requests whose usage is known.",
		}, []string{"model"}),
		runsInFlight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "iop_runs_in_flight", Help: "Runs admitted and not yet ended, by requested model.",
		}, []string{"model"}),
		runsEnded: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "iop_runs_ended_total", Help: "Runs ended, by why they ended (edge.EndReason: complete, closed, node_gone, ...).",
		}, []string{"reason"}),
		connects: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "iop_node_connects_total", Help: "Node connections accepted (each a new generation).",
		}, []string{"node"}),
		fences: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "iop_node_fences_total", Help: "Node connections fenced, by why they ended.",
		}, []string{"node", "reason"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "iop_dispatch_retries_total", Help: "Dispatches that failed before their run started and were admitted again.",
		}, []string{"model", "reason"}),
		flowAdmits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "iop_flow_admissions_total", Help: "Requests admitted to a slot (at once or after queueing), by requested model, flow and priority.",
		}, []string{"model", "flow", "priority"}),
		flowSheds: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "iop_flow_sheds_total", Help: "Sheddable requests shed, by requested model, flow and reason (displaced, expected_wait).",
		}, []string{"model", "flow", "reason"}),
		prefixPrompt: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "iop_prefix_prompt_tokens_total", Help: "Prompt tokens (full 16-token blocks of 64 characters) of runs admitted with routing prefix, by requested model.",
		}, []string{"model"}),
		prefixPredicted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "iop_prefix_predicted_tokens_total", Help: "Prompt tokens of runs admitted with routing prefix that the router expected the chosen provider to hold in its cache, by requested model; divided by iop_prefix_prompt_tokens_total, the predicted prefix hit ratio.",
		}, []string{"model"}),
		flowNames: make(map[string]struct{}),
		nodeGen:   make(map[string]uint64),
		reasons:   make(map[string][]string),
		gone:      make(map[string]time.Time),
	}
	for _, c := range []prometheus.Collector{m.requests, m.admissions, m.queueWait, m.ttft, m.duration, m.interToken,
		m.inputTokens, m.outputTokens, m.runsInFlight, m.runsEnded, m.connects, m.fences, m.retries, m.flowAdmits, m.flowSheds,
		m.prefixPrompt, m.prefixPredicted, newSnapshotCollector(snap)} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	for _, r := range edge.EndReasons() {
		m.runsEnded.WithLabelValues(string(r)) // every reason has its series from the start
	}
	return m, nil
}

// knownModel returns rec's model for a label, or "" when the edge never
// knew it (see the package doc).
func knownModel(rec observe.RequestRecord) string {
	switch rec.Admission {
	case "", contract.AdmissionUnknownModel, contract.AdmissionCancelled:
		return ""
	}
	return rec.Model
}

// MaxFlowLabels bounds the flow label values taken from clients' headers
// or bodies (see the package doc).
const MaxFlowLabels = 100

// flowLabel is rec's flow as a label value: a key's name as it is; a
// client-named flow as it is while fewer than MaxFlowLabels have been
// seen, else "other".
func (m *Metrics) flowLabel(rec observe.RequestRecord) string {
	if !utf8.ValidString(rec.Flow) {
		// A label must be UTF-8 (client_golang panics otherwise); the API
		// layer gives valid names, this keeps a stray one from taking the
		// request's bookkeeping down.
		return "other"
	}
	if rec.FlowFromKey {
		return rec.Flow
	}
	m.flowMu.Lock()
	defer m.flowMu.Unlock()
	if _, ok := m.flowNames[rec.Flow]; ok {
		return rec.Flow
	}
	if len(m.flowNames) >= MaxFlowLabels {
		return "other"
	}
	m.flowNames[rec.Flow] = struct{}{}
	return rec.Flow
}

// observeSeconds adds d, in seconds, to the histogram o, with the exemplar
// {trace_id="<32 hex digits>"} when the request's trace was sampled
// (traceID not ""), so that a slow bucket leads to a trace. Exemplars are
// exposed in the OpenMetrics format only.
func observeSeconds(o prometheus.Observer, d time.Duration, traceID string) {
	if traceID != "" {
		if eo, ok := o.(prometheus.ExemplarObserver); ok {
			eo.ObserveWithExemplar(d.Seconds(), prometheus.Labels{"trace_id": traceID})
			return
		}
	}
	o.Observe(d.Seconds())
}

// RequestDone counts one finished API request.
func (m *Metrics) RequestDone(rec observe.RequestRecord) {
	model := knownModel(rec)
	m.requests.WithLabelValues(model, rec.API, rec.Outcome.String(), strconv.Itoa(rec.Status)).Inc()
	observeSeconds(m.duration.WithLabelValues(model, rec.API), rec.Duration, rec.TraceID)
	if rec.Admission != "" {
		m.admissions.WithLabelValues(model, rec.Admission.String()).Inc()
	}
	switch rec.Admission {
	case contract.AdmissionImmediate, contract.AdmissionQueued:
		m.flowAdmits.WithLabelValues(model, m.flowLabel(rec), rec.Priority).Inc()
	case contract.AdmissionShed:
		m.flowSheds.WithLabelValues(model, m.flowLabel(rec), rec.ShedReason).Inc()
	}
	if rec.RunID == "" {
		return
	}
	observeSeconds(m.queueWait.WithLabelValues(model), rec.QueueWait, rec.TraceID)
	if rec.TimeToFirstToken > 0 {
		observeSeconds(m.ttft.WithLabelValues(model, rec.Path), rec.TimeToFirstToken, rec.TraceID)
	}
	if rec.InterTokenLatency > 0 {
		m.interToken.WithLabelValues(model, rec.Path).Observe(rec.InterTokenLatency.Seconds())
	}
	if rec.TokensKnown {
		m.inputTokens.WithLabelValues(model).Add(float64(rec.InputTokens))
		m.outputTokens.WithLabelValues(model).Add(float64(rec.OutputTokens))
	}
}

// Observe counts node connects and fences, dispatch retries and runs in
// flight from the edge's lifecycle events.
func (m *Metrics) Observe(e lifecycle.Event) {
	switch e.Type {
	case lifecycle.NodeConnected, lifecycle.NodeFenced:
		m.observeNode(e)
	case lifecycle.DispatchRetried:
		m.retries.WithLabelValues(e.Model, e.Reason).Inc()
	case lifecycle.RunAdmitted:
		m.runsInFlight.WithLabelValues(e.Model).Inc()
		if e.PrefixPromptTokens > 0 {
			m.prefixPrompt.WithLabelValues(e.Model).Add(float64(e.PrefixPromptTokens))
			m.prefixPredicted.WithLabelValues(e.Model).Add(float64(e.PrefixPredictedTokens))
		}
	case lifecycle.RunEnded:
		m.runsInFlight.WithLabelValues(e.Model).Dec()
		m.runsEnded.WithLabelValues(e.Reason).Inc()
	}
}

// observeNode counts a node connect or fence, keeps track of which nodes
// are gone, and deletes the label values of nodes gone edge.ForgetAfter
// before e.
func (m *Metrics) observeNode(e lifecycle.Event) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if e.Type == lifecycle.NodeConnected {
		m.connects.WithLabelValues(e.NodeID).Inc()
		m.nodeGen[e.NodeID] = max(m.nodeGen[e.NodeID], e.Generation)
		delete(m.gone, e.NodeID)
	} else {
		m.fences.WithLabelValues(e.NodeID, e.Reason).Inc()
		if !slices.Contains(m.reasons[e.NodeID], e.Reason) {
			m.reasons[e.NodeID] = append(m.reasons[e.NodeID], e.Reason)
		}
		// A superseded connection's fence, after its successor connected,
		// leaves the node live.
		if e.Generation >= m.nodeGen[e.NodeID] {
			m.nodeGen[e.NodeID] = e.Generation
			m.gone[e.NodeID] = e.Time
			m.expiry = append(m.expiry, goneNode{e.NodeID, e.Time})
		}
	}
	n := 0
	for _, g := range m.expiry {
		if e.Time.Sub(g.at) < edge.ForgetAfter {
			break
		}
		n++
		if at, ok := m.gone[g.node]; ok && at.Equal(g.at) {
			m.connects.DeleteLabelValues(g.node)
			for _, r := range m.reasons[g.node] {
				m.fences.DeleteLabelValues(g.node, r)
			}
			delete(m.reasons, g.node)
			delete(m.gone, g.node)
			delete(m.nodeGen, g.node)
		}
	}
	// Drop the expired head; when it was most of the queue, copy the rest
	// so the old array is freed (O(1) per entry dropped).
	if n > 0 && len(m.expiry)-n < len(m.expiry)/4 {
		m.expiry = slices.Clone(m.expiry[n:])
	} else {
		m.expiry = m.expiry[n:]
	}
}
