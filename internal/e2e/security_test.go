package e2e

// Security end-to-end tests: a real edge and real node agents over real
// gRPC (and TLS), real HTTP clients, `iop sim` and small recording
// upstreams as providers.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"iop/internal/auth"
	"iop/internal/e2e/harness"
	"iop/internal/ledger"
	"iop/internal/node"
	"iop/internal/process"
	"iop/internal/quota"
	"iop/internal/sim"
	"iop/internal/testenv"
)

// testCA is an in-process certificate authority.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newTestCA(t *testing.T, name string) *testCA {
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
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// issue writes dir/name.crt and dir/name.key: a server certificate for
// 127.0.0.1 and localhost, or a client certificate, signed by ca.
func (ca *testCA) issue(t *testing.T, dir, name string, server bool) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if server {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		tmpl.IPAddresses = []net.IP{net.ParseIP("127.0.0.1")}
		tmpl.DNSNames = []string{"localhost"}
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
	writeFile(t, certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
	writeFile(t, keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}))
	return certFile, keyFile
}

func writeFile(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// startEdgeWith starts an edge with cfg on ephemeral loopback ports.
func startEdgeWith(t *testing.T, cfg process.EdgeFile, logger *slog.Logger) *process.Process {
	t.Helper()
	cfg.Listen, cfg.NodeListen = "127.0.0.1:0", "127.0.0.1:0"
	if cfg.Database == "" || cfg.Database == process.DefaultDatabase {
		cfg.Database = ":memory:"
	}
	ctx, cancel := context.WithCancel(context.Background())
	e, err := process.Start(ctx, process.Config{Mode: process.ModeEdge, Edge: cfg}, process.Deps{Logger: logger})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	harness.StopAtCleanup(t, cancel, e)
	return e
}

// failingNode runs a node that must not get connected: it returns once
// the node has logged a failed connection attempt, with that log record.
func failingNode(t *testing.T, e *process.Process, cfg node.Config) map[string]string {
	t.Helper()
	logs := &logRecorder{}
	agent, err := node.New(cfg, slog.New(logs))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- agent.Run(ctx) }()
	defer func() {
		cancel()
		<-done
	}()
	rec := waitLog(t, logs, map[string]string{"msg": "connection to edge ended"})
	select {
	case <-agent.Ready():
		t.Fatalf("node %s connected", cfg.NodeID)
	default:
	}
	for _, n := range e.Service.Snapshot().Nodes {
		if n.NodeID == cfg.NodeID {
			t.Fatalf("node %s is registered", cfg.NodeID)
		}
	}
	return rec
}

