// Package cluster elects one scheduler leader among several edges on etcd.
//
// Edges given a cluster configuration (Config) campaign for leadership with
// go.etcd.io/etcd/client/v3/concurrency: each holds a Session on an etcd
// lease of SessionTTL, and Election.Campaign puts the edge's advertise
// address (the gRPC address of its admission service) under the election
// prefix. The edge whose key has the lowest create revision is the leader,
// and that revision is its epoch: a fencing token that only grows, beside
// node generations. Every edge observes the election (Election.Observe), so
// a follower always knows the current leader's address and epoch.
//
// When the leader's session expires (its process died, or it lost etcd for
// SessionTTL) or it resigns, the key goes and the next campaigner is
// elected with a higher epoch. An edge steps down at once (State.Leader
// false), opens a new session and campaigns again when its session ends,
// when its last granted renewal is a TTL old (Leads is 0 from that
// instant: a leader frozen past its TTL grants nothing when it wakes), or
// when it learns of a higher epoch (the observer, or Depose: a node's
// refusal, a peer): a deposed leader that comes back follows.
//
// # Concurrency
//
// An Elector runs two goroutines (campaign, observe) until Close, and a
// renewal loop while a session stands. The session's validity (the last
// granted renewal) is an atomic; Leads and State take no lock. State is
// published through an atomic pointer: State() takes no lock and never
// blocks; Changes is closed and replaced at every change of State.
package cluster

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"
)

// DefaultSessionTTL is a session's lease TTL when Config.SessionTTL is 0:
// a leader that dies is replaced about this long after (its lease must
// expire; the client renews it every TTL/3), so 3 s keeps a failover
// within 5 s with the rebuild (docs/several-edges.md), while an etcd pause shorter
// than about 2 s does not depose the leader.
const DefaultSessionTTL = 3 * time.Second

// DefaultPrefix is the election's key prefix when Config.Prefix is "".
const DefaultPrefix = "/iop/scheduler/leader"

// Config is an edge's `cluster:` section.
//
//	cluster:
//	  etcd: [https://etcd-1:2379, https://etcd-2:2379, https://etcd-3:2379]
//	  name: edge-1                 # unique per edge
//	  advertise: 10.0.0.11:7071    # where other edges reach this edge's admission service
//	  listen: 0.0.0.0:7071         # admission service listener; default: advertise
//	  session_ttl: 5s
//	  etcd_ca: /etc/iop/etcd-ca.pem
//	  etcd_cert: /etc/iop/etcd-client.pem
//	  etcd_key: /etc/iop/etcd-client-key.pem
//	  etcd_username: iop
//	  etcd_password: secret
//	  id: prod-eu                  # this deployment; or derived from token
//	  token: long-shared-secret    # every edge-to-edge call carries it
//	  tls_cert: /etc/iop/edge-a.crt  # TLS between edges (this edge's certificate)
//	  tls_key: /etc/iop/edge-a.key
//	  tls_ca: /etc/iop/edges-ca.crt  # the CA of the edges' certificates: mutual TLS
type Config struct {
	// Etcd are the etcd client endpoints (URLs); at least one.
	Etcd []string `yaml:"etcd"`
	// Name names this edge in the cluster (logs, the leader's view of its
	// followers); unique per edge, required.
	Name string `yaml:"name"`
	// Advertise is the host:port other edges dial for this edge's
	// admission service (gRPC) when it leads; required.
	Advertise string `yaml:"advertise"`
	// Listen is the admission service's listen address; default Advertise.
	Listen string `yaml:"listen"`
	// SessionTTL is the etcd lease TTL of this edge's session: a leader
	// that dies is replaced within about this long; default 5s, at least 1s.
	SessionTTL time.Duration `yaml:"session_ttl"`
	// Prefix is the election's etcd key prefix; default
	// /iop/scheduler/leader. Edges of one cluster share it; the election's
	// keys are under Prefix + "/" + Identity().
	Prefix string `yaml:"prefix"`
	// EtcdCA, EtcdCert and EtcdKey are PEM files for TLS to etcd: the CA
	// etcd's certificates chain to, and this edge's client certificate and
	// key (both or neither). Any set, with https:// endpoints, means TLS.
	EtcdCA   string `yaml:"etcd_ca"`
	EtcdCert string `yaml:"etcd_cert"`
	EtcdKey  string `yaml:"etcd_key"`
	// EtcdUsername and EtcdPassword authenticate to etcd (etcd's auth);
	// both empty: none.
	EtcdUsername string `yaml:"etcd_username"`
	EtcdPassword string `yaml:"etcd_password"`
	// ID names the deployment the edge belongs to: it is part of the
	// election's key prefix (so edges of another deployment on the same
	// etcd never share this election) and every call between edges
	// carries it (an edge of another deployment is refused). 1 to 64 of
	// A-Z a-z 0-9 . _ -. Default: derived from Token (DeriveID); one of ID
	// and Token is required.
	ID string `yaml:"id"`
	// Token is the secret the edges of the deployment share: every call
	// between edges carries it and a wrong one is refused. Empty: calls
	// are not authenticated by token (TLS with TLSCA may still be).
	Token string `yaml:"token"`
	// TLSCert and TLSKey are PEM files of this edge's certificate and key:
	// its admission service serves TLS, and it presents them to the
	// leader it calls. Both or neither; neither means plaintext gRPC
	// between edges.
	TLSCert string `yaml:"tls_cert"`
	TLSKey  string `yaml:"tls_key"`
	// TLSCA is a PEM file of the CA(s) the edges' certificates chain to:
	// a follower verifies the leader's certificate against it, and the
	// leader requires the caller's (mutual TLS). Empty: the system's
	// roots verify the leader, and callers need no certificate.
	TLSCA string `yaml:"tls_ca"`
	// TLSServerName is the name the leader's certificate must carry;
	// default the host of the leader's advertise address.
	TLSServerName string `yaml:"tls_server_name"`
}

