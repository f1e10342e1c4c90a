package anthropic

import (
	"io"
	"time"

	"iop/internal/edge/api"
	"iop/internal/edge/contract"
)

// messagesPingInterval is how long a streamed Messages answer may stay
// quiet before the edge sends a ping event (Anthropic's keep-alive, which
// its clients ignore): a provider reading a long prompt, or thinking
// without showing it, sends nothing for a long time, and proxies and
// clients between give up on a silent connection.
const messagesPingInterval = 10 * time.Second

// pingRun is a Run whose Recv calls ping, on the calling goroutine, each
// time interval passes without a message, so that the request goroutine
// stays the only writer of the response. The run's own Recv is called by
// a receiving goroutine of pingRun's, which hands each message over; stop
// ends that goroutine and waits for it.
type pingRun struct {
	api.Run
	interval time.Duration
	// ping is called when interval passed without a message; nil or an
	// error stops the pings (a failed write: the client has gone, and the
	// next write says so).
	ping func() error

	msgs    chan recvResult
	done    chan struct{} // closed by stop
	exited  chan struct{} // closed when the receiving goroutine ends
	started bool          // the receiving goroutine was started
}

type recvResult struct {
	msg contract.Message
	err error
}

func newPingRun(run api.Run, interval time.Duration, ping func() error) *pingRun {
	return &pingRun{Run: run, interval: interval, ping: ping,
		msgs: make(chan recvResult), done: make(chan struct{}), exited: make(chan struct{})}
}

// Recv returns the run's next message, calling ping while none comes.
// After the message that ends the run, or an error, it returns io.EOF.
func (p *pingRun) Recv() (contract.Message, error) {
	if !p.started {
		p.started = true
		go p.receive()
	}
	timer := time.NewTimer(p.interval)
	defer timer.Stop()
	for {
		select {
		case res := <-p.msgs:
			return res.msg, res.err
		case <-p.exited:
			return contract.Message{}, io.EOF
		case <-timer.C:
			if p.ping != nil && p.ping() != nil {
				p.ping = nil
			}
			timer.Reset(p.interval)
		}
	}
}

// receive calls the run's Recv until a message ends the run or it fails,
// handing each result to Recv.
func (p *pingRun) receive() {
	defer close(p.exited)
	for {
		msg, err := p.Run.Recv()
		select {
		case p.msgs <- recvResult{msg, err}:
		case <-p.done:
			return
		}
		if err != nil || msg.Ends {
			return
		}
	}
}

// stop ends the receiving goroutine and waits for it: the run is
// cancelled first (a no-op for a run that has ended), which makes a
// blocked Recv return. The request goroutine calls it before the run is
// closed.
func (p *pingRun) stop() {
	close(p.done)
	if !p.started {
		return
	}
	p.Run.Cancel("the edge ended the answer")
	<-p.exited
}
