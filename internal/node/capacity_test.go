package node

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"iop/internal/wire/nodev1"
)

// TestProviderCapacityIsNodeWide: a provider of capacity 1 never runs two
// requests at once, whatever is dispatched: a second Dispatch while the
// first runs waits for a slot and, when none frees within slotWait (the
// agent's clock), is refused with ErrProviderBusy; one that arrives as the
// first run is ending gets the slot as soon as the first run's last frame
// is sent, and is not refused.
func TestProviderCapacityIsNodeWide(t *testing.T) {
	e, addr := startEdge(t)
	started := make(chan string, 4)
	release := make(chan struct{})
	var inFlight, most int
	mu := make(chan struct{}, 1)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu <- struct{}{}
		inFlight++
		most = max(most, inFlight)
		<-mu
		defer func() { mu <- struct{}{}; inFlight--; <-mu }()
		started <- string(b)
		if strings.Contains(string(b), "hold") {
			<-release
		}
		io.WriteString(w, "answer")
	}))
	t.Cleanup(up.Close)
	clk := newTestClock()
	a := startAgent(t, testConfig(addr, ProviderConfig{ID: "p", Type: "openai", BaseURL: up.URL, Models: []string{"served-model"}, Capacity: 1}), clk, nil)
	c := connect(t, e, 1, hour)
	plain := func(runID string) *nodev1.EdgeMessage {
		m := dispatchMsg(runID, "p", tunnel)
		m.GetDispatch().Stream = false
		return m
	}

	c.send(t, plain("r1"))
	r1 := recv(t, e.runs, "run r1")
	r1.sendBody(t, `{"note":"hold"}`)
	recv(t, started, "r1 at the provider")

	c.send(t, plain("r2"))
	clk.waitArmed(t, slotWait) // r2 waits for r1's slot
	if got := len(a.RunsInFlight()); got != 2 {
		t.Errorf("runs in flight: %d, want r1 running and r2 waiting", got)
	}
	clk.Advance(slotWait)
	var refused *nodev1.DispatchRefused
	for refused == nil {
		refused = c.next(t).GetDispatchRefused()
	}
	if refused.RunId != "r2" || !strings.Contains(refused.Reason, ErrProviderBusy.Error()) || !refused.GetBusy() {
		t.Fatalf("refusal %v, want r2 refused busy with %q", refused, ErrProviderBusy)
	}

	c.send(t, plain("r3"))
	clk.waitArmed(t, slotWait) // r3 waits
	close(release)             // r1 ends: its last frame frees the slot
	if _, body, complete := tunnelAnswer(r1.rest(t)); body != "answer" || !complete {
		t.Errorf("r1: %q complete %v", body, complete)
	}
	r1.end <- nil
	r3 := recv(t, e.runs, "run r3, given r1's slot")
	if r3.open.RunId != "r3" {
		t.Fatalf("run stream of %q, want r3", r3.open.RunId)
	}
	r3.sendBody(t, `{"note":"quick"}`)
	if _, body, complete := tunnelAnswer(r3.rest(t)); body != "answer" || !complete {
		t.Errorf("r3: %q complete %v", body, complete)
	}
	r3.end <- nil
	mu <- struct{}{}
	if most != 1 {
		t.Errorf("the provider ran %d at once, capacity 1", most)
	}
	<-mu
}
