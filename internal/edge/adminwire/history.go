package adminwire

// History is the answer of GET /admin/v1/history: the edge's per-second
// aggregates of the last WindowSeconds seconds (package edge/history), one
// Second per second after Since through Through, oldest first. A second
// is listed once it is over, and never changes after that, so a reader
// that asks again with since = the Through it got receives only the
// seconds it has not seen.
type History struct {
	Object string `json:"object"` // "history"
	// IntervalSeconds is the width of one Second (1); WindowSeconds how
	// far back the edge keeps them (900: 15 minutes).
	IntervalSeconds int `json:"interval_seconds"`
	WindowSeconds   int `json:"window_seconds"`
	// Since is the since asked for (Unix seconds; 0: none), Through the
	// last second that is over (Unix seconds): Data holds the seconds in
	// (Since, Through] that the window still holds.
	Since   int64 `json:"since"`
	Through int64 `json:"through"`
	// Start is the first second the edge recorded (Unix seconds: the
	// second it started); the window holds nothing before it, so a chart
	// of a young edge spans (Start, Through], not the whole window.
	Start int64 `json:"start"`
	// Outcomes and Reasons name every key Requests and Refusals may
	// hold, in a stable order (a chart's legend order).
	Outcomes []string `json:"outcomes"`
	Reasons  []string `json:"reasons"`
	Data     []Second `json:"data"`
}

// Second is what the edge saw in one second: [Time, Time+1).
type Second struct {
	// Time is the second's start, in Unix seconds.
	Time int64 `json:"time"`
	// Requests counts the API requests that ended in the second, by
	// outcome (the RequestRecord's: completed, refused, upstream_error,
	// ...); an outcome with none is left out.
	Requests map[string]int `json:"requests"`
	// TimeToFirstToken summarises the time to first token of the requests
	// that ended in the second and saw one; nil when none did.
	TimeToFirstToken *Quantiles `json:"time_to_first_token_ms"`
	// OutputTokens sums the output tokens of the requests that ended in
	// the second (those whose usage is known), as iop_output_tokens_total
	// counts them: a long answer's tokens count in the second it ended.
	OutputTokens int64 `json:"output_tokens"`
	// Refusals counts the refused requests that ended in the second, by
	// reason: their admission (queue_full, queue_timeout, unavailable,
	// rejected, unknown_model, dispatch_failed) or their key's limit
	// (concurrency_limit_exceeded, rate_limit_exceeded,
	// model_not_allowed); a reason with none is left out.
	Refusals map[string]int `json:"refusals"`
	// Providers are the scheduler's counters of each provider as sampled
	// at the end of the second; nil when the edge took no sample then
	// (it was too busy to, or had not started): no provider at all is [].
	Providers []ProviderSample `json:"providers"`
}

// Quantiles are the median and the 95th percentile of a second's times to
// first token, in milliseconds, read from fixed buckets four to an octave
// (each within 9% of the true value) and kept within the second's
// smallest and largest (so one request's are exact), and how many
// requests they cover.
type Quantiles struct {
	Count int     `json:"count"`
	P50   float64 `json:"p50"`
	P95   float64 `json:"p95"`
}

// ProviderSample is one provider's counters at the end of a second.
type ProviderSample struct {
	NodeID     string `json:"node_id"`
	ProviderID string `json:"provider_id"`
	InFlight   int    `json:"in_flight"`
	Queued     int    `json:"queued"` // waiters that list the provider
	Capacity   int    `json:"capacity"`
}
