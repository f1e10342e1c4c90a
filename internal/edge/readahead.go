package edge

import "errors"

// maxReadAhead bounds the bytes of a failed tunnel answer (its error body)
// Dispatch keeps while it admits the request again; a longer one is
// relayed as it is.
const maxReadAhead = 256 << 10

// readAhead owns the messages of a run read before its caller had it
// (Run.readFirst), which Recv returns first, as they came. It is guarded by
// Run.mu.
type readAhead struct {
	msgs []runMsg
}

// unread puts msgs back before the messages still held.
func (a *readAhead) unread(msgs []runMsg) { a.msgs = append(msgs, a.msgs...) }

// pop takes the first message held, if any.
func (a *readAhead) pop() (runMsg, bool) {
	if len(a.msgs) == 0 {
		return runMsg{}, false
	}
	m := a.msgs[0]
	a.msgs = a.msgs[1:]
	return m, true
}

// reset drops every message held.
func (a *readAhead) reset() { a.msgs = nil }

// readFirst reads r's messages until one tells how the provider did
// (verdict) and keeps them in r.ahead for Recv. For a failure worth another
// candidate it returns the retry reason; the run has then ended (a failed
// tunnel answer is read to its end, up to maxReadAhead bytes, else it is no
// retry). A node lost before that message is the reason "node gone", with
// its error. It does not watch the caller's context: the attempt's
// client-gone watcher ends the run, which ends the read.
func (r *Run) readFirst() (reason string, err error) {
	var got []runMsg
	defer func() {
		r.mu.Lock()
		r.ahead.unread(got)
		r.mu.Unlock()
	}()
	for {
		m, err := r.recv()
		if err != nil {
			if errors.Is(err, ErrNodeGone) {
				return "node gone", err
			}
			return "", nil // io.EOF or ctx: Recv will say it again
		}
		got = append(got, m)
		if !m.decisive {
			continue
		}
		retry := m.retry
		if retry == "" || !m.head || m.msg.Ends { // a head with the whole answer ended the run
			return retry, nil
		}
		// A failed tunnel answer: read its body to the end, so that the
		// run's slot is free while the request is admitted again.
		size := m.dataLen
		for {
			m, err := r.recv()
			if err != nil {
				return retry, nil // ended: the head and what came is the answer
			}
			got = append(got, m)
			size += m.dataLen
			if size > maxReadAhead {
				return "", nil
			}
			if m.msg.Ends {
				return retry, nil
			}
		}
	}
}
