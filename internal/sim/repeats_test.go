package sim

import (
	"io"
	"net/http"
	"testing"
)

// TestCountRepeats: with CountRepeats, Stats.Admitted counts every admitted
// inference request and Stats.Repeated each whose prompt an earlier one
// had; the listing routes count in neither. Without it Repeated stays 0.
func TestCountRepeats(t *testing.T) {
	for _, count := range []bool{true, false} {
		s, url, _ := startSim(t, Config{Protocol: ProtocolOllama, Models: []string{"m"}, CountRepeats: count})
		c := newClient(t)
		for _, prompt := range []string{"req-1", "req-2", "req-1", "req-1"} {
			resp := mustPost(t, c, url+"/api/generate", map[string]any{"model": "m", "prompt": prompt, "stream": false})
			_, _ = io.Copy(io.Discard, resp.Body)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d", resp.StatusCode)
			}
		}
		resp, err := c.Get(url + "/api/tags")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		st := s.Stats()
		wantRepeated := int64(0)
		if count {
			wantRepeated = 2
		}
		if st.Admitted != 4 || st.Repeated != wantRepeated {
			t.Errorf("CountRepeats %v: admitted %d, repeated %d; want 4, %d", count, st.Admitted, st.Repeated, wantRepeated)
		}
	}
}
