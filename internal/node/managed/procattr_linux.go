package managed

import "syscall"

// sysProcAttr puts a server in its own process group, so that a stop
// signals the whole tree it started, and has the kernel SIGKILL it when the
// node's thread that started it dies (a node killed with SIGKILL leaves no
// server behind; Pdeathsig reaches the server's own process, not the
// processes it forked).
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