// TestNodeTLS: real gRPC over real TLS between node agents and the edge,
// with certificates made in-process. A node trusting the edge's CA
// connects and serves; one trusting another CA, or dialing in plaintext,
// does not. With mutual TLS (client_ca), a node without a client
// certificate, or with one from another CA, is refused; one with a
// certificate from the CA connects.
func TestNodeTLS(t *testing.T) {
	harness.Parallel(t)
	dir := t.TempDir()
	ca, other := newTestCA(t, "iop test CA"), newTestCA(t, "some other CA")
	caFile, otherFile := filepath.Join(dir, "ca.crt"), filepath.Join(dir, "other.crt")
	writeFile(t, caFile, ca.pem)
	writeFile(t, otherFile, other.pem)
	edgeCert, edgeKey := ca.issue(t, dir, "edge", true)
	goodCert, goodKey := ca.issue(t, dir, "gpu-1", false)
	rogueCert, rogueKey := other.issue(t, dir, "rogue", false)
	_, simURL := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOpenAI, Models: []string{"m"}})
	nodeCfg := func(id string, e *process.Process) node.Config {
		return node.Config{NodeID: id, Edge: e.NodeAddr, ReconnectMin: time.Millisecond, ReconnectMax: 5 * time.Millisecond,
			Providers: []node.ProviderConfig{{ID: "p", Type: node.TypeOpenAI, BaseURL: simURL + "/v1", Models: []string{"m"}}}}
	}
	tlsFailure := func(t *testing.T, rec map[string]string) {
		t.Helper()
		if e := strings.ToLower(rec["err"]); !strings.Contains(e, "tls") && !strings.Contains(e, "certificate") {
			t.Errorf("the failed attempt's error %q names no TLS failure", rec["err"])
		}
	}

	t.Run("server certificate", func(t *testing.T) {
		cfg := process.DefaultEdgeFile()
		cfg.TLSCert, cfg.TLSKey = edgeCert, edgeKey
		e := startEdgeWith(t, cfg, harness.Logger(t, "edge"))
		good := nodeCfg("good", e)
		good.TLSCA = caFile
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		harness.Node(t, ctx, good)
		client := newClient(e)
		if _, err := client.Chat.Completions.New(context.Background(), chatParams("m", "hi")); err != nil {
			t.Fatalf("chat through the TLS node: %v", err)
		}
		wrongCA := nodeCfg("wrong-ca", e)
		wrongCA.TLSCA = otherFile
		tlsFailure(t, failingNode(t, e, wrongCA))
		wrongName := nodeCfg("wrong-name", e)
		wrongName.TLSCA, wrongName.TLSServerName = caFile, "edge.example.com"
		rec := failingNode(t, e, wrongName)
		tlsFailure(t, rec)
		if !strings.Contains(rec["hint"], "tls_server_name") {
			t.Errorf("a certificate for another name: log %v has no tls_server_name hint", rec)
		}
		// A plaintext node at a TLS endpoint: the error alone ("error
		// reading server preface: EOF") gave a new user no clue.
		if rec := failingNode(t, e, nodeCfg("plaintext", e)); !strings.Contains(rec["hint"], "tls_ca") {
			t.Errorf("plaintext node at a TLS edge: log %v has no TLS hint", rec)
		}
	})

	t.Run("TLS node at a plaintext edge", func(t *testing.T) {
		e := startEdgeWith(t, process.DefaultEdgeFile(), harness.Logger(t, "edge"))
		n := nodeCfg("tls-node", e)
		n.TLSCA = caFile
		if rec := failingNode(t, e, n); !strings.Contains(rec["hint"], "tls_ca") {
			t.Errorf("TLS node at a plaintext edge: log %v has no TLS hint", rec)
		}
	})

	t.Run("mutual TLS", func(t *testing.T) {
		cfg := process.DefaultEdgeFile()
		cfg.TLSCert, cfg.TLSKey, cfg.ClientCA = edgeCert, edgeKey, caFile
		e := startEdgeWith(t, cfg, harness.Logger(t, "edge"))
		// With TLS 1.3 the client's handshake completes before the edge
		// checks its certificate, so the node sees the edge drop the
		// connection (broken pipe, EOF) rather than a TLS error.
		noCert := nodeCfg("no-cert", e)
		noCert.TLSCA = caFile
		failingNode(t, e, noCert)
		rogue := nodeCfg("rogue", e)
		rogue.TLSCA, rogue.TLSCert, rogue.TLSKey = caFile, rogueCert, rogueKey
		failingNode(t, e, rogue)
		good := nodeCfg("gpu-1", e)
		good.TLSCA, good.TLSCert, good.TLSKey = caFile, goodCert, goodKey
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		harness.Node(t, ctx, good)
		client := newClient(e)
		if _, err := client.Chat.Completions.New(context.Background(), chatParams("m", "hi")); err != nil {
			t.Fatalf("chat through the mTLS node: %v", err)
		}
	})
}

