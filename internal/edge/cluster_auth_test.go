package edge

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"iop/internal/cluster"
	"iop/internal/testenv/etcdtest"
	"iop/internal/wire/clusterv1"
	"iop/internal/wire/nodev1"
)

// logBuf is a slog destination a test reads.
type logBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuf) has(s string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Contains(l.b.String(), s)
}

// startLoggedEdge is startEdge with a logger the test reads.
func startTextLogEdge(t *testing.T, cfg Config) (*testEdge, *logBuf) {
	t.Helper()
	lb := &logBuf{}
	clk := newTestClock()
	srv, err := NewServer(cfg, Deps{Clock: clk, Logger: slog.New(slog.NewTextHandler(lb, nil))})
	if err != nil {
		t.Fatalf("NewServer: %v", err)
	}
	if cfg.Cluster != nil {
		paceClock(t, clk)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, lis) }()
	var once sync.Once
	var serveErr error
	stop := func() error {
		once.Do(func() { cancel(); serveErr = <-served })
		return serveErr
	}
	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = stop(); cc.Close() })
	return &testEdge{srv: srv, svc: srv.Service(), clk: clk, client: nodev1.NewNodeGatewayClient(cc), stop: stop}, lb
}

func clusterCfg(etcd *etcdtest.Cluster, id, name string, t *testing.T) *cluster.Config {
	return &cluster.Config{Etcd: etcd.Endpoints(), Name: name, Advertise: freeAddr(t), SessionTTL: time.Second, ID: id}
}

// waitLog waits until lb has every one of marks.
func waitLog(t *testing.T, what string, lb *logBuf, marks ...string) {
	t.Helper()
	deadline := time.Now().Add(failsafe)
	for {
		ok := true
		for _, m := range marks {
			ok = ok && lb.has(m)
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			lb.mu.Lock()
			defer lb.mu.Unlock()
			t.Fatalf("%s: no %q in the log:\n%s", what, marks, lb.b.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestRegression_OtherDeploymentNeverServesFollowers: an edge of another
// deployment (other models, other keys) pointed at the same etcd with the
// default prefix won the election and answered the first deployment's
// followers: 404 model_not_found and 429 "limit of 0". With the
// deployment's id in the election's prefix and in every call, the first
// deployment elects one of its own edges and serves its followers'
// requests; a call of one of its followers to the other deployment's edge
// is refused (PermissionDenied), with a clear line in both edges' logs.
func TestRegression_OtherDeploymentNeverServesFollowers(t *testing.T) {
	etcd := etcdtest.Start(t)
	bcfg := testConfig()
	bcfg.Cluster = clusterCfg(etcd, "beta", "beta-1", t)
	beta, blog := startTextLogEdge(t, bcfg)
	waitLeader(t, []*testEdge{beta}, []bool{true}, 0) // beta leads first, as in the report

	var alpha []*testEdge
	var alog []*logBuf
	for i := range 2 {
		cfg := testConfig()
		cfg.Cluster = clusterCfg(etcd, "alpha", fmt.Sprintf("alpha-%d", i+1), t)
		e, lb := startTextLogEdge(t, cfg)
		alpha, alog = append(alpha, e), append(alog, lb)
	}
	li := waitLeader(t, alpha, []bool{true, true}, 0)
	fi := 1 - li
	if st, _ := beta.svc.Cluster(); !st.Leader {
		t.Fatalf("beta's edge no longer leads its own deployment: %+v", st)
	}
	cn := &clusterNode{runs: map[string]*nodev1.RunInFlight{}}
	for _, e := range alpha {
		cn.conns = append(cn.conns, e.connect(t, hello("n1", prov("p1", nodev1.ExecutionPath_EXECUTION_PATH_NORMALIZED, 2, "m"))))
	}
	_, _, d := cn.accept(t, fi, alpha[fi].dispatchAsync(context.Background(), chatReq("m")))
	if lst, _ := alpha[li].svc.Cluster(); d.GetEpoch() != lst.Epoch {
		t.Fatalf("alpha's follower was admitted at epoch %d, want alpha's leader's %d", d.GetEpoch(), lst.Epoch)
	}
	if got := leaderInFlight(alpha[li]); got != 1 {
		t.Fatalf("alpha's leader counts %d in flight, want 1", got)
	}

	// A call of alpha's follower to beta's admission service is refused.
	cli, err := alpha[fi].svc.cl.client(bcfg.Cluster.Advertise)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), failsafe)
	defer cancel()
	st, _ := beta.svc.Cluster()
	_, err = cli.AdmitKey(ctx, &clusterv1.AdmitKeyRequest{Epoch: st.Epoch, Edge: "alpha-x", Key: "k"})
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), `deployment "beta"`) {
		t.Fatalf("alpha's call to beta = %v, want PermissionDenied naming beta", err)
	}
	waitLog(t, "beta's edge", blog, "refused a call from an edge of another deployment", "caller_cluster_id=alpha")
	waitLog(t, "alpha's follower", alog[fi], "the leader refused this edge", "cluster id mismatch")
}

// testCA is an in-process certificate authority for edge certificates.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	file string
}

func newTestCA(t *testing.T, dir, name string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	ca := &testCA{cert: cert, key: key, file: filepath.Join(dir, name+".crt")}
	writePEM(t, ca.file, "CERTIFICATE", der)
	return ca
}