// DeriveID is the deployment id derived from a shared token: "t-" and
// the first 16 hex digits of SHA-256("iop cluster id\x00" + token).
// Deployments with different tokens get different ids, and the id says
// nothing usable about the token.
func DeriveID(token string) string {
	sum := sha256.Sum256([]byte("iop cluster id\x00" + token))
	return "t-" + hex.EncodeToString(sum[:8])
}

// Identity is the deployment id: ID, else DeriveID(Token).
func (c Config) Identity() string {
	if c.ID != "" {
		return c.ID
	}
	return DeriveID(c.Token)
}

// electionPrefix is the election's key prefix: Prefix + "/" + Identity.
func (c Config) electionPrefix() string { return c.Prefix + "/" + c.Identity() }

// TLS reports whether the edges talk TLS (TLSCert is set).
func (c Config) TLS() bool { return c.TLSCert != "" }

// SetDefaults fills the zero fields with their defaults.
func (c *Config) SetDefaults() {
	if c.SessionTTL == 0 {
		c.SessionTTL = DefaultSessionTTL
	}
	if c.Prefix == "" {
		c.Prefix = DefaultPrefix
	}
	if c.Listen == "" {
		c.Listen = c.Advertise
	}
}

// Validate reports the first invalid field.
func (c Config) Validate() error {
	switch {
	case len(c.Etcd) == 0:
		return errors.New("cluster.etcd: at least one endpoint")
	case c.Name == "":
		return errors.New("cluster.name is required")
	case c.Advertise == "":
		return errors.New("cluster.advertise is required")
	case c.SessionTTL != 0 && c.SessionTTL < time.Second:
		return fmt.Errorf("cluster.session_ttl %s: at least 1s", c.SessionTTL)
	case (c.EtcdCert == "") != (c.EtcdKey == ""):
		return errors.New("cluster.etcd_cert and cluster.etcd_key go together")
	case (c.EtcdUsername == "") != (c.EtcdPassword == ""):
		return errors.New("cluster.etcd_username and cluster.etcd_password go together")
	case c.ID == "" && c.Token == "":
		return errors.New("cluster.id is required (the deployment's name; or set cluster.token and the id is derived from it): " +
			"edges of different deployments on one etcd must never share an election")
	case c.ID != "" && !validID(c.ID):
		return fmt.Errorf("cluster.id %q: 1 to 64 of A-Z a-z 0-9 . _ -", c.ID)
	case (c.TLSCert == "") != (c.TLSKey == ""):
		return errors.New("cluster.tls_cert and cluster.tls_key go together")
	case c.TLSCA != "" && c.TLSCert == "":
		return errors.New("cluster.tls_ca needs cluster.tls_cert and cluster.tls_key (TLS between edges)")
	}
	return nil
}

