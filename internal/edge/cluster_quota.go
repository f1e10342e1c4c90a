package edge

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"iop/internal/cluster"
	"iop/internal/edge/contract"
	"iop/internal/quota"
	"iop/internal/wire/clusterv1"
)

// Quotas with several edges. The leader holds every edge's quota windows
// (package quota), as it counts every edge's key slots:
//   - A follower's request of a key with a quota asks the leader for its
//     reservation (ReserveQuota, one round trip): a hold (epoch, hold id)
//     or a refusal. Its settlement goes to the leader of the moment
//     (SettleQuota), retried until one takes it; an unknown hold is a
//     no-op, an ended one is remembered (quotaTombstone) so a late
//     report of it is never counted again.
//   - A follower lists its unsettled holds in its Follow session; a new
//     leader adopts each once (quota.Ledger.Adopt, whether or not it
//     fits). A hold whose follower has had no session for unlistedGrace
//     is settled at its full reservation: a lost settlement never leaks,
//     and errs on the side of refusing.
//   - A new leader rebuilds its windows before it admits: it forgets what
//     it knew (Reset), restores the settled usage of every open window
//     from the usage ledger (QuotaDeps.Restore: with several edges, the
//     shared PostgreSQL ledger), adopts its own holds as a follower and
//     the followers' (Follow). What the old leader let its own requests
//     run in its last moments (its own reservations, its last usage not
//     yet written) no edge can know: a leader that follows another fills
//     its minute windows (quota.Ledger.Fill), so none of them takes a
//     reservation for a minute. Longer windows count what the ledger and
//     the followers say; the old leader's own requests in flight when it
//     died are the bound's only slack there.
//   - The rate-limit headers of a follower's answer are the windows the
//     leader sent with its last hold of that key.

// QuotaDeps give the edge the quota ledger its leader keeps (several
// edges) and the way to rebuild it.
type QuotaDeps struct {
	// Ledger is the quota ledger; nil: no quotas.
	Ledger *quota.Ledger
	// Restore counts into l the settled usage of every open window (from
	// the usage ledger); nil: none. A new leader calls it after l.Reset,
	// with a deadline; an error is logged and the leader goes on.
	Restore func(ctx context.Context, l *quota.Ledger) error
}

// quotaTombstone is how long a leader remembers an ended hold.
const quotaTombstone = 10 * time.Minute

// clusterQuota is the quota side of clusterMode.
type clusterQuota struct {
	deps QuotaDeps

	mu       sync.Mutex // guards the fields below; a leaf
	seq      uint64
	holds    map[leaseKey]*quotaHold           // leader: the followers' holds
	ended    map[leaseKey]time.Time            // leader: holds ended, until then + quotaTombstone
	sessions map[string]int                    // leader: open Follow sessions by edge name
	mine     map[leaseKey]*clusterv1.HeldQuota // follower: holds not yet settled at a leader
	windows  map[string][]quota.WindowStatus   // follower: the key's windows the leader last sent
}

// quotaHold is a follower's reservation at the leader.
type quotaHold struct {
	res    *quota.Reservation
	edge   string
	orphan time.Time // since when its edge has had no session (zero: it has one)
}

func (q *clusterQuota) initLocked() {
	if q.holds == nil {
		q.holds = make(map[leaseKey]*quotaHold)
		q.ended = make(map[leaseKey]time.Time)
		q.sessions = make(map[string]int)
		q.mine = make(map[leaseKey]*clusterv1.HeldQuota)
		q.windows = make(map[string][]quota.WindowStatus)
	}
}

func usageOf(u *clusterv1.QuotaUsage) quota.Usage {
	return quota.Usage{Model: u.GetModel(), InputTokens: u.GetInputTokens(), OutputTokens: u.GetOutputTokens(),
		SlotTime: time.Duration(u.GetSlotTimeNs()), CostWeight: u.GetCostWeight()}
}

func wireUsage(u quota.Usage) *clusterv1.QuotaUsage {
	return &clusterv1.QuotaUsage{Model: u.Model, InputTokens: u.InputTokens, OutputTokens: u.OutputTokens,
		SlotTimeNs: int64(u.SlotTime), CostWeight: u.CostWeight}
}

// ---- the leader ----

// quotaElected rebuilds the quota windows for a new leadership of epoch,
// before its term starts (so the followers' sessions adopt into the new
// windows): Reset, Restore, and the holds this edge took as a follower.
func (cm *clusterMode) quotaElected(epoch int64) {
	l := cm.quota.deps.Ledger
	if l == nil {
		return
	}
	l.Reset()
	if f := cm.quota.deps.Restore; f != nil {
		ctx, cancel := cm.withTimeout(cm.stopCtx, rebuildWait)
		err := f(ctx, l)
		cancel()
		if err != nil {
			cm.s.log.Error("cluster leader: quota windows not restored from the usage ledger", "edge", cm.name, "epoch", epoch, "error", err)
		}
	}
	q := &cm.quota
	q.mu.Lock()
	defer q.mu.Unlock()
	q.initLocked()
	clear(q.holds)
	for k, h := range q.mine {
		q.holds[k] = &quotaHold{res: l.Adopt(h.GetKey(), usageOf(h.GetHeld())), edge: cm.name}
	}
}

