package api

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"iop/internal/edge/contract"
)

// BenchmarkRunEndedLog measures what logging a run's end costs a request
// at the default level (info, JSON to a discarding writer): the debug line
// is not written, so the cost is what is built for it anyway.
func BenchmarkRunEndedLog(b *testing.B) {
	h := &handler{logger: slog.New(slog.NewJSONHandler(io.Discard, nil)).With("component", "edge-api")}
	info := contract.DispatchInfo{RunID: "run_0123456789abcdef0123456789abcdef", NodeID: "node-1", ProviderID: "sim-openai",
		Path: contract.PathTunnel, QueueWait: time.Millisecond}
	req := &contract.Request{Model: "bench-model", Operation: contract.OperationChat}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		h.logRunEnded(ctx, info, req, ReasonCompleted, false)
	}
}
