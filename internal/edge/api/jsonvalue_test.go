package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"iop/internal/translate"
	"iop/internal/wire/nodev1"
)

// jsonSeeds are bodies at the edges of RFC 8259 as encoding/json reads it.
var jsonSeeds = []string{
	`{}`, `[]`, `""`, `0`, `-0.5e+10`, `01`, `1.`, `.5`, `-`, `1e`, `true`, `tru`, `null`, ` {"a" : [1, 2 ,{}]} `,
	`{"model":"m","messages":[{"role":"user","content":"h\u00e9llo \ud83d\ude00 \ud800 x"}]}`,
	"{\"a\":\"\xff\xfe bad utf-8\"}", "{\"a\":\"tab\there\"}", `{"a":"\x"}`, `{"a":1,}`, `[1,]`, `{"a" 1}`,
	`{"mod\u0065l":"x","model":"y"}`, `{"a":"\"\\\/\b\f\n\r\t"}`, `{"a":"\u12"}`, `{} x`, `{"a":[[[[]]]]}`,
	`{"a":{"b":1,"c":[1,{"d":2,"e":[3,4]}],"f":{}},"g":[[],[1,2],{}],"h":3}`, `[{"a":[1,{"b":[]}]},[2,[3]],4]`,
	`{"a":{"b":1,"c":[1,{"d":2}` + "]}}x",
}

// FuzzParseJSON: parseJSON accepts exactly what encoding/json accepts,
// decodes every string as encoding/json does (text, its length in code
// points), and counts a value's code points as json.Compact writes it.
func FuzzParseJSON(f *testing.F) {
	for _, s := range jsonSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		v, err := parseJSON(data)
		if valid := json.Valid(data); valid != (err == nil) {
			t.Fatalf("parseJSON error %v, json.Valid %v", err, valid)
		}
		if err != nil {
			return
		}
		var check func(v *jsonValue)
		check = func(v *jsonValue) {
			var buf bytes.Buffer
			if err := json.Compact(&buf, v.raw); err != nil {
				t.Fatalf("raw %q is not a JSON value: %v", v.raw, err)
			}
			if n := utf8.RuneCount(buf.Bytes()); n != v.compact {
				t.Fatalf("compact of %q: %d code points, want %d", v.raw, v.compact, n)
			}
			switch v.kind() {
			case '"':
				var s string
				if err := json.Unmarshal(v.raw, &s); err != nil {
					t.Fatal(err)
				}
				if v.text() != s || v.runes != utf8.RuneCountInString(s) {
					t.Fatalf("string %q: text %q (%d runes), want %q (%d)", v.raw, v.text(), v.runes, s, utf8.RuneCountInString(s))
				}
			case '{':
				var m map[string]json.RawMessage
				if err := json.Unmarshal(v.raw, &m); err != nil {
					t.Fatal(err)
				}
				for k, raw := range m {
					got := v.get(k)
					if got == nil || !bytes.Equal(got.raw, raw) {
						t.Fatalf("member %q: %v, want %q", k, got, raw)
					}
				}
				// Exactly the object's own members, in order, none of a
				// nested object's.
				dec := json.NewDecoder(bytes.NewReader(v.raw))
				dec.Token() // '{'
				for i := 0; dec.More(); i++ {
					key, _ := dec.Token()
					var raw json.RawMessage
					if err := dec.Decode(&raw); err != nil {
						t.Fatal(err)
					}
					if i >= len(v.members) || v.members[i].key() != key || !bytes.Equal(v.members[i].value.raw, raw) {
						t.Fatalf("member %d of %q (parseJSON has %d), want %q: %q", i, v.raw, len(v.members), key, raw)
					}
					if !dec.More() && i != len(v.members)-1 {
						t.Fatalf("%q has %d members, parseJSON %d", v.raw, i+1, len(v.members))
					}
				}
				for i := range v.members {
					check(&v.members[i].value)
				}
			case '[':
				var elems []json.RawMessage
				if err := json.Unmarshal(v.raw, &elems); err != nil {
					t.Fatal(err)
				}
				if len(elems) != len(v.elems) || v.elems == nil {
					t.Fatalf("array %q: %d elements (nil %v), want %d", v.raw, len(v.elems), v.elems == nil, len(elems))
				}
				for i := range v.elems {
					if !bytes.Equal(v.elems[i].raw, elems[i]) {
						t.Fatalf("element %d of %q: %q, want %q", i, v.raw, v.elems[i].raw, elems[i])
					}
					check(&v.elems[i])
				}
			}
		}
		check(v)
	})
}