// quotaReady ends a new leader's quota rebuild (the followers' holds are
// adopted): after another leader, the minute windows are filled; then
// the sweep of orphan holds runs for the term.
func (cm *clusterMode) quotaReady(t *leadTerm) {
	l := cm.quota.deps.Ledger
	if l == nil {
		return
	}
	if cm.keys.sawLeader.Load() {
		l.Fill(time.Minute)
		cm.s.log.Info("cluster leader: minute quota windows filled after another leader", "edge", cm.name, "epoch", t.epoch)
	}
	cm.wg.Add(1)
	go func() {
		defer cm.wg.Done()
		for {
			tick, stop := cm.after(cm.followBeat())
			select {
			case <-t.ctx.Done():
				stop()
				return
			case <-tick:
			}
			cm.sweepQuota()
		}
	}()
}

// sweepQuota settles, at their full reservation, the holds of edges that
// have had no session for unlistedGrace, and forgets old tombstones.
func (cm *clusterMode) sweepQuota() {
	now := cm.clk.Now()
	q := &cm.quota
	q.mu.Lock()
	var lost []*quota.Reservation
	for k, h := range q.holds {
		switch {
		case h.edge == cm.name || q.sessions[h.edge] > 0:
			h.orphan = time.Time{}
		case h.orphan.IsZero():
			h.orphan = now
		case now.Sub(h.orphan) >= cm.unlistedGrace():
			lost = append(lost, h.res)
			delete(q.holds, k)
			q.ended[k] = now
		}
	}
	for k, at := range q.ended {
		if now.Sub(at) > quotaTombstone {
			delete(q.ended, k)
		}
	}
	q.mu.Unlock()
	for _, res := range lost {
		res.Settle(res.Ask())
	}
	if len(lost) > 0 {
		cm.s.log.Warn("cluster leader: quota holds of an edge without a session settled at their reservation", "edge", cm.name, "holds", len(lost))
	}
}

// followSession counts edge's Follow session at the leader and adopts the
// holds it lists; the returned func ends the session.
func (cm *clusterMode) followSession(edge string, held []*clusterv1.HeldQuota) func() {
	q := &cm.quota
	l := q.deps.Ledger
	q.mu.Lock()
	defer q.mu.Unlock()
	q.initLocked()
	q.sessions[edge]++
	for _, h := range held {
		k := leaseKey{h.GetEpoch(), h.GetHoldId()}
		if l == nil || q.holds[k] != nil || !q.ended[k].IsZero() {
			continue
		}
		q.holds[k] = &quotaHold{res: l.Adopt(h.GetKey(), usageOf(h.GetHeld())), edge: edge}
	}
	return func() {
		q.mu.Lock()
		q.sessions[edge]--
		q.mu.Unlock()
	}
}

// ReserveQuota takes a follower's reservation in this leader's quota
// windows: a hold, the quota's refusal (over), or Refused not_leader.
func (a *admissionServer) ReserveQuota(_ context.Context, req *clusterv1.ReserveQuotaRequest) (*clusterv1.ReserveQuotaReply, error) {
	cm := a.cm
	t, ref := a.check(req.GetEpoch())
	if ref != nil {
		return &clusterv1.ReserveQuotaReply{Refused: ref}, nil
	}
	l := cm.quota.deps.Ledger
	if l == nil {
		return &clusterv1.ReserveQuotaReply{Refused: &clusterv1.Refused{Code: refusedNotLeader, Message: "the leader keeps no quotas", Epoch: t.epoch}}, nil
	}
	res, err := l.ReserveUpTo(req.GetKey(), usageOf(req.GetAsk()), req.GetMinOutput())
	windows := wireWindows(l.Status(req.GetKey()))
	var over *quota.Refusal
	if errors.As(err, &over) {
		return &clusterv1.ReserveQuotaReply{Epoch: t.epoch, Over: &clusterv1.QuotaRefusal{
			Scope: over.Scope, Name: over.Name, Window: over.Window, Limit: over.Limit, Asked: over.Asked, Used: over.Used,
			ResetAtUnixNs: unixNs(over.ResetAt), RetryAfterNs: int64(over.RetryAfter), Never: over.Never,
		}, Windows: windows}, nil
	}
	if err != nil {
		return nil, err
	}
	q := &cm.quota
	q.mu.Lock()
	q.initLocked()
	q.seq++
	k := leaseKey{t.epoch, q.seq}
	q.holds[k] = &quotaHold{res: res, edge: req.GetEdge()}
	q.mu.Unlock()
	if cm.el.Leads() != t.epoch || t.ctx.Err() != nil {
		// Deposed meanwhile: the next leader counts nothing of it.
		q.mu.Lock()
		delete(q.holds, k)
		q.mu.Unlock()
		res.Cancel()
		return &clusterv1.ReserveQuotaReply{Refused: cm.notLeader()}, nil
	}
	return &clusterv1.ReserveQuotaReply{Epoch: t.epoch, HoldId: k.id, Held: wireUsage(res.Ask()), Windows: windows}, nil
}

