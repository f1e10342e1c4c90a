package metrics

import (
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"iop/internal/edge"
	"iop/internal/edge/api/observe"
	"iop/internal/edge/contract"
	"iop/internal/edge/lifecycle"
)

type fixedSnapshot contract.Snapshot

func (s fixedSnapshot) Snapshot() contract.Snapshot { return contract.Snapshot(s) }

// series gathers reg into "name{k=v,...} value" lines, histograms as their
// sample count.
func series(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range fams {
		for _, m := range f.GetMetric() {
			var ls []string
			for _, l := range m.GetLabel() {
				ls = append(ls, l.GetName()+"="+l.GetValue())
			}
			sort.Strings(ls)
			v := m.GetCounter().GetValue() + m.GetGauge().GetValue() + float64(m.GetHistogram().GetSampleCount())
			out[f.GetName()+"{"+strings.Join(ls, ",")+"}"] = v
		}
	}
	return out
}

func TestMetricsFromRecordsEventsAndSnapshot(t *testing.T) {
	reg := prometheus.NewRegistry()
	snap := fixedSnapshot{
		Nodes: []contract.NodeSnapshot{{NodeID: "n1"}},
		Providers: []contract.ProviderSnapshot{
			{NodeID: "n1", ProviderID: "p", Capacity: 4, InFlight: 3, Queued: 2, Healthy: true, Status: "available", Circuit: edge.CircuitClosed},
			{NodeID: "n1", ProviderID: "q", Capacity: 1, Healthy: true, Status: "available", Circuit: edge.CircuitOpen},
		},
		Queues: []contract.QueueSnapshot{{Model: "m", MaxQueue: 16, Queued: 2}},
	}
	m, err := New(reg, snap)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := New(reg, snap); err == nil {
		t.Fatal("registering twice on one registry succeeded")
	}
	m.RequestDone(observe.RequestRecord{API: "chat.completions", Model: "m", RunID: "r", Path: "tunnel", Admission: contract.AdmissionQueued,
		QueueWait: time.Second, Status: 200, Outcome: contract.OutcomeCompleted, Duration: 3 * time.Second,
		TimeToFirstToken: time.Second, InterTokenLatency: 10 * time.Millisecond, InputTokens: 7, OutputTokens: 9, TokensKnown: true})
	// A client's unknown model name never becomes a label.
	m.RequestDone(observe.RequestRecord{API: "chat.completions", Model: "attacker-chosen", Admission: contract.AdmissionUnknownModel, Status: 404, Outcome: contract.OutcomeRefused})
	m.RequestDone(observe.RequestRecord{API: "chat.completions", Model: "also-chosen", Status: 400, Outcome: contract.OutcomeInvalidRequest})
	m.Observe(lifecycle.Event{Type: lifecycle.NodeConnected, NodeID: "n1"})
	m.Observe(lifecycle.Event{Type: lifecycle.NodeFenced, NodeID: "n1", Reason: "heartbeats missed"})
	m.Observe(lifecycle.Event{Type: lifecycle.DispatchRetried, Model: "m", Reason: "stale generation"})
	m.Observe(lifecycle.Event{Type: lifecycle.RunAdmitted, Model: "m"})
	m.Observe(lifecycle.Event{Type: lifecycle.RunAdmitted, Model: "m"})
	m.Observe(lifecycle.Event{Type: lifecycle.RunEnded, Model: "m"})

	got := series(t, reg)
	want := map[string]float64{
		"iop_requests_total{api=chat.completions,model=m,outcome=completed,status=200}":      1,
		"iop_requests_total{api=chat.completions,model=,outcome=refused,status=404}":         1,
		"iop_requests_total{api=chat.completions,model=,outcome=invalid_request,status=400}": 1,
		"iop_admissions_total{model=m,reason=queued}":                                        1,
		"iop_admissions_total{model=,reason=unknown_model}":                                  1,
		"iop_queue_wait_seconds{model=m}":                                                    1,
		"iop_time_to_first_token_seconds{model=m,path=tunnel}":                               1,
		"iop_inter_token_latency_seconds{model=m,path=tunnel}":                               1,
		"iop_request_duration_seconds{api=chat.completions,model=m}":                         1,
		"iop_request_duration_seconds{api=chat.completions,model=}":                          2,
		"iop_input_tokens_total{model=m}":                                                    7,
		"iop_output_tokens_total{model=m}":                                                   9,
		"iop_runs_in_flight{model=m}":                                                        1,
		"iop_node_connects_total{node=n1}":                                                   1,
		"iop_node_fences_total{node=n1,reason=heartbeats missed}":                            1,
		"iop_dispatch_retries_total{model=m,reason=stale generation}":                        1,
		"iop_nodes_connected{}":                                                              1,
		"iop_provider_in_flight{node=n1,provider=p}":                                         3,
		"iop_provider_capacity{node=n1,provider=p}":                                          4,
		"iop_provider_queued{node=n1,provider=p}":                                            2,
		"iop_provider_healthy{node=n1,provider=p}":                                           1,
		"iop_provider_circuit_open{node=n1,provider=p}":                                      0,
		"iop_provider_circuit_open{node=n1,provider=q}":                                      1,
		"iop_queue_depth{model=m}":                                                           2,
		"iop_queue_max{model=m}":                                                             16,
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v, want %v", k, got[k], v)
		}
	}
	for k := range got {
		if strings.Contains(k, "chosen") {
			t.Errorf("a client's model name became a label: %s", k)
		}
	}
}

