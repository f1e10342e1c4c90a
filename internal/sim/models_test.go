package sim

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"iop/internal/clock"
)

// getJSON GETs url and decodes its 200 answer into out.
func getJSON(t *testing.T, c *http.Client, url string, out any) {
	t.Helper()
	resp, err := c.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %s", url, resp.StatusCode, body)
	}
	if err := json.Unmarshal(body, out); err != nil {
		t.Fatalf("GET %s: %v: %s", url, err, body)
	}
}

type tagsEntry struct {
	Name       string `json:"name"`
	ModifiedAt string `json:"modified_at"`
	Digest     string `json:"digest"`
}

func tags(t *testing.T, c *http.Client, base string) []tagsEntry {
	t.Helper()
	var out struct{ Models []tagsEntry }
	getJSON(t, c, base+"/api/tags", &out)
	return out.Models
}

func names(entries []tagsEntry) []string {
	var out []string
	for _, e := range entries {
		out = append(out, e.Name)
	}
	return out
}

// show POSTs /api/show for model and returns its status and capabilities.
func show(t *testing.T, c *http.Client, base, model string) (int, []string) {
	t.Helper()
	resp := mustPost(t, c, base+"/api/show", map[string]string{"model": model})
	var out struct {
		Capabilities []string `json:"capabilities"`
	}
	json.NewDecoder(resp.Body).Decode(&out)
	return resp.StatusCode, out.Capabilities
}

// TestModelsChangeAtRunTime: a model added while the server runs is listed
// first (Ollama lists the most recently modified first), with the time it
// was added, a new digest and the capabilities given, and is served; a
// removed one disappears from the listings and is answered 404; adding a
// served model again is a re-pull: same name, new digest.
func TestModelsChangeAtRunTime(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	s, base, _ := startSim(t, Config{Protocol: ProtocolOllama, Models: []string{"a", "e"}, Clock: clk,
		Capabilities: map[string][]string{"e": {"embedding"}}})
	c := newClient(t)
	if got := names(tags(t, c, base)); !slices.Equal(got, []string{"a", "e"}) {
		t.Fatalf("tags %v", got)
	}
	if _, caps := show(t, c, base, "e"); !slices.Equal(caps, []string{"embedding"}) {
		t.Fatalf("configured capabilities of e: %v", caps)
	}
	if _, caps := show(t, c, base, "a"); !slices.Equal(caps, DefaultCapabilities) {
		t.Fatalf("default capabilities of a: %v", caps)
	}

	clk.Advance(time.Minute)
	if err := s.AddModel("b:7b", "completion", "tools", "thinking"); err != nil {
		t.Fatal(err)
	}
	list := tags(t, c, base)
	if got := names(list); !slices.Equal(got, []string{"b:7b", "a", "e"}) {
		t.Fatalf("tags after AddModel %v", got)
	}
	if list[0].ModifiedAt != "2026-03-01T12:01:00Z" || len(list[0].Digest) != 64 || list[0].Digest == list[1].Digest {
		t.Fatalf("added entry %+v", list[0])
	}
	if status, caps := show(t, c, base, "b:7b"); status != 200 || !slices.Equal(caps, []string{"completion", "tools", "thinking"}) {
		t.Fatalf("show b:7b: %d %v", status, caps)
	}
	chat := func(model string) int {
		resp := mustPost(t, c, base+"/api/chat", map[string]any{"model": model, "stream": false,
			"messages": []map[string]string{{"role": "user", "content": "hi"}}})
		return resp.StatusCode
	}
	if got := chat("b:7b"); got != 200 {
		t.Fatalf("chat with the added model: %d", got)
	}

	if !s.RemoveModel("a") || s.RemoveModel("a") {
		t.Fatal("RemoveModel: want true once, then false")
	}
	if got := names(tags(t, c, base)); !slices.Equal(got, []string{"b:7b", "e"}) {
		t.Fatalf("tags after RemoveModel %v", got)
	}
	if got := chat("a"); got != 404 {
		t.Fatalf("chat with the removed model: %d, want 404", got)
	}
	if status, _ := show(t, c, base, "a"); status != 404 {
		t.Fatalf("show of the removed model: %d, want 404", status)
	}
	var ps struct{ Models []tagsEntry }
	getJSON(t, c, base+"/api/ps", &ps)
	if got := names(ps.Models); !slices.Equal(got, []string{"b:7b", "e"}) {
		t.Fatalf("ps %v", got)
	}

	before := list[0].Digest
	clk.Advance(time.Minute)
	if err := s.AddModel("b:7b"); err != nil {
		t.Fatal(err)
	}
	list = tags(t, c, base)
	if got := names(list); !slices.Equal(got, []string{"b:7b", "e"}) || list[0].Digest == before || list[0].ModifiedAt != "2026-03-01T12:02:00Z" {
		t.Fatalf("tags after a re-pull: %+v (digest before %s)", list, before)
	}
	if _, caps := show(t, c, base, "b:7b"); !slices.Equal(caps, DefaultCapabilities) {
		t.Fatalf("re-pulled without capabilities: %v", caps)
	}
	if err := s.AddModel(""); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("AddModel(\"\"): %v", err)
	}
}

