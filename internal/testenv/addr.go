package testenv

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
)

// ProcessAddr returns a loopback address ("127.0.0.1:PORT") for a child
// process (or a later Listen) to listen on, now or after a restart.
//
// A port the kernel picked for ":0" and that was closed again may be
// handed to any outgoing connection or ":0" listener before the process
// binds it ("address already in use"). ProcessAddr picks, at random, a
// port below the kernel's ephemeral range (net.ipv4.ip_local_port_range,
// from 20000 up), which neither takes, and checks that it is free now;
// only another explicit bind to the same port can collide. When the
// ephemeral range leaves no room below it, it falls back to ":0".
func ProcessAddr(t testing.TB) string {
	t.Helper()
	const lowest = 20000
	top := ephemeralLow()
	for range 100 {
		if top <= lowest+1000 {
			break
		}
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(lowest+rand.IntN(top-lowest)))
		if l, err := net.Listen("tcp", addr); err == nil {
			l.Close()
			return addr
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("testenv: a free port: %v", err)
	}
	defer l.Close()
	return l.Addr().String()
}

// ephemeralLow is the first port of the kernel's ephemeral range (32768
// when it cannot be read).
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	var lo, hi int
	if _, err := fmt.Sscan(strings.TrimSpace(string(b)), &lo, &hi); err != nil || lo <= 0 {
		return 32768
	}
	return lo
}
