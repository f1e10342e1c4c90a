package translate

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// jsonEqual reports whether two JSON texts hold the same value.
func jsonEqual(t *testing.T, got []byte, want string) bool {
	t.Helper()
	var g, w any
	if err := json.Unmarshal(got, &g); err != nil {
		t.Fatalf("got invalid JSON %s: %v", got, err)
	}
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		t.Fatalf("want invalid JSON %s: %v", want, err)
	}
	return reflect.DeepEqual(g, w)
}

// translatedAs reports whether req is want: a canonical body, whose
// ExtensionKey member (absent: none) is what req.OllamaFields must hold,
// apart from req.Body, which must equal the rest and never carry the
// member (a wire field does not live in the body).
func translatedAs(t *testing.T, req Request, want string) bool {
	t.Helper()
	var w map[string]json.RawMessage
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		t.Fatalf("want invalid JSON %s: %v", want, err)
	}
	fields, hasFields := w[ExtensionKey]
	delete(w, ExtensionKey)
	rest, err := json.Marshal(w)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(req.Body, []byte(ExtensionKey)) {
		t.Errorf("body carries %s: %s", ExtensionKey, req.Body)
		return false
	}
	if !jsonEqual(t, req.Body, string(rest)) {
		return false
	}
	if !hasFields {
		if req.OllamaFields != nil {
			t.Errorf("OllamaFields %s, want none", req.OllamaFields)
			return false
		}
		return true
	}
	if req.OllamaFields == nil || !jsonEqual(t, req.OllamaFields, string(fields)) {
		t.Errorf("OllamaFields %s, want %s", req.OllamaFields, fields)
		return false
	}
	return true
}

const pngB64 = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="

