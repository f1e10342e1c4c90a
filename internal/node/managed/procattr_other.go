//go:build !linux

package managed

import "syscall"

// sysProcAttr puts a server in its own process group, so that a stop
// signals the whole tree it started. Outside Linux there is no Pdeathsig:
// a node killed with SIGKILL leaves its servers running.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
