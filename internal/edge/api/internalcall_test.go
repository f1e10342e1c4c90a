package api

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"iop/internal/auth"
	"iop/internal/edge/contract"
)

// TestInternalCallerRunsAsTheKeyAtItsPriority: a request the edge serves
// to itself with WithInternalCaller needs no credential, runs as the
// named key (its flow) at the given priority; without it the same
// request is 401.
func TestInternalCallerRunsAsTheKeyAtItsPriority(t *testing.T) {
	_, hash := auth.Generate()
	ring, err := auth.NewKeyring("keys", []auth.Key{{Name: "alice", Hash: hash, Priority: "critical"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	gw := &fakeGateway{models: []string{"m"}, dispatch: okRun}
	h := New(withOpenAI(Config{Keys: ring}), gw, nil)
	serve := func(r *http.Request) *httptest.ResponseRecorder {
		r.Header.Set("Content-Type", "application/json")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	if w := serve(httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(simpleChat))); w.Code != http.StatusUnauthorized {
		t.Fatalf("without the internal caller: %d %s", w.Code, w.Body)
	}
	r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(simpleChat))
	r = r.WithContext(WithInternalCaller(r.Context(), ring.ByName("alice"), contract.PriorityBatch))
	if w := serve(r); w.Code != http.StatusOK {
		t.Fatalf("internal caller: %d %s", w.Code, w.Body)
	}
	reqs := gw.requests()
	if len(reqs) != 1 || reqs[0].Flow != "alice" || reqs[0].Priority != contract.PriorityBatch {
		t.Fatalf("dispatched %+v", reqs)
	}
}