// TestParseJSONTreeOutlivesItsScratch: the members and elements of one
// parse are its own, not the pooled scratch stack's, so parses after it
// (of other bodies, which reuse the scratch) leave its tree as it was.
func TestParseJSONTreeOutlivesItsScratch(t *testing.T) {
	body := []byte(`{"model":"m","messages":[{"role":"user","content":"a"},{"role":"assistant","content":"b"}],"n":[1,2,3]}`)
	v, err := parseJSON(body)
	if err != nil {
		t.Fatal(err)
	}
	for range 50 {
		if _, err := parseJSON([]byte(`{"x":[{"y":{"z":[9,8,7,6]}},{"w":0}],"v":{"u":"t"}}`)); err != nil {
			t.Fatal(err)
		}
	}
	if got := string(v.get("model").raw); got != `"m"` {
		t.Errorf("model %s", got)
	}
	msgs := v.get("messages")
	if len(msgs.elems) != 2 || msgs.elems[1].get("role").text() != "assistant" || msgs.elems[0].get("content").text() != "a" {
		t.Errorf("messages %s: %+v", msgs.raw, msgs.elems)
	}
	if n := v.get("n"); len(n.elems) != 3 || string(n.elems[2].raw) != "3" {
		t.Errorf("n %+v", n)
	}
	if len(v.members) != 3 {
		t.Errorf("%d members, want 3", len(v.members))
	}
}

