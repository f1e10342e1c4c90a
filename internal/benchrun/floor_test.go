package benchrun

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"sync"
	"testing"
	"time"
)

// floorClientEnv names the environment variable that makes this test
// binary the clients of BenchmarkNetHTTPBlockedRequest: their address.
const floorClientEnv = "IOP_BENCHRUN_FLOOR_CLIENT"

// floorRequests is the number of requests held blocked, as in the memory
// phase of the overhead benchmark.
const floorRequests = 10000

func TestMain(m *testing.M) {
	if addr := os.Getenv(floorClientEnv); addr != "" {
		floorClients(addr, floorRequests)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// BenchmarkNetHTTPBlockedRequest measures what Go's net/http server alone
// pins for an HTTP/1.1 request whose handler has read its small JSON body
// and blocks (the state of a queued request at the edge, without the
// edge): the live heap (after a GC), the goroutine stacks and the
// goroutines per blocked request, with 10,000 blocked. The clients run in
// another process (this test binary, re-run), so only the server is
// counted. frames=N blocks below N stack frames of about 1 KB each: the
// stack a handler reaches before it waits decides the size class its
// connection goroutine's stack keeps (the GC halves a stack only when a
// quarter of it is used).
func BenchmarkNetHTTPBlockedRequest(b *testing.B) {
	if testing.Short() {
		b.Skip("starts 10,000 connections")
	}
	for _, frames := range []int{0, 3, 6} {
		b.Run(fmt.Sprintf("frames=%d", frames), func(b *testing.B) {
			var heap, stack, goroutines float64
			for b.Loop() {
				heap, stack, goroutines = blockedRequestCost(b, frames)
			}
			b.ReportMetric(heap, "heap-B/req")
			b.ReportMetric(stack, "stack-B/req")
			b.ReportMetric(goroutines, "goroutines/req")
			b.ReportMetric(0, "ns/op")
		})
	}
}

func blockedRequestCost(b *testing.B, frames int) (heap, stack, goroutines float64) {
	blocked := make(chan struct{}, floorRequests) // one value per request blocked in the handler
	release := make(chan struct{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := io.ReadAll(r.Body); err != nil {
			return
		}
		waitBelow(frames, func() {
			blocked <- struct{}{}
			<-release
		})
		w.Write([]byte("ok"))
	})}
	go srv.Serve(ln)
	defer srv.Close()

	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	g0 := runtime.NumGoroutine()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), floorClientEnv+"="+ln.Addr().String())
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { close(release); cmd.Wait() }()
	timeout := time.After(2 * time.Minute)
	for n := 0; n < floorRequests; n++ {
		select {
		case <-blocked:
		case <-timeout:
			b.Fatalf("%d of %d requests blocked after 2 minutes", n, floorRequests)
		}
	}
	runtime.GC()
	runtime.GC() // a second cycle: stacks that can shrink have halved once more
	runtime.ReadMemStats(&after)
	n := float64(floorRequests)
	return float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / n,
		float64(int64(after.StackInuse)-int64(before.StackInuse)) / n,
		float64(runtime.NumGoroutine()-g0) / n
}

// waitBelow calls wait under n frames of about 1 KB of stack each.
//
//go:noinline
func waitBelow(n int, wait func()) byte {
	var pad [960]byte
	pad[n%len(pad)] = byte(n)
	if n == 0 {
		wait()
		return pad[0]
	}
	return waitBelow(n-1, wait) + pad[len(pad)-1-n%len(pad)]
}

// floorClients sends n small JSON POSTs to addr at once, each on its own
// connection, and waits for their answers.
func floorClients(addr string, n int) {
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: n}}
	body := []byte(`{"model":"bench-hang","messages":[{"role":"user","content":"the quick brown fox jumps over the lazy dog the quick brown fo"}]}`)
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := client.Post("http://"+addr, "application/json", bytes.NewReader(body))
			if err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
	}
	wg.Wait()
}
