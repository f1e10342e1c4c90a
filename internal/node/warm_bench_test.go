package node

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"iop/internal/wire/nodev1"
)

// benchAnswer is a non-streamed chat completion as iop sim answers one.
const benchAnswer = `{"id":"chatcmpl-sim-1","object":"chat.completion","created":1767225600,"model":"served-model","system_fingerprint":"fp_sim",` +
	`"choices":[{"index":0,"message":{"role":"assistant","content":"Lorem ipsum dolor sit amet consectetur adipiscing elit"},"logprobs":null,"finish_reason":"length"}],` +
	`"usage":{"prompt_tokens":12,"completion_tokens":8,"total_tokens":20}}`

// BenchmarkWarmRun measures one small non-streamed tunnel run served on a
// warm run stream, per run: the fake edge's Dispatch (body inline) down
// the stream, the node's RunOpen, its call to an OpenAI-compatible
// provider over loopback HTTP and its answer up the stream, read to its
// terminal message; at 1 client (one warm stream, run after run) and at
// 32 (32 warm streams, each run after run). Everything runs in this
// process (the fake edge, the node's agent, the provider), so allocs/op
// and cpu-ns/op (the process's CPU time per run, every goroutine's) are
// the three together; only the node's share changes with the node.
func BenchmarkWarmRun(b *testing.B) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(benchAnswer))
	}))
	defer up.Close()
	const body = `{"model":"alias","messages":[{"role":"user","content":"hello"}]}`
	for _, clients := range []int{1, 32} {
		b.Run(fmt.Sprintf("clients_%d", clients), func(b *testing.B) {
			e, addr := startWarmEdge(b)
			e.warm = make(chan *edgeRun, 2*clients+16)
			startAgentWith(b, testConfig(addr, ProviderConfig{ID: "oai", Type: "openai", BaseURL: up.URL + "/v1", Models: []string{"served-model"},
				Capacity: clients}), newTestClock(), nil, func(a *Agent) { a.warm = clients })
			connect(b, e, 1, hour)
			streams := make([]*edgeRun, clients)
			for i := range streams {
				streams[i] = recv(b, e.warm, "warm run stream")
			}
			var n atomic.Int64
			serve := func(r *edgeRun) error {
				id := fmt.Sprintf("r%d", n.Add(1))
				d := inlineDispatchMsg(id, "oai", tunnel, body).GetDispatch()
				d.Stream, d.Headers = false, nil
				if err := r.stream.Send(&nodev1.RunDown{Msg: &nodev1.RunDown_Dispatch{Dispatch: d}}); err != nil {
					return err
				}
				ack := <-r.up
				if ack.GetOpen().GetRunId() != id {
					return fmt.Errorf("run %s: first message %v, want its RunOpen", id, ack)
				}
				for {
					m := <-r.up
					if m == nil {
						return fmt.Errorf("run %s: stream ended before its terminal message", id)
					}
					if isTerminal(m) || m.GetTunnelHead().GetEnd() {
						return nil
					}
				}
			}
			for _, r := range streams { // each stream served once: pools and connections grown
				if err := serve(r); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportAllocs()
			cpu := cpuTime()
			b.ResetTimer()
			var wg sync.WaitGroup
			per := b.N / clients
			for i, r := range streams {
				runs := per
				if i < b.N%clients {
					runs++
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range runs {
						if err := serve(r); err != nil {
							b.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
			b.StopTimer()
			b.ReportMetric(float64(cpuTime()-cpu)/float64(b.N), "cpu-ns/op")
		})
	}
}

// cpuTime is the CPU time the process used so far, user and system, every
// goroutine's: on a loaded machine a steadier figure than the wall time
// per op.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
