package sim

import (
	"encoding/json"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"
)

// TestResidency: with MaxLoadedModels 1 every alternation loads its model
// (LoadTime, or the model's LoadTimes), evicting the other; a loaded model
// answers without a load; Ollama's answers report the wait as
// load_duration; /api/ps lists the loaded model alone; /stats counts
// loads and evictions.
func TestResidency(t *testing.T) {
	_, url, _ := startSim(t, Config{Protocol: ProtocolOllama, Models: []string{"x", "y"}, MaxLoadedModels: 1,
		LoadTime: 2 * time.Second, LoadTimes: map[string]time.Duration{"y": 3 * time.Second}, Clock: newFakeClock(false)})
	c := newClient(t)
	var loads []time.Duration
	for _, m := range []string{"x", "x", "y", "x"} {
		var got struct {
			Done          bool  `json:"done"`
			LoadDuration  int64 `json:"load_duration"`
			TotalDuration int64 `json:"total_duration"`
		}
		body := map[string]any{"model": m, "stream": false, "messages": []any{map[string]any{"role": "user", "content": "hi"}}}
		if err := json.NewDecoder(mustPost(t, c, url+"/api/chat", body).Body).Decode(&got); err != nil || !got.Done {
			t.Fatalf("%s: %+v %v", m, got, err)
		}
		if got.TotalDuration < got.LoadDuration {
			t.Fatalf("%s: total_duration %d below load_duration %d", m, got.TotalDuration, got.LoadDuration)
		}
		loads = append(loads, time.Duration(got.LoadDuration))
	}
	if want := []time.Duration{2 * time.Second, 1, 3 * time.Second, 2 * time.Second}; !slices.Equal(loads, want) {
		t.Fatalf("load_duration %v, want %v", loads, want)
	}
	var ps struct {
		Models []struct {
			Name string `json:"name"`
		} `json:"models"`
	}
	getJSON(t, c, url+"/api/ps", &ps)
	if len(ps.Models) != 1 || ps.Models[0].Name != "x" {
		t.Fatalf("/api/ps %+v, want x alone", ps)
	}
	var st Stats
	getJSON(t, c, url+"/stats", &st)
	if st.Loads != 3 || st.Evictions != 2 {
		t.Fatalf("stats: %d loads, %d evictions; want 3 and 2", st.Loads, st.Evictions)
	}
}

// TestResidencyBusyModelIsNotEvicted: requests for two models at once on a
// server holding one: the second waits for the first to end before its
// load evicts it, and both are answered.
func TestResidencyBusyModelIsNotEvicted(t *testing.T) {
	for _, p := range []Protocol{ProtocolOllama, ProtocolOpenAI} {
		t.Run(string(p), func(t *testing.T) {
			s, url, _ := startSim(t, Config{Protocol: p, Models: []string{"x", "y"}, MaxLoadedModels: 1,
				LoadTime: 10 * time.Millisecond, TTFT: 50 * time.Millisecond})
			c := newClient(t)
			path := "/api/chat"
			if p == ProtocolOpenAI {
				path = "/v1/chat/completions"
			}
			var wg sync.WaitGroup
			for _, m := range []string{"x", "y", "x", "y"} {
				wg.Go(func() {
					body := map[string]any{"model": m, "stream": false, "messages": []any{map[string]any{"role": "user", "content": "hi"}}}
					resp := mustPost(t, c, url+path, body)
					resp.Body.Close()
					if resp.StatusCode != http.StatusOK {
						t.Errorf("%s: status %d", m, resp.StatusCode)
					}
				})
			}
			wg.Wait()
			st := s.Stats()
			if st.Loads < 2 || st.Evictions != st.Loads-1 {
				t.Fatalf("stats: %d loads, %d evictions; want at least 2, one fewer evictions", st.Loads, st.Evictions)
			}
		})
	}
}

// TestRegression_SimLoadEvictedBeforeUse: with two models alternating on
// a server holding one, a model just loaded was evicted by a waiter of
// the other before the request that loaded it could use it, so models
// were loaded again and again (43 loads for 11 requests in the
// residency benchmark). Each request loads its model at most once.
func TestRegression_SimLoadEvictedBeforeUse(t *testing.T) {
	s, url, _ := startSim(t, Config{Protocol: ProtocolOllama, Models: []string{"x", "y"}, MaxLoadedModels: 1,
		LoadTime: 5 * time.Millisecond, TTFT: 5 * time.Millisecond})
	c := newClient(t)
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Go(func() {
			m := []string{"x", "y"}[i%2]
			body := map[string]any{"model": m, "stream": false, "messages": []any{map[string]any{"role": "user", "content": "hi"}}}
			resp := mustPost(t, c, url+"/api/chat", body)
			resp.Body.Close()
		})
	}
	wg.Wait()
	if st := s.Stats(); st.Loads > st.Admitted {
		t.Fatalf("%d loads for %d requests: a load was evicted before its request used it", st.Loads, st.Admitted)
	}
}

