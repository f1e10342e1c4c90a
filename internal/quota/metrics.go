package quota

import "github.com/prometheus/client_golang/prometheus"

// Collector exports a Ledger's windows to Prometheus, read at each
// scrape:
//
//	iop_quota_limit{scope,name,window,unit}      the window's limit
//	iop_quota_remaining{scope,name,window,unit}  limit − (settled + reserved), ≥ 0
//
// scope is "key" or "team"; unit is the window's Unit (tokens, requests,
// gpu_ms, micros). Only limited windows are exported.
type Collector struct {
	l                *Ledger
	limit, remaining *prometheus.Desc
}

var _ prometheus.Collector = (*Collector)(nil)

// NewCollector returns the Collector of l; register it on the edge's
// registry.
func NewCollector(l *Ledger) *Collector {
	labels := []string{"scope", "name", "window", "unit"}
	return &Collector{l: l,
		limit:     prometheus.NewDesc("iop_quota_limit", "A quota window's limit, in its unit.", labels, nil),
		remaining: prometheus.NewDesc("iop_quota_remaining", "A quota window's limit minus what is settled in it and reserved now, in its unit.", labels, nil),
	}
}

// Describe sends the two descriptors.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.limit
	ch <- c.remaining
}

// Collect sends every limited window of every key and team.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	for _, s := range c.l.All() {
		lv := []string{s.Scope, s.Name, s.Window.Name, s.Window.Unit}
		ch <- prometheus.MustNewConstMetric(c.limit, prometheus.GaugeValue, float64(s.Limit), lv...)
		ch <- prometheus.MustNewConstMetric(c.remaining, prometheus.GaugeValue, float64(s.Remaining()), lv...)
	}
}
