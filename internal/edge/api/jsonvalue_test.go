package api

import (
	"bytes"
	"encoding/json"
	"testing"
	"unicode/utf8"

	"iop/internal/translate"
)

// jsonSeeds are bodies at the edges of RFC 8259 as encoding/json reads it.
var jsonSeeds = []string{
	`{}`, `[]`, `""`, `0`, `-0.5e+10`, `01`, `1.`, `.5`, `-`, `1e`, `true`, `tru`, `null`, ` {"a" : [1, 2 ,{}]} `,
	`{"model":"m","messages":[{"role":"user","content":"h\u00e9llo \ud83d\ude00 \ud800 x"}]}`,
	"{\"a\":\"\xff\xfe bad utf-8\"}", "{\"a\":\"tab\there\"}", `{"a":"\x"}`, `{"a":1,}`, `[1,]`, `{"a" 1}`,
	`{"mod\u0065l":"x","model":"y"}`, `{"a":"\"\\\/\b\f\n\r\t"}`, `{"a":"\u12"}`, `{} x`, `{"a":[[[[]]]]}`,
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
				for i := range v.members {
					check(&v.members[i].value)
				}
			case '[':
				for i := range v.elems {
					check(&v.elems[i])
				}
			}
		}
		check(v)
	})
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
