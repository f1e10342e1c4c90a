package e2e

import (
	"fmt"
	"io"
	"iop/internal/e2e/harness"
	"iop/internal/testenv"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"
)

// keyAsk sends one chat request of key to e for model slow with maxTokens
// and returns its status (0: no answer) and body.
func (rig *clusterRig) keyAsk(e *clusterEdge, key string, maxTokens int) (int, string) {
	body := fmt.Sprintf(`{"model":"slow","max_tokens":%d,"messages":[{"role":"user","content":"hi"}]}`, maxTokens)
	req, _ := http.NewRequest(http.MethodPost, e.base+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestRegression_KeyLimitsSurviveFailover: three real edges on a real
// etcd, one node on every edge. A key with max_concurrent 2 has two long
// runs going through the followers, and a key with requests_per_minute 3
// has used its minute, when the leader is SIGKILLed. Before, the new
// leader counted neither: a third run of the first key started at once
// (3 of a limit-2 key at once) and the second key got 3 more requests in
// the same minute. Now the new leader counts the first key's runs it
// adopts (the key travels with the Dispatch and the node's report): its
// requests get 429 until a run ends, then one is admitted; and it starts
// the second key's allowance empty: it gets no more than a single leader
// would have refilled since its burst (one per 20 s).
func TestRegression_KeyLimitsSurviveFailover(t *testing.T) {
	harness.ParallelLong(t)
	rig := newClusterEdges(t)
	rig.startNodeOnEvery()
	var li int
	var epoch int64
	testenv.Eventually(t, "one ready leader", func() bool { li, epoch = rig.leader(0); return li >= 0 })
	var fol []*clusterEdge
	for i, e := range rig.edges {
		if i != li {
			fol = append(fol, e)
		}
	}

	// The rpm key's whole minute, through a follower.
	burst := time.Now()
	for i := range 3 {
		if st, b := rig.keyAsk(fol[0], rig.rpm, 4); st != http.StatusOK {
			t.Fatalf("rpm request %d: %d %s", i, st, b)
		}
	}
	if st, _ := rig.keyAsk(fol[0], rig.rpm, 4); st != http.StatusTooManyRequests {
		t.Fatalf("the rpm key's 4th request in its minute: %d, want 429", st)
	}

	// Two long runs of the small key (max_concurrent 2), one per follower
	// (about 12 s each at 100 tokens/s).
	long := make(chan int, 2)
	for _, e := range fol {
		go func() {
			st, _ := rig.keyAsk(e, rig.small, 1200)
			long <- st
		}()
	}
	testenv.Eventually(t, "both long runs in flight at the leader", func() bool {
		v, err := rig.view(rig.edges[li])
		return err == nil && v.Leases >= 2
	})
	if st, _ := rig.keyAsk(fol[0], rig.small, 4); st != http.StatusTooManyRequests {
		t.Fatalf("a third request of the small key before the failover: %d, want 429", st)
	}

	killed := rig.edges[li]
	killed.down.Store(true)
	killed.proc.Signal(t, syscall.SIGKILL)
	_ = killed.proc.Wait(t, 10*time.Second)
	testenv.Eventually(t, "a new ready leader", func() bool { li, _ = rig.leader(epoch); return li >= 0 })

	// The long runs still go: the small key is at its limit at the new
	// leader too.
	select {
	case st := <-long:
		t.Fatalf("a long run ended (%d) before the check: make it longer", st)
	default:
	}
	for _, e := range fol {
		if st, b := rig.keyAsk(e, rig.small, 4); st != http.StatusTooManyRequests {
			t.Fatalf("the small key's request via %s after the failover with 2 runs going: %d %s, want 429 (3 of a limit-2 key at once)", e.name, st, b)
		}
	}
	// The rpm key: at most what one leader would have refilled since the
	// burst (one request per 20 s).
	allowed := 0
	for range 3 {
		if st, _ := rig.keyAsk(fol[1], rig.rpm, 4); st == http.StatusOK {
			allowed++
		}
	}
	if most := int(time.Since(burst) / (20 * time.Second)); allowed > most {
		t.Fatalf("the rpm key got %d more requests %s after its burst of 3 (limit 3 per minute), at most %d", allowed, time.Since(burst).Round(time.Second), most)
	}

	// The long runs end; their slots come back at the new leader.
	for range 2 {
		if st := <-long; st != http.StatusOK {
			t.Fatalf("a long run of the small key: %d", st)
		}
	}
	testenv.Eventually(t, "the small key admitted again after its runs ended", func() bool {
		st, _ := rig.keyAsk(fol[0], rig.small, 4)
		return st == http.StatusOK
	})
}
