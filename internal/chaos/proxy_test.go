package chaos

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// linkMode is what a proxy does with one source's traffic.
type linkMode int

const (
	pass  linkMode = iota // forward both ways
	stall                 // accept and hold: forward nothing, close nothing
	drop                  // accept and discard every byte
	cut                   // close every connection, and each new one at once
)

func (m linkMode) String() string {
	return [...]string{"pass", "stall", "drop", "cut"}[m]
}

// proxy is a TCP proxy to one target whose behaviour is set per source:
// the name that identify gives an accepted connection ("" when unknown).
type proxy struct {
	ln       net.Listener
	target   string
	identify func(net.Conn) string

	mu      sync.Mutex // guards the fields below
	changed *sync.Cond // broadcast at every mode change
	modes   map[string]linkMode
	conns   map[*pipe]struct{}
	seen    map[string]int // accepted connections by source
	closed  bool
}

// pipe is one proxied connection: client side and target side.
type pipe struct {
	src          string
	client, dest net.Conn
	once         sync.Once
}

func (p *pipe) close() {
	p.once.Do(func() {
		p.client.Close()
		p.dest.Close()
	})
}

// startProxy listens on a free loopback port and forwards to target until
// the test ends.
func startProxy(t testing.TB, target string, identify func(net.Conn) string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, target: target, identify: identify, modes: map[string]linkMode{}, seen: map[string]int{}, conns: map[*pipe]struct{}{}}
	p.changed = sync.NewCond(&p.mu)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

// addr is where to dial the proxy.
func (p *proxy) addr() string { return p.ln.Addr().String() }

// set gives source's traffic mode m; cut also closes its connections.
func (p *proxy) set(source string, m linkMode) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.modes[source] = m
	if m == cut {
		for c := range p.conns {
			if c.src == source {
				c.close()
			}
		}
	}
	p.changed.Broadcast()
}

func (p *proxy) close() {
	p.ln.Close()
	p.mu.Lock()
	p.closed = true
	for c := range p.conns {
		c.close()
	}
	p.changed.Broadcast()
	p.mu.Unlock()
}

func (p *proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		go p.serve(c)
	}
}

func (p *proxy) serve(c net.Conn) {
	src := ""
	if p.identify != nil {
		src = p.identify(c)
	}
	p.mu.Lock()
	p.seen[src]++
	p.mu.Unlock()
	if p.mode(src) == cut {
		c.Close()
		return
	}
	d, err := net.Dial("tcp", p.target)
	if err != nil {
		c.Close()
		return
	}
	pp := &pipe{src: src, client: c, dest: d}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		pp.close()
		return
	}
	p.conns[pp] = struct{}{}
	p.mu.Unlock()
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); p.copy(pp, d, c) }()
	go func() { defer wg.Done(); p.copy(pp, c, d) }()
	wg.Wait()
	pp.close()
	p.mu.Lock()
	delete(p.conns, pp)
	p.mu.Unlock()
}

// copy forwards from → to, chunk by chunk, as the source's mode says.
func (p *proxy) copy(pp *pipe, to, from net.Conn) {
	defer pp.close()
	buf := make([]byte, 32<<10)
	for {
		n, err := from.Read(buf)
		if n > 0 {
			switch p.await(pp.src) {
			case cut:
				return
			case drop:
			default:
				if _, werr := to.Write(buf[:n]); werr != nil {
					return
				}
			}
		}
		if err != nil {
			return
		}
	}
}

// sources counts the accepted connections by source ("" unknown).
func (p *proxy) sources() map[string]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]int, len(p.seen))
	for k, v := range p.seen {
		out[k] = v
	}
	return out
}

// mode is source's mode now.
func (p *proxy) mode(source string) linkMode {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.modes[source]
}

// await waits while source's link stalls and returns its mode then.
func (p *proxy) await(source string) linkMode {
	p.mu.Lock()
	defer p.mu.Unlock()
	for p.modes[source] == stall && !p.closed {
		p.changed.Wait()
	}
	if p.closed {
		return cut
	}
	return p.modes[source]
}

// ownerOf names, among pids (name → pid), the process that owns the local
// end of the loopback connection whose far end c accepted: it finds the
// socket's inode in /proc/net/tcp and that inode among each process's
// file descriptors. "" when none does (or not on Linux).
func ownerOf(c net.Conn, pids map[string]int) string {
	ra, ok := c.RemoteAddr().(*net.TCPAddr)
	if !ok {
		return ""
	}
	inode, err := socketInode(ra.Port)
	if err != nil {
		return ""
	}
	want := "socket:[" + inode + "]"
	for name, pid := range pids {
		dir := fmt.Sprintf("/proc/%d/fd", pid)
		ents, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		for _, e := range ents {
			if l, err := os.Readlink(dir + "/" + e.Name()); err == nil && l == want {
				return name
			}
		}
	}
	return ""
}

// socketInode is the inode of the IPv4 TCP socket whose local port is port.
func socketInode(port int) (string, error) {
	f, err := os.Open("/proc/net/tcp")
	if err != nil {
		return "", err
	}
	defer f.Close()
	suffix := ":" + strings.ToUpper(strconv.FormatInt(int64(port), 16))
	for len(suffix) < 5 {
		suffix = ":0" + suffix[1:]
	}
	r := bufio.NewReader(f)
	for {
		line, err := r.ReadString('\n')
		fields := strings.Fields(line)
		// sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
		if len(fields) >= 10 && strings.HasSuffix(fields[1], suffix) && strings.HasPrefix(fields[1], "0100007F") {
			return fields[9], nil
		}
		if errors.Is(err, io.EOF) {
			return "", errors.New("no such socket")
		}
		if err != nil {
			return "", err
		}
	}
}