func TestFromOllamaChat(t *testing.T) {
	for _, c := range []struct {
		name, in, want string
		ext, dropped   []string
	}{
		{
			name: "plain",
			in:   `{"model":"llama3","messages":[{"role":"user","content":"hi"}]}`,
			want: `{"model":"llama3","messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true}}`,
		},
		{
			name: "options, format and Ollama-only fields",
			in: `{"model":"m","stream":false,"keep_alive":"24h","think":true,"truncate":false,"format":"json",
				"options":{"num_predict":5,"temperature":0,"top_p":0.9,"stop":["\n"],"seed":42.0,"frequency_penalty":1,"presence_penalty":1.5,"num_ctx":8192,"top_k":40},
				"messages":[{"role":"user","content":"hi"}]}`,
			want: `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true},
				"max_tokens":5,"temperature":0,"top_p":0.9,"stop":["\n"],"seed":42,"frequency_penalty":1,"presence_penalty":1.5,
				"response_format":{"type":"json_object"},
				"iop_ollama":{"keep_alive":"24h","think":true,"truncate":false,"options":{"num_ctx":8192,"top_k":40}}}`,
			ext: []string{"keep_alive", "options.num_ctx", "options.top_k", "think", "truncate"},
		},
		{
			name: "no limit and a schema format",
			in:   `{"model":"m","options":{"num_predict":-1},"format":{"type":"object"},"messages":[{"role":"user","content":"hi"}]}`,
			want: `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true},
				"response_format":{"type":"json_schema","json_schema":{"name":"ollama_format","schema":{"type":"object"}}}}`,
		},
		{
			name: "images, tool calls and tool results",
			in: `{"model":"m","tools":[{"type":"function","function":{"name":"w"}}],"messages":[
				{"role":"user","content":"look","images":["` + pngB64 + `"]},
				{"role":"assistant","content":"","thinking":"hmm","tool_calls":[{"function":{"name":"w","arguments":{"city":"Paris"}}},{"function":{"name":"t","arguments":{}}}]},
				{"role":"tool","tool_name":"t","content":"12:00"},
				{"role":"tool","content":"sunny"}]}`,
			want: `{"model":"m","stream":true,"stream_options":{"include_usage":true},"tools":[{"type":"function","function":{"name":"w"}}],"messages":[
				{"role":"user","content":[{"type":"text","text":"look"},{"type":"image_url","image_url":{"url":"data:image/png;base64,` + pngB64 + `"}}]},
				{"role":"assistant","content":"","tool_calls":[
					{"id":"call_1_0","type":"function","function":{"name":"w","arguments":"{\"city\":\"Paris\"}"}},
					{"id":"call_1_1","type":"function","function":{"name":"t","arguments":"{}"}}]},
				{"role":"tool","content":"12:00","tool_call_id":"call_1_1"},
				{"role":"tool","content":"sunny","tool_call_id":"call_1_0"}],
				"iop_ollama":{"messages":[{},{"thinking":"hmm"},{},{}]}}`,
			ext: []string{"messages[1].thinking"},
		},
		{
			name: "think levels reach OpenAI-compatible providers as reasoning_effort",
			in:   `{"model":"m","think":"high","messages":[{"role":"user","content":"hi"}]}`,
			want: `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true},
				"reasoning_effort":"high","iop_ollama":{"think":"high"}}`,
			ext: []string{"think"},
		},
		{
			name: "think false sends no reasoning_effort",
			in:   `{"model":"m","think":false,"messages":[{"role":"user","content":"hi"}]}`,
			want: `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true},
				"iop_ollama":{"think":false}}`,
			ext: []string{"think"},
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			req, err := FromOllamaChat([]byte(c.in))
			if err != nil {
				t.Fatal(err)
			}
			if !translatedAs(t, req, c.want) {
				t.Fatalf("body\n%s\nfields %s\nwant\n%s", req.Body, req.OllamaFields, c.want)
			}
			if !reflect.DeepEqual(req.Extension, c.ext) || !reflect.DeepEqual(req.Dropped, c.dropped) || req.Operation != Chat {
				t.Fatalf("extension %v dropped %v operation %v", req.Extension, req.Dropped, req.Operation)
			}
		})
	}
	t.Run("stream defaults to true", func(t *testing.T) {
		for in, want := range map[string]bool{`{"model":"m"}`: true, `{"model":"m","stream":null}`: true, `{"model":"m","stream":false}`: false} {
			req, err := FromOllamaChat([]byte(in))
			if err != nil || req.Stream != want || !req.LoadOnly {
				t.Fatalf("%s: stream %v load %v %v", in, req.Stream, req.LoadOnly, err)
			}
		}
	})
}