func validID(id string) bool {
	if len(id) > 64 {
		return false
	}
	for _, r := range id {
		ok := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-'
		if !ok {
			return false
		}
	}
	return id != ""
}

// clientConfig is the etcd client configuration of c.
func (c Config) clientConfig() (clientv3.Config, error) {
	cc := clientv3.Config{
		Endpoints:            c.Etcd,
		DialTimeout:          5 * time.Second,
		DialKeepAliveTime:    2 * time.Second,
		DialKeepAliveTimeout: 2 * time.Second,
		Username:             c.EtcdUsername,
		Password:             c.EtcdPassword,
		Logger:               zap.NewNop(),
	}
	if c.EtcdCA != "" || c.EtcdCert != "" {
		tc := &tls.Config{MinVersion: tls.VersionTLS12}
		if c.EtcdCA != "" {
			pem, err := os.ReadFile(c.EtcdCA)
			if err != nil {
				return cc, fmt.Errorf("cluster.etcd_ca: %w", err)
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return cc, fmt.Errorf("cluster.etcd_ca %s: no certificate", c.EtcdCA)
			}
			tc.RootCAs = pool
		}
		if c.EtcdCert != "" {
			cert, err := tls.LoadX509KeyPair(c.EtcdCert, c.EtcdKey)
			if err != nil {
				return cc, fmt.Errorf("cluster.etcd_cert/etcd_key: %w", err)
			}
			tc.Certificates = []tls.Certificate{cert}
		}
		cc.TLS = tc
	}
	return cc, nil
}

// State is what an edge knows of the election at one instant.
type State struct {
	// Leader: this edge leads, at Epoch.
	Leader bool
	// Epoch is the current leader's election revision (0: no leader known).
	Epoch int64
	// LeaderAddr is the current leader's advertise address ("" if none).
	LeaderAddr string
}

// Elector campaigns for one edge and follows the election. Create it with
// Start; Close ends it (resigning if it leads).
type Elector struct {
	cfg    Config
	log    *slog.Logger
	cli    *clientv3.Client
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	// base is the origin of validUntil (its monotonic reading).
	base time.Time
	// validUntil (ns since base) is when this edge's session lease may
	// have expired at etcd: the send time of its last granted renewal plus
	// the TTL. Past it, the edge no longer leads (Leads), whatever etcd
	// says later: a frozen leader that wakes grants nothing.
	validUntil atomic.Int64

	// nameInUseBy is the advertise address of another edge that had
	// claimed cfg.Name when this edge's session began ("": none).
	nameInUseBy atomic.Pointer[string]

	state  atomic.Pointer[State]
	mu     sync.Mutex    // guards changed and the writes of state
	ch     chan struct{} // closed at the next change
	own    int64         // epoch of this edge's current leadership (0: none); guarded by mu
	seen   int64         // highest epoch observed; guarded by mu
	depose func()        // ends the current leadership's hold (nil: none); guarded by mu
}

