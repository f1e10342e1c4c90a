package edge

import (
	"strings"
	"sync"
	"testing"

	"iop/internal/wire/memlink"
)

// The node link: a node reaches the edge over gRPC (a remote node, and
// the tests' fake nodes by default) or in memory (package memlink: a node
// in the edge's own process). Both run the same handlers, so every
// guarantee of the remote path must hold on either; TestGuaranteesOnEachLink
// runs the tests that protect them on both.
const (
	linkGRPC   = "grpc"
	linkMemory = "memory"
)

// links holds the link of the tests that chose one (useLink), by test name.
var links sync.Map // string → string

// useLink makes startEdge, in t and its subtests, hand the fake nodes a
// client of the given link.
func useLink(t *testing.T, link string) {
	links.Store(t.Name(), link)
	t.Cleanup(func() { links.Delete(t.Name()) })
}

// linkOf is the link t (or the test it is a subtest of) chose; gRPC when
// none.
func linkOf(t testing.TB) string {
	name := t.Name()
	for {
		if l, ok := links.Load(name); ok {
			return l.(string)
		}
		i := strings.LastIndexByte(name, '/')
		if i < 0 {
			return linkGRPC
		}
		name = name[:i]
	}
}

// TestGuaranteesOnEachLink runs the tests of the edge's guarantees to a
// node over each link: generations (a reconnect is a new generation, a
// replaced or stale one's late messages change nothing), exactly-once
// release (by a terminal message, a tunnel error, a refusal, a timeout, a
// Close, a lost node, a stream the node aborts), cancellation both ways,
// drain, a node lost mid-run, warm streams, the body inline or in chunks,
// heartbeats and the edge's shutdown.
func TestGuaranteesOnEachLink(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		test func(*testing.T)
	}{
		{"GenerationIncreasesOnReconnect", TestGenerationIncreasesOnReconnect},
		{"DispatchNormalized", TestDispatchNormalized},
		{"DispatchTunnel", TestDispatchTunnel},
		{"TunnelErrorReleases", TestTunnelErrorReleases},
		{"BodyInlineOrChunked", TestBodyInlineOrChunked},
		{"NodeDisconnectMidRun", TestNodeDisconnectMidRun},
		{"RunStreamAbortedByNode", TestRunStreamAbortedByNode},
		{"RunOpenRefused", TestRunOpenRefused},
		{"DispatchPendingOnReplacedGenerationIsReadmitted", TestDispatchPendingOnReplacedGenerationIsReadmitted},
		{"StaleGenerationReadmitsOnce", TestStaleGenerationReadmitsOnce},
		{"StaleGenerationTwiceFails", TestStaleGenerationTwiceFails},
		{"DispatchTimeoutReleases", TestDispatchTimeoutReleases},
		{"DispatchRefusedReleases", TestDispatchRefusedReleases},
		{"CloseIdempotentReleasesOnce", TestCloseIdempotentReleasesOnce},
		{"CloseUnblocksRecv", TestCloseUnblocksRecv},
		{"ClientCancelWhileQueued", TestClientCancelWhileQueued},
		{"ClientCancelWhileWaitingForOpen", TestClientCancelWhileWaitingForOpen},
		{"Heartbeats", TestHeartbeats},
		{"HelloTimeout", TestHelloTimeout},
		{"ShutdownEndsRuns", TestShutdownEndsRuns},
		{"RetryWhenNodeLostBeforeFirstByte", TestRetryWhenNodeLostBeforeFirstByte},
		{"WarmStreamCarriesDispatch", TestWarmStreamCarriesDispatch},
		{"WarmStreamSequentialRuns", TestWarmStreamSequentialRuns},
		{"WarmStreamOfOldGenerationRefused", TestWarmStreamOfOldGenerationRefused},
		{"WarmStreamsEndWithTheirConnection", TestWarmStreamsEndWithTheirConnection},
		{"WarmRunCancel", TestWarmRunCancel},
		{"WarmStreamNotReusedAfterFailure", TestWarmStreamNotReusedAfterFailure},
		{"WarmRunRefused", TestWarmRunRefused},
		{"NodeDrain", TestNodeDrain},
		{"NodeDrainLeavesNowhereElse", TestNodeDrainLeavesNowhereElse},
		{"ShutdownEndsRequestsCleanly", TestShutdownEndsRequestsCleanly},
		{"OutboxOverflowBreaksConn", TestOutboxOverflowBreaksConn},
	}
	for _, link := range []string{linkGRPC, linkMemory} {
		t.Run(link, func(t *testing.T) {
			t.Parallel()
			useLink(t, link)
			t.Run("LinkInUse", func(t *testing.T) {
				if _, inMemory := startEdge(t, testConfig()).client.(*memlink.Link); inMemory != (link == linkMemory) {
					t.Fatalf("link %s: the fake nodes' client is %T", link, startEdge(t, testConfig()).client)
				}
			})
			for _, tc := range tests {
				t.Run(tc.name, tc.test)
			}
		})
	}
}

// TestChurnOnTheInMemoryLink is TestChurnOfRealNodeConnections on the
// in-memory link. It counts the process's goroutines, so it runs on its
// own, not in TestGuaranteesOnEachLink's parallel rows: there the other
// row's churn and the package's parallel tests were counted too (30 for a
// baseline of 15, under make test).
func TestChurnOnTheInMemoryLink(t *testing.T) {
	useLink(t, linkMemory)
	TestChurnOfRealNodeConnections(t)
}
