package ledger

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Settled is the usage of the requests of one key and model that ended
// within one span of time (a run: they were dispatched).
type Settled struct {
	Key, Model string
	// End is the end of the span: no request of the sum ended later.
	End time.Time
	// Requests counts them; the token sums are what their providers
	// reported; GPUTime is their slot time weighted by cost weight.
	Requests                       int64
	PromptTokens, CompletionTokens int64
	GPUTime                        time.Duration
}

// ErrNoSettled: the store cannot list settled usage (a store other than
// the SQL one).
var ErrNoSettled = errors.New("the usage store cannot list settled usage")

// settledLister is a Store that lists settled usage (*SQL).
type settledLister interface {
	Settled(ctx context.Context, spans []SettledSpan) ([]Settled, error)
}

// SettledSpan asks for the requests that ended in [From, To), summed per
// key, model and Granule of their end.
type SettledSpan struct {
	From, To time.Time
	Granule  time.Duration
}

// longestRequest bounds how long before its span a request may have
// started and still be found: a request that ran longer is not.
const longestRequest = time.Hour

// Settled lists the usage of dispatched requests that ended in each
// span, summed per key, model and granule of their end (each sum's End
// is its granule's end, so at or after every end it sums), after every
// entry recorded before the call is in the store. Only requests that
// started at most longestRequest before their span are found.
// ErrNoSettled for a store that cannot.
func (l *Ledger) Settled(ctx context.Context, spans []SettledSpan) ([]Settled, error) {
	l.Flush()
	sl, ok := l.store.(settledLister)
	if !ok {
		return nil, ErrNoSettled
	}
	return sl.Settled(ctx, spans)
}

// Settled implements Ledger.Settled's query in SQL: one per span.
func (s *SQL) Settled(ctx context.Context, spans []SettledSpan) ([]Settled, error) {
	var out []Settled
	for _, sp := range spans {
		g := max(int64(sp.Granule), 1)
		end := "(at_ns + duration_ns)"
		query := fmt.Sprintf(`SELECT key_name, model, CAST(%[1]s / %[2]d AS BIGINT) AS b, COUNT(*),
			CAST(COALESCE(SUM(prompt_tokens), 0) AS BIGINT),
			CAST(COALESCE(SUM(completion_tokens), 0) AS BIGINT),
			CAST(COALESCE(SUM(gpu_ns), 0) AS BIGINT)
			FROM usage_ledger
			WHERE run_id <> '' AND at_ns >= %[3]s AND %[1]s >= %[4]s AND %[1]s < %[5]s
			GROUP BY key_name, model, b`, end, g, s.param(1), s.param(2), s.param(3))
		rows, err := s.db.QueryContext(ctx, query, sp.From.Add(-longestRequest).UnixNano(), sp.From.UnixNano(), sp.To.UnixNano())
		if err != nil {
			return nil, err
		}
		for rows.Next() {
			var (
				st       Settled
				b, gpuNs int64
			)
			if err := rows.Scan(&st.Key, &st.Model, &b, &st.Requests, &st.PromptTokens, &st.CompletionTokens, &gpuNs); err != nil {
				rows.Close()
				return nil, err
			}
			st.End, st.GPUTime = time.Unix(0, (b+1)*g).UTC(), time.Duration(gpuNs)
			out = append(out, st)
		}
		err = rows.Err()
		rows.Close()
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}
