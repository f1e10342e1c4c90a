package observe

import (
	"context"
	"log/slog"

	"iop/internal/edge/contract"
	"iop/internal/ledger"
)

// LedgerEntry is the usage ledger's entry for a finished request.
func LedgerEntry(rec RequestRecord) ledger.Entry {
	e := ledger.Entry{
		Time: rec.Start, RequestID: rec.RequestID, Key: rec.Key, Model: rec.Model,
		RunID: rec.RunID, NodeID: rec.NodeID, ProviderID: rec.ProviderID, ServedModel: rec.ServedModel,
		Duration: rec.Duration, SlotTime: rec.SlotTime, CostWeight: rec.CostWeight, Outcome: rec.Outcome.String(), ErrorCode: rec.ErrorCode,
	}
	if rec.TokensKnown {
		e.PromptTokens, e.CompletionTokens = int64(rec.InputTokens), int64(rec.OutputTokens)
	}
	return e
}

// Log writes the one log line of a finished API request to logger: info,
// or warn for a 5xx or an upstream failure. It names no header and no
// body, so no credential can appear in it.
func Log(ctx context.Context, logger *slog.Logger, rec RequestRecord) {
	level := slog.LevelInfo
	if rec.Status >= 500 || rec.Outcome == contract.OutcomeUpstreamError || rec.Outcome == contract.OutcomeError {
		level = slog.LevelWarn
	}
	// Built only when the line is written, in an array that holds every
	// attribute below (BenchmarkRequestLog).
	if !logger.Enabled(ctx, level) {
		return
	}
	var buf [24]slog.Attr
	attrs := append(buf[:0],
		slog.String("api", rec.API),
		slog.String("request_id", rec.RequestID))
	if rec.Model != "" {
		// None when the request ended before its body was read (a key
		// refused at the door: over its limits, or no scheduler leader to
		// count them): the line says no model rather than an empty one.
		attrs = append(attrs, slog.String("model", rec.Model))
	}
	attrs = append(attrs,
		slog.Int("status", rec.Status),
		slog.String("outcome", rec.Outcome.String()),
		slog.Duration("duration", rec.Duration),
	)
	if rec.Admission != "" {
		attrs = append(attrs, slog.String("queue_reason", rec.Admission.String()), slog.Duration("queue_wait", rec.QueueWait))
	}
	if rec.RunID != "" {
		attrs = append(attrs,
			slog.String("run_id", rec.RunID),
			slog.String("node_id", rec.NodeID),
			slog.Uint64("generation", rec.Generation),
			slog.String("provider_id", rec.ProviderID),
			slog.String("served_model", rec.ServedModel),
			slog.String("path", rec.Path),
			slog.Bool("stream", rec.Stream))
	}
	if rec.TimeToFirstToken > 0 {
		attrs = append(attrs, slog.Duration("time_to_first_token", rec.TimeToFirstToken))
	}
	if rec.TokensKnown {
		attrs = append(attrs, slog.Int("input_tokens", rec.InputTokens), slog.Int("output_tokens", rec.OutputTokens))
	}
	if rec.ErrorCode != "" {
		attrs = append(attrs, slog.String("error_code", rec.ErrorCode))
	}
	if rec.Key != "" {
		attrs = append(attrs, slog.String("key", rec.Key))
	}
	if rec.ClientRequestID != "" {
		attrs = append(attrs, slog.String("client_request_id", rec.ClientRequestID))
	}
	if rec.Priority != "" {
		attrs = append(attrs, slog.String("flow", rec.Flow), slog.String("priority", rec.Priority))
	}
	if rec.ShedReason != "" {
		attrs = append(attrs, slog.String("shed_reason", rec.ShedReason))
	}
	if rec.TraceID != "" {
		attrs = append(attrs, slog.String("trace_id", rec.TraceID))
	}
	logger.LogAttrs(ctx, level, "request", attrs...)
}
