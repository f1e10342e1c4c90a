package api

import (
	"context"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"

	"iop/internal/auth"
	"iop/internal/responses"
)

// saveHook is a ResponseStore whose Save runs hook first (an error from
// it fails the save); the rest is the SQLite store's.
type saveHook struct {
	*responses.SQLite
	hook func(rec responses.Record) error
}

func (s *saveHook) Save(ctx context.Context, rec responses.Record) error {
	if err := s.hook(rec); err != nil {
		return err
	}
	return s.SQLite.Save(ctx, rec)
}

// TestRegression_FailedSaveFailsTheRequest: a response whose save fails
// (the tester's: a save that timed out waiting for the store's one
// connection) is not answered as a success "store": true that GET then
// does not know: not streamed, a 500 error answer; streamed, the stream
// ends with response.failed carrying the error, never response.completed.
func TestRegression_FailedSaveFailsTheRequest(t *testing.T) {
	store := &saveHook{SQLite: newResponseStore(t), hook: func(responses.Record) error {
		return context.DeadlineExceeded // what the store's timeout gave
	}}
	env := newEnv(t, Config{Responses: store}, okRun)
	resp := env.post(t, "/v1/responses", "application/json", `{"model":"m","input":"tiny"}`)
	if resp.status != http.StatusInternalServerError || !strings.Contains(resp.body, `"error":{`) || strings.Contains(resp.body, `"store":true`) {
		t.Errorf("not streamed: %d %s", resp.status, resp.body)
	}
	resp = env.post(t, "/v1/responses", "application/json", `{"model":"m","input":"tiny","stream":true}`)
	if resp.status != http.StatusOK {
		t.Fatalf("streamed: %d %s", resp.status, resp.body)
	}
	evs := responseEvents(t, resp.body)
	types := eventTypes(evs)
	if slices.Contains(types, "response.completed") || types[len(types)-1] != "response.failed" {
		t.Fatalf("streamed events %q", types)
	}
	final := finalResponse(t, evs)
	if final["status"] != "failed" || final["error"] == nil {
		t.Errorf("streamed final response %v", final)
	}
	id, _ := final["id"].(string)
	if got := env.get(t, "/v1/responses/"+id); got.status != http.StatusNotFound {
		t.Errorf("GET of the unsaved response: %d %s", got.status, got.body)
	}
}

// TestRegression_SlotHeldWhileSaving: a key limited to one request at a
// time (max_concurrent 1) has its slot until its response is stored; the
// tester's second request was admitted while the first was still saving.
func TestRegression_SlotHeldWhileSaving(t *testing.T) {
	f := newKeys(t, auth.Key{MaxConcurrent: 1})
	entered, proceed := make(chan struct{}), make(chan struct{})
	first := true
	store := &saveHook{SQLite: newResponseStore(t), hook: func(responses.Record) error {
		if first {
			first = false
			close(entered)
			<-proceed
		}
		return nil
	}}
	env := newEnv(t, Config{Keys: f.keys, AdminKeys: f.admin, Responses: store}, okRun)
	h := bearer(f.alice)
	h["Content-Type"] = "application/json"
	type result struct {
		status int
		body   string
		err    error
	}
	done := make(chan result, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, env.srv.URL+"/v1/responses", strings.NewReader(`{"model":"m","input":"first"}`))
		for k, v := range h {
			req.Header.Set(k, v)
		}
		resp, err := env.srv.Client().Do(req)
		if err != nil {
			done <- result{err: err}
			return
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		done <- result{status: resp.StatusCode, body: string(body)}
	}()
	<-entered
	if resp := env.send(t, http.MethodPost, "/v1/responses", `{"model":"m","input":"second"}`, h); resp.status != http.StatusTooManyRequests {
		t.Errorf("while the first is saving: %d %s", resp.status, resp.body)
	}
	close(proceed)
	r := <-done
	if r.err != nil || r.status != http.StatusOK {
		t.Fatalf("first: %d %s %v", r.status, r.body, r.err)
	}
	if resp := env.send(t, http.MethodPost, "/v1/responses", `{"model":"m","input":"third"}`, h); resp.status != http.StatusOK {
		t.Errorf("after the first was stored: %d %s", resp.status, resp.body)
	}
}
