package e2e

// Tracing tests: real `iop edge` (tracing by the
// OTEL_* environment) and `iop node` (tracing by its config file's
// tracing: section) processes, in front of two sims served by the test
// (OpenAI protocol: tunnel path; Ollama protocol: normalized path; each
// records the traceparent it gets), export to a real OTLP receiver of the
// test, over gRPC and over HTTP (protobuf).

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	tracev1 "go.opentelemetry.io/proto/otlp/trace/v1"

	"iop/internal/e2e/harness"
	"iop/internal/sim"
	"iop/internal/testenv"
)

// The canaries: secrets of the client (its prompt, its Authorization
// header, a tool call's arguments) and of the operator (the provider's API
// key). None may appear anywhere in what is exported.
const (
	canaryPrompt      = "CANARY-prompt-7f3a19"
	canaryAuth        = "CANARY-auth-91c2e4"
	canaryToolArg     = "CANARY-toolarg-55d0b8"
	canaryProviderKey = "CANARY-provkey-c0de77"
)

// traceparentRecorder serves an in-process `iop sim` (package sim) on
// loopback HTTP and records the traceparent header of every request the
// sim gets.
type traceparentRecorder struct {
	mu   sync.Mutex
	seen []string
}

// serveSim serves a sim of protocol for model, which wants the provider
// key canaryProviderKey, and returns its URL.
func (rec *traceparentRecorder) serveSim(t *testing.T, protocol sim.Protocol, model string) string {
	t.Helper()
	s, err := sim.New(sim.Config{Protocol: protocol, Models: []string{model}, TokensPerSecond: 2000, APIKey: canaryProviderKey}, nil)
	if err != nil {
		t.Fatal(err)
	}
	h := s.Handler()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			rec.mu.Lock()
			rec.seen = append(rec.seen, r.Header.Get("Traceparent"))
			rec.mu.Unlock()
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

func (rec *traceparentRecorder) all() []string {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return slices.Clone(rec.seen)
}

// startTracedProcess runs bin as harness.StartProgram does, with env added
// to the test's.
func startTracedProcess(t *testing.T, name, bin string, env []string, args ...string) *harness.Command {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	return harness.StartCmd(t, nil, name, cmd)
}

// tracedChat is a chat request body for model whose prompt, and a tool
// call's arguments, carry the canaries.
func tracedChat(model string, stream bool) string {
	body := map[string]any{
		"model":      model,
		"stream":     stream,
		"max_tokens": 6,
		"messages": []any{
			map[string]any{"role": "user", "content": "what is the weather? " + canaryPrompt},
			map[string]any{"role": "assistant", "content": nil, "tool_calls": []any{map[string]any{
				"id": "call_1", "type": "function",
				"function": map[string]any{"name": "weather", "arguments": `{"city":"` + canaryToolArg + `"}`},
			}}},
			map[string]any{"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
		},
		"tools": []any{map[string]any{"type": "function", "function": map[string]any{
			"name": "weather", "parameters": map[string]any{"type": "object", "properties": map[string]any{"city": map[string]any{"type": "string"}}},
		}}},
	}
	if stream {
		body["stream_options"] = map[string]any{"include_usage": true}
	}
	b, _ := json.Marshal(body)
	return string(b)
}

// postTracedChat posts body to the edge with the canary Authorization and, if
// set, a traceparent; it reads the whole answer and wants 200.
func postTracedChat(t *testing.T, base, body, traceparent string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+canaryAuth)
	if traceparent != "" {
		req.Header.Set("Traceparent", traceparent)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("POST /v1/chat/completions: %d %v: %s", resp.StatusCode, err, b)
	}
}

// TestTracesAcrossEdgeNodeProvider: one trace per request across the
// edge, the node and the provider call, over both OTLP protocols. A
// client's sampled traceparent is continued (its trace id, the edge span's
// parent); without one a trace starts at the edge; an unsampled one is not
// exported but still reaches the provider. The edge span is the server
// span "chat <model>" with its events in order within it, GenAI and iop
// attributes; the node's run span is its child and the provider call (a
// client span) the run's; each child lies within its parent; the provider
// sees a traceparent naming the provider call's span; the request's log
// line and the latency histograms' exemplars carry the trace id; and no
// canary secret appears anywhere in what was exported.
func TestTracesAcrossEdgeNodeProvider(t *testing.T) {
	harness.Parallel(t)
	bin := harness.IOP(t)
	for _, protocol := range []string{"grpc", "http/protobuf"} {
		t.Run(strings.ReplaceAll(protocol, "/", "_"), func(t *testing.T) {
			testTraces(t, bin, protocol)
		})
	}
}

func testTraces(t *testing.T, bin, protocol string) {
	recv, endpoint := startOTLPReceiver(t, protocol)
	var oaSeen, olSeen traceparentRecorder
	oaURL := oaSeen.serveSim(t, sim.ProtocolOpenAI, "oa-m")
	olURL := olSeen.serveSim(t, sim.ProtocolOllama, "ol-m")

	// The edge traces by the environment.
	httpAddr, nodeAddr := testenv.ProcessAddr(t), testenv.ProcessAddr(t)
	edgeEnv := []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + endpoint, "OTEL_EXPORTER_OTLP_PROTOCOL=" + protocol,
		"OTEL_BSP_SCHEDULE_DELAY=20", "OTEL_SERVICE_NAME="}
	edgeProc := startTracedProcess(t, "edge", bin, edgeEnv, "edge", "--listen", httpAddr, "--node-listen", nodeAddr,
		"--database", ":memory:", "--log-format", "json", "--log-level", "info")
	base := "http://" + httpAddr
	testenv.Eventually(t, "the edge answers", func() bool { return getStatus(base+"/healthz") == http.StatusOK })

	// The node traces by its config file; the environment names no endpoint.
	cfgPath := filepath.Join(t.TempDir(), "node.yaml")
	yaml := fmt.Sprintf(`node_id: tn
edge: %s
reconnect_min: 50ms
reconnect_max: 200ms
tracing: {endpoint: %q, protocol: %s}
providers:
  - {id: oa, type: sim, protocol: openai, base_url: %q, models: [oa-m], capacity: 4, capabilities: [tools], api_key_env: IOP_TRACES_TEST_KEY}
  - {id: ol, type: sim, protocol: ollama, base_url: %q, models: [ol-m], capacity: 4, capabilities: [tools], api_key_env: IOP_TRACES_TEST_KEY}
`, nodeAddr, endpoint, protocol, oaURL+"/v1", olURL)
	if err := os.WriteFile(cfgPath, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	startTracedProcess(t, "node", bin, []string{"IOP_TRACES_TEST_KEY=" + canaryProviderKey, "OTEL_BSP_SCHEDULE_DELAY=20",
		"OTEL_EXPORTER_OTLP_ENDPOINT=", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT="},
		"node", "--config", cfgPath, "--log-level", "warn")
	testenv.Eventually(t, "node tn's providers in rotation", func() bool { return len(fetchView(t, base).Providers) == 2 })

	const (
		clientTrace    = "4bf92f3577b34da6a3ce929d0e0e4736"
		clientSpan     = "00f067aa0ba902b7"
		unsampledTrace = "7a3c5e1d2b4f69880a1b2c3d4e5f6071"
	)
	// Unsampled first: its spans, were any exported, would come before the others'.
	postTracedChat(t, base, tracedChat("oa-m", false), "00-"+unsampledTrace+"-"+clientSpan+"-00")
	postTracedChat(t, base, tracedChat("oa-m", true), "00-"+clientTrace+"-"+clientSpan+"-01")
	postTracedChat(t, base, tracedChat("ol-m", false), "")

	// The edge span of the request that came without a trace context.
	var started string
	testenv.Eventually(t, "the three spans of both sampled requests exported", func() bool {
		spans := recv.snapshot()
		started = ""
		for _, s := range spans {
			if s.service == "iop-edge" && s.Name == "chat ol-m" && len(s.ParentSpanId) == 0 {
				started = hex.EncodeToString(s.TraceId)
			}
		}
		return started != "" && len(inTrace(spans, clientTrace)) == 3 && len(inTrace(spans, started)) == 3
	})
	spans := recv.snapshot()
	if n := len(inTrace(spans, unsampledTrace)); n != 0 {
		t.Errorf("%d spans exported of the trace whose traceparent said not sampled", n)
	}
	for _, tc := range []struct {
		trace, model, path string
		seen               *traceparentRecorder
	}{
		{clientTrace, "oa-m", "tunnel", &oaSeen},
		{started, "ol-m", "normalized", &olSeen},
	} {
		t.Run(tc.path, func(t *testing.T) {
			edgeSpan, runSpan, call := checkTraceTree(t, inTrace(spans, tc.trace))
			if tc.trace == clientTrace && hex.EncodeToString(edgeSpan.ParentSpanId) != clientSpan {
				t.Errorf("edge span's parent = %x, want the client's span %s", edgeSpan.ParentSpanId, clientSpan)
			}
			checkEdgeSpan(t, edgeSpan, tc.model, tc.path)
			for _, s := range []receivedSpan{runSpan, call} {
				if got := attrString(s.Attributes, "iop.execution_path"); got != tc.path {
					t.Errorf("%s: iop.execution_path = %q, want %q", s.Name, got, tc.path)
				}
			}
			if got := attrString(runSpan.Attributes, "iop.run_id"); got == "" || got != attrString(edgeSpan.Attributes, "iop.run_id") {
				t.Errorf("node run's iop.run_id %q, edge span's %q", got, attrString(edgeSpan.Attributes, "iop.run_id"))
			}
			if call.Name != "chat "+tc.model || attrString(call.Attributes, "gen_ai.provider.name") != "sim" {
				t.Errorf("provider call span %q, gen_ai.provider.name %q; want %q, sim", call.Name, attrString(call.Attributes, "gen_ai.provider.name"), "chat "+tc.model)
			}
			// The provider saw the call's span as its parent.
			want := "00-" + tc.trace + "-" + hex.EncodeToString(call.SpanId) + "-01"
			if seen := tc.seen.all(); !slices.Contains(seen, want) {
				t.Errorf("provider saw traceparent %q, want one %q", seen, want)
			}
			// The request's log line names its trace.
			if !slices.Contains(requestLogTraceIDs(t, edgeProc.Log.String()), tc.trace) {
				t.Errorf("no request log line has trace_id %s:\n%s", tc.trace, edgeProc.Log.String())
			}
		})
	}
	// The unsampled request reached the provider with its trace context,
	// and its log line has no trace_id.
	if seen := oaSeen.all(); !slices.ContainsFunc(seen, func(s string) bool {
		return strings.HasPrefix(s, "00-"+unsampledTrace+"-") && strings.HasSuffix(s, "-00")
	}) {
		t.Errorf("provider saw traceparents %q, none of the unsampled trace %s", seen, unsampledTrace)
	}
	if slices.Contains(requestLogTraceIDs(t, edgeProc.Log.String()), unsampledTrace) {
		t.Errorf("the unsampled request's log line has its trace_id")
	}

	// Exemplars, in the OpenMetrics exposition only.
	metrics := scrapeOpenMetrics(t, base)
	for _, id := range []string{clientTrace, started} {
		if !strings.Contains(metrics, `trace_id="`+id+`"`) {
			t.Errorf("no exemplar with trace_id %s on /metrics (OpenMetrics)", id)
		}
	}
	if strings.Contains(metrics, unsampledTrace) {
		t.Errorf("an exemplar names the unsampled trace %s", unsampledTrace)
	}

	for _, canary := range []string{canaryPrompt, canaryAuth, canaryToolArg, canaryProviderKey} {
		if recv.contains(canary) {
			t.Errorf("the secret %q was exported", canary)
		}
		for _, s := range spans {
			checkNoSecret(t, s, canary)
		}
	}
}

// inTrace returns the spans of trace id (hex).
func inTrace(spans []receivedSpan, id string) []receivedSpan {
	var out []receivedSpan
	for _, s := range spans {
		if hex.EncodeToString(s.TraceId) == id {
			out = append(out, s)
		}
	}
	return out
}

// checkTraceTree checks that spans are one edge server span, its child the
// node's run span, and the run's child the provider call's client span,
// each within its parent, and returns them.
func checkTraceTree(t *testing.T, spans []receivedSpan) (edgeSpan, runSpan, call receivedSpan) {
	t.Helper()
	var found int
	for _, s := range spans {
		switch {
		case s.service == "iop-edge" && s.Kind == tracev1.Span_SPAN_KIND_SERVER:
			edgeSpan, found = s, found|1
		case s.service == "iop-node" && s.Kind == tracev1.Span_SPAN_KIND_SERVER:
			runSpan, found = s, found|2
		case s.service == "iop-node" && s.Kind == tracev1.Span_SPAN_KIND_CLIENT:
			call, found = s, found|4
		}
	}
	if found != 7 || len(spans) != 3 {
		t.Fatalf("want an edge server span, a node run span and a provider client span; got %s", spanNames(spans))
	}
	if !bytes.Equal(runSpan.ParentSpanId, edgeSpan.SpanId) {
		t.Errorf("node run span's parent %x, want the edge span %x", runSpan.ParentSpanId, edgeSpan.SpanId)
	}
	if !bytes.Equal(call.ParentSpanId, runSpan.SpanId) {
		t.Errorf("provider call span's parent %x, want the run span %x", call.ParentSpanId, runSpan.SpanId)
	}
	for _, pair := range [][2]receivedSpan{{edgeSpan, runSpan}, {runSpan, call}} {
		parent, child := pair[0], pair[1]
		if child.StartTimeUnixNano < parent.StartTimeUnixNano || child.EndTimeUnixNano > parent.EndTimeUnixNano {
			t.Errorf("span %q [%d, %d] is not within its parent %q [%d, %d]", child.Name, child.StartTimeUnixNano, child.EndTimeUnixNano,
				parent.Name, parent.StartTimeUnixNano, parent.EndTimeUnixNano)
		}
	}
	for _, s := range spans {
		if s.StartTimeUnixNano > s.EndTimeUnixNano {
			t.Errorf("span %q ends before it starts", s.Name)
		}
	}
	return edgeSpan, runSpan, call
}

func spanNames(spans []receivedSpan) string {
	var names []string
	for _, s := range spans {
		names = append(names, fmt.Sprintf("%s/%s/%s", s.service, s.Kind, s.Name))
	}
	return strings.Join(names, ", ")
}

// checkEdgeSpan checks the edge span of a chat request for model on path:
// its GenAI name and attributes, iop's, and its events in order within it.
func checkEdgeSpan(t *testing.T, s receivedSpan, model, path string) {
	t.Helper()
	if s.Name != "chat "+model {
		t.Errorf("edge span name %q, want %q", s.Name, "chat "+model)
	}
	for key, want := range map[string]string{
		"gen_ai.operation.name": "chat", "gen_ai.request.model": model, "gen_ai.response.model": model,
		"gen_ai.provider.name": "sim", "iop.node_id": "tn", "iop.execution_path": path,
		"iop.queue_reason": "immediate", "iop.outcome": "completed", "http.request.method": "POST",
		"http.route": "/v1/chat/completions",
	} {
		if got := attrString(s.Attributes, key); got != want {
			t.Errorf("edge span %s = %q, want %q", key, got, want)
		}
	}
	if got := attrString(s.Attributes, "iop.provider_id"); got != "oa" && got != "ol" {
		t.Errorf("edge span iop.provider_id = %q", got)
	}
	for _, key := range []string{"gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens", "iop.generation"} {
		if v := attrValue(s.Attributes, key); v == nil || v.GetIntValue() <= 0 {
			t.Errorf("edge span %s = %v, want a positive count", key, v)
		}
	}
	if v := attrValue(s.Attributes, "http.response.status_code"); v.GetIntValue() != http.StatusOK {
		t.Errorf("edge span http.response.status_code = %v", v)
	}
	if path == "normalized" {
		reasons := attrValue(s.Attributes, "gen_ai.response.finish_reasons").GetArrayValue().GetValues()
		if len(reasons) != 1 || (reasons[0].GetStringValue() != "length" && reasons[0].GetStringValue() != "stop") {
			t.Errorf("edge span gen_ai.response.finish_reasons = %v, want [length] or [stop]", reasons)
		}
	}
	if s.Status.GetCode() == tracev1.Status_STATUS_CODE_ERROR {
		t.Errorf("edge span of a completed request has status %v", s.Status)
	}
	want := []string{"admitted", "dispatched", "first_token", "stream_end"}
	var got []string
	last := s.StartTimeUnixNano
	for _, ev := range s.Events {
		got = append(got, ev.Name)
		if ev.TimeUnixNano < last || ev.TimeUnixNano > s.EndTimeUnixNano {
			t.Errorf("event %q at %d is out of order or outside the span [%d, %d]", ev.Name, ev.TimeUnixNano, s.StartTimeUnixNano, s.EndTimeUnixNano)
		}
		last = ev.TimeUnixNano
	}
	if !slices.Equal(got, want) {
		t.Errorf("edge span events %q, want %q", got, want)
	}
}

// checkNoSecret fails if canary is in any name, attribute value, event or
// status of s.
func checkNoSecret(t *testing.T, s receivedSpan, canary string) {
	t.Helper()
	texts := []string{s.Name, s.Status.GetMessage(), s.TraceState}
	for _, kv := range s.Attributes {
		texts = append(texts, kv.GetKey(), kv.GetValue().String())
	}
	for _, ev := range s.Events {
		texts = append(texts, ev.Name)
		for _, kv := range ev.Attributes {
			texts = append(texts, kv.GetKey(), kv.GetValue().String())
		}
	}
	for _, text := range texts {
		if strings.Contains(text, canary) {
			t.Errorf("span %q carries the secret %q: %q", s.Name, canary, text)
		}
	}
}

// requestLogTraceIDs returns the trace_id of every "request" line of a
// JSON log.
func requestLogTraceIDs(t *testing.T, logs string) []string {
	t.Helper()
	var ids []string
	sc := bufio.NewScanner(strings.NewReader(logs))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		var line struct {
			Msg     string `json:"msg"`
			TraceID string `json:"trace_id"`
		}
		if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "request" && line.TraceID != "" {
			ids = append(ids, line.TraceID)
		}
	}
	return ids
}

// scrapeOpenMetrics reads /metrics in the OpenMetrics text format.
func scrapeOpenMetrics(t *testing.T, base string) string {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, base+"/metrics", nil)
	req.Header.Set("Accept", "application/openmetrics-text; version=1.0.0")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/openmetrics-text") {
		t.Fatalf("/metrics answered %q to an OpenMetrics scraper", ct)
	}
	return string(b)
}
