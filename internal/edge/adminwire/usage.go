package adminwire

// Usage is the answer of GET /admin/v1/usage: the usage ledger's sums,
// one UsageGroup per value of GroupBy ("" for one total), ordered by that
// value.
type Usage struct {
	Object  string `json:"object"` // "list"
	GroupBy string `json:"group_by"`
	// TZ is the time zone whose dates group_by=day names (IANA name,
	// "UTC" by default).
	TZ   string       `json:"tz"`
	Data []UsageGroup `json:"data"`
}

// UsageGroup is the sum of one group's ledger entries.
type UsageGroup struct {
	// Group is the group's value: a key name, team, model,
	// "node/provider", node id or date (YYYY-MM-DD); "" for the total,
	// the open API's key or the keys in no team.
	Group string `json:"group"`
	// Requests counts the requests, Completed those answered in full.
	Requests  int64 `json:"requests"`
	Completed int64 `json:"completed"`
	// Tokens as the providers reported them.
	PromptTokens     int64 `json:"prompt_tokens"`
	CompletionTokens int64 `json:"completion_tokens"`
	TotalTokens      int64 `json:"total_tokens"`
	// DurationMs sums the requests' durations, from arrival to the end
	// of the answer, in milliseconds.
	DurationMs int64 `json:"duration_ms"`
	// GPUSeconds sums the seconds each request held a provider slot
	// (from its dispatch to the end of the answer), each weighted by the
	// provider's cost weight (1 when not known); millisecond precision.
	GPUSeconds float64 `json:"gpu_seconds"`
}