// TestOpenAPIOnlyOnLoopback: without client keys the edge refuses a
// non-loopback listen address unless --insecure-open, and says why.
func TestOpenAPIOnlyOnLoopback(t *testing.T) {
	harness.Parallel(t)
	cfg := process.DefaultEdgeFile()
	cfg.Listen, cfg.NodeListen, cfg.Database = "0.0.0.0:0", "127.0.0.1:0", ":memory:"
	_, err := process.Start(context.Background(), process.Config{Mode: process.ModeEdge, Edge: cfg}, process.Deps{Logger: harness.Logger(t, "edge")})
	if err == nil || !strings.Contains(err.Error(), "--insecure-open") || !strings.Contains(err.Error(), "keys") {
		t.Fatalf("open API on 0.0.0.0: %v, want a refusal naming keys and --insecure-open", err)
	}
	for name, mutate := range map[string]func(*process.EdgeFile){
		"insecure-open": func(c *process.EdgeFile) { c.InsecureOpen = true },
		"keys":          func(c *process.EdgeFile) { _, h := auth.Generate(); c.Keys = []auth.Key{{Name: "k", Hash: h}} },
	} {
		c := cfg
		mutate(&c)
		logs := &logRecorder{}
		ctx, cancel := context.WithCancel(context.Background())
		e, err := process.Start(ctx, process.Config{Mode: process.ModeEdge, Edge: c}, process.Deps{Logger: slog.New(logs)})
		if err != nil {
			cancel()
			t.Fatalf("%s: %v", name, err)
		}
		open := logs.find(map[string]string{"msg": "client API is open: no API keys are configured, every caller is served"})
		if (name == "insecure-open") != (len(open) == 1) {
			t.Errorf("%s: open-API warnings %v", name, open)
		}
		cancel()
		if err := e.Wait(); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// TestDevAPIKey: iop dev --api-key requires that key, with an OpenAI error
// the official client understands.
func TestDevAPIKey(t *testing.T) {
	harness.Parallel(t)
	var banner bytes.Buffer // the banner iop dev prints once ready
	d := harness.Dev(t, process.DevConfig{APIKey: "dev-secret-key"}, &banner)
	if !strings.Contains(banner.String(), "Authorization: Bearer dev-secret-key") {
		t.Errorf("banner without the key header:\n%s", banner.String())
	}
	// The status command it suggests works as printed: it carries the key,
	// without which it gets 401.
	if !strings.Contains(banner.String(), "iop status --edge http://"+d.HTTPAddr+" --api-key dev-secret-key") {
		t.Errorf("banner's status command without the key:\n%s", banner.String())
	}
	base := "http://" + d.HTTPAddr + "/v1"
	for key, want := range map[string]int{"": 401, "wrong": 401, "dev-secret-key": 200} {
		opts := []option.RequestOption{option.WithBaseURL(base), option.WithMaxRetries(0)}
		if key != "" {
			opts = append(opts, option.WithAPIKey(key))
		}
		client := openai.NewClient(opts...)
		_, err := client.Chat.Completions.New(context.Background(), chatParams("demo", "hi"))
		var apiErr *openai.Error
		switch {
		case want == 200 && err != nil:
			t.Errorf("key %q: %v", key, err)
		case want == 401 && (!errors.As(err, &apiErr) || apiErr.StatusCode != 401):
			t.Errorf("key %q: %v, want 401", key, err)
		}
	}
	// The dev key also opens the admin API, for the dashboard and iop
	// status (the banner points at both).
	withKey := harness.StartCommand(t, context.Background(), "status", "--edge", d.HTTPAddr, "--json", "--api-key", "dev-secret-key")
	if err := <-withKey.Done(); err != nil || !strings.Contains(withKey.Out.String(), `"providers"`) {
		t.Errorf("iop status with the dev key: %v\n%s", err, withKey.Out.String())
	}
	without := harness.StartCommand(t, context.Background(), "status", "--edge", d.HTTPAddr)
	if err := <-without.Done(); err == nil || !strings.Contains(without.Log.String(), "--api-key") {
		t.Errorf("iop status without a key: %v, %q, want an error naming --api-key", err, without.Log.String())
	}
}

// TestKeysCreate: iop keys create prints a key once and a config line
// that, pasted under keys:, accepts exactly that key with its limits.
func TestKeysCreate(t *testing.T) {
	harness.Parallel(t)
	create := harness.StartCommand(t, context.Background(), "keys", "create", "team a", "--models", "llama3,qwen:7b", "--max-concurrent", "2", "--requests-per-minute", "30",
		"--team", "research", "--tokens-per-minute", "10000", "--tokens-per-day", "2000000", "--requests-per-day", "500", "--gpu-seconds-per-day", "3600.5")
	if err := <-create.Done(); err != nil {
		t.Fatalf("%v\n%s", err, create.Log.String())
	}
	out := create.Out.String()
	var secret, line string
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		s := strings.TrimSpace(sc.Text())
		switch {
		case strings.HasPrefix(s, auth.KeyPrefix):
			secret = s
		case strings.HasPrefix(s, "- {"):
			line = s
		}
	}
	if secret == "" || line == "" || strings.Contains(line, secret) {
		t.Fatalf("output:\n%s", out)
	}
	cfg, err := process.ParseEdgeFile([]byte("teams:\n  - {name: research}\nkeys:\n  " + line + "\n"))
	if err != nil {
		t.Fatalf("the printed line does not parse: %v", err)
	}
	k := cfg.Keys[0]
	if k.Name != "team a" || k.MaxConcurrent != 2 || k.RequestsPerMinute != 30 || !slices.Equal(k.Models, []string{"llama3", "qwen:7b"}) ||
		k.Team != "research" || k.Quota != (quota.Limits{TokensPerMinute: 10000, TokensPerDay: 2000000, RequestsPerDay: 500, GPUSecondsPerDay: 3600.5}) {
		t.Errorf("key %+v", k)
	}
	if !strings.Contains(out, `team "research" must be listed under teams:`) {
		t.Errorf("output does not say the team must be listed:\n%s", out)
	}
	kr, err := auth.NewKeyring("keys", cfg.Keys, nil)
	if err != nil || kr.Authenticate(secret) == nil {
		t.Fatalf("the key does not authenticate with its line: %v", err)
	}
	// A keys file in the same shape works too.
	path := filepath.Join(t.TempDir(), "keys.yaml")
	writeFile(t, path, []byte("teams:\n  - {name: research}\nkeys:\n  "+line+"\n"))
	c2, err := process.AccessConfig{KeysFile: path}.LoadKeysFile()
	if err != nil || len(c2.Keys) != 1 || c2.Keys[0].Hash != k.Hash {
		t.Fatalf("keys file: %+v, %v", c2.Keys, err)
	}
}

// rawRequest sends a raw HTTP/1.1 request to addr and returns the
// response's status line and headers and body.
func rawRequest(t *testing.T, addr, req string) (*http.Response, string) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp, string(body)
}

