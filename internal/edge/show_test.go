package edge

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"

	"iop/internal/edge/contract"
	"iop/internal/wire/nodev1"
)

// TestShowGoesThroughTheNode: Service.Show sends a ShowRequest down the
// node's control stream and returns the answer's parts joined, with the
// server's status; an error part, a provider that is no Ollama, a node
// that is gone or that does not answer in time each end the call with its
// error, and a part of a request no longer awaited is dropped.
func TestShowGoesThroughTheNode(t *testing.T) {
	e := startEdge(t, testConfig())
	ol := prov("ol", nodev1.ExecutionPath_EXECUTION_PATH_NORMALIZED, 1, "tiny")
	ol.Type = "ollama"
	oa := prov("oa", nodev1.ExecutionPath_EXECUTION_PATH_TUNNEL, 1, "gpt")
	n := e.connect(t, hello("n1", ol, oa))
	type result struct {
		status int
		body   string
		err    error
	}
	show := func(provider string) <-chan result {
		out := make(chan result, 1)
		go func() {
			status, body, err := e.svc.Show(context.Background(), "n1", provider, "tiny", true)
			out <- result{status, string(body), err}
		}()
		return out
	}
	answer := func(id uint64, status int32, data string, last bool, errText string) {
		n.send(t, &nodev1.NodeMessage{Msg: &nodev1.NodeMessage_ShowAnswer{ShowAnswer: &nodev1.ShowAnswer{
			RequestId: id, Status: status, Data: []byte(data), Last: last, Error: errText}}})
	}

	res := show("ol")
	req := n.next(t).GetShowRequest()
	if req.GetProviderId() != "ol" || req.GetModel() != "tiny" || !req.GetVerbose() {
		t.Fatalf("request %v", req)
	}
	answer(req.GetRequestId()+100, 200, "stray", true, "") // no such request: dropped
	answer(req.GetRequestId(), 200, `{"template":`, false, "")
	answer(req.GetRequestId(), 200, `"x"}`, true, "")
	if r := wait(t, res); r.err != nil || r.status != 200 || r.body != `{"template":"x"}` {
		t.Fatalf("show: %+v", r)
	}

	res = show("ol")
	req = n.next(t).GetShowRequest()
	answer(req.GetRequestId(), 0, "", true, "the provider's model server did not answer /api/show")
	if r := wait(t, res); !errors.Is(r.err, errShowUnavailable) || !strings.Contains(r.err.Error(), "did not answer") {
		t.Fatalf("error part: %+v", r)
	}

	if r := wait(t, show("oa")); !errors.Is(r.err, errShowUnavailable) {
		t.Fatalf("no Ollama: %+v", r)
	}

	res = show("ol")
	n.next(t)
	e.clk.waitArmed(t, showTimeout, 1)
	e.clk.Advance(showTimeout)
	if r := wait(t, res); !errors.Is(r.err, errShowTimeout) {
		t.Fatalf("no answer: %+v", r)
	}

	res = show("ol")
	n.next(t)
	n.cancel()
	if r := wait(t, res); !errors.Is(r.err, errShowUnavailable) {
		t.Fatalf("node gone: %+v", r)
	}
	if r := wait(t, show("ol")); !errors.Is(r.err, errShowUnavailable) {
		t.Fatalf("no node: %+v", r)
	}
}

// TestLoadedListsWhatProvidersHold: an Ollama provider's reported loaded
// models (from Hello, then a ProviderUpdate carrying them alone) that it
// serves, by their server's names; an OpenAI-compatible provider's every
// model, always; and a model with a run in flight not reported.
func TestLoadedListsWhatProvidersHold(t *testing.T) {
	e := startEdge(t, testConfig())
	ol := prov("ol", nodev1.ExecutionPath_EXECUTION_PATH_NORMALIZED, 2, "a", "b")
	ol.Type = "ollama"
	ol.LoadedSet, ol.Loaded = true, []*nodev1.LoadedModel{{Name: "a:latest", Model: "a:latest", Size: 9, ExpiresAt: "t1", LoadedSince: "s1"},
		{Name: "other:latest"}} // loaded on that server, not served by this provider
	oa := prov("oa", nodev1.ExecutionPath_EXECUTION_PATH_TUNNEL, 1, "gpt")
	n := e.connect(t, hello("n1", ol, oa))
	summary := func() string {
		var out []string
		for _, m := range e.svc.Loaded() {
			out = append(out, m.ProviderID+"/"+m.Served+"/"+m.Name+"/"+m.Source+"/"+m.ExpiresAt+"/"+strconv.Itoa(m.InFlight))
		}
		return strings.Join(out, " ")
	}
	if got, want := summary(), "oa/gpt/gpt/always//0 ol/a/a:latest/reported/t1/0"; got != want {
		t.Fatalf("loaded %q, want %q", got, want)
	}
	n.send(t, &nodev1.NodeMessage{Msg: &nodev1.NodeMessage_ProviderUpdate{ProviderUpdate: &nodev1.ProviderUpdate{
		ProviderId: "ol", Healthy: true, LoadedSet: true, Loaded: []*nodev1.LoadedModel{{Name: "b:latest", ExpiresAt: "t2"}}}}})
	waitFor(t, func() bool { return summary() == "oa/gpt/gpt/always//0 ol/b/b:latest/reported/t2/0" })
	if snap, _ := providerOf(e.svc.Snapshot(), "n1", "ol"); !slices.Equal(snap.Models, []string{"a", "b"}) {
		t.Fatalf("a residency update changed the served models: %v", snap.Models)
	}
	// A run of a, which the node has not reported loaded.
	req := chatReq("a")
	e.startRun(t, n, req)
	want := "oa/gpt/gpt/always//0 ol/a/a/" + contract.LoadedInFlight + "//1 ol/b/b:latest/reported/t2/0"
	if got := summary(); got != want {
		t.Fatalf("loaded %q, want %q", got, want)
	}
}
