package loadgen

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"go.uber.org/goleak"

	"iop/internal/sim"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// startSim serves a simulator of protocol with cfg's other fields on a free
// loopback port until the test ends.
func startSim(t *testing.T, protocol sim.Protocol, cfg sim.Config) (*sim.Server, string) {
	t.Helper()
	cfg.Protocol = protocol
	if len(cfg.Models) == 0 {
		cfg.Models = []string{"m"}
	}
	s, err := sim.New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	url, stop, err := s.Start("")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	return s, url
}

// run runs cfg to its end; its keep-alive connections are dropped when the
// test ends, so no transport goroutine outlives it.
func run(t *testing.T, cfg Config) Result {
	t.Helper()
	if cfg.Client == nil {
		conns := max(cfg.Concurrency, 64)
		cfg.Client = NewClient(conns)
	}
	t.Cleanup(cfg.Client.CloseIdleConnections)
	res, err := Run(context.Background(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// TestCountsEveryRequestAndChunk runs a fixed number of requests on both
// APIs, streamed and not, and checks the counts against the simulator's own
// counters and its deterministic answer length.
func TestCountsEveryRequestAndChunk(t *testing.T) {
	const tokens, requests = 5, 40
	for _, api := range []API{APIOpenAI, APIOllama} {
		for _, stream := range []bool{false, true} {
			t.Run(string(api)+"/stream="+strconv.FormatBool(stream), func(t *testing.T) {
				s, url := startSim(t, sim.Protocol(api), sim.Config{DefaultMaxTokens: tokens})
				res := run(t, Config{URL: url, API: api, Model: "m", Stream: stream, Concurrency: 4, Requests: requests})

				if res.Requests != requests || res.OK != requests {
					t.Fatalf("requests %d, ok %d; want %d each (outcomes %v, errors %v)", res.Requests, res.OK, requests, res.Outcomes, res.Errors)
				}
				if len(res.Outcomes) != 1 || res.Outcomes[OutcomeOK] != requests {
					t.Errorf("outcomes %v, want only %q: %d", res.Outcomes, OutcomeOK, requests)
				}
				if got := s.Stats().Requests; got != requests {
					t.Errorf("the simulator saw %d requests, want %d", got, requests)
				}
				if res.Latency.N != requests {
					t.Errorf("latency samples %d, want %d", res.Latency.N, requests)
				}
				if res.CompletionTokens != requests*tokens {
					t.Errorf("completion tokens %d, want %d", res.CompletionTokens, requests*tokens)
				}
				wantChunks, wantTTFT, wantITL := 0, 0, 0
				if stream {
					wantChunks, wantTTFT, wantITL = requests*tokens, requests, requests*(tokens-1)
				}
				if res.Chunks != int64(wantChunks) || res.TTFT.N != wantTTFT || res.ITL.N != wantITL {
					t.Errorf("chunks %d, ttft samples %d, itl samples %d; want %d, %d, %d",
						res.Chunks, res.TTFT.N, res.ITL.N, wantChunks, wantTTFT, wantITL)
				}
				if res.Throughput <= 0 || res.Elapsed <= 0 {
					t.Errorf("throughput %v over %v, want > 0", res.Throughput, res.Elapsed)
				}
			})
		}
	}
}

// TestMaxTokensReachesTheServer checks that MaxTokens is sent in each API's
// own field: the simulator shortens its answers to it.
func TestMaxTokensReachesTheServer(t *testing.T) {
	for _, api := range []API{APIOpenAI, APIOllama} {
		t.Run(string(api), func(t *testing.T) {
			_, url := startSim(t, sim.Protocol(api), sim.Config{DefaultMaxTokens: 10})
			res := run(t, Config{URL: url, API: api, Model: "m", Stream: true, MaxTokens: 3, Concurrency: 2, Requests: 6})
			if res.OK != 6 || res.Chunks != 18 {
				t.Errorf("ok %d, chunks %d; want 6 answers of 3 chunks (outcomes %v)", res.OK, res.Chunks, res.Outcomes)
			}
		})
	}
}

// TestOpenLoopSendsTheScheduledRequests runs open loop to a request count.
func TestOpenLoopSendsTheScheduledRequests(t *testing.T) {
	s, url := startSim(t, sim.ProtocolOpenAI, sim.Config{})
	res := run(t, Config{URL: url, API: APIOpenAI, Model: "m", Rate: 2000, Requests: 30})
	if res.Requests+res.Dropped != 30 || res.OK != res.Requests {
		t.Fatalf("requests %d + dropped %d, ok %d; want 30 issued, all ok (outcomes %v)", res.Requests, res.Dropped, res.OK, res.Outcomes)
	}
	if got := s.Stats().Requests; got != int64(res.Requests) {
		t.Errorf("the simulator saw %d requests, the generator reports %d", got, res.Requests)
	}
}

// TestDurationEndsTheRun runs by duration: every request sent ends and is
// counted, and the simulator agrees.
func TestDurationEndsTheRun(t *testing.T) {
	s, url := startSim(t, sim.ProtocolOllama, sim.Config{})
	res := run(t, Config{URL: url, API: APIOllama, Model: "m", Concurrency: 2, Duration: 100 * time.Millisecond})
	if res.Requests == 0 || res.OK != res.Requests {
		t.Fatalf("requests %d, ok %d (outcomes %v)", res.Requests, res.OK, res.Outcomes)
	}
	if got := s.Stats().Requests; got != int64(res.Requests) {
		t.Errorf("the simulator saw %d requests, the generator reports %d", got, res.Requests)
	}
}

// TestOutcomesByStatusAndFailure checks the outcome of answers that are not
// a success: an error status, a stream cut before its end marker, a
// rejection at the server's concurrency limit, an unknown model.
func TestOutcomesByStatusAndFailure(t *testing.T) {
	t.Run("error status", func(t *testing.T) {
		_, url := startSim(t, sim.ProtocolOpenAI, sim.Config{Faults: sim.Faults{ErrorRate: 1, ErrorStatus: 503}})
		res := run(t, Config{URL: url, API: APIOpenAI, Model: "m", Concurrency: 3, Requests: 9})
		if res.OK != 0 || res.Outcomes["503"] != 9 || res.Latency.N != 0 {
			t.Errorf("ok %d, outcomes %v, latency samples %d; want 9 × 503 and no latency", res.OK, res.Outcomes, res.Latency.N)
		}
	})
	for _, api := range []API{APIOpenAI, APIOllama} {
		t.Run("truncated stream/"+string(api), func(t *testing.T) {
			_, url := startSim(t, sim.Protocol(api), sim.Config{Faults: sim.Faults{DropAfter: 2}})
			res := run(t, Config{URL: url, API: api, Model: "m", Stream: true, Concurrency: 2, Requests: 4})
			if res.OK != 0 || res.Outcomes[OutcomeTruncated] != 4 || res.Chunks != 0 {
				t.Errorf("ok %d, outcomes %v, chunks %d; want 4 truncated and no chunks counted", res.OK, res.Outcomes, res.Chunks)
			}
		})
	}
	t.Run("unknown model", func(t *testing.T) {
		_, url := startSim(t, sim.ProtocolOllama, sim.Config{})
		res := run(t, Config{URL: url, API: APIOllama, Model: "nope", Concurrency: 1, Requests: 2})
		if res.Outcomes["404"] != 2 || len(res.Errors) == 0 {
			t.Errorf("outcomes %v, errors %v; want 2 × 404 with the server's message", res.Outcomes, res.Errors)
		}
	})
	t.Run("over the server's limit", func(t *testing.T) {
		s, url := startSim(t, sim.ProtocolOpenAI, sim.Config{MaxConcurrent: 1, TTFT: 2 * time.Millisecond})
		res := run(t, Config{URL: url, API: APIOpenAI, Model: "m", Concurrency: 4, Requests: 40})
		st := s.Stats()
		if res.Requests != 40 || res.OK+res.Outcomes["429"] != 40 {
			t.Fatalf("requests %d, outcomes %v; want 40, each 200 or 429", res.Requests, res.Outcomes)
		}
		if int64(res.Outcomes["429"]) != st.Rejected {
			t.Errorf("429 outcomes %d, the simulator rejected %d", res.Outcomes["429"], st.Rejected)
		}
	})
}

// TestCancelEndsTheRun cancels a run whose requests hang: Run returns, and
// every request in flight counts as cancelled.
func TestCancelEndsTheRun(t *testing.T) {
	s, url := startSim(t, sim.ProtocolOpenAI, sim.Config{Faults: sim.Faults{Hang: true}})
	ctx, cancel := context.WithCancel(context.Background())
	client := NewClient(3)
	t.Cleanup(client.CloseIdleConnections)
	done := make(chan Result)
	go func() {
		res, err := Run(ctx, Config{URL: url, API: APIOpenAI, Model: "m", Concurrency: 3, Duration: time.Hour, Client: client}, nil)
		if err != nil {
			t.Error(err)
		}
		done <- res
	}()
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for s.Stats().InFlight < 3 {
		if time.Now().After(deadline) {
			t.Fatal("the requests never reached the simulator")
		}
		<-tick.C
	}
	cancel()
	res := <-done
	if res.Requests != 3 || res.Outcomes[OutcomeCancelled] != 3 {
		t.Errorf("requests %d, outcomes %v; want 3 cancelled", res.Requests, res.Outcomes)
	}
}

func TestValidate(t *testing.T) {
	ok := Config{URL: "http://127.0.0.1:1", API: APIOpenAI, Model: "m", Concurrency: 1, Requests: 1}
	if err := ok.Validate(); err != nil {
		t.Fatalf("valid config: %v", err)
	}
	for name, mut := range map[string]func(*Config){
		"no url":          func(c *Config) { c.URL = "127.0.0.1:1" },
		"bad api":         func(c *Config) { c.API = "grpc" },
		"no model":        func(c *Config) { c.Model = "" },
		"no load":         func(c *Config) { c.Concurrency = 0 },
		"both loads":      func(c *Config) { c.Rate = 10 },
		"no end":          func(c *Config) { c.Requests = 0 },
		"negative tokens": func(c *Config) { c.MaxTokens = -1 },
	} {
		c := ok
		mut(&c)
		if err := c.Validate(); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%s: err %v, want ErrInvalidConfig", name, err)
		}
	}
}

func TestPercentilesNearestRank(t *testing.T) {
	var ds []time.Duration
	for i := 100; i >= 1; i-- { // unsorted on purpose
		ds = append(ds, time.Duration(i)*time.Millisecond)
	}
	p := percentiles(ds)
	want := Percentiles{N: 100, P50: 50 * time.Millisecond, P90: 90 * time.Millisecond, P95: 95 * time.Millisecond, P99: 99 * time.Millisecond,
		Max: 100 * time.Millisecond, Mean: 50500 * time.Microsecond}
	if p != want {
		t.Errorf("percentiles = %+v, want %+v", p, want)
	}
	if one := percentiles([]time.Duration{7}); one.P50 != 7 || one.P99 != 7 || one.Max != 7 {
		t.Errorf("one sample: %+v", one)
	}
	if empty := percentiles(nil); empty != (Percentiles{}) {
		t.Errorf("no samples: %+v", empty)
	}
}

func TestPromptHasTheRequestedSize(t *testing.T) {
	for _, n := range []int{1, 44, 45, 1000} {
		if got := len(prompt(n)); got != n {
			t.Errorf("prompt(%d) has %d bytes", n, got)
		}
	}
}
