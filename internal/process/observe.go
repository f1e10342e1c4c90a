package process

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"iop/internal/clock"
	"iop/internal/edge"
	"iop/internal/edge/api"
	"iop/internal/edge/api/admin"
	"iop/internal/edge/api/observe"
	"iop/internal/edge/contract"
	"iop/internal/edge/history"
	"iop/internal/edge/lifecycle"
	"iop/internal/edge/metrics"
	"iop/internal/tracing"
)

// observability is an edge's metrics registry and lifecycle event hub, and
// the hooks that feed them.
type observability struct {
	registry *prometheus.Registry
	hub      *lifecycle.Hub
	metrics  *metrics.Metrics
	svc      *edge.Service // set by attach, before the edge serves

	history *history.History // per-second aggregates for the dashboard; sampling from Start
}

// newObservability creates the registry (with the Go runtime and process
// collectors), the edge's metrics and the event hub.
func newObservability() (*observability, error) {
	o := &observability{registry: prometheus.NewRegistry(), hub: lifecycle.NewHub(nil)}
	if err := o.registry.Register(collectors.NewGoCollector()); err != nil {
		return nil, err
	}
	if err := o.registry.Register(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})); err != nil {
		return nil, err
	}
	m, err := metrics.New(o.registry, o)
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	o.metrics = m
	o.history = history.New(clock.Real(), o)
	return o, nil
}

// Snapshot is the edge's snapshot, for the scrape-time gauges.
func (o *observability) Snapshot() contract.Snapshot { return o.svc.Snapshot() }

// observer is what the edge service reports lifecycle events to.
func (o *observability) observer() lifecycle.Observer {
	return lifecycle.Observers{o.metrics, o.hub}
}

// RequestDone feeds a finished API request to the metrics and the
// history, and a refused one (by admission or by its key's limits) to the
// event stream (the dashboard's recent refusals), once each.
func (o *observability) RequestDone(rec observe.RequestRecord) {
	o.metrics.RequestDone(rec)
	o.history.RequestDone(rec)
	if rec.Outcome == contract.OutcomeRefused {
		model, reason := rec.Model, history.RefusalReason(rec) // its admission, or a key's limit
		if rec.Admission == "" || rec.Admission == contract.AdmissionUnknownModel {
			model = "" // a client's string, not (yet) a model the edge knows
		}
		o.hub.Publish(lifecycle.Event{Type: lifecycle.RequestRefused, RequestID: rec.RequestID, Model: model,
			Reason: reason, Outcome: rec.Outcome.String(), Status: rec.Status})
	}
}

// apiConfig adds the observability hooks to cfg: the request observer
// and the /metrics handler.
func (o *observability) apiConfig(cfg api.Config) api.Config {
	cfg.Observer = o
	// OpenMetrics when the scraper asks for it: only that format carries
	// the latency histograms' exemplars (their trace ids).
	cfg.Metrics = promhttp.HandlerFor(o.registry, promhttp.HandlerOpts{EnableOpenMetrics: true})
	return cfg
}

// adminConfig adds the observability routes' sources to cfg: the events
// stream and the history.
func (o *observability) adminConfig(cfg admin.Config) admin.Config {
	cfg.Events = o.hub
	cfg.History = o.history
	return cfg
}

// shutdownTracing exports the spans t still buffers, for at most
// tracing.ShutdownTimeout, and logs a failure.
func shutdownTracing(t *tracing.Tracing, logger *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), tracing.ShutdownTimeout)
	defer cancel()
	if err := t.Shutdown(ctx); err != nil {
		logger.Warn("tracing: the last spans were not exported", "err", err)
	}
}
