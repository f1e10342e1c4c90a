package edge

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"iop/internal/cluster"
)

// Metadata of every call between edges (gRPC headers).
const (
	mdClusterID    = "iop-cluster-id"    // the caller's deployment id
	mdClusterToken = "iop-cluster-token" // the deployment's shared token ("" : none)
	mdClusterEdge  = "iop-cluster-edge"  // the caller's cluster.name, for logs
)

// peerLogEvery bounds how often one refusal (same peer, same cause) is
// logged: followers retry every 50 ms.
const peerLogEvery = 10 * time.Second

// peerAuth decides which edges may call this edge's admission service,
// and how this edge calls the leader: every call carries the deployment
// id and the shared token (metadata), checked by the callee before any
// handler runs; with cluster.tls_cert the calls go over TLS (mutual TLS
// with cluster.tls_ca), with the node endpoint's server loader
// (serverTLS). A refusal is logged on both sides, at most once per
// peerLogEvery per peer and cause.
type peerAuth struct {
	id     string
	token  string
	hash   [sha256.Size]byte // of token
	name   string
	log    *slog.Logger
	server credentials.TransportCredentials // never written after newPeerAuth
	client credentials.TransportCredentials

	mu     sync.Mutex // guards logged; a leaf lock
	logged map[string]time.Time
}

// newPeerAuth loads cfg's TLS files. Errors name the file.
func newPeerAuth(cfg cluster.Config, log *slog.Logger) (*peerAuth, error) {
	p := &peerAuth{id: cfg.Identity(), token: cfg.Token, hash: sha256.Sum256([]byte(cfg.Token)), name: cfg.Name, log: log,
		server: insecure.NewCredentials(), client: insecure.NewCredentials(), logged: make(map[string]time.Time)}
	if !cfg.TLS() {
		return p, nil
	}
	stc, err := serverTLS(cfg.TLSCert, cfg.TLSKey, cfg.TLSCA)
	if err != nil {
		return nil, fmt.Errorf("cluster TLS: %w", err)
	}
	ctc := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: cfg.TLSServerName, Certificates: stc.Certificates}
	if cfg.TLSCA != "" {
		pem, err := os.ReadFile(cfg.TLSCA)
		if err != nil {
			return nil, fmt.Errorf("%w: cluster.tls_ca: %w", ErrInvalidConfig, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%w: cluster.tls_ca %s: no PEM certificate in it", ErrInvalidConfig, cfg.TLSCA)
		}
		ctc.RootCAs = pool
	}
	p.server = loggedCreds{TransportCredentials: credentials.NewTLS(stc), p: p}
	p.client = credentials.NewTLS(ctc)
	return p, nil
}

// serverOptions are the admission server's credentials and checks.
func (p *peerAuth) serverOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.Creds(p.server),
		grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			if err := p.authorize(ctx, info.FullMethod); err != nil {
				return nil, err
			}
			return h(ctx, req)
		}),
		grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			if err := p.authorize(ss.Context(), info.FullMethod); err != nil {
				return err
			}
			return h(srv, ss)
		}),
	}
}

// dialOptions are a follower's credentials and metadata for the leader.
func (p *peerAuth) dialOptions() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithTransportCredentials(p.client),
		grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			err := invoker(p.outgoing(ctx), method, req, reply, cc, opts...)
			p.noteRefusal(cc.Target(), err)
			return err
		}),
		grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
			cs, err := streamer(p.outgoing(ctx), desc, cc, method, opts...)
			if err != nil {
				p.noteRefusal(cc.Target(), err)
				return nil, err
			}
			return &notedStream{ClientStream: cs, p: p, target: cc.Target()}, nil
		}),
	}
}

func (p *peerAuth) outgoing(ctx context.Context) context.Context {
	return metadata.AppendToOutgoingContext(ctx, mdClusterID, p.id, mdClusterToken, p.token, mdClusterEdge, p.name)
}