// Start connects to etcd and begins campaigning. It returns at once; the
// first leader shows in State when elected.
func Start(cfg Config, log *slog.Logger) (*Elector, error) {
	cfg.SetDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cc, err := cfg.clientConfig()
	if err != nil {
		return nil, err
	}
	cli, err := clientv3.New(cc)
	if err != nil {
		return nil, fmt.Errorf("cluster: etcd client: %w", err)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	e := &Elector{cfg: cfg, log: log, cli: cli, ch: make(chan struct{}), base: time.Now()}
	e.ctx, e.cancel = context.WithCancel(context.Background())
	e.state.Store(&State{})
	e.wg.Add(2)
	go e.campaignLoop()
	go e.observeLoop()
	return e, nil
}

// State is the current state; it never blocks.
func (e *Elector) State() State { return *e.state.Load() }

// Leads returns the epoch this edge leads now, or 0: State says it leads
// and its session lease cannot have expired at etcd yet (its last renewal
// was granted less than the TTL ago). It never blocks; a leader frozen
// past its TTL stops leading here the instant it wakes, before the etcd
// client notices.
func (e *Elector) Leads() int64 {
	st := e.state.Load()
	if !st.Leader || !e.valid() {
		return 0
	}
	return st.Epoch
}

func (e *Elector) valid() bool {
	return int64(time.Since(e.base)) < e.validUntil.Load()
}

// renewed records a renewal of the session lease sent at sent.
func (e *Elector) renewed(sent time.Time) {
	until := int64(sent.Sub(e.base) + e.cfg.SessionTTL)
	for {
		old := e.validUntil.Load()
		if until <= old || e.validUntil.CompareAndSwap(old, until) {
			return
		}
	}
}

// Depose tells the elector that a leader of epoch exists, at addr when
// known (a node refused this edge's older epoch, or a peer named it):
// when this edge leads an older epoch it steps down at once, and
// campaigns again on a new session. It never blocks.
func (e *Elector) Depose(epoch int64, addr string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.own != 0 && e.own < epoch {
		e.log.Warn("cluster: a newer leader exists: stepping down", "edge", e.cfg.Name, "epoch", e.own, "newer", epoch)
		e.own = 0
		if e.depose != nil {
			e.depose()
		}
	}
	// The observer's reads of etcd stay the judge (seen is not raised):
	// the epoch named here only stands until it reads the leader.
	if st := e.state.Load(); epoch > st.Epoch || (epoch == st.Epoch && st.LeaderAddr == "" && addr != "") {
		e.publishLocked(epoch, addr)
	}
}

// Changes is closed at the next change of State.
func (e *Elector) Changes() <-chan struct{} {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.ch
}

// Name is this edge's cluster name.
func (e *Elector) Name() string { return e.cfg.Name }

// WaitLeader waits until some leader is known (any edge), or ctx ends.
func (e *Elector) WaitLeader(ctx context.Context) (State, error) {
	for {
		ch := e.Changes()
		if st := e.State(); st.Epoch != 0 {
			return st, nil
		}
		select {
		case <-ctx.Done():
			return State{}, ctx.Err()
		case <-ch:
		}
	}
}

// publish recomputes the state from own and the observed leader.
func (e *Elector) publishLocked(epoch int64, addr string) {
	st := State{Epoch: epoch, LeaderAddr: addr}
	st.Leader = e.own != 0 && e.own == epoch
	if old := e.state.Load(); *old == st {
		return
	}
	e.state.Store(&st)
	close(e.ch)
	e.ch = make(chan struct{})
	e.log.Info("cluster election", "edge", e.cfg.Name, "leader", st.Leader, "epoch", st.Epoch, "leader_addr", st.LeaderAddr)
}

func (e *Elector) campaignLoop() {
	defer e.wg.Done()
	backoff := 100 * time.Millisecond
	for e.ctx.Err() == nil {
		if err := e.campaignOnce(); err != nil && e.ctx.Err() == nil {
			e.log.Warn("cluster campaign", "edge", e.cfg.Name, "error", err)
			select {
			case <-e.ctx.Done():
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, 2*time.Second)
			continue
		}
		backoff = 100 * time.Millisecond
	}
}

// campaignOnce opens a session, campaigns until elected, then holds the
// leadership until the session ends or Close.
func (e *Elector) campaignOnce() error {
	ttl := int(e.cfg.SessionTTL / time.Second)
	granted := time.Now()
	sess, err := concurrency.NewSession(e.cli, concurrency.WithTTL(ttl), concurrency.WithContext(e.ctx))
	if err != nil {
		return err
	}
	defer sess.Close() // revokes the lease: the next campaigner is elected at once
	e.validUntil.Store(0)
	e.renewed(granted)
	e.claimName(sess.Lease())
	el := concurrency.NewElection(sess, e.cfg.electionPrefix())
	cctx, ccancel := context.WithCancel(e.ctx)
	go func() {
		select {
		case <-sess.Done():
			ccancel()
		case <-cctx.Done():
		}
	}()
	defer ccancel()
	go e.renewLoop(cctx, sess.Lease())
	if err := el.Campaign(cctx, e.cfg.Advertise); err != nil {
		return err
	}
	epoch := el.Rev()
	hold, deposed := context.WithCancel(cctx)
	defer deposed()
	e.mu.Lock()
	e.own = epoch
	if epoch >= e.seen && e.valid() {
		e.seen = epoch
		e.depose = deposed
		e.publishLocked(epoch, e.cfg.Advertise)
	} else {
		e.own = 0 // a newer leader was seen first: never lead an old epoch
		deposed()
	}
	e.mu.Unlock()
	lapse := time.NewTimer(e.untilLapse())
	defer lapse.Stop()
	for held := true; held; {
		select {
		case <-sess.Done():
			e.log.Warn("cluster session lost: stepping down", "edge", e.cfg.Name, "epoch", epoch)
			held = false
		case <-lapse.C:
			if e.valid() {
				lapse.Reset(e.untilLapse())
				continue
			}
			e.log.Warn("cluster session not renewed within its TTL: stepping down", "edge", e.cfg.Name, "epoch", epoch)
			held = false
		case <-hold.Done():
			held = false
			if e.ctx.Err() != nil {
				rctx, rcancel := context.WithTimeout(context.Background(), 2*time.Second)
				_ = el.Resign(rctx)
				rcancel()
			}
		}
	}
	e.mu.Lock()
	e.own = 0
	e.depose = nil
	st := e.State()
	if st.Leader {
		// Until the observer sees the next leader, none is known.
		e.publishLocked(0, "")
	}
	e.mu.Unlock()
	return nil
}

// untilLapse is the time left before the session lease may have expired
// (at least 1 ms, for a timer).
func (e *Elector) untilLapse() time.Duration {
	return max(time.Duration(e.validUntil.Load()-int64(time.Since(e.base))), time.Millisecond)
}

// renewLoop renews the session lease every third of its TTL, each call
// bounded by that third, and records each granted renewal (renewed), until
// ctx ends. The session's own keep-alive renews it too; this loop only
// learns when a renewal was granted, which the session does not tell.
func (e *Elector) renewLoop(ctx context.Context, lease clientv3.LeaseID) {
	every := e.cfg.SessionTTL / 3
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		sent := time.Now()
		rctx, cancel := context.WithTimeout(ctx, every)
		resp, err := e.cli.KeepAliveOnce(rctx, lease)
		cancel()
		if err == nil && resp.TTL > 0 {
			e.renewed(sent)
		}
	}
}

