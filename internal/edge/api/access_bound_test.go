package api

import (
	"context"
	"sync"
	"testing"

	"iop/internal/auth"
	"iop/internal/edge/contract"
)

// TestKeyAdmitAndDispatchShareTheLeaderBound: with several edges a
// request waits for a scheduler leader in its key's admission
// (Config.KeyAdmit) and in its dispatch; both get the request's one
// contract.LeaderBound, so the two waits have one deadline.
func TestKeyAdmitAndDispatchShareTheLeaderBound(t *testing.T) {
	f := newKeys(t, auth.Key{MaxConcurrent: 4})
	var mu sync.Mutex
	var atKey, atDispatch *contract.LeaderBound
	gw := &fakeGateway{models: []string{"m"}, dispatch: func(ctx context.Context, req contract.Request) (Run, error) {
		mu.Lock()
		atDispatch = contract.LeaderBoundOf(ctx)
		mu.Unlock()
		return okRun(ctx, req)
	}}
	cfg := Config{Keys: f.keys, KeyAdmit: func(ctx context.Context, _ *auth.Caller) (func(), bool, error) {
		mu.Lock()
		atKey = contract.LeaderBoundOf(ctx)
		mu.Unlock()
		return nil, true, nil
	}}
	env := newEnvWithGateway(t, cfg, gw, gw)
	if resp := env.send(t, "POST", "/v1/chat/completions", simpleChat, bearer(f.alice)); resp.status != 200 {
		t.Fatalf("request: %d %s", resp.status, resp.body)
	}
	mu.Lock()
	defer mu.Unlock()
	if atKey == nil || atKey != atDispatch {
		t.Fatalf("leader bound at the key's admission %p, at the dispatch %p: want one, the same", atKey, atDispatch)
	}
}
