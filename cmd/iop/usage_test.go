package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"iop/internal/auth"
	"iop/internal/e2e/harness"
	"iop/internal/node"
	"iop/internal/sim"
	"iop/internal/status"
	"iop/internal/testenv"
)

// runIOP runs the iop command line with args in this process and returns
// what it printed and its error.
func runIOP(args ...string) (string, error) {
	root := newRootCommand()
	var out strings.Builder
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(args)
	err := root.Execute()
	return out.String(), err
}

// TestUsageCommand drives `iop usage` against a real edge, node and
// simulator over TCP: two keys' requests (one refused for an unknown
// model) are summed by key, by day in a time zone, as a table and as
// JSON; the admin key comes from --api-key or $IOP_ADMIN_KEY, and a bad
// query or a missing key says what is wrong.
func TestUsageCommand(t *testing.T) {
	_, simURL := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOllama, Models: []string{"usage-m"}, TTFT: 20 * time.Millisecond})
	alice, aliceHash := auth.Generate()
	bob, bobHash := auth.Generate()
	admin, adminHash := auth.Generate()
	cfg := harness.EdgeConfig(nil)
	cfg.Keys = []auth.Key{{Name: "alice", Hash: aliceHash}, {Name: "bob", Hash: bobHash}}
	cfg.AdminKeys = []auth.Key{{Name: "ops", Hash: adminHash}}
	ctx, cancel := context.WithCancel(context.Background())
	e := harness.Edge(t, ctx, cfg)
	t.Cleanup(cancel)
	harness.Node(t, ctx, node.Config{NodeID: "n1", Edge: e.NodeAddr, Providers: []node.ProviderConfig{
		{ID: "sim", Type: node.TypeOllama, BaseURL: simURL, Models: []string{"usage-m"}, Capacity: 2}}})
	base := "http://" + e.HTTPAddr
	chat := func(key, model string, maxTokens int) int {
		body := fmt.Sprintf(`{"model":%q,"max_tokens":%d,"messages":[{"role":"user","content":"count"}]}`, model, maxTokens)
		req, _ := http.NewRequest("POST", base+"/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for range 3 {
		if st := chat(alice, "usage-m", 5); st != 200 {
			t.Fatalf("alice's request: %d", st)
		}
	}
	if st := chat(bob, "usage-m", 7); st != 200 {
		t.Fatalf("bob's request: %d", st)
	}
	if st := chat(bob, "no-such-model", 7); st != 404 {
		t.Fatalf("bob's request for an unknown model: %d", st)
	}
	// A request's ledger entry is written after its answer: wait for all 5.
	testenv.Eventually(t, "the ledger has the 5 requests", func() bool {
		out, err := runIOP("usage", "--edge", base, "--api-key", admin, "--group-by", "none", "--json")
		var u status.Usage
		return err == nil && json.Unmarshal([]byte(out), &u) == nil && len(u.Data) == 1 && u.Data[0].Requests == 5
	})

	out, err := runIOP("usage", "--edge", e.HTTPAddr, "--api-key", admin, "--group-by", "key", "--from", "1d")
	if err != nil {
		t.Fatalf("iop usage: %v\n%s", err, out)
	}
	// KEY, requests, completed, prompt, completion, total tokens, GPU-seconds.
	for _, want := range []string{
		`(?m)^KEY\s+REQUESTS\s+COMPLETED\s+PROMPT TOKENS\s+COMPLETION TOKENS\s+TOTAL TOKENS\s+GPU-SECONDS$`,
		`(?m)^alice\s+3\s+3\s+\d+\s+15\s+\d+\s+\d+\.\d$`,
		`(?m)^bob\s+2\s+1\s+\d+\s+7\s+\d+\s+\d+\.\d$`,
		`(?m)^TOTAL\s+5\s+4\s+\d+\s+22\s+\d+\s+\d+\.\d$`,
	} {
		if !regexp.MustCompile(want).MatchString(out) {
			t.Errorf("iop usage --group-by key lacks %s:\n%s", want, out)
		}
	}

	// As JSON, by day in Tokyo, one key: today's date there, with
	// GPU-time (each request held its slot at least the 20 ms TTFT).
	t.Setenv("IOP_ADMIN_KEY", admin)
	out, err = runIOP("usage", "--edge", base, "--key", "alice", "--tz", "Asia/Tokyo", "--json")
	if err != nil {
		t.Fatalf("iop usage --json: %v\n%s", err, out)
	}
	var u status.Usage
	if err := json.Unmarshal([]byte(out), &u); err != nil {
		t.Fatalf("iop usage --json printed %s: %v", out, err)
	}
	tokyo, err := time.LoadLocation("Asia/Tokyo")
	if err != nil {
		t.Skipf("no zone data: %v", err)
	}
	today := time.Now().In(tokyo).Format(time.DateOnly)
	if u.GroupBy != "day" || u.TZ != "Asia/Tokyo" || len(u.Data) < 1 || u.Data[len(u.Data)-1].Group < today[:8] {
		t.Errorf("alice by day in Tokyo: %+v (today there %s)", u, today)
	}
	var requests, completion int64
	var gpu float64
	for _, g := range u.Data {
		requests, completion, gpu = requests+g.Requests, completion+g.CompletionTokens, gpu+g.GPUSeconds
	}
	if requests != 3 || completion != 15 || gpu < 0.06 {
		t.Errorf("alice: %d requests, %d completion tokens, %.3f GPU-seconds; want 3, 15, ≥ 0.06", requests, completion, gpu)
	}

	// Nothing before the ledger began.
	if out, err := runIOP("usage", "--edge", base, "--to", "1d", "--group-by", "key"); err != nil || !strings.Contains(out, "no usage") {
		t.Errorf("iop usage --to 1d: %v\n%s", err, out)
	}
	// A bad query says which parameter, and a missing key how to give one.
	if out, err := runIOP("usage", "--edge", base, "--group-by", "colour"); err == nil || !strings.Contains(err.Error(), "group_by") {
		t.Errorf("iop usage --group-by colour: %v\n%s", err, out)
	}
	t.Setenv("IOP_ADMIN_KEY", "")
	if out, err := runIOP("usage", "--edge", base); err == nil || !strings.Contains(err.Error(), "--api-key") {
		t.Errorf("iop usage without an admin key: %v\n%s", err, out)
	}
}

func TestSinceNow(t *testing.T) {
	now := time.Date(2026, 6, 10, 12, 0, 0, 0, time.UTC)
	for in, want := range map[string]string{
		"7d": "2026-06-03T12:00:00Z", "36h": "2026-06-09T00:00:00Z", "90m": "2026-06-10T10:30:00Z",
		"2026-06-01": "2026-06-01", "1767225600": "1767225600", "2026-06-01T00:00:00Z": "2026-06-01T00:00:00Z", "": "",
		"xd": "xd", "-1d": "-1d",
	} {
		if got := sinceNow(in, now); got != want {
			t.Errorf("sinceNow(%q) = %q, want %q", in, got, want)
		}
	}
}