// FuzzStripMembers: taking the iop_ollama member out of a body from the
// spans of its one parse gives the bytes translate.StripExtension gives.
func FuzzStripMembers(f *testing.F) {
	for _, s := range []string{
		`{"iop_ollama":{"think":true}}`, `{"iop_ollama":1,"model":"m"}`, `{"model":"m", "iop_ollama" : {} }`,
		`{ "iop_ollama":1 , "iop_ollama":2 ,"a":3,"iop_ollama":4}`, `{"a":1,"iop_ollama":null}`, `{"iop_\u006fllama":1,"b":2}`,
		`{"model":"m"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		top, err := parseJSON(body)
		if err != nil || top.kind() != '{' {
			return
		}
		want, _, err := translate.StripExtension(body)
		if err != nil {
			t.Fatalf("StripExtension: %v", err)
		}
		if got := stripMembers(body, top, translate.ExtensionKey); !bytes.Equal(got, want) {
			t.Fatalf("stripMembers(%q) = %q, want %q", body, got, want)
		}
	})
}

// TestRoutesParseBodyOnce: each OpenAI route parses the client's bytes
// once: its checks, needs, estimated input tokens and the
// iop_ollama member's removal all come from that one parse.
func TestRoutesParseBodyOnce(t *testing.T) {
	for _, c := range []struct {
		path, body string
		run        *fakeRun
		needs      []string
		estimate   int
	}{
		{"/v1/chat/completions",
			`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"look at this"},{"type":"image_url","image_url":{"url":"https://example.com/a.png"}}]}],` +
				`"tools":[{"type":"function","function":{"name":"f"}}],"iop_ollama":{"think":true}}`,
			scriptedRun(normalized, events(delta("hi"), complete("stop"))),
			[]string{NeedTools, NeedVision, NeedRemoteImages},
			(len("look at this") + len(`{"type":"function","function":{"name":"f"}}`) + 3) / 4},
		{"/v1/completions", `{"model":"m","prompt":["one","two"],"n":2}`,
			scriptedRun(normalized, events(delta("hi"), complete("stop"))),
			[]string{NeedPromptBatch, NeedChoices}, (len("onetwo") + 3) / 4},
		{"/v1/embeddings", `{"model":"m","input":"some text"}`,
			scriptedRun(normalized, events(&nodev1.RunEvent{Type: nodev1.RunEvent_TYPE_DELTA, Embeddings: []*nodev1.Embedding{{Values: []float32{1}}}}), events(complete("stop"))),
			[]string{NeedEmbeddings}, (len("some text") + 3) / 4},
	} {
		t.Run(c.path, func(t *testing.T) {
			env := newEnv(t, Config{}, runWith(c.run))
			before := bodyParses.Load()
			resp, err := http.Post(env.srv.URL+c.path, "application/json", strings.NewReader(c.body))
			if err != nil {
				t.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d", resp.StatusCode)
			}
			if n := bodyParses.Load() - before; n != 1 {
				t.Errorf("the body was parsed %d times, want 1", n)
			}
			reqs := env.gw.requests()
			if len(reqs) != 1 {
				t.Fatalf("dispatched %d requests", len(reqs))
			}
			r := reqs[0]
			if !slices.Equal(r.Needs, c.needs) || r.EstimatedInputTokens != c.estimate {
				t.Errorf("needs %q estimate %d, want %q %d", r.Needs, r.EstimatedInputTokens, c.needs, c.estimate)
			}
			if strings.Contains(string(r.Body), translate.ExtensionKey) || !json.Valid(r.Body) {
				t.Errorf("dispatched body %s", r.Body)
			}
		})
	}
}

// FuzzOllamaNeedsAsCanonical: an Ollama request's checks, needs and
// estimate, taken from what the translation decoded (TranslatedChatNeeds,
// CheckTranslatedEmbed), are those decodeChatRequest and
// decodeEmbeddingsRequest find in the canonical body it generated, which
// the route used to decode again.
func FuzzOllamaNeedsAsCanonical(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","messages":[{"role":"user","content":"héllo","images":["iVBORw0KGgo="]}]}`,
		`{"model":"m","messages":[{"role":"wizard","content":"x"}]}`,
		`{"model":"m","messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f","description":"a <b> & c \u2028"}}]}`,
		`{"model":"m","messages":[{"role":"user","content":"x"}],"tools":[{"type":"nope"}]}`,
		`{"model":"m","messages":[{"role":"user","content":"x"}],"tools":[]}`,
		`{"model":"m","messages":[{"role":"assistant","content":"","tool_calls":[{"function":{"name":"f","arguments":{"a":"<1>"}}}]},{"role":"tool","content":"r"}],"think":"high"}`,
		`{"model":"m","messages":[{"role":"user","content":"x"}],"think":true,"options":{"num_predict":5,"stop":["a"]},"format":"json"}`,
		`{"model":"m","prompt":"why","system":"be brief","images":["iVBORw0KGgo="]}`,
		`{"model":"m","prompt":"p","raw":true}`,
		`{"model":"m","input":["a","","c"]}`, `{"model":"m","input":"one","dimensions":0}`, `{"model":"m","input":["a","b"],"dimensions":8}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		words := func(err error) string {
			var re *requestError
			if errors.As(err, &re) {
				return re.param + ": " + re.message
			}
			if err != nil {
				return "other: " + err.Error()
			}
			return ""
		}
		for _, from := range []func([]byte) (translate.Request, error){translate.FromOllamaChat, translate.FromOllamaGenerate} {
			tr, err := from(body)
			if err != nil || tr.LoadOnly || tr.Operation != translate.Chat {
				continue
			}
			want, werr := decodeChatRequest(tr.Body)
			needs, estimate, gerr := TranslatedChatNeeds(&tr)
			if words(gerr) != words(werr) {
				t.Fatalf("body %s: error %q, the canonical body's %q", body, words(gerr), words(werr))
			}
			if werr == nil && (!slices.Equal(needs, want.Needs) || estimate != want.EstimatedInputTokens) {
				t.Fatalf("body %s: needs %q estimate %d, the canonical body's %q %d", body, needs, estimate, want.Needs, want.EstimatedInputTokens)
			}
		}
		tr, err := translate.FromOllamaEmbed(body)
		if err != nil || tr.LoadOnly {
			return
		}
		want, werr := decodeEmbeddingsRequest(tr.Body)
		gerr := CheckTranslatedEmbed(&tr)
		if words(gerr) != words(werr) {
			t.Fatalf("body %s: error %q, the canonical body's %q", body, words(gerr), words(werr))
		}
		if werr == nil && (len(tr.Inputs) != want.Inputs || (tr.InputChars+3)/4 != want.EstimatedInputTokens) {
			t.Fatalf("body %s: %d inputs, estimate %d; the canonical body's %d %d", body, len(tr.Inputs), (tr.InputChars+3)/4, want.Inputs, want.EstimatedInputTokens)
		}
	})
}
