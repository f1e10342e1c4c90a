package loadgen

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Outcomes of a request that are not an HTTP status (Result.Outcomes keys;
// a request answered with a status other than 200 counts under that status,
// e.g. "429").
const (
	OutcomeOK = "200"
	// OutcomeTransport: no answer: the connection failed or Timeout passed
	// before the status line.
	OutcomeTransport = "transport_error"
	// OutcomeStreamError: a 200 answer whose stream carried an error event
	// (OpenAI: a `data: {"error":...}` event; Ollama: a line with "error").
	OutcomeStreamError = "stream_error"
	// OutcomeTruncated: a 200 answer that ended (or timed out) before its
	// end marker (OpenAI stream: "data: [DONE]"; Ollama stream: done true;
	// non-streamed: a complete JSON body).
	OutcomeTruncated = "truncated"
	// OutcomeBadBody: a 200 answer whose body or chunk is not the API's
	// JSON shape.
	OutcomeBadBody = "bad_body"
	// OutcomeCancelled: the run's context ended while the request was in
	// flight.
	OutcomeCancelled = "cancelled"
)

// Percentiles summarize a set of durations. In JSON every duration is in
// microseconds (fields p50_us, ...).
type Percentiles struct {
	N                             int
	P50, P90, P95, P99, Max, Mean time.Duration
}

// MarshalJSON writes the durations in microseconds.
func (p Percentiles) MarshalJSON() ([]byte, error) {
	us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
	return json.Marshal(struct {
		N    int     `json:"n"`
		P50  float64 `json:"p50_us"`
		P90  float64 `json:"p90_us"`
		P95  float64 `json:"p95_us"`
		P99  float64 `json:"p99_us"`
		Max  float64 `json:"max_us"`
		Mean float64 `json:"mean_us"`
	}{p.N, us(p.P50), us(p.P90), us(p.P95), us(p.P99), us(p.Max), us(p.Mean)})
}

// percentiles sorts ds in place and summarizes it; the q-th percentile is
// the smallest sample with at least q% of the samples at or below it
// (nearest rank).
func percentiles(ds []time.Duration) Percentiles {
	if len(ds) == 0 {
		return Percentiles{}
	}
	slices.Sort(ds)
	rank := func(q float64) time.Duration {
		i := int(q*float64(len(ds))+0.999999999) - 1
		return ds[min(max(i, 0), len(ds)-1)]
	}
	var sum time.Duration
	for _, d := range ds {
		sum += d
	}
	return Percentiles{N: len(ds), P50: rank(0.50), P90: rank(0.90), P95: rank(0.95), P99: rank(0.99), Max: ds[len(ds)-1], Mean: sum / time.Duration(len(ds))}
}

// Result is what a run measured.
type Result struct {
	API         API     `json:"api"`
	URL         string  `json:"url"`
	Model       string  `json:"model"`
	Stream      bool    `json:"stream"`
	Concurrency int     `json:"concurrency,omitempty"`
	Rate        float64 `json:"rate,omitempty"`
	// Sessions, Turns and SharedPrefixTokens describe a sessions workload
	// (0 for the fixed one).
	Sessions           int `json:"sessions,omitempty"`
	Turns              int `json:"turns,omitempty"`
	SharedPrefixTokens int `json:"shared_prefix_tokens,omitempty"`
	// Requests counts the requests that ended, whatever their outcome; OK
	// those that succeeded (a complete 200 answer).
	Requests int `json:"requests"`
	OK       int `json:"ok"`
	// Dropped counts open-loop requests not sent because MaxInFlight were
	// in flight.
	Dropped int `json:"dropped,omitempty"`
	// Outcomes counts requests by outcome: the HTTP status ("200", "429")
	// or one of the Outcome constants.
	Outcomes map[string]int `json:"outcomes"`
	// Elapsed runs from the first request's start to the last one's end.
	Elapsed time.Duration `json:"elapsed_ns"`
	// Throughput is Requests / Elapsed, in requests per second; OKPerSecond
	// the same for OK requests.
	Throughput  float64 `json:"throughput_rps"`
	OKPerSecond float64 `json:"ok_rps"`
	// Latency is the whole request, from its (scheduled) start to the end of
	// its body, over OK requests.
	Latency Percentiles `json:"latency"`
	// TTFT is the time to first token (the first chunk with content) of OK
	// streamed requests; ITL the time between two content chunks.
	TTFT Percentiles `json:"ttft"`
	ITL  Percentiles `json:"itl"`
	// Chunks counts content chunks (streamed chunks with non-empty text) of
	// OK requests; ChunksPerSecond is Chunks / Elapsed.
	Chunks          int64   `json:"chunks"`
	ChunksPerSecond float64 `json:"chunks_per_second"`
	// CompletionTokens sums the servers' usage counts of OK requests, when
	// they report one.
	CompletionTokens int64 `json:"completion_tokens"`
	// Errors are up to 5 distinct error texts, for diagnosis.
	Errors []string `json:"errors,omitempty"`
}

// WriteText writes r as a human-readable report.
func (r Result) WriteText(w io.Writer) {
	mode := fmt.Sprintf("concurrency %d", r.Concurrency)
	if r.Rate > 0 {
		mode = fmt.Sprintf("rate %s/s", strconv.FormatFloat(r.Rate, 'f', -1, 64))
	}
	if r.Sessions > 0 {
		mode += fmt.Sprintf(", %d sessions of %d turns (shared prefix %d words)", r.Sessions, r.Turns, r.SharedPrefixTokens)
	}
	fmt.Fprintf(w, "%s %s model %s, stream %v, %s\n", r.API, r.URL, r.Model, r.Stream, mode)
	fmt.Fprintf(w, "requests     %d in %.2fs: %.1f/s (ok %.1f/s)", r.Requests, r.Elapsed.Seconds(), r.Throughput, r.OKPerSecond)
	if r.Dropped > 0 {
		fmt.Fprintf(w, ", %d dropped (max in flight)", r.Dropped)
	}
	fmt.Fprintln(w)
	keys := make([]string, 0, len(r.Outcomes))
	for k := range r.Outcomes {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s: %d", k, r.Outcomes[k])
	}
	fmt.Fprintf(w, "outcomes     %s\n", strings.Join(parts, ", "))
	line := func(name string, p Percentiles) {
		if p.N == 0 {
			return
		}
		fmt.Fprintf(w, "%-12s p50 %v  p90 %v  p95 %v  p99 %v  max %v  (n %d)\n", name, round(p.P50), round(p.P90), round(p.P95), round(p.P99), round(p.Max), p.N)
	}
	line("latency", r.Latency)
	line("ttft", r.TTFT)
	line("inter-token", r.ITL)
	if r.Chunks > 0 {
		fmt.Fprintf(w, "chunks       %d: %.0f/s\n", r.Chunks, r.ChunksPerSecond)
	}
	for _, e := range r.Errors {
		fmt.Fprintf(w, "error        %s\n", e)
	}
}

// round shortens d for display: µs precision under 10 ms, else ms.
func round(d time.Duration) time.Duration {
	if d < 10*time.Millisecond {
		return d.Round(time.Microsecond)
	}
	return d.Round(100 * time.Microsecond)
}

// sample is what one finished request reports.
type sample struct {
	outcome          string
	err              error
	latency, ttft    time.Duration
	itl              []time.Duration
	chunks           int
	completionTokens int
	text             string // the answer's content, when the requester keeps it
}

// recorder collects samples from every request goroutine.
type recorder struct {
	mu       sync.Mutex // guards the fields below
	outcomes map[string]int
	latency  []time.Duration
	ttft     []time.Duration
	itl      []time.Duration
	chunks   int64
	tokens   int64
	errors   []string
	requests int
	ok       int
}

func newRecorder() *recorder { return &recorder{outcomes: make(map[string]int)} }

func (r *recorder) add(s sample) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.requests++
	r.outcomes[s.outcome]++
	if s.err != nil && len(r.errors) < 5 {
		msg := s.outcome + ": " + s.err.Error()
		if !slices.Contains(r.errors, msg) {
			r.errors = append(r.errors, msg)
		}
	}
	if s.outcome != OutcomeOK {
		return
	}
	r.ok++
	r.latency = append(r.latency, s.latency)
	if s.chunks > 0 {
		r.ttft = append(r.ttft, s.ttft)
	}
	r.itl = append(r.itl, s.itl...)
	r.chunks += int64(s.chunks)
	r.tokens += int64(s.completionTokens)
}

// counts returns the requests ended and succeeded so far.
func (r *recorder) counts() (requests, ok int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.requests, r.ok
}

func (r *recorder) result(cfg Config, elapsed time.Duration, dropped int) Result {
	r.mu.Lock()
	defer r.mu.Unlock()
	res := Result{
		API: cfg.API, URL: cfg.URL, Model: cfg.Model, Stream: cfg.Stream, Concurrency: cfg.Concurrency, Rate: cfg.Rate,
		Requests: r.requests, OK: r.ok, Dropped: dropped, Outcomes: r.outcomes, Elapsed: elapsed,
		Latency: percentiles(r.latency), TTFT: percentiles(r.ttft), ITL: percentiles(r.itl),
		Chunks: r.chunks, CompletionTokens: r.tokens, Errors: r.errors,
	}
	if cfg.Workload == WorkloadSessions {
		res.Sessions, res.Turns, res.SharedPrefixTokens = cfg.Sessions, cfg.Turns, cfg.SharedPrefixTokens
	}
	if s := elapsed.Seconds(); s > 0 {
		res.Throughput = float64(r.requests) / s
		res.OKPerSecond = float64(r.ok) / s
		res.ChunksPerSecond = float64(r.chunks) / s
	}
	return res
}
