package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"iop/internal/wire/nodev1"
)

// Several edges: the node keeps one connection (a link) to every edge it
// is given, each with its own Hello/Welcome, generation (generations are
// per (node, edge)), heartbeats, warm streams and reconnect backoff; what
// the node runs is shared (provider slots and the runs in flight, see
// capacity.go), so a provider's capacity holds whatever the edges send.

// ErrEdgeGone is the drain reason of a link whose address a name no
// longer resolves to.
var ErrEdgeGone = errors.New("edge address no longer resolved")

// WithResolver makes the agent look the DNS names of Config.Edges up
// with r instead of net.DefaultResolver (tests give one whose Dial reaches
// a DNS server of their own).
func WithResolver(r *net.Resolver) Option { return func(a *Agent) { a.resolver = r } }

// link is the node's connection to one edge address, kept (reconnected
// after every loss) until Run ends, the agent drains, or the address is
// retired (its name no longer resolves to it).
type link struct {
	a *Agent
	// addr is the address the link stands for: a configured host:port, or
	// ip:port resolved from a name. Its key in Agent.links.
	addr string
	// target and authority are what gRPC dials: target as configured, or
	// passthrough:///ip:port with authority name:port (so TLS verifies the
	// name and the :authority header carries it).
	target, authority string
	logger            *slog.Logger

	// draining is closed when the agent drains or the link is retired
	// (drainReason is written before); the link's session then drains its
	// connection as Agent.Drain describes.
	draining    chan struct{}
	drainOnce   sync.Once
	drainReason string
}

// newLink builds the link of addr; it drains when the agent does.
func (a *Agent) newLink(addr, target, authority string) *link {
	return &link{a: a, addr: addr, target: target, authority: authority,
		logger: a.logger.With("edge", addr), draining: make(chan struct{})}
}

// retire drains the link with reason: its connection says Drain, refuses
// new dispatches, lets its runs finish (up to Config.DrainTimeout, then
// aborts them) and closes, and the link does not reconnect.
func (l *link) retire(reason string) {
	l.drainOnce.Do(func() {
		l.drainReason = reason
		close(l.draining)
	})
}

func (l *link) isDraining() bool {
	select {
	case <-l.draining:
		return true
	default:
		return false
	}
}

// superviseEdges runs one link per edge address until ctx ends or the
// agent's drain is over; it returns after every link has ended. A
// configured literal address (or Config.Edge) is one link for the whole
// Run; a DNS name in Config.Edges is looked up now and every
// ResolveInterval (resolveName). It returns an error only when no edge
// can be dialed at all (a target gRPC refuses).
func (a *Agent) superviseEdges(ctx context.Context) error {
	var wg sync.WaitGroup
	errs := make(chan error, 1)
	start := func(l *link) {
		a.addLink(l)
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer a.removeLink(l)
			if err := l.run(ctx); err != nil {
				select {
				case errs <- err:
				default:
				}
			}
		}()
	}
	if a.gateway != nil {
		start(a.newLink(InProcessEdge, "", ""))
	}
	if a.cfg.Edge != "" {
		start(a.newLink(a.cfg.Edge, a.cfg.Edge, ""))
	}
	for _, e := range a.cfg.Edges {
		host, port, _ := net.SplitHostPort(e) // Validate checked the form
		if _, err := netip.ParseAddr(host); err == nil {
			start(a.newLink(e, e, ""))
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			a.resolveName(ctx, host, port, start)
		}()
	}
	wg.Wait()
	select {
	case err := <-errs:
		return err
	default:
		return nil
	}
}

// resolveName keeps one link per address that host resolves to: it looks
// host up now and then every ResolveInterval (on the agent's clock),
// starts a link for each new address and retires (drains, then closes) the
// link of each address gone. A failed lookup, or one that finds nothing,
// changes nothing (the links go on: a DNS outage does not disconnect the
// edges). It returns when ctx ends or the agent drains, after retiring
// nothing: the links drain with the agent and end with Run.
func (a *Agent) resolveName(ctx context.Context, host, port string, start func(*link)) {
	name := net.JoinHostPort(host, port)
	logger := a.logger.With("edges", name)
	links := map[string]*link{}
	for {
		addrs, err := a.lookup(ctx, host)
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			logger.Warn("cannot resolve the edges' name: keeping the connections there are", "err", err, "edges_connected", len(links), "retry_in", a.cfg.ResolveInterval)
		case len(addrs) == 0:
			logger.Warn("the edges' name resolves to no address: keeping the connections there are", "edges_connected", len(links), "retry_in", a.cfg.ResolveInterval)
		default:
			want := map[string]bool{}
			for _, ip := range addrs {
				addr := net.JoinHostPort(ip.String(), port)
				want[addr] = true
				if links[addr] == nil && !a.isDraining() {
					l := a.newLink(addr, "passthrough:///"+addr, name)
					links[addr] = l
					logger.Info("edge address found", "edge", addr)
					start(l)
				}
			}
			for addr, l := range links {
				if !want[addr] {
					logger.Info("edge address gone: draining its connection", "edge", addr)
					l.retire(ErrEdgeGone.Error())
					delete(links, addr)
				}
			}
		}
		if !a.sleepOn(ctx, a.draining, a.cfg.ResolveInterval) {
			return
		}
	}
}