// TestResidencyPreloadAndUnload: POST /api/generate with a model and no
// prompt loads it (done_reason "load"; keep_alive -1 changes nothing
// here), and with keep_alive 0 unloads it (done_reason "unload"), as
// Ollama does: /api/ps lists it, then not; /stats counts one load and one
// unload.
func TestResidencyPreloadAndUnload(t *testing.T) {
	_, url, _ := startSim(t, Config{Protocol: ProtocolOllama, Models: []string{"x", "y"}, MaxLoadedModels: 1,
		LoadTime: time.Millisecond})
	c := newClient(t)
	generate := func(keepAlive any, want string) {
		t.Helper()
		var got struct {
			Done       bool   `json:"done"`
			DoneReason string `json:"done_reason"`
		}
		body := map[string]any{"model": "x", "stream": false, "keep_alive": keepAlive}
		if err := json.NewDecoder(mustPost(t, c, url+"/api/generate", body).Body).Decode(&got); err != nil || !got.Done || got.DoneReason != want {
			t.Fatalf("keep_alive %v: %+v %v, want done_reason %q", keepAlive, got, err, want)
		}
	}
	loaded := func() int {
		var ps struct {
			Models []struct {
				Name string `json:"name"`
			} `json:"models"`
		}
		getJSON(t, c, url+"/api/ps", &ps)
		return len(ps.Models)
	}
	generate(-1, "load")
	if n := loaded(); n != 1 {
		t.Fatalf("/api/ps lists %d models after a load, want 1", n)
	}
	generate("0s", "unload")
	if n := loaded(); n != 0 {
		t.Fatalf("/api/ps lists %d models after an unload, want 0", n)
	}
	generate(0, "unload") // not loaded: no error
	var st Stats
	getJSON(t, c, url+"/stats", &st)
	if st.Loads != 1 || st.Unloads != 1 || st.Evictions != 0 {
		t.Fatalf("stats: %d loads, %d unloads, %d evictions; want 1, 1, 0", st.Loads, st.Unloads, st.Evictions)
	}
}

// TestRegression_SimEvictsAKeptModelLast: a model loaded with keep_alive
// -1 (as keep_loaded loads it) was the first evicted when it was the least
// recently used; Ollama's scheduler unloads the shortest keep-alive first,
// so the kept model stays and /api/ps shows it expiring far ahead.
func TestRegression_SimEvictsAKeptModelLast(t *testing.T) {
	_, url, _ := startSim(t, Config{Protocol: ProtocolOllama, Models: []string{"a", "b", "c"}, MaxLoadedModels: 2,
		LoadTime: time.Millisecond})
	c := newClient(t)
	load := func(model string, keepAlive any) {
		t.Helper()
		body := map[string]any{"model": model, "stream": false}
		if keepAlive != nil {
			body["keep_alive"] = keepAlive
		}
		resp := mustPost(t, c, url+"/api/generate", body)
		resp.Body.Close()
	}
	loaded := func() map[string]time.Time {
		var ps struct {
			Models []struct {
				Name      string    `json:"name"`
				ExpiresAt time.Time `json:"expires_at"`
			} `json:"models"`
		}
		getJSON(t, c, url+"/api/ps", &ps)
		out := map[string]time.Time{}
		for _, m := range ps.Models {
			out[m.Name] = m.ExpiresAt
		}
		return out
	}
	load("c", -1)    // kept, and the least recently used from here on
	load("a", nil)   // default keep-alive
	load("b", "10m") // evicts a, not c
	got := loaded()
	if _, ok := got["c"]; !ok || len(got) != 2 {
		t.Fatalf("/api/ps %v: want c (kept) and b", got)
	}
	if !got["c"].After(time.Now().AddDate(100, 0, 0)) {
		t.Errorf("kept c expires %v, want far ahead", got["c"])
	}
	load("a", "30m") // evicts b (10m), the shorter keep-alive
	if got := loaded(); len(got) != 2 || got["c"].IsZero() || got["a"].IsZero() {
		t.Fatalf("/api/ps %v: want c and a", got)
	}
}