func TestFromOllamaGenerate(t *testing.T) {
	req, err := FromOllamaGenerate([]byte(`{"model":"m","prompt":"why?","system":"be brief","template":"{{.Prompt}}","images":["` + pngB64 + `"],"keep_alive":300}`))
	if err != nil {
		t.Fatal(err)
	}
	want := `{"model":"m","stream":true,"stream_options":{"include_usage":true},"iop_ollama":{"keep_alive":300},"messages":[
		{"role":"system","content":"be brief"},
		{"role":"user","content":[{"type":"text","text":"why?"},{"type":"image_url","image_url":{"url":"data:image/png;base64,` + pngB64 + `"}}]}]}`
	if !translatedAs(t, req, want) || req.Operation != Chat || !reflect.DeepEqual(req.Dropped, []string{"template"}) {
		t.Fatalf("%s %v %v", req.Body, req.Operation, req.Dropped)
	}

	req, err = FromOllamaGenerate([]byte(`{"model":"m","prompt":"def f(","suffix":"return x","system":"s","format":"json","options":{"num_predict":9}}`))
	if err != nil {
		t.Fatal(err)
	}
	want = `{"model":"m","prompt":"def f(","suffix":"return x","stream":true,"stream_options":{"include_usage":true},"max_tokens":9,
		"response_format":{"type":"json_object"},"iop_ollama":{"format":"json"}}`
	if !translatedAs(t, req, want) || req.Operation != Completion || req.EstimatedInputTokens != 4 {
		t.Fatalf("%s %v %d", req.Body, req.Operation, req.EstimatedInputTokens)
	}

	for in, field := range map[string]string{
		`{"model":"m","prompt":"p","context":[1,2]}`:           "context",
		`{"model":"m","prompt":"p","raw":true,"images":["x"]}`: "images",
		`{"prompt":"p"}`:                                                      "model",
		`{"model":"m","prompt":7}`:                                            "prompt",
		`{"model":"m","prompt":"p","options":[]}`:                             "options",
		`{"model":"m","prompt":"p","options":{"seed":1.5}}`:                   "options.seed",
		`{"model":"m","prompt":"p","options":{"stop":[1]}}`:                   "options.stop",
		`{"model":"m","prompt":"p","options":{"stop":["a","b","c","d","e"]}}`: "options.stop",
		`{"model":"m","prompt":"p","format":7}`:                               "format",
		`{"model":"m","prompt":"p","images":["not base64!"]}`:                 "images[0]",
		`[1]`: "",
	} {
		_, err := FromOllamaGenerate([]byte(in))
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field != field {
			t.Fatalf("%s: err %v, want a FieldError for %q", in, err, field)
		}
	}
	for in, unload := range map[string]bool{`{"model":"m","keep_alive":0}`: true, `{"model":"m","keep_alive":"0s"}`: true, `{"model":"m","keep_alive":"5m"}`: false, `{"model":"m"}`: false} {
		req, err := FromOllamaGenerate([]byte(in))
		if err != nil || !req.LoadOnly || req.Unload != unload {
			t.Fatalf("%s: %+v %v", in, req, err)
		}
	}
}