// TestOrphanProviderExportsNoCapacity: a provider whose node is gone keeps
// its in-flight and health series (0) but no capacity ones, so summing
// iop_provider_capacity counts the capacity of live nodes only; a draining
// provider is not healthy (it takes no new requests) but still has its
// capacity.
func TestOrphanProviderExportsNoCapacity(t *testing.T) {
	reg := prometheus.NewRegistry()
	snap := fixedSnapshot{Providers: []contract.ProviderSnapshot{
		{NodeID: "live", ProviderID: "p", Capacity: 4, LongCapacity: 2, Healthy: true, Status: "available", Circuit: edge.CircuitClosed},
		{NodeID: "gone", ProviderID: "p", Capacity: 8, LongCapacity: 8, Status: "orphan", Circuit: edge.CircuitClosed},
		{NodeID: "leaving", ProviderID: "p", Capacity: 2, LongCapacity: 2, Healthy: true, Status: edge.StatusDraining, Circuit: edge.CircuitClosed},
	}}
	if _, err := New(reg, snap); err != nil {
		t.Fatal(err)
	}
	got := series(t, reg)
	for k, want := range map[string]float64{
		"iop_provider_capacity{node=live,provider=p}":         4,
		"iop_provider_long_capacity{node=live,provider=p}":    2,
		"iop_provider_healthy{node=live,provider=p}":          1,
		"iop_provider_in_flight{node=gone,provider=p}":        0,
		"iop_provider_healthy{node=gone,provider=p}":          0,
		"iop_provider_capacity{node=leaving,provider=p}":      2,
		"iop_provider_long_capacity{node=leaving,provider=p}": 2,
		"iop_provider_healthy{node=leaving,provider=p}":       0,
	} {
		if v, ok := got[k]; !ok || v != want {
			t.Errorf("%s = %v (present %v), want %v", k, v, ok, want)
		}
	}
	for _, k := range []string{"iop_provider_capacity{node=gone,provider=p}", "iop_provider_long_capacity{node=gone,provider=p}"} {
		if v, ok := got[k]; ok {
			t.Errorf("orphan exports %s = %v", k, v)
		}
	}
}

