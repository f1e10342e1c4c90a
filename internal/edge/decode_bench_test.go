package edge

import (
	"testing"

	"iop/internal/wire/nodev1"
)

// BenchmarkDecodeRunUp measures the edge's one decode of a run message
// into the contract's typed message, with its classification (end,
// release reason, verdict): one op is one message.
func BenchmarkDecodeRunUp(b *testing.B) {
	for _, bc := range []struct {
		name string
		m    *nodev1.RunUp
	}{
		{"delta", events(event(nodev1.RunEvent_TYPE_DELTA, " token"))},
		{"delta+usage+complete", events(event(nodev1.RunEvent_TYPE_DELTA, " token"),
			&nodev1.RunEvent{Type: nodev1.RunEvent_TYPE_USAGE, PromptTokens: 10, CompletionTokens: 20},
			&nodev1.RunEvent{Type: nodev1.RunEvent_TYPE_COMPLETE, FinishReason: "stop"})},
		{"tunnel_data", tunnelData(`data: {"choices":[{"index":0,"delta":{"content":" token"}}]}` + "\n\n")},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, ok := decodeRunUp(bc.m); !ok {
					b.Fatal("not decoded")
				}
			}
		})
	}
}
