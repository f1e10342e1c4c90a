package testenv

import (
	"math/rand/v2"
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

// TestRegression_ProcessAddrKeepsItsPortReserved: a port ProcessAddr
// handed out is reserved until its test ends, for every test process
// (an flock on its file): an etcd of one test bound the node port of
// another test's edge, killed to be restarted on it, and the restarted
// edge failed with "address already in use". Here the reservation is
// tried as another process's ProcessAddr would (a file opened anew), and
// it is let go when the test that took it ends. (ProcessAddr reserves
// through reserveFor; on a machine whose ephemeral range leaves no room
// below it, it falls back to ":0" and reserves nothing.)
func TestRegression_ProcessAddrKeepsItsPortReserved(t *testing.T) {
	var port int
	t.Run("holder", func(t *testing.T) {
		for ok := false; !ok; { // a port no other test process holds
			port = 20000 + rand.IntN(12000)
			_, ok = reserveFor(t, port)
		}
		if f, ok := reservePort(port); ok {
			f.Close()
			t.Fatalf("port %d reserved again while its test runs", port)
		}
	})
	f, ok := reservePort(port)
	if !ok {
		t.Fatalf("port %d still reserved after its test ended", port)
	}
	f.Close()
}
