package edge

import (
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"sync"

	"gopkg.in/yaml.v3"

	"iop/internal/auth"
)

// NodeToken is one accepted node join token: the token itself or its hash
// (auth.Hash), and the node ids that may present it. In YAML, a plain
// string is a token any node id may present:
//
//	tokens:
//	  - shared-join-token                 # any node id
//	  - {token: gpu-token, nodes: [gpu-1, gpu-2]}
//	  - {hash: "sha256:9f86d0...", nodes: [laptop]}
type NodeToken struct {
	// Token is the secret nodes present in Hello.
	Token string `yaml:"token"`
	// Hash is auth.Hash(token), for a config that holds no usable secret;
	// exactly one of Token and Hash is set.
	Hash string `yaml:"hash"`
	// Nodes are the node ids that may present the token; empty means any.
	Nodes []string `yaml:"nodes"`
}

// UnmarshalYAML reads a token as a plain string or as a mapping with the
// fields token, hash and nodes (any other field is an error, as
// everywhere in the config).
func (t *NodeToken) UnmarshalYAML(n *yaml.Node) error {
	*t = NodeToken{}
	if n.Kind == yaml.ScalarNode {
		return n.Decode(&t.Token)
	}
	if n.Kind == yaml.MappingNode {
		for i := 0; i+1 < len(n.Content); i += 2 {
			switch k := n.Content[i].Value; k {
			case "token", "hash", "nodes":
			default:
				return fmt.Errorf("line %d: field %s not found in type edge.NodeToken", n.Content[i].Line, k)
			}
		}
	}
	type plain NodeToken
	return n.Decode((*plain)(t))
}

// validate reports a token without exactly one of token and hash, a bad
// hash or an empty node id.
func (t NodeToken) validate() error {
	if (t.Token == "") == (t.Hash == "") {
		return errors.New("set exactly one of token and hash")
	}
	if t.Hash != "" {
		if _, err := auth.ParseHash(t.Hash); err != nil {
			return err
		}
	}
	for _, n := range t.Nodes {
		if n == "" {
			return errors.New("empty node id in nodes")
		}
	}
	return nil
}

// trust decides which nodes may join (DESIGN.md "Edge ↔ node protocol":
// hello carries a token). A Hello must present an accepted token (when
// any is configured) that the node id may use; and a node id, once
// accepted, stays bound to the hash of the token it was accepted with for
// the edge's lifetime, so a node presenting another (even valid) token can
// never take over its id and its traffic. The bindings are kept in memory:
// an edge restart forgets them, and the first node to connect after it
// binds its id again. A reload (setTokens) replaces the tokens for the
// next Hello, and frees the ids bound to a token no longer configured;
// nodes already connected stay connected.
type trust struct {
	mu     sync.Mutex // guards the fields below; a leaf lock
	tokens []trustedToken
	bound  map[string][sha256.Size]byte
}

type trustedToken struct {
	hash  [sha256.Size]byte
	nodes map[string]bool // nil = any node id
}

func newTrust(tokens []NodeToken) *trust {
	tr := &trust{bound: make(map[string][sha256.Size]byte)}
	tr.setTokens(tokens)
	return tr
}

// setTokens makes tokens the accepted ones and unbinds every node id bound
// to a token that is no longer among them (none when tokens is empty: an
// open edge), so its node may join with a new token. It reports how many tokens were added and removed (by hash).
func (tr *trust) setTokens(tokens []NodeToken) (added, removed int) {
	var next []trustedToken
	for _, t := range tokens {
		tt := trustedToken{hash: sha256.Sum256([]byte(t.Token))}
		if t.Hash != "" {
			tt.hash, _ = auth.ParseHash(t.Hash) // validated by Config.Validate
		}
		if len(t.Nodes) > 0 {
			tt.nodes = make(map[string]bool, len(t.Nodes))
			for _, n := range t.Nodes {
				tt.nodes[n] = true
			}
		}
		next = append(next, tt)
	}
	kept := make(map[[sha256.Size]byte]bool, len(next))
	for _, t := range next {
		kept[t.hash] = true
	}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	was := make(map[[sha256.Size]byte]bool, len(tr.tokens))
	for _, t := range tr.tokens {
		was[t.hash] = true
	}
	for h := range kept {
		if !was[h] {
			added++
		}
	}
	for h := range was {
		if !kept[h] {
			removed++
		}
	}
	tr.tokens = next
	for node, h := range tr.bound {
		if len(next) > 0 && !kept[h] { // an open edge keeps every binding
			delete(tr.bound, node)
		}
	}
	return added, removed
}

// check reports whether node may join with token: errBadToken for a token
// not configured (when any is), errTokenNode for a token the node id may
// not present. Every configured token is compared, in constant time, so
// the time taken says nothing about which one nearly matched.
func (tr *trust) check(node, token string) error {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if len(tr.tokens) == 0 {
		return nil
	}
	sum := sha256.Sum256([]byte(token))
	var match *trustedToken
	for i := range tr.tokens {
		if subtle.ConstantTimeCompare(tr.tokens[i].hash[:], sum[:]) == 1 {
			match = &tr.tokens[i]
		}
	}
	switch {
	case match == nil:
		return errBadToken
	case match.nodes != nil && !match.nodes[node]:
		return fmt.Errorf("%w: node %q", errTokenNode, node)
	}
	return nil
}

// bind binds node to token's hash on its first accepted Hello and reports
// errNodeBound when node is already bound to another token, unless that
// token names node in its nodes (an explicit grant: how a node moves to a
// rotated token while the old one is still listed). It reports
// errBadToken when a reload removed token since check.
func (tr *trust) bind(node, token string) error {
	sum := sha256.Sum256([]byte(token))
	tr.mu.Lock()
	defer tr.mu.Unlock()
	var match *trustedToken
	for i := range tr.tokens {
		if tr.tokens[i].hash == sum {
			match = &tr.tokens[i]
		}
	}
	if len(tr.tokens) > 0 && match == nil {
		return errBadToken
	}
	if held, ok := tr.bound[node]; ok && subtle.ConstantTimeCompare(held[:], sum[:]) != 1 && (match == nil || !match.nodes[node]) {
		return fmt.Errorf("%w: node %q", errNodeBound, node)
	}
	tr.bound[node] = sum
	return nil
}

// serverTLS builds the node endpoint's TLS configuration from the
// certificate and key files (PEM) and, for mutual TLS, the CA file whose
// certificates node client certificates must chain to. TLS 1.2 is the
// oldest version accepted (gRPC over HTTP/2 needs it, RFC 7540 §9.2).
func serverTLS(certFile, keyFile, clientCAFile string) (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("%w: tls_cert/tls_key: %w", ErrInvalidConfig, err)
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if clientCAFile != "" {
		pem, err := os.ReadFile(clientCAFile)
		if err != nil {
			return nil, fmt.Errorf("%w: client_ca: %w", ErrInvalidConfig, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%w: client_ca %s: no PEM certificate in it", ErrInvalidConfig, clientCAFile)
		}
		cfg.ClientCAs, cfg.ClientAuth = pool, tls.RequireAndVerifyClientCert
	}
	return cfg, nil
}
