package harness

import (
	"strings"
	"sync"
	"testing"

	"iop/internal/node"
	"iop/internal/process"
)

// The node link a test's nodes use to reach an edge Edge started: gRPC
// (LinkGRPC, the default: the node dials the edge's node endpoint, as a
// remote node does) or in memory (LinkMemory: the node runs in the edge's
// process and connects through its in-memory link, package memlink).
const (
	LinkGRPC   = "grpc"
	LinkMemory = "memory"
)

var (
	// links holds the link of the tests that chose one (UseLink), by
	// test name.
	links sync.Map // string → string
	// edges holds the edges Edge started, by node endpoint address, for
	// Node to find the in-memory link of the edge a config names.
	edges sync.Map // string → *process.Process
)

// UseLink makes Node, in t and its subtests, connect a node whose config
// names one edge that Edge started (Config.Edge) through link: with
// LinkMemory, through that edge's in-memory link instead of gRPC. Nodes
// of several edges, or of an edge started otherwise, dial it as ever.
func UseLink(t *testing.T, link string) {
	links.Store(t.Name(), link)
	t.Cleanup(func() { links.Delete(t.Name()) })
}

// LinkOf is the link t (or the test it is a subtest of) chose; LinkGRPC
// when none.
func LinkOf(t testing.TB) string {
	name := t.Name()
	for {
		if l, ok := links.Load(name); ok {
			return l.(string)
		}
		i := strings.LastIndexByte(name, '/')
		if i < 0 {
			return LinkGRPC
		}
		name = name[:i]
	}
}

// RememberEdge lists p, an edge a test started (Edge does it), for Node
// until the test ends: a node of a test that chose LinkMemory then runs
// in p's process.
func RememberEdge(t testing.TB, p *process.Process) {
	if p.NodeAddr == "" || p.NodeLink == nil {
		return
	}
	edges.Store(p.NodeAddr, p)
	t.Cleanup(func() { edges.CompareAndDelete(p.NodeAddr, p) })
}

// onLink returns cfg and opts for the link t chose: with LinkMemory and a
// cfg naming one edge Edge started, a node in that edge's process.
func onLink(t testing.TB, cfg node.Config, opts []node.Option) (node.Config, []node.Option) {
	if LinkOf(t) != LinkMemory || cfg.Edge == "" || len(cfg.Edges) > 0 {
		return cfg, opts
	}
	v, ok := edges.Load(cfg.Edge)
	if !ok {
		return cfg, opts
	}
	cfg.Edge = ""
	return cfg, append(append([]node.Option(nil), opts...), node.WithGateway(v.(*process.Process).NodeLink))
}
