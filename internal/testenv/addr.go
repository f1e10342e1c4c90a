package testenv

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
)

// ProcessAddr returns a loopback address ("127.0.0.1:PORT") for a child
// process (or a later Listen) to listen on, now or after a restart.
//
// A port the kernel picked for ":0" and that was closed again may be
// handed to any outgoing connection or ":0" listener before the process
// binds it ("address already in use"). ProcessAddr picks, at random, a
// port below the kernel's ephemeral range (net.ipv4.ip_local_port_range,
// from 20000 up), which neither takes, and checks that it is free now.
// It also reserves the port until t ends, with an flock(2) on a file
// named after it (os.TempDir()/iop-test-ports), which every ProcessAddr
// of every test process honours: a port a test freed to restart its
// server on is not handed to another test meanwhile (an etcd of another
// test bound the port of an edge killed to be restarted, and the edge
// could not come back). The lock goes with the process, whatever ends it.
// When the ephemeral range leaves no room below it, it falls back to ":0".
func ProcessAddr(t testing.TB) string {
	t.Helper()
	const lowest = 20000
	top := ephemeralLow()
	for range 100 {
		if top <= lowest+1000 {
			break
		}
		port := lowest + rand.IntN(top-lowest)
		release, ok := reserveFor(t, port)
		if !ok {
			continue
		}
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		if l, err := net.Listen("tcp", addr); err == nil {
			l.Close()
			return addr
		}
		release()
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("testenv: a free port: %v", err)
	}
	defer l.Close()
	return l.Addr().String()
}

// reserveFor reserves port (reservePort) until t ends; release lets it go
// sooner. false when another test holds it.
func reserveFor(t testing.TB, port int) (release func(), ok bool) {
	lock, ok := reservePort(port)
	if !ok {
		return nil, false
	}
	var once sync.Once
	release = func() { once.Do(func() { lock.Close() }) }
	t.Cleanup(release)
	return release, true
}

// reservePort takes an exclusive flock on port's file under
// os.TempDir()/iop-test-ports, without waiting: the open file holds it
// (closing it lets it go); false when another holds it. Where the file
// cannot be made or locked, the port is taken unreserved.
func reservePort(port int) (*os.File, bool) {
	dir := filepath.Join(os.TempDir(), "iop-test-ports")
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return nil, true
	}
	f, err := os.OpenFile(filepath.Join(dir, strconv.Itoa(port)), os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		return nil, true
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil, !errors.Is(err, syscall.EWOULDBLOCK)
	}
	return f, true
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