func (e *Elector) observeLoop() {
	defer e.wg.Done()
	for e.ctx.Err() == nil {
		if err := e.observeOnce(); err != nil && e.ctx.Err() == nil {
			e.log.Warn("cluster observe", "edge", e.cfg.Name, "error", err)
			select {
			case <-e.ctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
		}
	}
}

// observeOnce publishes the current leader (the election key with the
// lowest create revision), then waits until it is deleted (publishing "no
// leader" unless this edge leads) or a first one is put.
func (e *Elector) observeOnce() error {
	resp, err := e.cli.Get(e.ctx, e.cfg.electionPrefix()+"/", clientv3.WithFirstCreate()...)
	if err != nil {
		return err
	}
	octx, cancel := context.WithCancel(e.ctx)
	defer cancel()
	if len(resp.Kvs) == 0 {
		e.seeLeader(0, "")
		wch := e.cli.Watch(octx, e.cfg.electionPrefix()+"/", clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision+1))
		for wr := range wch {
			if err := wr.Err(); err != nil {
				return err
			}
			for _, ev := range wr.Events {
				if ev.Type == clientv3.EventTypePut {
					return nil // read again: the first-created key leads
				}
			}
		}
		return errors.New("watch closed")
	}
	kv := resp.Kvs[0]
	e.seeLeader(kv.CreateRevision, string(kv.Value))
	wch := e.cli.Watch(octx, string(kv.Key), clientv3.WithRev(resp.Header.Revision+1))
	for wr := range wch {
		if err := wr.Err(); err != nil {
			return err
		}
		for _, ev := range wr.Events {
			if ev.Type == clientv3.EventTypeDelete {
				e.seeLeader(0, "")
				return nil
			}
		}
	}
	return errors.New("watch closed")
}