// TestOversizedHeader: a header block over the edge's 64 KiB limit is
// answered 431 (net/http's MaxHeaderBytes), before any handler runs.
func TestOversizedHeader(t *testing.T) {
	harness.Parallel(t)
	_, h := auth.Generate()
	cfg := process.DefaultEdgeFile()
	cfg.Keys = []auth.Key{{Name: "k", Hash: h}}
	e := startEdgeWith(t, cfg, harness.Logger(t, "edge"))
	big := strings.Repeat("a", 100<<10)
	resp, _ := rawRequest(t, e.HTTPAddr, "GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Big: "+big+"\r\nConnection: close\r\n\r\n")
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Fatalf("100 KiB header: %d, want 431", resp.StatusCode)
	}
	resp, _ = rawRequest(t, e.HTTPAddr, "GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "+big+"\r\nConnection: close\r\n\r\n")
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Fatalf("100 KiB Authorization: %d, want 431", resp.StatusCode)
	}
	// A normal request on the same edge is answered (401: no key).
	resp, _ = rawRequest(t, e.HTTPAddr, "GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("small request: %d", resp.StatusCode)
	}
}

// upstream is a recording OpenAI-compatible model server: it keeps the
// method, path, headers and body of every request and answers with
// answer (nil: a minimal chat completion).
type upstream struct {
	URL    string
	answer func(w http.ResponseWriter, r *http.Request, body []byte)

	mu   sync.Mutex
	reqs []upstreamRequest
}

type upstreamRequest struct {
	Method, Path string
	Header       http.Header
	Body         []byte
}

