package sim

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sort"
	"strings"
	"testing"

	"iop/internal/ollamatest"
)

// skeleton is the shape of a JSON value: its type, and for an object its
// keys (sorted) with their values' shapes. Two answers in the same format
// have the same skeletons, whatever their text.
func skeleton(v any) string {
	switch x := v.(type) {
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		parts := make([]string, len(keys))
		for i, k := range keys {
			parts[i] = k + ":" + skeleton(x[k])
		}
		return "{" + strings.Join(parts, ",") + "}"
	case []any:
		return "[]"
	case string:
		return "string"
	case float64:
		return "number"
	case bool:
		return "bool"
	case nil:
		return "null"
	}
	return fmt.Sprintf("%T", v)
}

// answerObject is one object of an Ollama answer: its kind (a line of
// thinking, a line of text, or the final object), its skeleton, and
// whether a thinking line's text is empty, as Ollama writes it.
type answerObject struct {
	kind, shape  string
	emptyContent bool
}

// readAnswer posts body and classifies the answer's objects. Fields that
// belong to other parts of the API than thinking are left out: "context"
// (a non-raw generate's final object; not simulated).
func readAnswer(t *testing.T, c *http.Client, url, path, body string) (int, []answerObject, string) {
	t.Helper()
	resp, err := c.Post(url+path, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var out []answerObject
	errText := ""
	for _, line := range bytes.Split(bytes.TrimSpace(data), []byte("\n")) {
		var obj map[string]any
		if err := json.Unmarshal(line, &obj); err != nil {
			t.Fatalf("%s %s: %q: %v", path, body, line, err)
		}
		if e, ok := obj["error"].(string); ok {
			errText = e
			continue
		}
		delete(obj, "context")
		o := answerObject{kind: "text"}
		content, thinking := obj["response"], obj["thinking"]
		if msg, ok := obj["message"].(map[string]any); ok {
			content, thinking = msg["content"], msg["thinking"]
		}
		switch {
		case obj["done"] == true:
			o.kind = "final"
		case thinking != nil && thinking != "":
			o.kind, o.emptyContent = "thinking", content == ""
		}
		o.shape = skeleton(obj)
		out = append(out, o)
	}
	return resp.StatusCode, out, errText
}

// kinds is the order of the object kinds of an answer, runs collapsed:
// "thinking,text,final".
func kinds(objs []answerObject) string {
	var ks []string
	for _, o := range objs {
		if len(ks) == 0 || ks[len(ks)-1] != o.kind {
			ks = append(ks, o.kind)
		}
	}
	return strings.Join(ks, ",")
}

// TestThinkingFormatMatchesRealOllama checks the simulator's thinking
// (Config.Thinking) against a real Ollama (v0.17.4, package ollamatest)
// serving a tiny thinking-capable model, request for request: where the
// thinking goes (message.thinking in a chat, thinking in a generate),
// what a thinking line holds (empty content), that thinking comes before
// any text, the final object's and a whole answer's shapes, when a model
// thinks (think unset, true, false), and the refusals of a model that
// cannot think, word for word. The real model never stops thinking once
// asked to (it never writes its closing tag), so its answers have no text
// after the thinking; the simulator's go on to text, whose lines are
// compared where the real model writes text too (think false).
//
// A think level is refused by the real thinking model, which is not
// gpt-oss, and by the simulator without Config.ThinkLevels, word for word.
// Not compared, as the simulator differs on purpose: its token limit
// bounds the text only.
func TestThinkingFormatMatchesRealOllama(t *testing.T) {
	real := ollamatest.Start(t)
	real.CreateModel(t, "tiny-thinking", ollamatest.Thinking)
	real.CreateModel(t, "tiny-plain", ollamatest.Plain)
	_, thinker, _ := startSim(t, Config{Protocol: ProtocolOllama, Models: []string{"tiny-thinking"}, Thinking: true})
	_, plain, _ := startSim(t, Config{Protocol: ProtocolOllama, Models: []string{"tiny-plain"}})
	client := newClient(t)

	for _, c := range []struct {
		name, path, body string
		sim              string // the simulator standing in for the model
		real             string // kinds of the real answer
	}{
		{"chat stream, think true", "/api/chat", `{"model":"tiny-thinking","think":true,"messages":[{"role":"user","content":"hi"}],"options":{"num_predict":6}}`, thinker, "thinking,final"},
		{"chat stream, think unset", "/api/chat", `{"model":"tiny-thinking","messages":[{"role":"user","content":"hi"}],"options":{"num_predict":6}}`, thinker, "thinking,final"},
		{"chat stream, think false", "/api/chat", `{"model":"tiny-thinking","think":false,"messages":[{"role":"user","content":"hi"}],"options":{"num_predict":6}}`, thinker, "text,final"},
		{"chat, think true", "/api/chat", `{"model":"tiny-thinking","think":true,"stream":false,"messages":[{"role":"user","content":"hi"}],"options":{"num_predict":6}}`, thinker, "final"},
		{"generate stream, think true", "/api/generate", `{"model":"tiny-thinking","think":true,"prompt":"hi","options":{"num_predict":6}}`, thinker, "thinking,final"},
		{"generate, think true", "/api/generate", `{"model":"tiny-thinking","think":true,"stream":false,"prompt":"hi","options":{"num_predict":6}}`, thinker, "final"},
		{"chat stream, a model that cannot think, think false", "/api/chat", `{"model":"tiny-plain","think":false,"messages":[{"role":"user","content":"hi"}],"options":{"num_predict":4}}`, plain, "text,final"},
	} {
		t.Run(c.name, func(t *testing.T) {
			rs, robjs, rerr := readAnswer(t, real.Client, real.URL, c.path, c.body)
			ss, sobjs, serr := readAnswer(t, client, c.sim, c.path, c.body)
			if rs != 200 || ss != 200 || rerr != "" || serr != "" {
				t.Fatalf("real %d %q, simulator %d %q", rs, rerr, ss, serr)
			}
			if got := kinds(robjs); got != c.real {
				t.Fatalf("the real answer is %s, want %s (the test's premise)", got, c.real)
			}
			// The simulator's answer begins as the real one does; after
			// the thinking it may go on to text (see the doc).
			if got := kinds(sobjs); !strings.HasPrefix(got, strings.TrimSuffix(c.real, ",final")) || !strings.HasSuffix(got, "final") {
				t.Fatalf("the simulator's answer is %s, the real one %s", got, c.real)
			}
			shapes := func(objs []answerObject) map[string][]string {
				m := map[string][]string{}
				for _, o := range objs {
					if !slices.Contains(m[o.kind], o.shape) {
						m[o.kind] = append(m[o.kind], o.shape)
					}
					if o.kind == "thinking" && !o.emptyContent {
						t.Errorf("a thinking line with text: %s", o.shape)
					}
				}
				return m
			}
			rm, sm := shapes(robjs), shapes(sobjs)
			for kind, want := range rm {
				if !slices.Equal(sm[kind], want) {
					t.Errorf("%s objects: simulator %v, real Ollama %v", kind, sm[kind], want)
				}
			}
		})
	}

	t.Run("refusals of a model that cannot think", func(t *testing.T) {
		for _, c := range []struct{ path, body string }{
			{"/api/chat", `{"model":"tiny-plain","think":true,"messages":[{"role":"user","content":"hi"}]}`},
			{"/api/chat", `{"model":"tiny-plain","think":"low","messages":[{"role":"user","content":"hi"}]}`},
			{"/api/generate", `{"model":"tiny-plain","think":true,"prompt":"hi"}`},
			{"/api/generate", `{"model":"tiny-plain","think":"high","prompt":"hi"}`},
		} {
			rs, _, rerr := readAnswer(t, real.Client, real.URL, c.path, c.body)
			ss, _, serr := readAnswer(t, client, plain, c.path, c.body)
			if rs != http.StatusBadRequest || ss != rs || serr != rerr {
				t.Errorf("%s %s: real %d %q, simulator %d %q", c.path, c.body, rs, rerr, ss, serr)
			}
		}
	})

	t.Run("refusals of a think level by a thinking model", func(t *testing.T) {
		for _, c := range []struct{ path, body string }{
			{"/api/chat", `{"model":"tiny-thinking","think":"low","messages":[{"role":"user","content":"hi"}]}`},
			{"/api/generate", `{"model":"tiny-thinking","think":"high","prompt":"hi"}`},
		} {
			rs, _, rerr := readAnswer(t, real.Client, real.URL, c.path, c.body)
			ss, _, serr := readAnswer(t, client, thinker, c.path, c.body)
			if rs != http.StatusBadRequest || ss != rs || serr != rerr {
				t.Errorf("%s %s: real %d %q, simulator %d %q", c.path, c.body, rs, rerr, ss, serr)
			}
		}
	})

	t.Run("show lists the thinking capability", func(t *testing.T) {
		if got := real.Capabilities(t, "tiny-thinking"); !slices.Contains(got, "thinking") {
			t.Fatalf("real Ollama lists %v (the test's premise)", got)
		}
		resp, err := client.Post(thinker+"/api/show", "application/json", strings.NewReader(`{"model":"tiny-thinking"}`))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var show struct{ Capabilities []string }
		if err := json.NewDecoder(resp.Body).Decode(&show); err != nil || !slices.Contains(show.Capabilities, "thinking") {
			t.Fatalf("the simulator lists %v, %v", show.Capabilities, err)
		}
	})
}

// TestModelRoutesMatchRealOllama checks the simulator's /api/tags,
// /api/ps and /api/show against a real Ollama (v0.17.4) serving a tiny
// model, loaded: each answer has the real one's shape (every member, with
// its type; the details object's too), and an unknown model and a body
// without one get the real error texts. Values differ by nature (sizes,
// digests, the model's own model_info); the simulator lists every model
// as loaded.
func TestModelRoutesMatchRealOllama(t *testing.T) {
	real := ollamatest.Start(t)
	real.CreateModel(t, "tiny", ollamatest.Plain)
	_, sim, _ := startSim(t, Config{Protocol: ProtocolOllama, Models: []string{"tiny"}})
	client := newClient(t)
	get := func(base, method, path, body string) (int, map[string]any) {
		t.Helper()
		req, _ := http.NewRequest(method, base+path, strings.NewReader(body))
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out map[string]any
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		return resp.StatusCode, out
	}
	if status, _ := get(real.URL, http.MethodPost, "/api/generate", `{"model":"tiny","prompt":"hi","stream":false,"options":{"num_predict":1}}`); status != 200 {
		t.Fatalf("loading the real model: %d", status)
	}
	first := func(o map[string]any) any {
		if models, ok := o["models"].([]any); ok && len(models) > 0 {
			return models[0]
		}
		return nil
	}
	for _, c := range []struct{ name, method, path, body string }{
		{"tags", http.MethodGet, "/api/tags", ""},
		{"ps", http.MethodGet, "/api/ps", ""},
	} {
		_, r := get(real.URL, c.method, c.path, c.body)
		_, s := get(sim, c.method, c.path, c.body)
		if rs, ss := skeleton(first(r)), skeleton(first(s)); rs != ss {
			t.Errorf("%s entry:\n real %s\n sim  %s", c.name, rs, ss)
		}
	}
	_, r := get(real.URL, http.MethodPost, "/api/show", `{"model":"tiny"}`)
	_, s := get(sim, http.MethodPost, "/api/show", `{"model":"tiny"}`)
	for _, k := range []string{"model_info", "tensors"} { // their members are the model's own
		for _, o := range []map[string]any{r, s} {
			if _, ok := o[k]; ok {
				o[k] = fmt.Sprintf("%T", o[k])
			}
		}
	}
	if rs, ss := skeleton(r), skeleton(s); rs != ss {
		t.Errorf("show:\n real %s\n sim  %s", rs, ss)
	}
	for _, body := range []string{`{"model":"nope"}`, `{}`} {
		rstatus, r := get(real.URL, http.MethodPost, "/api/show", body)
		sstatus, s := get(sim, http.MethodPost, "/api/show", body)
		if rstatus != sstatus || r["error"] != s["error"] {
			t.Errorf("show %s: real %d %v, sim %d %v", body, rstatus, r, sstatus, s)
		}
	}
}
