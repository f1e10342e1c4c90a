package process

import (
	"context"
	"errors"
)

// step is one resource of a process: open acquires it, close releases it.
// Either may be nil (nothing to do in that direction).
type step struct {
	name  string
	open  func(ctx context.Context) error
	close func(ctx context.Context) error
}

// steps opens a process's resources in order and closes the opened ones
// in reverse: a process's shutdown order is its open order read
// backwards, written once in its step list.
type steps struct {
	hook   func(phase, name string) error // Deps.Steps; nil: none
	opened []step                         // in open order
}

// open runs the open of each step of list in order. When one fails (or
// the hook fails it) it closes the steps already opened, in reverse, with
// an ended context (waits are cut short), and returns the failure.
func (s *steps) open(ctx context.Context, list []step) error {
	for _, st := range list {
		err := s.call("open", st.name)
		if err == nil && st.open != nil {
			err = st.open(ctx)
		}
		if err != nil {
			cut, cancel := context.WithCancel(context.Background())
			cancel()
			if cerr := s.close(cut); cerr != nil {
				return errors.Join(err, cerr)
			}
			return err
		}
		s.opened = append(s.opened, st)
	}
	return nil
}

// close closes the opened steps in reverse order, each once, and returns
// their errors joined (nil when none failed; the error itself when one
// did). ctx ending cuts the waits of the steps short (Process.Abort).
func (s *steps) close(ctx context.Context) error {
	var errs []error
	for i := len(s.opened) - 1; i >= 0; i-- {
		st := s.opened[i]
		_ = s.call("close", st.name)
		if st.close != nil {
			if err := st.close(ctx); err != nil {
				errs = append(errs, err)
			}
		}
	}
	s.opened = nil
	if len(errs) == 1 {
		return errs[0]
	}
	return errors.Join(errs...)
}

func (s *steps) call(phase, name string) error {
	if s.hook == nil {
		return nil
	}
	return s.hook(phase, name)
}
