package loadgen

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// Progress is a snapshot of a run in progress.
type Progress struct {
	// Elapsed since the run started.
	Elapsed time.Duration
	// Requests ended so far, OK those that succeeded, InFlight those sent
	// and not ended.
	Requests, OK, InFlight int
}

// progressInterval is how often Run reports Progress.
const progressInterval = time.Second

// Run offers cfg's load and returns what it measured. progress, if not nil,
// is called about once a second from another goroutine while the run goes
// on. Run returns early, with what it measured so far, when ctx ends (the
// requests in flight end as OutcomeCancelled). Errors: a Config.Validate
// error (nothing is sent). A request's failure is an outcome in the Result,
// not an error.
func Run(ctx context.Context, cfg Config, progress func(Progress)) (Result, error) {
	if err := cfg.Validate(); err != nil {
		return Result{}, err
	}
	cfg = cfg.withDefaults()
	g := &generator{cfg: cfg, rec: newRecorder(), req: newRequester(cfg)}

	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	start := time.Now()
	var deadline <-chan time.Time
	if cfg.Duration > 0 {
		t := time.NewTimer(cfg.Duration)
		defer t.Stop()
		deadline = t.C
	}
	// done is closed when no more requests may start (duration passed, count
	// reached, ctx ended); requests in flight then finish on runCtx.
	done := make(chan struct{})
	go func() {
		select {
		case <-deadline:
		case <-runCtx.Done():
		case <-g.countReached():
		}
		close(done)
	}()

	var tickerWG sync.WaitGroup
	tickerDone := make(chan struct{})
	if progress != nil {
		tickerWG.Add(1)
		go func() {
			defer tickerWG.Done()
			t := time.NewTicker(progressInterval)
			defer t.Stop()
			for {
				select {
				case <-t.C:
					n, ok := g.rec.counts()
					progress(Progress{Elapsed: time.Since(start), Requests: n, OK: ok, InFlight: int(g.inFlight.Load())})
				case <-tickerDone:
					return
				}
			}
		}()
	}

	switch {
	case cfg.Workload == WorkloadSessions:
		g.sessionsLoop(runCtx, done)
	case cfg.Rate > 0:
		g.openLoop(runCtx, start, done)
	default:
		g.closedLoop(runCtx, done)
	}
	elapsed := time.Since(start)
	close(tickerDone)
	tickerWG.Wait()
	return g.rec.result(cfg, elapsed, int(g.dropped.Load())), nil
}

// generator is the state of one Run.
type generator struct {
	cfg Config
	rec *recorder
	req *requester

	issued   atomic.Int64 // requests started (or dropped), for Config.Requests
	inFlight atomic.Int64
	dropped  atomic.Int64
	reached  chan struct{} // closed when issued reaches Config.Requests
	once     sync.Once
}

// countReached returns a channel closed once Config.Requests requests were
// issued; nil (never ready) when there is no count.
func (g *generator) countReached() <-chan struct{} {
	g.once.Do(func() { g.reached = make(chan struct{}) })
	if g.cfg.Requests == 0 {
		return nil
	}
	return g.reached
}

// take claims the next request of the run; false when the count is reached.
func (g *generator) take() bool {
	g.countReached()
	if g.cfg.Requests == 0 {
		return true
	}
	n := g.issued.Add(1)
	if n == int64(g.cfg.Requests) {
		close(g.reached)
	}
	return n <= int64(g.cfg.Requests)
}

// stopped reports whether no more requests may start.
func stopped(done <-chan struct{}) bool {
	select {
	case <-done:
		return true
	default:
		return false
	}
}

// closedLoop runs Concurrency workers, each sending its next request when
// the previous one ends, until done.
func (g *generator) closedLoop(ctx context.Context, done <-chan struct{}) {
	var wg sync.WaitGroup
	for range g.cfg.Concurrency {
		wg.Go(func() {
			// ctx too: done closes a moment after ctx ends, and a request
			// cancelled by ctx must not be followed by another.
			for !stopped(done) && ctx.Err() == nil && g.take() {
				g.inFlight.Add(1)
				g.rec.add(g.req.do(ctx, time.Now()))
				g.inFlight.Add(-1)
			}
		})
	}
	wg.Wait()
}

// openLoop starts request i at start + i/Rate, each on its own goroutine,
// until done. Several requests are started at once when the scheduler woke
// late, so the offered rate holds on average.
func (g *generator) openLoop(ctx context.Context, start time.Time, done <-chan struct{}) {
	var wg sync.WaitGroup
	defer wg.Wait()
	interval := time.Duration(float64(time.Second) / g.cfg.Rate)
	timer := time.NewTimer(0)
	defer timer.Stop()
	for i := int64(0); ; i++ {
		at := start.Add(time.Duration(i) * interval)
		if wait := time.Until(at); wait > 0 {
			timer.Reset(wait)
			select {
			case <-timer.C:
			case <-done:
				return
			}
		}
		if stopped(done) || ctx.Err() != nil || !g.take() {
			return
		}
		if g.inFlight.Load() >= int64(g.cfg.MaxInFlight) {
			g.dropped.Add(1)
			continue
		}
		g.inFlight.Add(1)
		wg.Go(func() {
			defer g.inFlight.Add(-1)
			g.rec.add(g.req.do(ctx, at))
		})
	}
}
