package e2e

import (
	"context"
	"testing"

	"iop/internal/e2e/harness"
	"iop/internal/edge/contract"
	"iop/internal/node"
	"iop/internal/process"
	"iop/internal/sim"
)

// TestMetricsOrphanProviderHasNoCapacity: once a node is gone, /metrics no
// longer exports the capacity of its provider (the edge cannot send it
// anything: summing iop_provider_capacity must count live nodes only) and
// says it is not healthy, while the provider of the node still connected
// keeps its series.
func TestMetricsOrphanProviderHasNoCapacity(t *testing.T) {
	harness.Parallel(t)
	_, url := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOllama, Models: []string{"m"}})
	e, ctx := startFaultEdge(t, process.DefaultEdgeFile())
	harness.Node(t, ctx, node.Config{NodeID: "stays", Edge: e.NodeAddr, Providers: []node.ProviderConfig{
		{ID: "p", Type: node.TypeOllama, BaseURL: url, Models: []string{"m"}, Capacity: 3}}})
	goneCtx, stopGone := context.WithCancel(ctx)
	harness.Node(t, goneCtx, node.Config{NodeID: "goes", Edge: e.NodeAddr, Providers: []node.ProviderConfig{
		{ID: "p", Type: node.TypeOllama, BaseURL: url, Models: []string{"m"}, Capacity: 5}}})
	fams := scrape(t, e)
	for _, labels := range []string{"node=goes,provider=p", "node=stays,provider=p"} {
		if _, ok := metricValue(fams, "iop_provider_capacity", labels); !ok {
			t.Fatalf("no iop_provider_capacity{%s} while both nodes are connected", labels)
		}
	}

	stopGone()
	waitSnapshot(t, e, func(s contract.Snapshot) bool { return nodeGeneration(s, "goes") == 0 })
	fams = scrape(t, e)
	for _, name := range []string{"iop_provider_capacity", "iop_provider_long_capacity"} {
		if v, ok := metricValue(fams, name, "node=goes,provider=p"); ok {
			t.Errorf("%s{node=goes} = %v after its node is gone", name, v)
		}
	}
	if v, ok := metricValue(fams, "iop_provider_healthy", "node=goes,provider=p"); ok && v != 0 {
		t.Errorf("iop_provider_healthy{node=goes} = %v after its node is gone", v)
	}
	if v, _ := metricValue(fams, "iop_provider_capacity", "node=stays,provider=p"); v != 3 {
		t.Errorf("iop_provider_capacity{node=stays} = %v, want 3", v)
	}
	if got := familySum(fams, "iop_provider_capacity"); got != 3 {
		t.Errorf("total capacity %v, want 3 (the live node's)", got)
	}
}