// SettleQuota ends a hold once (settled false: unknown or ended already).
// errNotLeaderRPC when this edge is not the ready leader: the follower
// tries the next.
func (a *admissionServer) SettleQuota(_ context.Context, req *clusterv1.SettleQuotaRequest) (*clusterv1.SettleQuotaReply, error) {
	cm := a.cm
	if cm.readyTerm() == nil {
		return &clusterv1.SettleQuotaReply{}, errNotLeaderRPC
	}
	return &clusterv1.SettleQuotaReply{Settled: cm.settleHold(leaseKey{req.GetEpoch(), req.GetHoldId()}, usageOf(req.GetUsed()), !req.GetCancel())}, nil
}

// settleHold ends the hold k at this leader, once.
func (cm *clusterMode) settleHold(k leaseKey, used quota.Usage, ran bool) bool {
	q := &cm.quota
	q.mu.Lock()
	q.initLocked()
	h := q.holds[k]
	delete(q.holds, k)
	q.ended[k] = cm.clk.Now()
	q.mu.Unlock()
	if h == nil {
		return false
	}
	if ran {
		h.res.Settle(used)
	} else {
		h.res.Cancel()
	}
	return true
}

func unixNs(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

func timeOfNs(ns int64) time.Time {
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns).UTC()
}

func wireWindows(ws []quota.WindowStatus) []*clusterv1.QuotaWindow {
	out := make([]*clusterv1.QuotaWindow, 0, len(ws))
	for _, w := range ws {
		out = append(out, &clusterv1.QuotaWindow{Scope: w.Scope, Name: w.Name, Window: w.Window.Name, Limit: w.Limit, Used: w.Used, ResetAtUnixNs: unixNs(w.ResetAt)})
	}
	return out
}

func windowsOf(ws []*clusterv1.QuotaWindow) []quota.WindowStatus {
	out := make([]quota.WindowStatus, 0, len(ws))
	for _, w := range ws {
		st := quota.WindowStatus{Scope: w.GetScope(), Name: w.GetName(), Limit: w.GetLimit(), Used: w.GetUsed(), ResetAt: timeOfNs(w.GetResetAtUnixNs())}
		for _, win := range quota.Windows {
			if win.Name == w.GetWindow() {
				st.Window = win
			}
		}
		out = append(out, st)
	}
	return out
}

// ---- the follower ----

// heldQuotas lists the holds this edge has at a leader, for its Follow
// session.
func (cm *clusterMode) heldQuotas() []*clusterv1.HeldQuota {
	q := &cm.quota
	q.mu.Lock()
	defer q.mu.Unlock()
	out := make([]*clusterv1.HeldQuota, 0, len(q.mine))
	for _, h := range q.mine {
		out = append(out, h)
	}
	return out
}

// reserveQuota takes a reservation of key at the leader (see
// Service.ReserveQuota).
func (cm *clusterMode) reserveQuota(ctx context.Context, key string, ask quota.Usage, minOutput int64) (local bool, _ *quota.Reservation, _ error) {
	deadline := cm.clk.Now().Add(leaderWait)
	for {
		st, err := cm.waitLeader(ctx, deadline)
		if err != nil {
			return false, nil, err
		}
		if st.Leader {
			return true, nil, nil
		}
		res, err := cm.reserveAt(ctx, st, key, ask, minOutput)
		if err == nil || errors.Is(err, quota.ErrOverQuota) {
			return false, res, err
		}
		if ctx.Err() != nil {
			return false, nil, context.Cause(ctx)
		}
		if cm.clk.Now().After(deadline) {
			return false, nil, fmt.Errorf("%w: the leader at %s cannot be reached: %v", contract.ErrNoLeader, st.LeaderAddr, err)
		}
		pause, stop := cm.after(50 * time.Millisecond)
		select {
		case <-ctx.Done():
		case <-cm.stop:
			stop()
			return false, nil, fmt.Errorf("%w: the cluster side stopped", ErrShuttingDown)
		case <-cm.el.Changes():
		case <-pause:
		}
		stop()
	}
}

