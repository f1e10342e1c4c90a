package openai

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"testing"
	"time"

	"go.uber.org/goleak"

	"iop/internal/edge"
	"iop/internal/edge/api"
	"iop/internal/edge/api/apitest"
	"iop/internal/edge/contract"
	"iop/internal/wire/nodev1"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// Run is the run the tests' gateways hand out.
type Run = apitest.Run

// newHandler is the frame with the OpenAI routes over gw, its clock at
// Unix 1700000000.
func newHandler(gw *apitest.Gateway) http.Handler {
	cfg := api.Config{APIs: []api.API{Routes}, Now: func() time.Time { return time.Unix(1700000000, 0) }}
	return api.New(cfg, gw, slog.New(slog.DiscardHandler))
}

// newEnv serves newHandler over a gateway that hands out what
// dispatch returns (models m and alias), and checks each run is closed once.
func newEnv(t *testing.T, dispatch func(context.Context, contract.Request) (Run, error)) *apitest.Env {
	t.Helper()
	gw := &apitest.Gateway{Names: []string{"m", "alias"}, DispatchFunc: dispatch}
	return apitest.Start(t, gw, newHandler(gw))
}

// decoded is m as the edge decodes it.
func decoded(m *nodev1.RunUp) *contract.Message {
	d, _ := edge.DecodeRunUp(m)
	return &d
}

// generatedRun is a Run that yields body n times, then last, then
// io.EOF, without buffering them all.
type generatedRun struct {
	path       contract.Path
	body, last *contract.Message // decoded once, as the edge does on arrival
	n, i       int
}

func (r *generatedRun) Info() contract.DispatchInfo {
	return contract.DispatchInfo{RunID: "run_0123456789abcdef", NodeID: "n", ProviderID: "p", Path: r.path}
}
func (r *generatedRun) Close(contract.Outcome) {}
func (r *generatedRun) Cancel(string)          {}
func (r *generatedRun) Fail(string)            {}
func (r *generatedRun) Recv() (contract.Message, error) {
	r.i++
	switch {
	case r.i <= r.n:
		return *r.body, nil
	case r.i == r.n+1:
		return *r.last, nil
	default:
		return contract.Message{}, io.EOF
	}
}
