package access

import (
	"context"
	"sync"

	"iop/internal/auth"
)

// KeyAdmit takes one request slot of caller at the scheduler leader
// (several edges): release gives it back; local true means the caller's
// own limits count instead (api.Config.KeyAdmit).
type KeyAdmit func(ctx context.Context, caller *auth.Caller) (release func(), local bool, err error)

// Releaser gives a request slot back, once however often it is called.
type Releaser interface{ Release() }

// Admit takes one request slot of caller: at the scheduler leader when
// remote is set and says so, else from the caller itself, leaving leave
// of its slots free (a batch line leaves one to its key's own requests).
// Its errors are remote's, or the caller's *auth.LimitError.
func Admit(ctx context.Context, caller *auth.Caller, remote KeyAdmit, leave int) (Releaser, error) {
	if remote != nil {
		release, local, err := remote(ctx, caller)
		if err != nil {
			return nil, err
		}
		if !local {
			return &remotePermit{release: release}, nil
		}
	}
	p, err := caller.AdmitLeaving(leave)
	if err != nil {
		return nil, err
	}
	return p, nil
}

// remotePermit is a request slot the scheduler leader holds.
type remotePermit struct {
	once    sync.Once
	release func()
}

func (p *remotePermit) Release() {
	p.once.Do(func() {
		if p.release != nil {
			p.release()
		}
	})
}

// heldPermit is the request slot a request took; kept is set (on the
// request goroutine) when a run outliving the request took it over.
type heldPermit struct {
	permit Releaser
	kept   bool
}

type permitKey struct{}

// WithPermit returns ctx carrying the request slot permit its request
// took, and release, to call when the request ends: it gives the slot
// back unless a run took it over (KeepPermit).
func WithPermit(ctx context.Context, permit Releaser) (_ context.Context, release func()) {
	held := &heldPermit{permit: permit}
	return context.WithValue(ctx, permitKey{}, held), func() {
		if !held.kept {
			permit.Release()
		}
	}
}

// AnswerFinished gives back the request slot of the request whose
// context is ctx, if it holds one: its answer is finished, so the key's
// next request may start. It is called before the answer's last byte is
// written (its final bytes, an error answer, the end of a run recorded
// by the runs API), once the request occupies no provider any more: its
// run has ended at the edge (the terminal message arrived, or the run was
// cancelled; either way its lease is released) or it was never
// dispatched. The slot is given back once, however often this is called
// (auth.Permit.Release), also for a run that took it over (KeepPermit).
func AnswerFinished(ctx context.Context) {
	if held, _ := ctx.Value(permitKey{}).(*heldPermit); held != nil {
		held.permit.Release()
	}
}

// KeepPermit takes over the request slot of the request whose context is
// ctx, for a run that goes on after the request ends (a background run):
// the slot is then given back by calling the returned func (once), or
// when the run's answer is finished (AnswerFinished), not when the
// request ends. Without a slot it returns a no-op.
func KeepPermit(ctx context.Context) func() {
	held, _ := ctx.Value(permitKey{}).(*heldPermit)
	if held == nil {
		return func() {}
	}
	held.kept = true
	return held.permit.Release
}
