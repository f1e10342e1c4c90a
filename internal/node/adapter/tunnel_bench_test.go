package adapter

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"syscall"
	"testing"
	"time"

	"iop/internal/wire/nodev1"
)

// simAnswer is a non-streamed chat completion as iop sim answers one (8
// tokens).
const simAnswer = `{"id":"chatcmpl-sim-1","object":"chat.completion","created":1767225600,"model":"served","system_fingerprint":"fp_sim",` +
	`"choices":[{"index":0,"message":{"role":"assistant","content":"Lorem ipsum dolor sit amet consectetur adipiscing elit"},"logprobs":null,"finish_reason":"length"}],` +
	`"usage":{"prompt_tokens":12,"completion_tokens":8,"total_tokens":20}}`

// BenchmarkTunnelAnswer measures the node's tunnel of one small
// non-streamed answer, per answer: the provider request over loopback HTTP
// (a server that answers simAnswer with its Content-Length), the relay,
// and each message the node sends up marshalled as gRPC marshals it
// (wireSink, with the TunnelEnd serveRun adds after an answer that did not
// end with its head).
func BenchmarkTunnelAnswer(b *testing.B) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", strconv.Itoa(len(simAnswer)))
		io.WriteString(w, simAnswer)
	}))
	defer srv.Close()
	o, err := NewOpenAI(Config{BaseURL: srv.URL + "/v1", MaxConns: 1})
	if err != nil {
		b.Fatal(err)
	}
	defer o.Close()
	req := Request{Op: nodev1.Operation_OPERATION_CHAT, ServedModel: "served", Body: []byte(`{"model":"served","messages":[{"role":"user","content":"hi"}]}`)}
	sink := &wireSink{}
	b.ReportAllocs()
	cpu := cpuTime()
	for b.Loop() {
		sink.reset()
		if err := o.Tunnel(context.Background(), req, sink); err != nil {
			b.Fatal(err)
		}
		sink.finish()
		if sink.body != len(simAnswer) {
			b.Fatalf("relayed %d bytes, want %d", sink.body, len(simAnswer))
		}
	}
	b.ReportMetric(float64(cpuTime()-cpu)/float64(b.N), "cpu-ns/op")
	b.ReportMetric(float64(sink.msgs), "msgs/op")
}

// cpuTime is the CPU time the process used so far, user and system, every
// goroutine's (the provider's here too): on a loaded machine a steadier
// figure than the wall time per op.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
