package process

import (
	"context"
	"fmt"
	"time"

	"iop/internal/edge"
	"iop/internal/edge/api/access"
	"iop/internal/ledger"
	"iop/internal/quota"
)

// restoreSpans are the spans of the usage ledger a quota ledger is
// rebuilt from: the last two minutes by the second (the minute windows),
// then the rest of the longest window (a 30-day month, and half a day
// more for the granule) by 24 minutes (a day's granule).
func restoreSpans(now time.Time) (recent, older ledger.SettledSpan) {
	cut := now.Add(-2 * time.Minute)
	return ledger.SettledSpan{From: cut, To: now.Add(time.Hour), Granule: time.Second},
		ledger.SettledSpan{From: now.Add(-quota.Month - 12*time.Hour), To: cut, Granule: 24 * time.Minute}
}

// restoreQuota counts into q the usage of every open window the usage
// ledger holds (several edges: the shared PostgreSQL one, ledger_dsn),
// each sum at its granule's end, so never earlier than it was settled:
// a sum of the older span at most a minute before now, outside the
// minute windows it ended outside of. It waits for the usage ledger to
// open (a leader may be elected before).
func (e *edgeProcess) restoreQuota(ctx context.Context, q *quota.Ledger) error {
	select {
	case <-e.usageOpen:
	case <-ctx.Done():
		return fmt.Errorf("the usage ledger did not open: %w", context.Cause(ctx))
	}
	now := time.Now()
	recent, older := restoreSpans(now)
	for _, span := range []struct {
		ledger.SettledSpan
		latest time.Time // no sum counts later: the span's ends are all before it
	}{{recent, now}, {older, now.Add(-time.Minute - time.Second)}} {
		sums, err := e.usage.Settled(ctx, []ledger.SettledSpan{span.SettledSpan})
		if err != nil {
			return err
		}
		for _, s := range sums {
			at := s.End
			if at.After(span.latest) {
				at = span.latest
			}
			q.Restore(s.Key, at, quota.Usage{Model: s.Model, InputTokens: s.PromptTokens, OutputTokens: s.CompletionTokens,
				SlotTime: s.GPUTime, CostWeight: 1}, s.Requests)
		}
	}
	return nil
}

// quotaDeps is what the edge's cluster side needs of the quota ledger.
func (e *edgeProcess) quotaDeps() edge.QuotaDeps {
	return edge.QuotaDeps{Ledger: e.Quota, Restore: e.restoreQuota}
}

// apiQuota is the HTTP API's quota: with several edges the scheduler
// leader's (edge.Quota); a single edge's own ledger, restored from its
// usage ledger once at start.
func (e *edgeProcess) apiQuota(ctx context.Context) access.Quota {
	if e.cfg.Cluster != nil {
		return e.Service.Quota(e.Quota)
	}
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := e.restoreQuota(rctx, e.Quota); err != nil {
		e.logger.Error("quota windows not restored from the usage ledger", "error", err)
	}
	return e.Quota
}
