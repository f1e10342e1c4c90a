package edge

import (
	"context"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"iop/internal/wire/nodev1"
)

// logRecords is a slog.Handler that keeps every record with the
// attributes of the logger it came from.
type logRecords struct {
	mu      *sync.Mutex
	records *[]slog.Record
	attrs   []slog.Attr
}

func newLogRecords() logRecords { return logRecords{mu: &sync.Mutex{}, records: new([]slog.Record)} }

func (h logRecords) Enabled(context.Context, slog.Level) bool { return true }
func (h logRecords) WithGroup(string) slog.Handler            { return h }
func (h logRecords) WithAttrs(as []slog.Attr) slog.Handler {
	h.attrs = append(append([]slog.Attr(nil), h.attrs...), as...)
	return h
}
func (h logRecords) Handle(_ context.Context, r slog.Record) error {
	r = r.Clone()
	r.AddAttrs(h.attrs...)
	h.mu.Lock()
	defer h.mu.Unlock()
	*h.records = append(*h.records, r)
	return nil
}

// find returns the records with message msg, each as its attributes.
func (h logRecords) find(msg string) []map[string]any {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []map[string]any
	for _, r := range *h.records {
		if r.Message != msg {
			continue
		}
		attrs := map[string]any{"level": r.Level}
		r.Attrs(func(a slog.Attr) bool {
			attrs[a.Key] = a.Value.Any()
			return true
		})
		out = append(out, attrs)
	}
	return out
}

// startLoggedEdge is startEdge with its logs kept in logs.
func startLoggedEdge(t *testing.T, cfg Config, logs logRecords) *testEdge {
	t.Helper()
	clk := newTestClock()
	srv, err := NewServer(cfg, Deps{Clock: clk, Logger: slog.New(logs)})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, lis) }()
	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	stop := func() error {
		var err error
		once.Do(func() { cancel(); err = <-served })
		return err
	}
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Errorf("Serve: %v", err)
		}
		cc.Close()
	})
	return &testEdge{srv: srv, svc: srv.Service(), clk: clk, client: nodev1.NewNodeGatewayClient(cc), stop: stop}
}

// TestCircuitCloseIsLogged: a circuit that opens is logged at warn, and
// one that closes again (a good trial after the cool-down) at info, each
// once, with the node and the provider.
func TestCircuitCloseIsLogged(t *testing.T) {
	logs := newLogRecords()
	e := startLoggedEdge(t, breakerConfig(), logs)
	bad := e.connect(t, hello("a-bad", prov("a", normalized, 1, "m1")))
	failRun(t, e, bad, errorEvent(500))
	failRun(t, e, bad, errorEvent(500))
	const opened, closed = "provider out of rotation: circuit open", "provider back in rotation: circuit closed"
	if got := logs.find(closed); len(got) != 0 {
		t.Fatalf("closed logged while open: %v", got)
	}
	e.clk.Advance(10 * time.Second)
	trial, trs, _ := e.startRun(t, bad, chatReq("m1"))
	sendUp(t, trs, events(event(nodev1.RunEvent_TYPE_DELTA, "fine")))
	if _, err := trial.Recv(); err != nil {
		t.Fatal(err)
	}
	trial.Close("test")
	if got := circuitOf(e, "a-bad", "a"); got != CircuitClosed {
		t.Fatalf("circuit %s after a good trial", got)
	}
	for msg, level := range map[string]slog.Level{opened: slog.LevelWarn, closed: slog.LevelInfo} {
		got := logs.find(msg)
		if len(got) != 1 || got[0]["level"] != level || got[0]["node"] != "a-bad" || got[0]["provider"] != "a" || got[0]["component"] != "edge" {
			t.Errorf("%q logged %v, want once at %v with node a-bad and provider a", msg, got, level)
		}
	}
}
