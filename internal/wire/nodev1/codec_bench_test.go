package nodev1

import (
	"testing"

	"google.golang.org/protobuf/proto"
)

// runUpMessages are the RunUp messages a run sends per chunk: a normalized
// delta (one token), a normalized delta with the run's end (usage and
// complete), and a tunneled SSE event of one token.
func runUpMessages() map[string]*RunUp {
	return map[string]*RunUp{
		"delta": {Msg: &RunUp_Events{Events: &RunEvents{Events: []*RunEvent{
			{Type: RunEvent_TYPE_DELTA, Text: " token"}}}}},
		"delta_usage_complete": {Msg: &RunUp_Events{Events: &RunEvents{Events: []*RunEvent{
			{Type: RunEvent_TYPE_DELTA, Text: " token"},
			{Type: RunEvent_TYPE_USAGE, PromptTokens: 17, CompletionTokens: 16},
			{Type: RunEvent_TYPE_COMPLETE, FinishReason: "stop"}}}}},
		"tunnel_data_sse": {Msg: &RunUp_TunnelData{TunnelData: &TunnelData{Data: []byte(
			`data: {"id":"chatcmpl-sim-1","object":"chat.completion.chunk","created":1767225600,"model":"bench-openai","system_fingerprint":"fp_sim","choices":[{"index":0,"delta":{"content":" token"},"finish_reason":null}]}` + "\n\n")}}},
	}
}

// BenchmarkRunUpMarshal measures the node's encode of one RunUp message
// (what gRPC's proto codec does per Send), per message.
func BenchmarkRunUpMarshal(b *testing.B) {
	for name, m := range runUpMessages() {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := proto.Marshal(m); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkRunUpUnmarshal measures the edge's decode of one RunUp message
// (what gRPC's proto codec does per Recv), per message.
func BenchmarkRunUpUnmarshal(b *testing.B) {
	for name, m := range runUpMessages() {
		data, err := proto.Marshal(m)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(name, func(b *testing.B) {
			b.SetBytes(int64(len(data)))
			b.ReportAllocs()
			for b.Loop() {
				var out RunUp
				if err := proto.Unmarshal(data, &out); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