// TestOpenAIModelsChangeAtRunTime: GET /v1/models lists what the server
// serves at the time of the request.
func TestOpenAIModelsChangeAtRunTime(t *testing.T) {
	s, base, _ := startSim(t, Config{Protocol: ProtocolOpenAI, Models: []string{"a"}})
	c := newClient(t)
	list := func() []string {
		var out struct {
			Data []struct {
				ID string `json:"id"`
			} `json:"data"`
		}
		getJSON(t, c, base+"/v1/models", &out)
		var ids []string
		for _, d := range out.Data {
			ids = append(ids, d.ID)
		}
		return ids
	}
	s.AddModel("b")
	s.RemoveModel("a")
	if got := list(); !slices.Equal(got, []string{"b"}) {
		t.Fatalf("/v1/models %v", got)
	}
	resp, err := c.Get(base + "/v1/models/a")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 404 {
		t.Fatalf("/v1/models/a after RemoveModel: %d", resp.StatusCode)
	}
}

// TestRestartOnTheSameAddress: a stopped server refuses connections; one
// started again on its address answers there, with the models it served.
func TestRestartOnTheSameAddress(t *testing.T) {
	s, err := New(Config{Protocol: ProtocolOllama, Models: []string{"a"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	base, stop, err := s.Start("")
	if err != nil {
		t.Fatal(err)
	}
	s.AddModel("b")
	stop()
	c := newClient(t)
	if resp, err := c.Get(base + "/api/tags"); err == nil {
		resp.Body.Close()
		t.Fatal("a stopped server answered")
	}
	u, _ := url.Parse(base)
	again, stop, err := s.Start(u.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	if again != base {
		t.Fatalf("restarted at %s, want %s", again, base)
	}
	if got := names(tags(t, c, base)); !slices.Equal(got, []string{"b", "a"}) {
		t.Fatalf("tags after restart %v", got)
	}
}

func TestCapabilitiesOfUnknownModelRefused(t *testing.T) {
	_, err := New(Config{Protocol: ProtocolOllama, Models: []string{"a"}, Capabilities: map[string][]string{"b": {"tools"}}}, nil)
	if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), `"b"`) {
		t.Fatalf("New: %v", err)
	}
}

// TestRegression_OpenAISimAnswersHealth: an OpenAI-protocol simulator as a
// managed provider's server never became healthy at the default health URL
// (GET /health answered 404): it answers 200 as vLLM does; the Ollama
// protocol has no such route, as Ollama has none.
func TestRegression_OpenAISimAnswersHealth(t *testing.T) {
	for proto, want := range map[Protocol]int{ProtocolOpenAI: 200, ProtocolOllama: 404} {
		_, base, _ := startSim(t, Config{Protocol: proto, Models: []string{"a"}})
		resp, err := newClient(t).Get(base + "/health")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("%s: GET /health %d, want %d", proto, resp.StatusCode, want)
		}
	}
}