// TestFlowAdmissionsAndSheds: admitted requests count in
// iop_flow_admissions_total{model,flow,priority}, shed ones in
// iop_flow_sheds_total{model,flow,reason}; a key's flow keeps its name
// however many there are, while past MaxFlowLabels client-named flows
// count as flow="other".
func TestFlowAdmissionsAndSheds(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := New(reg, fixedSnapshot{})
	if err != nil {
		t.Fatal(err)
	}
	m.RequestDone(observe.RequestRecord{Model: "m", Admission: contract.AdmissionImmediate, Flow: "alice", FlowFromKey: true, Priority: "critical"})
	m.RequestDone(observe.RequestRecord{Model: "m", Admission: contract.AdmissionQueued, Flow: "alice", FlowFromKey: true, Priority: "critical"})
	m.RequestDone(observe.RequestRecord{Model: "m", Admission: contract.AdmissionShed, ShedReason: "displaced", Flow: "bob", FlowFromKey: true, Priority: "sheddable"})
	m.RequestDone(observe.RequestRecord{Model: "m", Admission: contract.AdmissionQueueFull, Flow: "bob", FlowFromKey: true, Priority: "standard"})
	for i := range MaxFlowLabels + 5 {
		m.RequestDone(observe.RequestRecord{Model: "m", Admission: contract.AdmissionImmediate, Flow: fmt.Sprintf("user-%d", i), Priority: "standard"})
	}
	m.RequestDone(observe.RequestRecord{Model: "m", Admission: contract.AdmissionImmediate, Flow: "user-0", Priority: "standard"})
	m.RequestDone(observe.RequestRecord{Model: "m", Admission: contract.AdmissionImmediate, Flow: "carol", FlowFromKey: true, Priority: "standard"})
	m.RequestDone(observe.RequestRecord{Model: "m", Admission: contract.AdmissionImmediate, Flow: "bad\xc3", Priority: "standard"}) // no panic: counted as other
	got := series(t, reg)
	for name, want := range map[string]float64{
		"iop_flow_admissions_total{flow=alice,model=m,priority=critical}":    2,
		"iop_flow_sheds_total{flow=bob,model=m,reason=displaced}":            1,
		"iop_flow_admissions_total{flow=user-0,model=m,priority=standard}":   2,
		"iop_flow_admissions_total{flow=other,model=m,priority=standard}":    6,
		"iop_flow_admissions_total{flow=carol,model=m,priority=standard}":    1,
		"iop_flow_admissions_total{flow=user-104,model=m,priority=standard}": 0,
	} {
		if got[name] != want {
			t.Errorf("%s = %v, want %v", name, got[name], want)
		}
	}
	flows := 0
	for name := range got {
		if strings.HasPrefix(name, "iop_flow_admissions_total{") {
			flows++
		}
	}
	if flows != MaxFlowLabels+3 { // alice, carol, other and the first MaxFlowLabels users
		t.Errorf("%d flow admission series, want %d", flows, MaxFlowLabels+3)
	}
}

// TestEveryEndReasonHasAMetricsLabel: iop_runs_ended_total has a series
// for every edge.EndReason from the start (at 0), and a run_ended event
// counts on its reason's.
func TestEveryEndReasonHasAMetricsLabel(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	m, err := New(reg, fixedSnapshot{})
	if err != nil {
		t.Fatal(err)
	}
	m.Observe(lifecycle.Event{Type: lifecycle.RunEnded, Model: "m", Reason: string(edge.EndNodeGone)})
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := make(map[string]float64)
	for _, f := range families {
		if f.GetName() != "iop_runs_ended_total" {
			continue
		}
		for _, mt := range f.GetMetric() {
			for _, l := range mt.GetLabel() {
				if l.GetName() == "reason" {
					got[l.GetValue()] = mt.GetCounter().GetValue()
				}
			}
		}
	}
	for _, r := range edge.EndReasons() {
		v, ok := got[string(r)]
		want := 0.0
		if r == edge.EndNodeGone {
			want = 1
		}
		if !ok || v != want {
			t.Errorf("iop_runs_ended_total{reason=%q} = %v (present %v), want %v", r, v, ok, want)
		}
	}
	if len(got) != len(edge.EndReasons()) {
		t.Errorf("iop_runs_ended_total has %d reasons, want %d: %v", len(got), len(edge.EndReasons()), got)
	}
}