// issue writes an edge's certificate (server and client, for 127.0.0.1)
// and key, signed by ca.
func (ca *testCA) issue(t *testing.T, dir, name string) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
	writePEM(t, certFile, "CERTIFICATE", der)
	writePEM(t, keyFile, "EC PRIVATE KEY", keyDER)
	return certFile, keyFile
}

func writePEM(t *testing.T, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestClusterTLSAndTokenBetweenEdges: edges with mutual TLS and a shared
// token admit through the leader as in plaintext; an edge with the wrong
// token, or with a certificate of another CA, is refused, and both the
// leader and the refused edge say so in their logs.
func TestClusterTLSAndTokenBetweenEdges(t *testing.T) {
	etcd := etcdtest.Start(t)
	dir := t.TempDir()
	good, bad := newTestCA(t, dir, "edges-ca"), newTestCA(t, dir, "other-ca")
	edgeCfg := func(name, token string, ca *testCA) Config {
		cfg := testConfig()
		cfg.Cluster = clusterCfg(etcd, "prod", name, t)
		cfg.Cluster.Token = token
		cfg.Cluster.TLSCert, cfg.Cluster.TLSKey = ca.issue(t, dir, name)
		cfg.Cluster.TLSCA = ca.file
		return cfg
	}
	e1, log1 := startTextLogEdge(t, edgeCfg("edge-1", "s3cret", good))
	waitLeader(t, []*testEdge{e1}, []bool{true}, 0)
	e2, _ := startTextLogEdge(t, edgeCfg("edge-2", "s3cret", good))
	waitLeader(t, []*testEdge{e1, e2}, []bool{true, true}, 0)

	// Over mutual TLS with the token, the follower's request is admitted
	// at the leader.
	cn := &clusterNode{runs: map[string]*nodev1.RunInFlight{}}
	for _, e := range []*testEdge{e1, e2} {
		cn.conns = append(cn.conns, e.connect(t, hello("n1", prov("p1", nodev1.ExecutionPath_EXECUTION_PATH_NORMALIZED, 2, "m"))))
	}
	_, _, d := cn.accept(t, 1, e2.dispatchAsync(context.Background(), chatReq("m")))
	if st, _ := e1.svc.Cluster(); d.GetEpoch() != st.Epoch || leaderInFlight(e1) != 1 {
		t.Fatalf("the follower's run: epoch %d (leader's %d), leader in flight %d", d.GetEpoch(), st.Epoch, leaderInFlight(e1))
	}

	// A wrong token: refused, logged by both.
	e3, log3 := startTextLogEdge(t, edgeCfg("edge-3", "guess", good))
	waitLog(t, "the leader", log1, "refused a call with a wrong cluster.token", "caller=edge-3")
	waitLog(t, "the edge with the wrong token", log3, "the leader refused this edge", "wrong cluster token")
	leaderAddr := e3.svc.cl.el.State().LeaderAddr
	cli, err := e3.svc.cl.client(leaderAddr)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), failsafe)
	defer cancel()
	if _, err := cli.AdmitKey(ctx, &clusterv1.AdmitKeyRequest{Edge: "edge-3", Key: "k"}); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("a call with the wrong token = %v, want Unauthenticated", err)
	}

	// A certificate of another CA: the handshake fails, logged by both.
	_, log4 := startTextLogEdge(t, edgeCfg("edge-4", "s3cret", bad))
	waitLog(t, "the leader", log1, "refused a TLS handshake from another edge")
	waitLog(t, "the edge of another CA", log4, "TLS with the leader failed")
	if got := leaderInFlight(e1); got != 1 {
		t.Fatalf("leader in flight %d after the refused edges, want 1", got)
	}
}

// TestClusterReadyNeedsALeader: /readyz's Service.Ready is false without a
// node connection, and with several edges also while no leader admits for
// the edge (etcd unreachable: no election); with a leader and a node it
// is true on the leader and on a follower once its session is open.
func TestClusterReadyNeedsALeader(t *testing.T) {
	cfg := testConfig()
	cfg.Cluster = &cluster.Config{Etcd: []string{"http://" + freeAddr(t)}, Name: "lonely", Advertise: freeAddr(t), SessionTTL: time.Second, ID: "x"}
	lonely := startEdge(t, cfg)
	lonely.connect(t, hello("n1", prov("p1", nodev1.ExecutionPath_EXECUTION_PATH_NORMALIZED, 2, "m")))
	if lonely.svc.Ready() {
		t.Fatal("ready with a node but no etcd (no leader)")
	}

	etcd := etcdtest.Start(t)
	es := clusterEdges(t, etcd, 2)
	li := waitLeader(t, es, []bool{true, true}, 0)
	for i, e := range es {
		if e.svc.Ready() {
			t.Fatalf("edge %d ready without a node", i)
		}
	}
	for _, e := range es {
		e.connect(t, hello("n1", prov("p1", nodev1.ExecutionPath_EXECUTION_PATH_NORMALIZED, 2, "m")))
	}
	waitFor(t, func() bool { return es[li].svc.Ready() && es[1-li].svc.Ready() })
	if lonely.svc.Ready() {
		t.Fatal("the edge without etcd became ready")
	}
}
