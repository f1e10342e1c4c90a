package loadgen

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"iop/internal/sim"
)

// TestSessionsWorkload checks the sessions workload from its rule: N
// sessions × T turns requests; each session's turn k+1 sends turn k's
// messages, the answer the server gave to turn k, and one new user
// message; every session starts with the same system prompt of K words;
// at the simulator's prefix cache, every turn after a session's first hits
// its previous prompt's full blocks. On both APIs, streamed and not.
func TestSessionsWorkload(t *testing.T) {
	const sessions, turns, shared = 4, 3, 40
	for _, api := range []API{APIOpenAI, APIOllama} {
		for _, stream := range []bool{false, true} {
			t.Run(string(api)+"/stream="+strconv.FormatBool(stream), func(t *testing.T) {
				protocol := sim.ProtocolOpenAI
				if api == APIOllama {
					protocol = sim.ProtocolOllama
				}
				s, err := sim.New(sim.Config{Protocol: protocol, Models: []string{"m"}, PrefixCacheTokens: 1 << 20}, nil)
				if err != nil {
					t.Fatal(err)
				}
				type sent struct {
					Messages []map[string]string `json:"messages"`
				}
				var mu sync.Mutex
				var bodies []sent
				srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					b, _ := io.ReadAll(r.Body)
					var m sent
					if json.Unmarshal(b, &m) == nil {
						mu.Lock()
						bodies = append(bodies, m)
						mu.Unlock()
					}
					r.Body = io.NopCloser(bytes.NewReader(b))
					s.Handler().ServeHTTP(w, r)
				}))
				t.Cleanup(srv.Close)
				res := run(t, Config{URL: srv.URL, API: api, Model: "m", Stream: stream, Concurrency: 2,
					Workload: WorkloadSessions, Sessions: sessions, Turns: turns, SharedPrefixTokens: shared, TurnTokens: 10, MaxTokens: 5})
				if res.Requests != sessions*turns || res.OK != sessions*turns {
					t.Fatalf("requests %d ok %d, want %d", res.Requests, res.OK, sessions*turns)
				}
				// Group the bodies by session (the user message names it) and
				// order each by length.
				bySession := map[string][]sent{}
				for _, b := range bodies {
					if len(b.Messages) < 2 || b.Messages[0]["role"] != "system" || len(strings.Fields(b.Messages[0]["content"])) != shared {
						t.Fatalf("body does not start with the %d-word system prompt: %v", shared, b.Messages)
					}
					if b.Messages[0]["content"] != bodies[0].Messages[0]["content"] {
						t.Fatal("sessions do not share their system prompt")
					}
					key := strings.SplitN(b.Messages[1]["content"], " turn", 2)[0]
					bySession[key] = append(bySession[key], b)
				}
				if len(bySession) != sessions {
					t.Fatalf("%d sessions seen, want %d", len(bySession), sessions)
				}
				for key, bs := range bySession {
					slices.SortFunc(bs, func(a, b sent) int { return len(a.Messages) - len(b.Messages) })
					for k := 1; k < len(bs); k++ {
						prev, cur := bs[k-1].Messages, bs[k].Messages
						if len(cur) != len(prev)+2 || !slices.EqualFunc(prev, cur[:len(prev)], func(a, b map[string]string) bool { return a["role"] == b["role"] && a["content"] == b["content"] }) {
							t.Fatalf("%s turn %d does not extend turn %d by two messages", key, k, k-1)
						}
						if a := cur[len(prev)]; a["role"] != "assistant" || len(strings.Fields(a["content"])) != 5 {
							t.Fatalf("%s turn %d: appended %v, want the 5-word answer", key, k, a)
						}
					}
				}
				if st := s.Stats(); st.PrefixHitBlocks == 0 {
					t.Fatalf("no cache hit: %+v", st)
				}
			})
		}
	}
}

func TestSessionsConfigValidate(t *testing.T) {
	base := Config{URL: "http://x", API: APIOpenAI, Model: "m", Concurrency: 1, Workload: WorkloadSessions, Sessions: 1, Turns: 1}
	if err := base.Validate(); err != nil {
		t.Fatalf("valid sessions config without a duration or count: %v", err)
	}
	for name, c := range map[string]Config{
		"no sessions": func() Config { c := base; c.Sessions = 0; return c }(),
		"no turns":    func() Config { c := base; c.Turns = 0; return c }(),
		"open loop":   func() Config { c := base; c.Concurrency, c.Rate = 0, 5; return c }(),
		"workload":    func() Config { c := base; c.Workload = "storm"; return c }(),
	} {
		if c.Validate() == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}
