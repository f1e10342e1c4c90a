package e2e

import (
	"encoding/json"
	"net/http"
	"testing"

	"iop/internal/e2e/harness"
)

// TestRegression_OversizedBodyNoConnectionReset: a client that writes its
// whole oversized body before it reads (as many HTTP clients do) got a
// connection reset ("broken pipe", "connection reset by peer") instead of
// the 413: the edge answered after reading the limit, net/http closed the
// connection with the rest of the body unread, and the kernel reset it.
// The edge now reads and discards the rest (bounded) after answering.
func TestRegression_OversizedBodyNoConnectionReset(t *testing.T) {
	harness.Parallel(t)
	const limit = 1 << 20
	rig := startBadRig(t, limit)
	for _, rt := range []badRoute{badRoutes[0], badRoutes[3]} { // chat, /api/chat
		// More than the kernel buffers of a loopback connection hold once
		// the edge stops reading (rawPost also shrinks the client's send
		// buffer): the client finishes writing only if the edge reads.
		huge := oversized(rt, limit+4<<20)
		for _, framing := range []string{"content-length", "chunked"} {
			t.Run(rt.name+"/"+framing, func(t *testing.T) {
				resp, body := rawPost(t, rig.e.HTTPAddr, rt.path, huge, framing, len(huge))
				checkErrorBody(t, rt, resp, body, badCase{body: "oversized", status: http.StatusRequestEntityTooLarge, code: "request_too_large"})
			})
		}
		rig.healthy(t, rt)
	}
}

// TestRegression_SyncRunOfUnknownModelIs404: POST /v1/runs (not in the
// background) of an unknown model was answered 200 with a failed record;
// a run that never reaches a provider is now answered as the chat route
// answers it (404 model_not_found), and its record, named by Location,
// stays listed as failed.
func TestRegression_SyncRunOfUnknownModelIs404(t *testing.T) {
	harness.Parallel(t)
	rig := startBadRig(t, 0)
	resp, body := rig.send(t, "/v1/runs", "application/json", `{"model":"no-such-model","prompt":"hi"}`)
	checkErrorBody(t, badRoutes[5], resp, body, badCase{body: "unknown model", status: http.StatusNotFound, param: "model", code: "model_not_found"})
	loc := resp.Header.Get("Location")
	if loc == "" {
		t.Fatal("no Location naming the run")
	}
	getResp, err := rig.client.Get(rig.base + loc)
	if err != nil {
		t.Fatal(err)
	}
	defer getResp.Body.Close()
	var rec runJSON
	if err := json.NewDecoder(getResp.Body).Decode(&rec); err != nil || getResp.StatusCode != http.StatusOK || rec.State != "error" || rec.Model != "no-such-model" {
		t.Fatalf("GET %s: %d %+v %v", loc, getResp.StatusCode, rec, err)
	}
	waitIdle(t, rig.e)
}
