package testenv

import (
	"net"
	"strconv"
	"testing"
)

// TestProcessAddr: the address is on loopback, below the kernel's
// ephemeral range (when there is room), and free.
func TestProcessAddr(t *testing.T) {
	for range 20 {
		addr := ProcessAddr(t)
		host, port, err := net.SplitHostPort(addr)
		if err != nil || host != "127.0.0.1" {
			t.Fatalf("ProcessAddr = %q, want 127.0.0.1:PORT", addr)
		}
		p, _ := strconv.Atoi(port)
		if lo := ephemeralLow(); lo > 21000 && (p < 20000 || p >= lo) {
			t.Fatalf("port %d, want in [20000, %d)", p, lo)
		}
		l, err := net.Listen("tcp", addr)
		if err != nil {
			t.Fatalf("listen on %s: %v", addr, err)
		}
		l.Close()
	}
}
