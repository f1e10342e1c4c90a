package observe

import (
	"context"
	"io"
	"iop/internal/edge/contract"
	"log/slog"
	"testing"
	"time"
)

// BenchmarkRequestLog measures the one log line of a finished request (a
// dispatched, completed one with tokens and a key): written at info (JSON
// to a discarding writer), and at warn, where the info line is dropped and
// costs only the check.
func BenchmarkRequestLog(b *testing.B) {
	rec := RequestRecord{API: "chat.completions", RequestID: "req_0123456789abcdef0123456789abcdef", Key: "team-a",
		Model: "bench-model", RunID: "run_0123456789abcdef0123456789abcdef", NodeID: "node-1", ProviderID: "sim-openai",
		ServedModel: "bench-model", Generation: 3, Path: "tunnel", Admission: contract.AdmissionImmediate, Status: 200,
		Outcome: contract.OutcomeCompleted, Duration: 3 * time.Millisecond, TimeToFirstToken: time.Millisecond,
		TokensKnown: true, InputTokens: 12, OutputTokens: 16}
	ctx := context.Background()
	for _, level := range []slog.Level{slog.LevelInfo, slog.LevelWarn} {
		logger := slog.New(slog.NewJSONHandler(io.Discard, &slog.HandlerOptions{Level: level})).With("component", "edge-api")
		b.Run("level="+level.String(), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				Log(ctx, logger, rec)
			}
		})
	}
}