// TestOllamaFieldsKeepJSONTypes: the fields reach the Ollama body with
// their JSON values unchanged, a field the translation sets (model,
// options.temperature) keeps the translated value, and fields that are
// not an object are refused.
func TestOllamaFieldsKeepJSONTypes(t *testing.T) {
	fields, err := ParseOllamaFields([]byte(`{"keep_alive":"24h","think":"high","model":"other","options":{"num_ctx":8192,"temperature":2}}`))
	if err != nil {
		t.Fatal(err)
	}
	canonical := []byte(`{"model":"x","messages":[{"role":"user","content":"hi"}],"temperature":0.5}`)
	out, err := ToOllamaChat(canonical, "m", fields)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"keep_alive":"24h","think":"high","options":{"temperature":0.5,"num_ctx":8192}}`
	if !jsonEqual(t, out, want) {
		t.Fatalf("%s", out)
	}
	if !bytes.Contains(out, []byte(`"num_ctx":8192`)) || !bytes.Contains(out, []byte(`"keep_alive":"24h"`)) {
		t.Fatalf("values changed: %s", out)
	}
	plain, err := ToOllamaChat(canonical, "m", nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, none := range []string{``, `null`, `{}`} {
		f, err := ParseOllamaFields([]byte(none))
		if err != nil {
			t.Fatalf("%q: %v", none, err)
		}
		out, err := ToOllamaChat(canonical, "m", f)
		if err != nil || !bytes.Equal(out, plain) {
			t.Fatalf("without fields (%q): %s %v, want %s", none, out, err, plain)
		}
	}
	for _, bad := range []string{`"x"`, `[]`, `1`, `{"options":[]}`, `{"options":1}`, `{"messages":{}}`, `{"messages":[1]}`, `{`} {
		if _, err := ParseOllamaFields([]byte(bad)); !errors.Is(err, ErrNotObject) {
			t.Fatalf("%s: %v", bad, err)
		}
	}
	// options null is no options; an empty options object is an empty one.
	for in, want := range map[string]string{
		`{"options":null}`: `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}`,
		`{"options":{}}`:   `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"options":{}}`,
	} {
		f, err := ParseOllamaFields([]byte(in))
		if err != nil {
			t.Fatal(err)
		}
		out, err := ToOllamaChat([]byte(`{"messages":[{"role":"user","content":"hi"}]}`), "m", f)
		if err != nil || !jsonEqual(t, out, want) {
			t.Fatalf("%s: %s %v, want %s", in, out, err, want)
		}
	}
}

// TestOllamaFieldsOnGenerateAndEmbed: the fields reach /api/generate and
// /api/embed bodies too; an embed body has no options of its own, so
// the fields' options are its options.
func TestOllamaFieldsOnGenerateAndEmbed(t *testing.T) {
	f, err := ParseOllamaFields([]byte(`{"keep_alive":300,"raw":true,"suffix":"theirs","options":{"num_ctx":512,"seed":9},"messages":[{"thinking":"x"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	out, err := ToOllamaGenerate([]byte(`{"prompt":"p","suffix":"mine","seed":1}`), "m", f)
	want := `{"model":"m","prompt":"p","suffix":"mine","stream":true,"keep_alive":300,"raw":true,"options":{"seed":1,"num_ctx":512}}`
	if err != nil || !jsonEqual(t, out, want) {
		t.Fatalf("generate: %s %v, want %s", out, err, want)
	}
	out, n, err := ToOllamaEmbed([]byte(`{"input":"a"}`), "e", f)
	want = `{"model":"e","input":["a"],"keep_alive":300,"raw":true,"suffix":"theirs","options":{"num_ctx":512,"seed":9}}`
	if err != nil || n != 1 || !jsonEqual(t, out, want) {
		t.Fatalf("embed: %s %d %v, want %s", out, n, err, want)
	}
}

func TestStripExtension(t *testing.T) {
	for in, want := range map[string]string{
		`{"model":"m"}`: `{"model":"m"}`,
		`{"a":1,"iop_ollama":{"keep_alive":"5m"},"b":2}`: `{"a":1,"b":2}`,
		`{"iop_ollama":{},"a":1}`:                        `{"a":1}`,
		`{ "iop_ollama" : {} , "a" : 1 }`:                `{ "a" : 1 }`,
		`{"iop_ollama":{}}`:                              `{}`,
		`{"iop_ollama":1,"iop_ollama":2,"a":[1, 2]}`:     `{"a":[1, 2]}`,
		`{"a":1,"iop\u005follama":{}}`:                   `{"a":1}`,
		`{"a":{"iop_ollama":1}}`:                         `{"a":{"iop_ollama":1}}`,
		"{\n  \"a\": 1.0,\n  \"iop_ollama\": null\n}":    "{\n  \"a\": 1.0\n}",
	} {
		out, removed, err := StripExtension([]byte(in))
		if err != nil || string(out) != want || removed != (in != want) {
			t.Fatalf("StripExtension(%s) = %s, %v, %v; want %s", in, out, removed, err, want)
		}
	}
	for _, in := range []string{``, `[]`, `{"a":1} {}`, `{"a":}`} {
		if _, _, err := StripExtension([]byte(in)); !errors.Is(err, ErrNotObject) {
			t.Fatalf("StripExtension(%q): %v", in, err)
		}
	}
}

// FuzzStripExtension checks that StripExtension leaves a JSON object with
// the same members minus ExtensionKey, or refuses what is not one object.
func FuzzStripExtension(f *testing.F) {
	f.Add([]byte(`{"a":1,"iop_ollama":{"keep_alive":"5m"},"b":2}`))
	f.Add([]byte(`{"iop_ollama":{},"iop_ollama":[],"x":"y"}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		out, removed, err := StripExtension(body)
		if err != nil {
			return
		}
		var before, after map[string]json.RawMessage
		if json.Unmarshal(body, &before) != nil {
			return // e.g. invalid UTF-8 that the tokenizer accepted
		}
		if err := json.Unmarshal(out, &after); err != nil {
			t.Fatalf("StripExtension(%q) = %q, not a JSON object: %v", body, out, err)
		}
		_, had := before[ExtensionKey]
		delete(before, ExtensionKey)
		if _, ok := after[ExtensionKey]; ok || removed != had || len(before) != len(after) {
			t.Fatalf("StripExtension(%q) = %q (removed %v)", body, out, removed)
		}
		for k, v := range before {
			if !bytes.Equal(after[k], v) {
				t.Fatalf("member %q changed: %s -> %s", k, v, after[k])
			}
		}
	})
}

// TestOllamaThinkTranslation: "think" reaches OpenAI-compatible providers
// as reasoning_effort (chat bodies only) and Ollama providers unchanged;
// false marks the request NoThinking; Ollama refuses other values, and so
// does the translation.
func TestOllamaThinkTranslation(t *testing.T) {
	effort := func(body []byte) string {
		var b struct {
			ReasoningEffort string `json:"reasoning_effort"`
		}
		_ = json.Unmarshal(body, &b)
		return b.ReasoningEffort
	}
	for _, c := range []struct {
		in         string
		effort     string
		noThinking bool
	}{
		{`{"model":"m","think":true,"messages":[{"role":"user","content":"x"}]}`, "", false},
		{`{"model":"m","think":"medium","messages":[{"role":"user","content":"x"}]}`, "medium", false},
		{`{"model":"m","think":"low","messages":[{"role":"user","content":"x"}]}`, "low", false},
		{`{"model":"m","think":false,"messages":[{"role":"user","content":"x"}]}`, "", true},
		{`{"model":"m","messages":[{"role":"user","content":"x"}]}`, "", false},
		{`{"model":"m","think":null,"messages":[{"role":"user","content":"x"}]}`, "", false},
	} {
		req, err := FromOllamaChat([]byte(c.in))
		if err != nil || effort(req.Body) != c.effort || req.NoThinking != c.noThinking {
			t.Errorf("chat %s: effort %q no-thinking %v %v; want %q %v", c.in, effort(req.Body), req.NoThinking, err, c.effort, c.noThinking)
		}
	}
	req, err := FromOllamaGenerate([]byte(`{"model":"m","prompt":"x","think":"high"}`))
	if err != nil || req.Operation != Chat || effort(req.Body) != "high" {
		t.Errorf("generate: %s %v", req.Body, err)
	}
	req, err = FromOllamaGenerate([]byte(`{"model":"m","prompt":"x","raw":true,"think":true}`))
	if err != nil || req.Operation != Completion || effort(req.Body) != "" || string(req.OllamaFields) != `{"raw":true,"think":true}` {
		t.Errorf("raw generate: a completions body carries think for Ollama only: %s %v", req.Body, err)
	}
	for _, in := range []string{
		`{"model":"m","think":"max","messages":[{"role":"user","content":"x"}]}`,
		`{"model":"m","think":1,"messages":[{"role":"user","content":"x"}]}`,
		`{"model":"m","think":{},"prompt":"x"}`,
	} {
		from := FromOllamaChat
		if strings.Contains(in, "prompt") {
			from = FromOllamaGenerate
		}
		var fe *FieldError
		if _, err := from([]byte(in)); !errors.As(err, &fe) || fe.Field != "think" {
			t.Errorf("%s: %v, want a FieldError for think", in, err)
		}
	}
}

// TestOllamaFieldsMergeMessages: the per-message fields of an Ollama
// client's messages (their thinking) reach the Ollama provider's messages
// of the same index, without replacing what the translation set.
func TestOllamaFieldsMergeMessages(t *testing.T) {
	req, err := FromOllamaChat([]byte(`{"model":"m","messages":[{"role":"user","content":"q"},
		{"role":"assistant","content":"a","thinking":"because"},{"role":"user","content":"and?"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	fields, err := ParseOllamaFields(req.OllamaFields)
	if err != nil {
		t.Fatal(err)
	}
	out, err := ToOllamaChat(req.Body, "m", fields)
	want := `{"model":"m","stream":true,"messages":[{"role":"user","content":"q"},{"role":"assistant","content":"a","thinking":"because"},{"role":"user","content":"and?"}]}`
	if err != nil || !jsonEqual(t, out, want) || !reflect.DeepEqual(req.Extension, []string{"messages[1].thinking"}) {
		t.Fatalf("%s %v %v", out, req.Extension, err)
	}
	// The translation's own thinking stays; extra entries and null values
	// are ignored.
	fields, err = ParseOllamaFields([]byte(`{"messages":[{"thinking":"theirs","x":null},{"thinking":"no such message"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	out, err = ToOllamaChat([]byte(`{"messages":[{"role":"assistant","content":"","reasoning_content":"mine"}]}`), "m", fields)
	if err != nil || !jsonEqual(t, out, `{"model":"m","stream":true,"messages":[{"role":"assistant","content":"","thinking":"mine"}]}`) {
		t.Fatalf("%s %v", out, err)
	}
}

// TestTakeOllamaStop: options.stop leaves the Ollama body (the other
// options stay, an emptied options object goes) and comes back in order;
// a body without it is unchanged; a wrong type or more than 4 is a
// FieldError naming options.stop.
func TestTakeOllamaStop(t *testing.T) {
	for _, tc := range []struct {
		in, out string
		stop    []string
		errs    bool
	}{
		{`{"model":"m","options":{"stop":["a","b"],"temperature":0}}`, `{"model":"m","options":{"temperature":0}}`, []string{"a", "b"}, false},
		{`{"model":"m","options":{"stop":"a"}}`, `{"model":"m"}`, []string{"a"}, false},
		{`{"model":"m","messages":[{"content":"\"stop\""}]}`, `{"model":"m","messages":[{"content":"\"stop\""}]}`, nil, false},
		{`{"model":"m","options":{"stop":1}}`, ``, nil, true},
		{`{"model":"m","options":{"stop":["a","b","c","d","e"]}}`, ``, nil, true},
	} {
		out, stop, err := TakeOllamaStop([]byte(tc.in))
		var fe *FieldError
		if tc.errs {
			if !errors.As(err, &fe) || fe.Field != "options.stop" {
				t.Errorf("%s: %v, want a FieldError naming options.stop", tc.in, err)
			}
			continue
		}
		if err != nil || string(out) != tc.out || !slices.Equal(stop, tc.stop) {
			t.Errorf("%s: %s %q %v, want %s %q", tc.in, out, stop, err, tc.out, tc.stop)
		}
	}
}

// TestOllamaClientThinkGoesInOllamaFields: an Ollama client's think
// level goes as the chat body's reasoning_effort and also as the "think"
// of OllamaFields, by which an adapter tells it from an effort an OpenAI
// client sent (it relays the provider's refusal of the former and may
// retry the latter without it); true and false are no effort.
func TestOllamaClientThinkGoesInOllamaFields(t *testing.T) {
	for _, c := range []struct{ think, effort, field string }{
		{`"high"`, `"high"`, `"high"`},
		{`"low"`, `"low"`, `"low"`},
		{`true`, ``, `true`},
		{`false`, ``, `false`},
	} {
		for _, from := range []func([]byte) (Request, error){FromOllamaChat, FromOllamaGenerate} {
			body := `{"model":"m","think":` + c.think + `,"prompt":"hi","messages":[{"role":"user","content":"hi"}]}`
			req, err := from([]byte(body))
			if err != nil {
				t.Fatalf("think %s: %v", c.think, err)
			}
			var top struct {
				Effort json.RawMessage `json:"reasoning_effort"`
			}
			if err := json.Unmarshal(req.Body, &top); err != nil {
				t.Fatal(err)
			}
			fields, err := ParseOllamaFields(req.OllamaFields)
			if err != nil {
				t.Fatal(err)
			}
			var field string
			if fields.Has("think") {
				field = string(fields.top["think"])
			}
			if string(top.Effort) != c.effort || field != c.field {
				t.Errorf("think %s: reasoning_effort %s, OllamaFields think %q; want %s and %q", c.think, top.Effort, field, c.effort, c.field)
			}
		}
	}
}
