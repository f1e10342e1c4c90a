package e2e

// A real OTLP trace receiver for the tracing tests: the collector's
// TraceService over gRPC, and POST /v1/traces (protobuf) over HTTP, as an
// OpenTelemetry Collector serves them, decoding ExportTraceServiceRequest
// with go.opentelemetry.io/proto/otlp.

import (
	"bytes"
	"compress/gzip"
	"context"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"

	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonv1 "go.opentelemetry.io/proto/otlp/common/v1"
	tracev1 "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

// receivedSpan is one exported span with its resource's service.name.
type receivedSpan struct {
	service string
	*tracev1.Span
}

// otlpReceiver keeps every span exported to it, and every export request
// as it came on the wire (for the secret scans).
type otlpReceiver struct {
	collectortrace.UnimplementedTraceServiceServer
	mu    sync.Mutex
	spans []receivedSpan
	raw   [][]byte
}

func (r *otlpReceiver) add(req *collectortrace.ExportTraceServiceRequest, raw []byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.raw = append(r.raw, raw)
	for _, rs := range req.GetResourceSpans() {
		service := attrString(rs.GetResource().GetAttributes(), "service.name")
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				r.spans = append(r.spans, receivedSpan{service, s})
			}
		}
	}
}

// Export is the gRPC TraceService's one method.
func (r *otlpReceiver) Export(_ context.Context, req *collectortrace.ExportTraceServiceRequest) (*collectortrace.ExportTraceServiceResponse, error) {
	raw, err := proto.Marshal(req)
	if err != nil {
		return nil, err
	}
	r.add(req, raw)
	return &collectortrace.ExportTraceServiceResponse{}, nil
}

// ServeHTTP is POST /v1/traces with an application/x-protobuf body.
func (r *otlpReceiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	if req.Method != http.MethodPost || req.URL.Path != "/v1/traces" {
		http.Error(w, "not found", http.StatusNotFound)
		return
	}
	if ct := req.Header.Get("Content-Type"); ct != "application/x-protobuf" {
		http.Error(w, "unsupported content type "+ct, http.StatusUnsupportedMediaType)
		return
	}
	var body io.Reader = req.Body
	if req.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(req.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		body = zr
	}
	raw, err := io.ReadAll(body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var msg collectortrace.ExportTraceServiceRequest
	if err := proto.Unmarshal(raw, &msg); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	r.add(&msg, raw)
	out, _ := proto.Marshal(&collectortrace.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}

// snapshot returns the spans received so far.
func (r *otlpReceiver) snapshot() []receivedSpan {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]receivedSpan(nil), r.spans...)
}

// contains reports whether any export request carried s anywhere.
func (r *otlpReceiver) contains(s string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, raw := range r.raw {
		if bytes.Contains(raw, []byte(s)) {
			return true
		}
	}
	return false
}

// startOTLPReceiver serves a receiver on a free loopback port over
// protocol ("grpc" or "http/protobuf") and returns it with its endpoint
// URL (OTEL_EXPORTER_OTLP_ENDPOINT's form).
func startOTLPReceiver(t *testing.T, protocol string) (*otlpReceiver, string) {
	t.Helper()
	r := &otlpReceiver{}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	switch protocol {
	case "grpc":
		srv := grpc.NewServer()
		collectortrace.RegisterTraceServiceServer(srv, r)
		go func() { _ = srv.Serve(lis) }()
		t.Cleanup(srv.Stop)
	default:
		srv := &http.Server{Handler: r}
		go func() { _ = srv.Serve(lis) }()
		t.Cleanup(func() { _ = srv.Close() })
	}
	return r, "http://" + lis.Addr().String()
}

// attrString is the string value of key among attrs ("" if absent).
func attrString(attrs []*commonv1.KeyValue, key string) string {
	for _, kv := range attrs {
		if kv.GetKey() == key {
			return kv.GetValue().GetStringValue()
		}
	}
	return ""
}

// attrValue is the value of key among attrs (nil if absent).
func attrValue(attrs []*commonv1.KeyValue, key string) *commonv1.AnyValue {
	for _, kv := range attrs {
		if kv.GetKey() == key {
			return kv.GetValue()
		}
	}
	return nil
}
