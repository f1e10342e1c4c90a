package process

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"iop/internal/node"
	"iop/internal/wire/memlink"
)

// DefaultLocalNodeID is the node id of the providers an edge serves
// itself (EdgeFile.Providers) when local_node_id is not set.
const DefaultLocalNodeID = "local"

// localAwait bounds how long opening an edge or iop dev waits for its
// in-process node to connect.
const localAwait = 30 * time.Second

// localNode is a node in the edge's own process (iop dev's, and iop
// edge's with providers): a node.Agent connected through the edge's
// in-memory link (package memlink) instead of gRPC. Its steps are start
// (after the edge's node endpoint), await (once the edge serves) and
// drain (before the node endpoint stops).
type localNode struct {
	cfg    node.Config // no Edge: the link is the edge
	opts   []node.Option
	logger *slog.Logger
	reason string // the drain reason the node tells the edge

	// Set by start; read-only after.
	Agent *node.Agent
	done  chan error // one value when Agent.Run has returned, put back by await
	stop  context.CancelFunc
}

// start makes the node and runs it on link; it outlives the run context
// until drain.
func (l *localNode) start(link *memlink.Link) error {
	agent, err := node.New(l.cfg, l.logger, append(l.opts, node.WithGateway(link))...)
	if err != nil {
		return err
	}
	l.Agent = agent
	ctx, stop := context.WithCancel(context.Background())
	l.stop = stop
	l.done = make(chan error, 1)
	go func() { l.done <- agent.Run(ctx) }()
	return nil
}

// await waits, up to localAwait, for the node to connect.
func (l *localNode) await(context.Context) error {
	select {
	case <-l.Agent.Ready():
		return nil
	case err := <-l.done:
		l.done <- err // for drain
		return fmt.Errorf("in-process node stopped: %w", err)
	case <-time.After(localAwait):
		return errors.New("in-process node did not connect within " + localAwait.String())
	}
}

// drain drains the node as `iop node` drains on SIGTERM (it tells the
// edge, and its runs may finish up to its drain timeout) and waits for
// its Run; ctx ending aborts its runs instead. Its error is Run's.
func (l *localNode) drain(ctx context.Context) error {
	defer l.stop()
	l.Agent.Drain(l.reason)
	select {
	case err := <-l.done:
		return err
	case <-ctx.Done():
		l.stop()
		return <-l.done
	}
}