// seeLeader publishes an observed leader (epoch 0: none), never going back
// to an older epoch; while this edge leads, its own leadership stands.
func (e *Elector) seeLeader(epoch int64, addr string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if epoch == 0 {
		if e.own == 0 {
			e.publishLocked(0, "")
		}
		return
	}
	if epoch < e.seen {
		return
	}
	e.seen = epoch
	if e.own != 0 && e.own < epoch {
		// Deposed while its session stood (it froze, or lost etcd).
		e.log.Warn("cluster: a newer leader was elected: stepping down", "edge", e.cfg.Name, "epoch", e.own, "newer", epoch)
		e.own = 0
		if e.depose != nil {
			e.depose()
		}
	}
	e.publishLocked(epoch, addr)
}

// nameKey is where an edge claims its Name for the life of its session:
// beside the election's prefix, after a character no ID holds, so that no
// deployment's election lists it.
func (c Config) nameKey() string { return c.electionPrefix() + "!names/" + c.Name }

// claimName claims the edge's Name, bound to its session's lease. When
// another edge (another advertise address) holds it, it warns and
// NameInUseBy says who: two edges with one name mix up in the logs and in
// the leader's view of its followers. Its own claim of an earlier session
// (a restart within the session TTL) it takes over. etcd errors only
// warn: the election goes on.
func (e *Elector) claimName(lease clientv3.LeaseID) {
	ctx, cancel := context.WithTimeout(e.ctx, 5*time.Second)
	defer cancel()
	key, own := e.cfg.nameKey(), e.cfg.Advertise
	resp, err := e.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, own, clientv3.WithLease(lease))).Else(clientv3.OpGet(key)).Commit()
	if err != nil {
		e.log.Warn("cluster name claim failed", "edge", e.cfg.Name, "error", err)
		return
	}
	other := ""
	if !resp.Succeeded {
		if kvs := resp.Responses[0].GetResponseRange().GetKvs(); len(kvs) > 0 {
			other = string(kvs[0].Value)
		}
		if other == own {
			other = ""
			if _, err := e.cli.Put(ctx, key, own, clientv3.WithLease(lease)); err != nil {
				e.log.Warn("cluster name claim failed", "edge", e.cfg.Name, "error", err)
			}
		}
	}
	// Logged before it is published: whoever sees NameInUseBy finds the
	// warning in the log.
	if other != "" {
		e.log.Warn("another edge of this cluster has this edge's cluster.name: give each edge its own name",
			"name", e.cfg.Name, "advertise", own, "other_advertise", other)
	}
	e.nameInUseBy.Store(&other)
}

// NameInUseBy is the advertise address of another edge that held this
// edge's Name when its session began ("": none, or not known yet).
func (e *Elector) NameInUseBy() string {
	if p := e.nameInUseBy.Load(); p != nil {
		return *p
	}
	return ""
}

// Campaigners returns the advertise addresses of every edge campaigning
// now (the leader's included): the values under the election prefix.
func (e *Elector) Campaigners(ctx context.Context) ([]string, error) {
	resp, err := e.cli.Get(ctx, e.cfg.electionPrefix()+"/", clientv3.WithPrefix())
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		out = append(out, string(kv.Value))
	}
	return out, nil
}

// closeResignWait bounds how long Close lets the campaign resign before it
// closes the etcd client: etcd's Campaign resigns on the client's own
// context, which only closing the client ends when etcd is unreachable.
const closeResignWait = 2 * time.Second

// Close resigns (if leading, and etcd answers within closeResignWait),
// stops campaigning and closes the etcd client. It returns within about
// closeResignWait even when etcd is unreachable
// (TestRegression_CloseWithoutEtcdReturns: a follower's SIGTERM hung).
func (e *Elector) Close() error {
	e.cancel()
	done := make(chan struct{})
	go func() {
		e.wg.Wait()
		close(done)
	}()
	t := time.NewTimer(closeResignWait)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	}
	err := e.cli.Close()
	<-done
	return err
}
