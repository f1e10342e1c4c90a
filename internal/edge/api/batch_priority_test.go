package api

import (
	"strings"
	"testing"

	"iop/internal/auth"
	"iop/internal/edge/api/access"
	"iop/internal/edge/contract"
)

// TestNoClientReachesTheBatchBand: contract.PriorityBatch is the batch
// runner's alone. X-Iop-Priority "batch" (or "-2") is refused with 400
// where the key allows the header (priority_header: sheddable, the
// lowest), ignored where it does not; and no key may name "batch" as its
// priority. Whatever a client sends, no dispatched request is below
// sheddable.
func TestNoClientReachesTheBatchBand(t *testing.T) {
	if _, ok := auth.PriorityRank("batch"); ok {
		t.Fatal(`auth.PriorityRank("batch") is a rank`)
	}
	if _, err := auth.NewKeyring("keys", []auth.Key{{Name: "b", Hash: mustHash(t), Priority: "batch"}}, nil); err == nil {
		t.Fatal("a key with priority batch was accepted")
	}
	secrets := map[string]string{}
	var keys []auth.Key
	for _, k := range []auth.Key{{Name: "low", PriorityHeader: "sheddable"}, {Name: "plain"}} {
		secret, hash := auth.Generate()
		k.Hash = hash
		secrets[k.Name] = secret
		keys = append(keys, k)
	}
	ring, err := auth.NewKeyring("keys", keys, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		key, header string
		status      int
	}{
		{"low", "batch", 400},
		{"low", "-2", 400},
		{"low", "sheddable", 200},
		{"plain", "batch", 200},
	} {
		env := newEnv(t, Config{Keys: ring}, okRun)
		resp := env.send(t, "POST", "/v1/chat/completions", simpleChat, map[string]string{
			"Authorization": "Bearer " + secrets[c.key], access.PriorityHeader: c.header})
		if resp.status != c.status {
			t.Fatalf("key %s, %s: %s: status %d, want %d: %s", c.key, access.PriorityHeader, c.header, resp.status, c.status, resp.body)
		}
		for _, r := range env.gw.requests() {
			if r.Priority < contract.PrioritySheddable {
				t.Fatalf("key %s, %s: %s: dispatched at priority %d", c.key, access.PriorityHeader, c.header, r.Priority)
			}
		}
		if c.status == 400 && !strings.Contains(resp.body, access.PriorityHeader) {
			t.Fatalf("the 400 does not name %s: %s", access.PriorityHeader, resp.body)
		}
	}
}

func mustHash(t *testing.T) string {
	t.Helper()
	_, hash := auth.Generate()
	return hash
}