// authorize admits a call that names this deployment and its token:
// codes.PermissionDenied for another deployment's edge (or a caller that
// names none), codes.Unauthenticated for a wrong token.
func (p *peerAuth) authorize(ctx context.Context, method string) error {
	md, _ := metadata.FromIncomingContext(ctx)
	first := func(k string) string {
		if v := md.Get(k); len(v) > 0 {
			return v[0]
		}
		return ""
	}
	id, edge, token := first(mdClusterID), first(mdClusterEdge), first(mdClusterToken)
	remote := "?"
	if pr, ok := peer.FromContext(ctx); ok {
		remote = pr.Addr.String()
	}
	if id != p.id {
		p.warn("id\x00"+remote, "cluster: refused a call from an edge of another deployment (check cluster.id and cluster.token)",
			"remote", remote, "caller", edge, "caller_cluster_id", id, "cluster_id", p.id, "method", method)
		return status.Errorf(codes.PermissionDenied, "cluster id mismatch: this edge belongs to deployment %q, the caller (%q) to %q", p.id, edge, id)
	}
	sum := sha256.Sum256([]byte(token))
	if subtle.ConstantTimeCompare(sum[:], p.hash[:]) != 1 {
		p.warn("token\x00"+remote, "cluster: refused a call with a wrong cluster.token",
			"remote", remote, "caller", edge, "cluster_id", p.id, "method", method)
		return status.Error(codes.Unauthenticated, "wrong cluster token")
	}
	return nil
}

// noteRefusal logs a call the leader refused for who this edge is (its
// deployment, token or certificate) or whose TLS handshake failed.
func (p *peerAuth) noteRefusal(target string, err error) {
	if err == nil {
		return
	}
	st, _ := status.FromError(err)
	switch {
	case st.Code() == codes.PermissionDenied, st.Code() == codes.Unauthenticated:
		p.warn("refused\x00"+target, "cluster: the leader refused this edge (check that every edge has the same cluster.id and cluster.token)",
			"leader_addr", target, "cluster_id", p.id, "error", st.Message())
	case st.Code() == codes.Unavailable && tlsFailure(st.Message()):
		p.warn("tls\x00"+target, "cluster: TLS with the leader failed (check that every edge has cluster.tls_cert/tls_key from the CA in cluster.tls_ca, or none has)",
			"leader_addr", target, "error", st.Message())
	}
}

func tlsFailure(msg string) bool {
	for _, mark := range []string{"authentication handshake failed", "tls:", "x509:", "certificate", "server preface", "does not look like a TLS handshake"} {
		if strings.Contains(msg, mark) {
			return true
		}
	}
	return false
}

// warn logs msg unless the same key was logged within peerLogEvery.
func (p *peerAuth) warn(key, msg string, args ...any) {
	now := time.Now()
	p.mu.Lock()
	last, seen := p.logged[key]
	if seen && now.Sub(last) < peerLogEvery {
		p.mu.Unlock()
		return
	}
	p.logged[key] = now
	if len(p.logged) > 1024 { // many peers: forget the oldest marks at once
		clear(p.logged)
	}
	p.mu.Unlock()
	p.log.Warn(msg, args...)
}

// loggedCreds logs the TLS handshakes the admission server refuses (a
// wrong CA, no client certificate, a plaintext caller): gRPC drops them
// without a word.
type loggedCreds struct {
	credentials.TransportCredentials
	p *peerAuth
}

func (c loggedCreds) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, ai, err := c.TransportCredentials.ServerHandshake(raw)
	if err != nil {
		host, _, _ := net.SplitHostPort(raw.RemoteAddr().String())
		c.p.warn("handshake\x00"+host, "cluster: refused a TLS handshake from another edge (check cluster.tls_cert/tls_key/tls_ca)",
			"remote", raw.RemoteAddr().String(), "error", err)
	}
	return conn, ai, err
}

func (c loggedCreds) Clone() credentials.TransportCredentials {
	return loggedCreds{TransportCredentials: c.TransportCredentials.Clone(), p: c.p}
}

// notedStream notes a refusal that shows at the stream's first receive.
type notedStream struct {
	grpc.ClientStream
	p      *peerAuth
	target string
}

func (s *notedStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if err != nil {
		s.p.noteRefusal(s.target, err)
	}
	return err
}