// lookup resolves host to the addresses of one family: IPv4 when it has
// any, else IPv6, sorted (a dual-stack host is one edge, not two).
func (a *Agent) lookup(ctx context.Context, host string) ([]netip.Addr, error) {
	r := a.resolver
	if r == nil {
		r = net.DefaultResolver
	}
	lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	ips, err := r.LookupNetIP(lctx, "ip", host)
	if err != nil {
		return nil, err
	}
	var v4, v6 []netip.Addr
	for _, ip := range ips {
		ip = ip.Unmap()
		if ip.Is4() {
			v4 = append(v4, ip)
		} else {
			v6 = append(v6, ip)
		}
	}
	out := v4
	if len(out) == 0 {
		out = v6
	}
	slices.SortFunc(out, func(x, y netip.Addr) int { return x.Compare(y) })
	return slices.Compact(out), nil
}

// addLink and removeLink keep Agent.links, the links running now.
func (a *Agent) addLink(l *link) {
	a.mu.Lock()
	a.links[l.addr] = l
	a.mu.Unlock()
}

func (a *Agent) removeLink(l *link) {
	a.mu.Lock()
	if a.links[l.addr] == l {
		delete(a.links, l.addr)
	}
	a.mu.Unlock()
}

// run connects to the link's edge and serves it until ctx ends, the link
// drains (the agent's drain, or retire) and its connection has drained,
// reconnecting after every lost connection with exponential backoff
// (ReconnectMin doubling up to ReconnectMax, full jitter; reset after a
// connection that lasted stableSession, so a connection replaced at once
// keeps backing off), independently of the other links. It returns nil
// then, or an error if the edge address cannot be used at all.
func (l *link) run(ctx context.Context) error {
	a := l.a
	// A retired link's drain has its own grace period; the agent's drain
	// timer ends every link.
	ctx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	if a.isDraining() {
		l.retire(a.drainReason)
	}
	go func() {
		select {
		case <-a.draining:
			l.retire(a.drainReason)
		case <-l.draining:
			if !a.isDraining() {
				t := a.clock.AfterFunc(a.cfg.DrainTimeout, func() { stop(ErrDrainTimeout) })
				<-ctx.Done()
				t.Stop()
			}
		case <-ctx.Done():
		}
	}()
	var cc *grpc.ClientConn
	defer func() {
		if cc != nil {
			cc.Close()
		}
	}()
	attempt := 0
	for {
		if l.isDraining() {
			return nil
		}
		client := a.gateway
		if client == nil {
			if cc == nil {
				var err error
				if cc, err = l.dial(); err != nil {
					return err
				}
			}
			client = nodev1.NewNodeGatewayClient(cc)
		}
		start := a.clock.Now()
		welcomed, err := a.session(ctx, l, client)
		if ctx.Err() != nil || l.isDraining() {
			return nil
		}
		if cc != nil && (errors.Is(err, ErrHeartbeatTimeout) || errors.Is(err, ErrWelcomeTimeout)) {
			// The edge went silent: the TCP connection may be dead (a NAT
			// dropped it) without gRPC knowing yet. Start over on a new one.
			cc.Close()
			cc = nil
		}
		// Reset the backoff only after a connection that lasted: one replaced
		// at once (two nodes sharing a node_id) must not reconnect in a
		// tight loop.
		if welcomed && a.clock.Now().Sub(start) >= stableSession {
			attempt = 0
		}
		wait := a.backoff(attempt)
		attempt++
		switch {
		case errors.Is(err, ErrHelloRefused):
			attrs := []any{"err", err, "retry_in", wait}
			if hint := refusalHint(err); hint != "" {
				attrs = append(attrs, "hint", hint)
			}
			l.logger.Error("edge refused the node", attrs...)
		case status.Code(err) == codes.FailedPrecondition:
			l.logger.Error("the edge replaced this connection with a newer one of the same node_id: is another node running with it (or is this edge listed twice)?", "err", err, "retry_in", wait)
		default:
			attrs := []any{"err", err, "retry_in", wait}
			if hint := handshakeHint(err); hint != "" {
				attrs = append(attrs, "hint", hint)
			}
			l.logger.Warn("connection to edge ended", attrs...)
		}
		if !a.sleepOn(ctx, l.draining, wait) {
			return nil
		}
	}
}

// dial makes the gRPC client connection to the link's edge (it connects
// lazily, on the first stream).
func (l *link) dial() (*grpc.ClientConn, error) {
	opts := l.a.dialOptions()
	if l.authority != "" {
		opts = append(opts, grpc.WithAuthority(l.authority))
	}
	cc, err := grpc.NewClient(l.target, opts...)
	if err != nil {
		return nil, fmt.Errorf("dial edge %q: %w", l.addr, err)
	}
	return cc, nil
}

// Generations are the generations of the node's welcomed connections, by
// edge address (as configured, or ip:port for an address a name of
// Config.Edges resolved to; while a retired connection to an address
// still drains beside a new one, the newer generation); empty when none
// is welcomed.
func (a *Agent) Generations() map[string]uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make(map[string]uint64, len(a.gens))
	for l, g := range a.gens {
		if g > out[l.addr] {
			out[l.addr] = g
		}
	}
	return out
}