// reserveAt makes one ReserveQuota call to the leader of st.
func (cm *clusterMode) reserveAt(ctx context.Context, st cluster.State, key string, ask quota.Usage, minOutput int64) (*quota.Reservation, error) {
	cli, err := cm.client(st.LeaderAddr)
	if err != nil {
		return nil, err
	}
	cctx, cancel := cm.withTimeout(ctx, 2*time.Second)
	rep, err := cli.ReserveQuota(cctx, &clusterv1.ReserveQuotaRequest{Epoch: st.Epoch, Edge: cm.name, Key: key, Ask: wireUsage(ask), MinOutput: minOutput})
	cancel()
	if err != nil {
		return nil, err
	}
	if r := rep.GetRefused(); r != nil {
		if r.GetEpoch() > st.Epoch {
			cm.el.Depose(r.GetEpoch(), r.GetLeader())
		}
		return nil, refusedError(r)
	}
	q := &cm.quota
	q.mu.Lock()
	q.initLocked()
	q.windows[key] = windowsOf(rep.GetWindows())
	q.mu.Unlock()
	if o := rep.GetOver(); o != nil {
		return nil, &quota.Refusal{Scope: o.GetScope(), Name: o.GetName(), Window: o.GetWindow(), Limit: o.GetLimit(), Asked: o.GetAsked(),
			Used: o.GetUsed(), ResetAt: timeOfNs(o.GetResetAtUnixNs()), RetryAfter: time.Duration(o.GetRetryAfterNs()), Never: o.GetNever()}
	}
	k := leaseKey{rep.GetEpoch(), rep.GetHoldId()}
	held := &clusterv1.HeldQuota{Epoch: k.epoch, HoldId: k.id, Key: key, Held: rep.GetHeld()}
	q.mu.Lock()
	q.mine[k] = held
	q.mu.Unlock()
	return quota.Held(usageOf(rep.GetHeld()), func(used quota.Usage, ran bool) { cm.settleQuota(k, used, ran) }), nil
}

// settleQuota ends this follower's hold k at the leader of the moment, in
// the background, retried until a ready leader took it (this edge's own
// when it leads); then the hold leaves the Follow sessions' list.
func (cm *clusterMode) settleQuota(k leaseKey, used quota.Usage, ran bool) {
	req := &clusterv1.SettleQuotaRequest{Epoch: k.epoch, HoldId: k.id, Edge: cm.name, Used: wireUsage(used), Cancel: !ran}
	settled := func(err error) error {
		if err == nil {
			cm.quota.mu.Lock()
			delete(cm.quota.mine, k)
			cm.quota.mu.Unlock()
		}
		return err
	}
	cm.untilLeaderTakes(func() error {
		_, err := (&admissionServer{cm: cm}).SettleQuota(context.Background(), req)
		return settled(err)
	}, func(ctx context.Context, cli clusterv1.AdmissionClient) error {
		_, err := cli.SettleQuota(ctx, req)
		return settled(err)
	})
}

// quotaWindows is what the follower last heard of key's windows.
func (cm *clusterMode) quotaWindows(key string) ([]quota.WindowStatus, bool) {
	cm.quota.mu.Lock()
	defer cm.quota.mu.Unlock()
	ws, ok := cm.quota.windows[key]
	return ws, ok
}

// ---- the HTTP API's quota ----

// Quota is the quota ledger as the HTTP API uses it (access.Quota). On a
// single edge, and on the leader, it is the ledger's; on a follower a
// reservation is the leader's (Service.ReserveQuota) and a key's windows
// are what the leader last said of them.
type Quota struct {
	s *Service
	l *quota.Ledger
}

// Quota returns the HTTP API's quota over l, which must be the ledger of
// QuotaDeps (several edges).
func (s *Service) Quota(l *quota.Ledger) *Quota { return &Quota{s: s, l: l} }

// Limited reports whether the key or its team has a quota.
func (q *Quota) Limited(key string) bool { return q.l.Limited(key) }

// ReserveUpTo is quota.Ledger.ReserveUpTo at the scheduler leader. Errors:
// a *quota.Refusal, contract.ErrNoLeader (no leader answered within
// leaderWait), ErrShuttingDown.
func (q *Quota) ReserveUpTo(key string, ask quota.Usage, minOutput int64) (*quota.Reservation, error) {
	if cm := q.s.cl; cm != nil {
		local, res, err := cm.reserveQuota(context.Background(), key, ask, minOutput)
		if !local {
			return res, err
		}
	}
	return q.l.ReserveUpTo(key, ask, minOutput)
}

// Status is the key's and its team's windows now (a follower's: as the
// leader last said; its own ledger's before it said anything).
func (q *Quota) Status(key string) []quota.WindowStatus {
	if cm := q.s.cl; cm != nil && !cm.el.State().Leader {
		if ws, ok := cm.quotaWindows(key); ok {
			return ws
		}
	}
	return q.l.Status(key)
}
