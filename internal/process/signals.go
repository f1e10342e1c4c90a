package process

import (
	"os"
	"os/signal"
	"syscall"

	"golang.org/x/sys/unix"
)

// HandleSignals gives SIGINT and SIGTERM to p until it stops (iop node,
// iop edge, iop dev): the first calls p.Drain with the signal's name (e.g.
// "SIGTERM"), the second p.Abort; then the default handling is restored,
// so a third stops the OS process as the system does. It returns at once;
// its goroutine ends when p stops.
func HandleSignals(p *Process) {
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	go func() {
		defer signal.Stop(sigs)
		for first := true; ; first = false {
			select {
			case s := <-sigs:
				if first {
					p.Drain(signalName(s))
					continue
				}
				p.Abort()
				return
			case <-p.done:
				return
			}
		}
	}()
}

// signalName is "SIGTERM" for syscall.SIGTERM and so on.
func signalName(s os.Signal) string {
	if n, ok := s.(syscall.Signal); ok {
		if name := unix.SignalName(n); name != "" {
			return name
		}
	}
	return s.String()
}