func startUpstream(t *testing.T, answer func(w http.ResponseWriter, r *http.Request, body []byte)) *upstream {
	t.Helper()
	u := &upstream{answer: answer}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		u.mu.Lock()
		u.reqs = append(u.reqs, upstreamRequest{r.Method, r.URL.Path, r.Header.Clone(), body})
		u.mu.Unlock()
		if u.answer != nil {
			u.answer(w, r, body)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"id":"c1","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":2,"completion_tokens":1,"total_tokens":3}}`)
	}))
	t.Cleanup(srv.Close)
	u.URL = srv.URL
	return u
}

func (u *upstream) requests() []upstreamRequest {
	u.mu.Lock()
	defer u.mu.Unlock()
	return slices.Clone(u.reqs)
}

// TestHeaderInjection: CR/LF in a model name, a served model name, run
// metadata or a session id never becomes a header, in the answer to the
// client or in the request to the provider.
func TestHeaderInjection(t *testing.T) {
	harness.Parallel(t)
	const injected = "X-Injected"
	up := startUpstream(t, nil)
	e := startEdgeWith(t, process.DefaultEdgeFile(), harness.Logger(t, "edge"))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	crlfModel := "m\r\nX-Injected: served"
	harness.Node(t, ctx, node.Config{NodeID: "n1", Edge: e.NodeAddr, Providers: []node.ProviderConfig{
		{ID: "up", Type: node.TypeOpenAI, BaseURL: up.URL + "/v1", Models: []string{"m", crlfModel}, Capacity: 4},
	}})
	checkHeaders := func(what string, h http.Header) {
		t.Helper()
		for name, values := range h {
			if strings.EqualFold(name, injected) {
				t.Errorf("%s: header %s: %v", what, name, values)
			}
			for _, v := range values {
				if strings.ContainsAny(v, "\r\n") {
					t.Errorf("%s: header %s has a line break: %q", what, name, v)
				}
			}
		}
	}
	post := func(path, body string, extra string) (*http.Response, string) {
		return rawRequest(t, e.HTTPAddr, "POST "+path+" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"+extra+
			fmt.Sprintf("Content-Length: %d\r\nConnection: close\r\n\r\n", len(body))+body)
	}
	bodyModel := func(model string) string {
		b, _ := json.Marshal(map[string]any{"model": model, "messages": []map[string]string{{"role": "user", "content": "hi"}}})
		return string(b)
	}
	// An unknown model with CR/LF: 404, its name only inside the JSON body.
	resp, body := post("/v1/chat/completions", bodyModel("nope\r\nX-Injected: 1"), "")
	checkHeaders("unknown model answer", resp.Header)
	if resp.StatusCode != 404 || strings.ContainsAny(body[:len(body)-1], "\r\n") {
		t.Errorf("unknown model: %d %q, want 404 with the name escaped", resp.StatusCode, body)
	}
	resp, _ = post("/api/chat", bodyModel("nope\r\nX-Injected: 1"), "")
	checkHeaders("Ollama unknown model answer", resp.Header)
	// A served model name with CR/LF reaches the provider inside the JSON
	// body only.
	resp, body = post("/v1/chat/completions", bodyModel(crlfModel), "X-Request-Id: req-1\r\n")
	checkHeaders("served CR/LF model answer", resp.Header)
	if resp.StatusCode != 200 {
		t.Fatalf("served CR/LF model: %d %s", resp.StatusCode, body)
	}
	// Run metadata with CR/LF is kept as data; a session id with one is refused.
	resp, body = post("/v1/runs", `{"model":"m","prompt":"hi","background":true,"metadata":{"k":"v\r\nX-Injected: 2"}}`, "")
	checkHeaders("runs answer", resp.Header)
	if resp.StatusCode != 202 || !strings.Contains(body, `v\r\nX-Injected: 2`) {
		t.Errorf("run with CR/LF metadata: %d %s", resp.StatusCode, body)
	}
	resp, _ = post("/v1/runs", `{"model":"m","prompt":"hi","session_id":"s\r\nX-Injected: 3"}`, "")
	if resp.StatusCode != 400 {
		t.Errorf("session id with CR/LF: %d", resp.StatusCode)
	}
	// A folded header line (obs-fold) is joined into one value by
	// net/http (RFC 9112 §5.2 lets a server do so): it stays one header.
	resp, _ = post("/v1/chat/completions", bodyModel("m"), "X-Request-Id: a\r\n X-Injected: 4\r\n")
	checkHeaders("obs-fold answer", resp.Header)
	testenv.Eventually(t, "the background run to reach the provider", func() bool { return len(up.requests()) >= 3 })
	reqs := up.requests()
	for i, r := range reqs {
		checkHeaders(fmt.Sprintf("upstream request %d", i), r.Header)
	}
	if got := reqs[0].Header.Get("X-Request-Id"); got != "req-1" {
		t.Errorf("X-Request-Id upstream %q, want req-1", got)
	}
	if !bytes.Contains(reqs[0].Body, []byte(`m\r\nX-Injected: served`)) {
		t.Errorf("served model not in the upstream body as JSON: %s", reqs[0].Body)
	}
}

// TestNeverAnOpenProxy: whatever the model name or body says, a node only
// ever calls its provider's configured endpoints (POST base_url +
// /chat/completions, /completions, /embeddings), and edge paths other than
// the API's reach no provider.
func TestNeverAnOpenProxy(t *testing.T) {
	harness.Parallel(t)
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		if bytes.Contains(body, []byte(`"stream":true`)) {
			// An Ollama route always asks for a stream; one answered
			// otherwise is a provider failure.
			w.Header().Set("Content-Type", "text/event-stream")
			chunk := `{"id":"c","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":"ok","finish_reason":"stop"}]}`
			if r.URL.Path == "/v1/chat/completions" {
				chunk = `{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"ok"},"finish_reason":"stop"}]}`
			}
			fmt.Fprintf(w, "data: %s\n\ndata: [DONE]\n\n", chunk)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.Path {
		case "/v1/embeddings":
			fmt.Fprint(w, `{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.5]}],"model":"m","usage":{"prompt_tokens":1,"total_tokens":1}}`)
		case "/v1/completions":
			fmt.Fprint(w, `{"id":"c","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":"ok","finish_reason":"stop"}]}`)
		default:
			fmt.Fprint(w, `{"id":"c","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}]}`)
		}
	})
	e := startEdgeWith(t, process.DefaultEdgeFile(), harness.Logger(t, "edge"))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	tricky := []string{"../../admin", "/../../v1/files", "m/../../../etc/passwd", "http://evil.example/x", "m?x=/v1/files#"}
	harness.Node(t, ctx, node.Config{NodeID: "n1", Edge: e.NodeAddr, Providers: []node.ProviderConfig{
		{ID: "up", Type: node.TypeOpenAI, BaseURL: up.URL + "/v1", Models: append([]string{"m"}, tricky...), Capacity: 4, Capabilities: []string{"embeddings"}},
	}})
	c := &http.Client{Transport: &http.Transport{}}
	defer c.CloseIdleConnections()
	base := "http://" + e.HTTPAddr
	send := func(method, path, body string) int {
		req, _ := http.NewRequest(method, base+path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, model := range tricky {
		b, _ := json.Marshal(map[string]any{"model": model, "messages": []map[string]string{{"role": "user", "content": "hi"}}})
		if st := send("POST", "/v1/chat/completions", string(b)); st != 200 {
			t.Errorf("model %q: %d", model, st)
		}
		b, _ = json.Marshal(map[string]any{"model": model, "prompt": "hi", "stream": false})
		if st := send("POST", "/api/generate", string(b)); st != 200 {
			t.Errorf("Ollama generate, model %q: %d", model, st)
		}
	}
	// Fields that try to name another URL or path are only body fields.
	send("POST", "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}],"url":"http://evil.example/","path":"/admin","base_url":"http://evil.example","endpoint":"/v1/files","api_base":"http://evil.example"}`)
	send("POST", "/v1/completions", `{"model":"m","prompt":"x","path":"/v1/files"}`)
	send("POST", "/v1/embeddings", `{"model":"m","input":"x","endpoint":"/v1/models"}`)
	// Paths the API does not serve reach no provider.
	before := len(up.requests())
	for _, p := range []string{"/v1/files", "/v1/audio/speech", "/v1/chat/completions/../../admin", "/v1/models/../../../v1/files",
		"/api/delete", "/api/copy", "/api/create", "/api/push", "/v1/responses"} {
		if st := send("POST", p, `{"model":"m","name":"m","messages":[{"role":"user","content":"hi"}]}`); st < 400 {
			t.Errorf("POST %s: %d", p, st)
		}
	}
	// A pull of a served model is answered by the edge itself (Ollama's
	// progress stream): it reaches no provider either.
	send("POST", "/api/pull", `{"model":"m","name":"m"}`)
	if n := len(up.requests()) - before; n != 0 {
		t.Errorf("%d provider requests from paths the API does not serve", n)
	}
	allowed := map[string]bool{"/v1/chat/completions": true, "/v1/completions": true, "/v1/embeddings": true}
	for _, r := range up.requests() {
		if r.Method != "POST" || !allowed[r.Path] {
			t.Errorf("the node called %s %s", r.Method, r.Path)
		}
	}
	if len(up.requests()) < 2*len(tricky)+3 {
		t.Errorf("only %d provider requests", len(up.requests()))
	}
}

// TestProviderKeyNeverEchoed: a provider that echoes its API key back in
// every way it can (an error message, a response header, an error event
// inside its stream, a text error page) never gets it to a client or into
// a log line of the edge or the node, at debug level, on any route:
// success and error paths, OpenAI, Ollama and runs APIs, the runs records
// and the usage report.
func TestProviderKeyNeverEchoed(t *testing.T) {
	harness.Parallel(t)
	const secret = "sk-test-PROVIDER-SECRET-9f3a71c2"
	keyEnv := harness.Env(t, secret)
	up := startUpstream(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		got := r.Header.Get("Authorization")
		w.Header().Set("X-Echo-Authorization", got)
		w.Header().Set("Www-Authenticate", "Bearer error=\"invalid\" key="+got)
		var req struct {
			User   string `json:"user"`
			Stream bool   `json:"stream"`
			Prompt string `json:"prompt"`
		}
		_ = json.Unmarshal(body, &req)
		mode := req.User
		if mode == "" && req.Prompt != "" {
			mode = req.Prompt
		}
		switch mode {
		case "err-json":
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(401)
			fmt.Fprintf(w, `{"error":{"message":"Incorrect API key provided: %s","type":"invalid_request_error","param":"%s","code":"invalid_api_key"}}`, got, got)
		case "err-text":
			w.Header().Set("Content-Type", "text/plain")
			w.WriteHeader(500)
			fmt.Fprintf(w, "upstream exploded with %s", got)
		case "err-sse":
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprint(w, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"x\"}}]}\n\n")
			fmt.Fprintf(w, "data: {\"error\":{\"message\":\"key %s was revoked\"}}\n\n", got)
		default:
			if req.Stream {
				w.Header().Set("Content-Type", "text/event-stream")
				fmt.Fprint(w, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"ok\"},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n")
				return
			}
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprint(w, `{"id":"c","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":2,"completion_tokens":1,"total_tokens":3}}`)
		}
	})
	var logs harness.Buffer
	logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	userKey, userHash := auth.Generate()
	adminKey, adminHash := auth.Generate()
	cfg := process.DefaultEdgeFile()
	cfg.Keys = []auth.Key{{Name: "alice", Hash: userHash}}
	cfg.AdminKeys = []auth.Key{{Name: "ops", Hash: adminHash}}
	// The provider fails on purpose, again and again: keep it in rotation.
	cfg.CircuitBreaker.Failures = -1
	e := startEdgeWith(t, cfg, logger)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	agent, err := node.New(node.Config{NodeID: "n1", Edge: e.NodeAddr, Providers: []node.ProviderConfig{
		{ID: "echo", Type: node.TypeOpenAI, BaseURL: up.URL + "/v1", Models: []string{"m"}, Capacity: 4, APIKeyEnv: keyEnv},
	}}, logger)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- agent.Run(ctx) }()
	defer func() {
		cancel()
		<-done
	}()
	<-agent.Ready()

	var answers strings.Builder
	c := &http.Client{Transport: &http.Transport{}}
	defer c.CloseIdleConnections()
	do := func(method, path, body, key string) {
		req, _ := http.NewRequest(method, "http://"+e.HTTPAddr+path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Fprintf(&answers, "%s %s -> %d %v\n%s\n", method, path, resp.StatusCode, resp.Header, b)
	}
	chat := func(mode string, stream bool) string {
		return fmt.Sprintf(`{"model":"m","user":%q,"stream":%v,"messages":[{"role":"user","content":"hi"}]}`, mode, stream)
	}
	for _, mode := range []string{"ok", "err-json", "err-text", "err-sse"} {
		for _, stream := range []bool{false, true} {
			do("POST", "/v1/chat/completions", chat(mode, stream), userKey)
		}
		do("POST", "/v1/completions", fmt.Sprintf(`{"model":"m","prompt":%q}`, mode), userKey)
		do("POST", "/api/chat", fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":"hi"}],"options":{},"stream":true,"user":%q}`, mode), userKey)
		do("POST", "/api/generate", fmt.Sprintf(`{"model":"m","prompt":%q,"stream":false}`, mode), userKey)
		do("POST", "/v1/runs", fmt.Sprintf(`{"model":"m","user":%q,"prompt":"hi"}`, mode), userKey)
	}
	do("GET", "/v1/runs?limit=100", "", userKey)
	e.Ledger.Flush()
	do("GET", "/admin/v1/usage?group_by=provider", "", adminKey)
	do("GET", "/admin/v1/providers", "", adminKey)

	if n := len(up.requests()); n < 20 {
		t.Fatalf("only %d provider requests: the test did not exercise the provider", n)
	}
	for _, r := range up.requests() {
		if r.Header.Get("Authorization") != "Bearer "+secret {
			t.Fatalf("the provider did not get its key: %v", r.Header)
		}
	}
	if !strings.Contains(answers.String(), " -> 401 ") || !strings.Contains(answers.String(), " -> 200 ") || !strings.Contains(answers.String(), " -> 500 ") {
		t.Fatalf("the answers miss a success or an error path:\n%s", answers.String())
	}
	for what, text := range map[string]string{"answers": answers.String(), "logs": logs.String()} {
		if i := strings.Index(text, secret); i >= 0 {
			t.Errorf("the provider key is in the %s: …%s…", what, text[max(0, i-200):min(len(text), i+100)])
		}
		if i := strings.Index(text, secret[:16]); i >= 0 {
			t.Errorf("a prefix of the provider key is in the %s: …%s…", what, text[max(0, i-200):min(len(text), i+100)])
		}
	}
	if !strings.Contains(logs.String(), "level=DEBUG") {
		t.Fatal("no debug logs were captured")
	}
}

// waitLedger polls, bounded, until the edge's ledger holds n entries: a
// request is recorded as its handler ends, just after its client had the
// answer.
func waitLedger(t *testing.T, e *process.Process, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		sums, err := e.Ledger.Aggregate(context.Background(), ledger.Query{})
		if err != nil {
			t.Fatal(err)
		}
		if got := sums[0].Requests; got == int64(n) {
			return
		} else if got > int64(n) || time.Now().After(deadline) {
			t.Fatalf("the ledger holds %d entries, want %d", got, n)
		}
		<-tick.C
	}
}

// TestUsageLedgerEndToEnd: every route records its finished runs under
// the caller's key, with the model, provider, node and the provider's
// token counts; GET /admin/v1/usage sums them. Two keys sending the same
// requests are scheduled the same way: attribution never steers selection.
func TestUsageLedgerEndToEnd(t *testing.T) {
	harness.Parallel(t)
	_, ollamaURL := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOllama, Models: []string{"m"}, Seed: 3})
	_, openaiURL := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOpenAI, Models: []string{"m"}, Seed: 3})
	alice, aliceHash := auth.Generate()
	bob, bobHash := auth.Generate()
	admin, adminHash := auth.Generate()
	cfg := process.DefaultEdgeFile()
	cfg.Keys = []auth.Key{{Name: "alice", Hash: aliceHash}, {Name: "bob", Hash: bobHash}}
	cfg.AdminKeys = []auth.Key{{Name: "ops", Hash: adminHash}}
	cfg.Database = filepath.Join(t.TempDir(), "iop.db")
	e := startEdgeWith(t, cfg, harness.Logger(t, "edge"))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	harness.Node(t, ctx, node.Config{NodeID: "gpu-1", Edge: e.NodeAddr, Providers: []node.ProviderConfig{
		{ID: "a-ollama", Type: node.TypeOllama, BaseURL: ollamaURL, Models: []string{"m"}, Capacity: 2, Capabilities: []string{"embeddings"}},
		{ID: "b-openai", Type: node.TypeOpenAI, BaseURL: openaiURL + "/v1", Models: []string{"m"}, Capacity: 2, Capabilities: []string{"embeddings"}},
	}})
	c := &http.Client{Transport: &http.Transport{}}
	defer c.CloseIdleConnections()
	do := func(method, path, body, key string) (int, []byte) {
		req, _ := http.NewRequest(method, "http://"+e.HTTPAddr+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	requests := []struct{ path, body string }{
		{"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hello there"}]}`},
		{"/v1/chat/completions", `{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hello"}]}`},
		{"/v1/completions", `{"model":"m","prompt":"once upon"}`},
		{"/v1/embeddings", `{"model":"m","input":["a b c","d"]}`},
		{"/api/chat", `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":false}`},
		{"/api/generate", `{"model":"m","prompt":"hi","stream":false}`},
		{"/v1/runs", `{"model":"m","prompt":"hi"}`},
	}
	// Sequential requests on an idle edge: each goes to the same provider
	// (least loaded, ties by provider id), whoever sends it.
	for _, key := range []string{alice, bob} {
		for _, r := range requests {
			if st, b := do("POST", r.path, r.body, key); st != 200 {
				t.Fatalf("%s: %d %s", r.path, st, b)
			}
		}
	}
	waitIdle(t, e)
	waitLedger(t, e, 2*len(requests))
	type group struct {
		Group            string `json:"group"`
		Requests         int64  `json:"requests"`
		Completed        int64  `json:"completed"`
		PromptTokens     int64  `json:"prompt_tokens"`
		CompletionTokens int64  `json:"completion_tokens"`
	}
	usage := func(q string) []group {
		st, b := do("GET", "/admin/v1/usage?"+q, "", admin)
		var out struct {
			Data []group `json:"data"`
		}
		if st != 200 || json.Unmarshal(b, &out) != nil {
			t.Fatalf("usage %s: %d %s", q, st, b)
		}
		return out.Data
	}
	byKey := usage("group_by=key")
	if len(byKey) != 2 || byKey[0].Group != "alice" || byKey[1].Group != "bob" {
		t.Fatalf("by key: %+v", byKey)
	}
	for _, g := range byKey {
		if g.Requests != int64(len(requests)) || g.Completed != g.Requests || g.PromptTokens == 0 || g.CompletionTokens == 0 {
			t.Errorf("key %s: %+v, want %d completed runs with tokens", g.Group, g, len(requests))
		}
	}
	if byKey[0] != (group{"alice", byKey[1].Requests, byKey[1].Completed, byKey[1].PromptTokens, byKey[1].CompletionTokens}) {
		t.Errorf("the same requests of two keys were accounted differently: %+v", byKey)
	}
	aliceProviders, bobProviders := usage("group_by=provider&key="+"alice"), usage("group_by=provider&key=bob")
	if fmt.Sprint(aliceProviders) != fmt.Sprint(bobProviders) {
		t.Errorf("scheduling differed by key:\nalice %+v\nbob   %+v", aliceProviders, bobProviders)
	}
	if byNode := usage("group_by=node"); len(byNode) != 1 || byNode[0].Group != "gpu-1" || byNode[0].Requests != 2*int64(len(requests)) {
		t.Errorf("by node: %+v", byNode)
	}
	if day := usage("group_by=day&from=" + time.Now().UTC().Format(time.DateOnly)); len(day) != 1 || day[0].Requests != 2*int64(len(requests)) {
		t.Errorf("by day: %+v", day)
	}
	// A refused request (unknown model) is recorded with its error code.
	do("POST", "/v1/chat/completions", `{"model":"nope","messages":[{"role":"user","content":"x"}]}`, alice)
	waitLedger(t, e, 2*len(requests)+1)
	if g := usage("model=nope"); len(g) != 1 || g[0].Requests != 1 || g[0].Completed != 0 {
		t.Errorf("refused request: %+v", g)
	}
}

