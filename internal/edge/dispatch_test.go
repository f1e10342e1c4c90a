package edge

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"iop/internal/scheduler"
)

// TestDispatchNext plays attempt results through next, one row per rule of
// DESIGN.md and the README ("When a provider fails before any byte ..."),
// and checks each decision and the request's end.
func TestDispatchNext(t *testing.T) {
	r1, r2, r3 := &Run{}, &Run{}, &Run{}
	answered := func(r *Run) attemptResult { return attemptResult{kind: resAnswered, run: r} }
	failed := func(r *Run, reason string) attemptResult {
		return attemptResult{kind: resFailedFirst, run: r, reason: reason}
	}
	nodeLost := func(r *Run) attemptResult {
		return attemptResult{kind: resFailedFirst, run: r, reason: "node gone", err: fmt.Errorf("%w: run stream failed", ErrNodeGone)}
	}
	notDispatched := func(err error) attemptResult { return attemptResult{kind: resNotDispatched, err: err} }
	notAdmitted := func(err error) attemptResult { return attemptResult{kind: resNotAdmitted, err: err} }
	outOfRot := attemptResult{kind: resOutOfRotation, err: errOutOfRotation}
	stale := fmt.Errorf("%w: node replaced", ErrStaleGeneration)
	timeout := fmt.Errorf("%w: not opened", ErrDispatchTimeout)
	refused := fmt.Errorf("%w: busy", ErrDispatchRefused)
	draining := fmt.Errorf("%w: %w", errNodeDraining, refused)
	noProvider := fmt.Errorf("%w %q but the ones that failed", scheduler.ErrNoProvider, "m")
	rejected := fmt.Errorf("%w: no capable provider", scheduler.ErrCandidatesRejected)

	type step struct {
		res     attemptResult
		want    actionKind
		exclude bool // actAgain only
	}
	tests := []struct {
		name       string
		maxRetries int
		steps      []step
		wantRun    *Run  // the run handed to the caller
		wantErr    error // or the error (errors.Is)
		wantNotErr error // an error the answer must not be
		wantDrop   *Run  // the run dropped as "client gone"
		wantRetry  int   // retries counted (max_retries counts these)
		wantMsg    string
	}{
		{
			name: "an answer is the answer", maxRetries: 1,
			steps:   []step{{answered(r1), actFinish, false}},
			wantRun: r1,
		},
		{
			name: "a provider failing before the first byte goes to another", maxRetries: 1,
			steps:   []step{{failed(r1, "status 503"), actRetry, false}, {answered(r2), actFinish, false}},
			wantRun: r2, wantRetry: 1,
		},
		{
			name: "at most max_retries times: then the failure as it came", maxRetries: 1,
			steps:   []step{{failed(r1, "status 502"), actRetry, false}, {failed(r2, "status 429"), actFinish, false}},
			wantRun: r2, wantRetry: 1,
		},
		{
			name: "max_retries 2 allows two", maxRetries: 2,
			steps: []step{{failed(r1, "status 503"), actRetry, false}, {failed(r2, "status 503"), actRetry, false},
				{answered(r3), actFinish, false}},
			wantRun: r3, wantRetry: 2,
		},
		{
			name: "max_retries 0: no retry", maxRetries: 0,
			steps:   []step{{failed(r1, "status 503"), actFinish, false}},
			wantRun: r1,
		},
		{
			name: "no provider not tried yet: the first provider's failure as it came", maxRetries: 1,
			steps:   []step{{failed(r1, "status 503"), actRetry, false}, {notAdmitted(noProvider), actFinish, false}},
			wantRun: r1, wantRetry: 1,
		},
		{
			name: "admitted once, never a rejection: the failure as it came", maxRetries: 1,
			steps:   []step{{failed(r1, "status 429"), actRetry, false}, {notAdmitted(rejected), actFinish, false}},
			wantRun: r1, wantRetry: 1,
		},
		{
			name: "a node lost before the first message goes to another", maxRetries: 1,
			steps:   []step{{nodeLost(r1), actRetry, false}, {answered(r2), actFinish, false}},
			wantRun: r2, wantRetry: 1,
		},
		{
			name: "a node lost with no other provider: the model has none (503)", maxRetries: 1,
			steps:   []step{{nodeLost(r1), actRetry, false}, {notAdmitted(noProvider), actFinish, false}},
			wantErr: scheduler.ErrProviderUnavailable, wantRetry: 1,
		},
		{
			name: "none left after two failures: the latest failed attempt's outcome", maxRetries: 2,
			steps: []step{{failed(r1, "status 503"), actRetry, false}, {nodeLost(r2), actRetry, false},
				{notAdmitted(noProvider), actFinish, false}},
			wantErr: scheduler.ErrProviderUnavailable, wantRetry: 2,
		},
		{
			name: "a node lost with retries used up: its error", maxRetries: 0,
			steps:   []step{{nodeLost(r1), actFinish, false}},
			wantErr: ErrNodeGone,
		},
		{
			name: "a stale generation is admitted again without counting as a retry", maxRetries: 1,
			steps: []step{{notDispatched(stale), actReadmit, false}, {failed(r1, "status 503"), actRetry, false},
				{answered(r2), actFinish, false}},
			wantRun: r2, wantRetry: 1,
		},
		{
			name: "a stale generation with max_retries 0 is still admitted again", maxRetries: 0,
			steps:   []step{{notDispatched(stale), actReadmit, false}, {answered(r1), actFinish, false}},
			wantRun: r1,
		},
		{
			name: "a stale generation twice in a row fails with it", maxRetries: 1,
			steps:   []step{{notDispatched(stale), actReadmit, false}, {notDispatched(stale), actFinish, false}},
			wantErr: ErrStaleGeneration,
		},
		{
			name: "a stale generation and no other provider: unavailable (503)", maxRetries: 1,
			steps:   []step{{notDispatched(stale), actReadmit, false}, {notAdmitted(noProvider), actFinish, false}},
			wantErr: scheduler.ErrProviderUnavailable,
		},
		{
			name: "a dispatch timeout is tried once elsewhere", maxRetries: 1,
			steps:   []step{{notDispatched(timeout), actReadmit, false}, {answered(r1), actFinish, false}},
			wantRun: r1,
		},
		{
			name: "a dispatch timeout twice in a row fails with it", maxRetries: 1,
			steps:   []step{{notDispatched(timeout), actReadmit, false}, {notDispatched(timeout), actFinish, false}},
			wantErr: ErrDispatchTimeout,
		},
		{
			name: "a dispatch timeout and no other provider: the timeout as it was", maxRetries: 1,
			steps:      []step{{notDispatched(timeout), actReadmit, false}, {notAdmitted(noProvider), actFinish, false}},
			wantErr:    ErrDispatchTimeout,
			wantNotErr: scheduler.ErrProviderUnavailable,
		},
		{
			name: "a refused dispatch is admitted again", maxRetries: 1,
			steps:   []step{{notDispatched(refused), actReadmit, false}, {answered(r1), actFinish, false}},
			wantRun: r1,
		},
		{
			name: "a draining node's refusal with no other provider: unavailable (503)", maxRetries: 1,
			steps:   []step{{notDispatched(draining), actReadmit, false}, {notAdmitted(noProvider), actFinish, false}},
			wantErr: scheduler.ErrProviderUnavailable,
		},
		{
			name: "one re-admission for a dispatch that never reached a provider: then the failed answer as it came", maxRetries: 2,
			steps: []step{{notDispatched(stale), actReadmit, false}, {failed(r1, "status 503"), actRetry, false},
				{notDispatched(timeout), actFinish, false}},
			wantRun: r1, wantRetry: 1,
		},
		{
			name: "a failed answer stays the answer across a re-admission", maxRetries: 1,
			steps: []step{{failed(r1, "status 503"), actRetry, false}, {notDispatched(stale), actReadmit, false},
				{notAdmitted(noProvider), actFinish, false}},
			wantRun: r1, wantRetry: 1,
		},
		{
			name: "a client gone during the read-ahead ends it", maxRetries: 1,
			steps:   []step{{attemptResult{kind: resClientGone, run: r1, err: context.Canceled, ctxErr: context.Canceled}, actFinish, false}},
			wantErr: context.Canceled, wantDrop: r1,
		},
		{
			name: "a client gone while admitted again ends it, the failed run dropped", maxRetries: 1,
			steps: []step{{failed(r1, "status 503"), actRetry, false},
				{attemptResult{kind: resNotAdmitted, err: context.Canceled, ctxErr: context.Canceled}, actFinish, false}},
			wantErr: context.Canceled, wantDrop: r1, wantRetry: 1,
		},
		{
			name: "a client gone while queued the first time: the admission's error", maxRetries: 1,
			steps:   []step{{attemptResult{kind: resNotAdmitted, err: scheduler.ErrQueueTimeout, ctxErr: context.Canceled}, actFinish, false}},
			wantErr: scheduler.ErrQueueTimeout,
		},
		{
			name: "a provider out of rotation before dispatch is no attempt", maxRetries: 0,
			steps: []step{{outOfRot, actAgain, false}, {outOfRot, actAgain, false}, {notDispatched(stale), actReadmit, false},
				{answered(r1), actFinish, false}},
			wantRun: r1,
		},
		{
			name: "out of rotation maxOutOfRotation times: that provider is left out", maxRetries: 1,
			steps: []step{{outOfRot, actAgain, false}, {outOfRot, actAgain, false}, {outOfRot, actAgain, true},
				{answered(r1), actFinish, false}},
			wantRun: r1,
		},
		{
			name: "out of rotation and then none left: its providers went away (503)", maxRetries: 1,
			steps:   []step{{outOfRot, actAgain, false}, {notAdmitted(noProvider), actFinish, false}},
			wantErr: scheduler.ErrProviderUnavailable, wantMsg: `model "m"`,
		},
		{
			name: "out of rotation and then a rejection: never a 400", maxRetries: 1,
			steps:      []step{{outOfRot, actAgain, false}, {notAdmitted(rejected), actFinish, false}},
			wantErr:    scheduler.ErrProviderUnavailable,
			wantNotErr: scheduler.ErrCandidatesRejected,
		},
		{
			name: "an admission error is the answer", maxRetries: 1,
			steps:   []step{{notAdmitted(scheduler.ErrQueueFull), actFinish, false}},
			wantErr: scheduler.ErrQueueFull,
		},
		{
			name: "a rejection at the first admission is the answer (400)", maxRetries: 1,
			steps:   []step{{notAdmitted(rejected), actFinish, false}},
			wantErr: scheduler.ErrCandidatesRejected,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := dispatchState{model: "m", maxRetries: tt.maxRetries}
			var act action
			for i, s := range tt.steps {
				act, st = next(s.res, st)
				if act.kind != s.want || act.exclude != s.exclude {
					t.Fatalf("step %d: action %v (exclude %v), want %v (exclude %v)", i, act.kind, act.exclude, s.want, s.exclude)
				}
			}
			if act.kind != actFinish {
				t.Fatalf("last action %v, want actFinish", act.kind)
			}
			if act.run != tt.wantRun {
				t.Errorf("run %p, want %p", act.run, tt.wantRun)
			}
			switch {
			case tt.wantErr == nil && act.err != nil:
				t.Errorf("err %v, want none", act.err)
			case tt.wantErr != nil && !errors.Is(act.err, tt.wantErr):
				t.Errorf("err %v, want %v", act.err, tt.wantErr)
			}
			if tt.wantNotErr != nil && errors.Is(act.err, tt.wantNotErr) {
				t.Errorf("err %v, must not be %v", act.err, tt.wantNotErr)
			}
			if tt.wantMsg != "" && (act.err == nil || !strings.Contains(act.err.Error(), tt.wantMsg)) {
				t.Errorf("err %v, want it to say %s", act.err, tt.wantMsg)
			}
			if act.drop != tt.wantDrop {
				t.Errorf("drop %p, want %p", act.drop, tt.wantDrop)
			}
			if st.retries != tt.wantRetry {
				t.Errorf("retries %d, want %d", st.retries, tt.wantRetry)
			}
		})
	}
}
