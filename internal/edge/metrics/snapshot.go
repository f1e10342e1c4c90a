package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"iop/internal/edge"
	"iop/internal/scheduler"
)

// snapshotCollector reads the scheduler-mirroring gauges from one edge
// Snapshot per scrape.
type snapshotCollector struct {
	snap Snapshotter

	nodes, inFlight, capacity, longInFlight, longCapacity, queued, healthy, circuitOpen, queueDepth, queueMax *prometheus.Desc
}

func newSnapshotCollector(snap Snapshotter) *snapshotCollector {
	provider := []string{"node", "provider"}
	return &snapshotCollector{
		snap:         snap,
		nodes:        prometheus.NewDesc("iop_nodes_connected", "Nodes with a live connection.", nil, nil),
		inFlight:     prometheus.NewDesc("iop_provider_in_flight", "Requests holding a slot of the provider.", provider, nil),
		capacity:     prometheus.NewDesc("iop_provider_capacity", "Concurrent requests the provider takes.", provider, nil),
		longInFlight: prometheus.NewDesc("iop_provider_long_in_flight", "Long-context requests holding a slot of the provider.", provider, nil),
		longCapacity: prometheus.NewDesc("iop_provider_long_capacity", "Concurrent long-context requests the provider takes.", provider, nil),
		queued:       prometheus.NewDesc("iop_provider_queued", "Queued requests that could use the provider.", provider, nil),
		healthy:      prometheus.NewDesc("iop_provider_healthy", "1 when the provider is healthy, its node connected and not draining, else 0.", provider, nil),
		circuitOpen:  prometheus.NewDesc("iop_provider_circuit_open", "1 while the provider's circuit breaker keeps it out of rotation (open or half-open), else 0.", provider, nil),
		queueDepth:   prometheus.NewDesc("iop_queue_depth", "Requests waiting in the model's queue.", []string{"model"}, nil),
		queueMax:     prometheus.NewDesc("iop_queue_max", "The model queue's max_queue.", []string{"model"}, nil),
	}
}

func (c *snapshotCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.nodes, c.inFlight, c.capacity, c.longInFlight, c.longCapacity, c.queued, c.healthy, c.circuitOpen, c.queueDepth, c.queueMax} {
		ch <- d
	}
}

func (c *snapshotCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.snap.Snapshot()
	ch <- prometheus.MustNewConstMetric(c.nodes, prometheus.GaugeValue, float64(len(s.Nodes)))
	for _, p := range s.Providers {
		healthy, open := 0.0, 0.0
		if p.Healthy && p.Status == "available" {
			healthy = 1
		}
		if p.Circuit != "" && p.Circuit != edge.CircuitClosed {
			open = 1
		}
		gauges := []struct {
			d *prometheus.Desc
			v float64
		}{
			{c.inFlight, float64(p.InFlight)}, {c.longInFlight, float64(p.LongInFlight)},
			{c.queued, float64(p.Queued)}, {c.healthy, healthy}, {c.circuitOpen, open},
		}
		// An orphan's capacity is no longer there: a sum of
		// iop_provider_capacity counts only providers of live nodes.
		if p.Status != scheduler.StatusOrphan {
			gauges = append(gauges, []struct {
				d *prometheus.Desc
				v float64
			}{{c.capacity, float64(p.Capacity)}, {c.longCapacity, float64(p.LongCapacity)}}...)
		}
		for _, v := range gauges {
			ch <- prometheus.MustNewConstMetric(v.d, prometheus.GaugeValue, v.v, p.NodeID, p.ProviderID)
		}
	}
	for _, q := range s.Queues {
		ch <- prometheus.MustNewConstMetric(c.queueDepth, prometheus.GaugeValue, float64(q.Queued), q.Model)
		ch <- prometheus.MustNewConstMetric(c.queueMax, prometheus.GaugeValue, float64(q.MaxQueue), q.Model)
	}
}