// TestDevBannerCommandsWork: every curl command iop dev's banner suggests
// works as printed, with and without --api-key (200, a body), the
// Responses and Messages ones included.
func TestDevBannerCommandsWork(t *testing.T) {
	harness.Parallel(t)
	if _, err := exec.LookPath("curl"); err != nil {
		testenv.Missing(t, "curl is not on PATH; the banner's commands are curl commands")
	}
	for _, key := range []string{"", "dev-secret-key"} {
		t.Run("key="+key, func(t *testing.T) {
			var banner bytes.Buffer
			harness.Dev(t, process.DevConfig{APIKey: key}, &banner)
			var commands []string
			for _, line := range strings.Split(banner.String(), "\n") {
				if line = strings.TrimSpace(line); strings.HasPrefix(line, "curl ") {
					commands = append(commands, line)
				}
			}
			if len(commands) < 4 {
				t.Errorf("banner has %d curl commands:\n%s", len(commands), banner.String())
			}
			for _, c := range commands {
				out, err := exec.Command("sh", "-c", c+" -sS -w '\\n%{http_code}'").CombinedOutput()
				body, status := "", string(out)
				if i := strings.LastIndex(status, "\n"); i >= 0 {
					body, status = status[:i], status[i+1:]
				}
				if err != nil || status != "200" || strings.TrimSpace(body) == "" {
					t.Errorf("key %q: %s\n→ %v, status %s:\n%s", key, c, err, status, out)
				}
			}
		})
	}
}
